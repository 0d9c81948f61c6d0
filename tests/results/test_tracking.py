"""graft.results.tracking without a tracker's package: a summary's metrics and their names,
the one line for a missing package, W&B's online/offline choice, and the environment that
reporting sets and restores. (Real TensorBoard and W&B runs: tests/cli/test_report_to.py.)"""

from __future__ import annotations

import os
import socket

import polars as pl
import pytest

from graft.results import tracking


def test_summary_metrics_name_rows_by_text_and_varying_seeds_and_leave_out_bounds():
    summary = pl.DataFrame(
        {
            "template": ["headline", "headline", "qa"],
            "graft": ["SFT", "FE+LT", "SFT"],
            "group": ["", "", "mean"],
            "data_seed": [0, 0, 0],
            "finetune_seed": [0, 1, None],
            "n": [2, 2, 4],
            "acc@5": [0.5, 0.25, 1.0],
            "acc@5_lo": [0.1, 0.0, 0.5],
            "acc@5_hi": [0.9, 0.7, 1.0],
            "acc@5_ci_method": ["95% Wilson interval"] * 3,
        }
    )
    metrics = tracking.summary_metrics(summary)
    assert metrics == {
        "headline/SFT/finetune_seed=0/n": 2.0,
        "headline/SFT/finetune_seed=0/acc@5": 0.5,
        "headline/FE+LT/finetune_seed=1/n": 2.0,
        "headline/FE+LT/finetune_seed=1/acc@5": 0.25,
        "qa/SFT/mean/n": 4.0,
        "qa/SFT/mean/acc@5": 1.0,
    }


def test_a_missing_package_is_one_line_naming_the_extra(monkeypatch):
    assert tracking.missing_package("none") is None
    monkeypatch.setitem(tracking.PACKAGES, "wandb", "graft_no_such_package")
    message = tracking.missing_package("wandb")
    assert message is not None and "\n" not in message
    assert "graft-interp[tracking]" in message and "--report-to wandb" in message


@pytest.fixture
def no_wandb_settings(monkeypatch, tmp_path):
    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    return monkeypatch


def test_wandb_mode_given_wins(no_wandb_settings):
    no_wandb_settings.setenv("WANDB_MODE", "disabled")
    assert tracking.wandb_mode() == ("disabled", None)


def test_wandb_is_offline_without_a_key(no_wandb_settings):
    mode, why = tracking.wandb_mode()
    assert mode == "offline" and "API key" in (why or "")


def test_wandb_is_offline_when_its_server_does_not_answer(no_wandb_settings):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    no_wandb_settings.setenv("WANDB_API_KEY", "x" * 40)
    no_wandb_settings.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{port}")
    mode, why = tracking.wandb_mode()
    assert mode == "offline" and "127.0.0.1 does not answer" in (why or "")


def test_wandb_is_online_with_a_key_and_a_server(no_wandb_settings):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        no_wandb_settings.setenv("WANDB_API_KEY", "x" * 40)
        no_wandb_settings.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{server.getsockname()[1]}")
        assert tracking.wandb_mode() == ("online", None)


def test_reporting_sets_wandb_settings_inside_and_restores_them(no_wandb_settings, tmp_path):
    no_wandb_settings.setenv("WANDB_PROJECT", "mine")
    no_wandb_settings.delenv("WANDB_DIR", raising=False)
    chosen = tracking.tracking_for("wandb", tmp_path / "tracking", "runs/position x")
    assert (
        chosen is not None and chosen.wandb_mode == "offline" and chosen.group == "runs-position-x"
    )
    assert tracking.current() is None
    with tracking.reporting(chosen):
        assert tracking.current() is chosen
        assert os.environ["WANDB_DIR"] == str(tmp_path / "tracking")
        assert os.environ["WANDB_MODE"] == "offline"
        assert os.environ["WANDB_PROJECT"] == "mine"  # the user's own project is kept
        with tracking.trainer_reporting("finetune-a") as (report_to, name):
            assert report_to == ["wandb"] and name == "runs-position-x/finetune-a"
    assert tracking.current() is None
    assert "WANDB_DIR" not in os.environ and "WANDB_MODE" not in os.environ
    assert os.environ["WANDB_PROJECT"] == "mine"


def test_tensorboard_trainer_writes_into_the_tracking_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("TENSORBOARD_LOGGING_DIR", raising=False)
    chosen = tracking.tracking_for("tensorboard", tmp_path, "run")
    with tracking.reporting(chosen), tracking.trainer_reporting("finetune-a") as (report, _):
        assert report == ["tensorboard"]
        assert os.environ["TENSORBOARD_LOGGING_DIR"] == str(tmp_path / "tensorboard/run/finetune-a")
    assert "TENSORBOARD_LOGGING_DIR" not in os.environ
    assert not any(tmp_path.iterdir())  # nothing written before a tracker writes


def test_without_tracking_the_trainer_reports_nowhere():
    with tracking.trainer_reporting("finetune-a") as (report_to, name):
        assert report_to == ["none"] and name is None
    assert tracking.tracking_for("none", "x", "y") is None  # type: ignore[arg-type]
