"""Stage times of a run: accumulated per stage, in first-run order, printed in one line."""

from __future__ import annotations

import time

from graft.study.running.timing import StageTimes


def test_stages_add_up_in_first_run_order():
    times = StageTimes()
    with times.stage("loading"):
        time.sleep(0.01)
    with times.stage("grafting"):
        time.sleep(0.02)
    with times.stage("loading"):
        time.sleep(0.01)
    assert list(times.seconds) == ["loading", "grafting"]
    assert times.seconds["loading"] >= 0.02 and times.seconds["grafting"] >= 0.02
    line = times.line()
    assert line.startswith("time: loading ") and ", grafting " in line and "(total " in line


def test_a_failing_block_is_timed_too():
    times = StageTimes()
    try:
        with times.stage("finetuning"):
            raise KeyError("x")
    except KeyError:
        pass
    assert "finetuning" in times.seconds


def test_format():
    times = StageTimes({"finetuning": 254.6, "loading": 3.21})
    assert times.line() == "time: finetuning 255 s, loading 3.2 s (total 258 s)"
