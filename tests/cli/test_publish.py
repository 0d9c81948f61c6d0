"""``graft-exp publish``: a run's tables into a results/ folder, with their provenance.

Most tests publish run folders built by hand (a config.json as graft writes it, a few CSV
tables); one publishes a real tiny-llama position run."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import polars as pl
import pytest
import torch
from click.testing import CliRunner, Result

from graft.errors import ResultsError
from graft.results.benchmark_tables import write_benchmark_table
from graft.results.paper.agreement import read_results
from graft.results.publish import (
    PROVENANCE_FILE,
    missing_fields,
    publish_run,
    read_provenance,
)
from graft.storage.tables import save_table
from graft_experiments.publish import publish
from tests.cli.tiny_runs import tiny_args

MACHINE = {
    "cpu": "Test CPU",
    "cpu_count": 4,
    "gpu": None,
    "torch_threads": 3,
    "platform": "Linux",
    "python": "3.11.7",
}
DONOR = "/ws/finetuned/tiny-llama/data-seed0/all/cpu-1234"


def run_config(experiment: str = "position", **changes) -> dict:
    """A config.json as graft writes it (the provenance fields filled in)."""
    config = {
        "experiment": experiment,
        "options": {
            "experiment": experiment,
            "model": "tiny-llama",
            "n": 6,
            "n_facts": 10,
            "seed": 0,
            "data_seed": 0,
            "finetune_seeds": [0, 1],
            "protocol": "graft",
            "preset": None,
            "device": None,
        },
        "grafts": [{"name": g, "group": "", "spec": g} for g in ("PRE", "SFT", "LT", "FE")],
        "replicates": [{"label": "d0-f0"}, {"label": "d0-f1"}],
        "finetuned_models": {
            DONOR: {"seed": 0, "config": {"name": "cpu"}, "machine": MACHINE, "versions": {}}
        },
        "machine": MACHINE,
        "packages": {"torch": "2.13.0", "graft": "0.1.0"},
        "git_commit": "0123456789abcdef0123456789abcdef01234567",
        "git_dirty": False,
        "command": f"graft-exp {experiment} --model tiny-llama --n 6",
        "created": "2026-11-01T10:00:00+00:00",
        "resumes": [{"time": "2026-11-02T09:00:00+00:00", "changed": {}}],
        "run_key": "abc",
    }
    config.update(changes)
    return config


def summary_frame(grafts=("PRE", "SFT", "LT", "FE"), group: str = "") -> pl.DataFrame:
    rows = []
    for template in ("headline", "movie", "qa"):
        for i, graft in enumerate(grafts):
            value = i / 10
            rows.append(
                {
                    "group": group,
                    "template": template,
                    "graft": graft,
                    "n": 6,
                    "acc@5": value,
                    "acc@5_lo": max(value - 0.05, 0.0),
                    "acc@5_hi": value + 0.05,
                    "n_seeds": 1,
                }
            )
    return pl.DataFrame(rows)


def make_run(
    folder: Path, experiment: str = "position", extra: tuple[str, ...] = (), **changes
) -> Path:
    """A finished run folder built by hand: marker, config.json, summary and contrasts
    (and the CSV tables ``extra`` names)."""
    folder.mkdir(parents=True)
    (folder / ".graft-run").write_text("graft\n")
    (folder / "config.json").write_text(json.dumps(run_config(experiment, **changes)))
    summary_frame().write_csv(folder / "summary.csv")
    pl.DataFrame({"template": ["qa"], "graft_a": ["LT"], "graft_b": ["PRE"]}).write_csv(
        folder / "contrasts.csv"
    )
    for stem in extra:
        pl.DataFrame({"x": [1]}).write_csv(folder / f"{stem}.csv")
    return folder


def invoke(*args: str, code: int = 0) -> Result:
    result = CliRunner().invoke(publish, list(args))
    assert result.exit_code == code, f"exit {result.exit_code}, expected {code}:\n{result.output}"
    return result


def test_publish_is_a_command():
    from graft_experiments.cli import COMMANDS

    assert ("publish", "publish") in COMMANDS


def test_publish_copies_the_tables_and_records_provenance(tmp_path):
    run = make_run(tmp_path / "run", extra=("top1_kinds", "top_tokens"))
    out = tmp_path / "results" / "x"
    result = invoke(str(run), "--to", str(out))
    assert "provenance.json (position)" in result.output
    files = sorted(p.name for p in out.iterdir())
    assert files == [
        "position_contrasts.csv",
        "position_summary.csv",
        "position_top_tokens.csv",
        PROVENANCE_FILE,
        "top1_kinds.csv",
    ]
    assert (out / "position_summary.csv").read_bytes() == (run / "summary.csv").read_bytes()
    entry = read_provenance(out)["experiments"]["position"]
    assert entry["command"] == "graft-exp position --model tiny-llama --n 6"
    assert entry["git_commit"].startswith("0123456789ab") and entry["git_dirty"] is False
    assert entry["machine"]["torch_threads"] == 3 and entry["machine"]["cpu"] == "Test CPU"
    assert entry["device"] == "cpu" and entry["packages"]["torch"] == "2.13.0"
    assert entry["created"].startswith("2026-11-01")
    assert [r["time"][:10] for r in entry["resumes"]] == ["2026-11-02"]
    assert entry["seeds"]["finetune_seeds"] == [0, 1] and entry["n"] == 6
    assert entry["model"] == "tiny-llama" and entry["protocol"] == "graft"
    assert entry["grafts"] == ["PRE", "SFT", "LT", "FE"]
    assert entry["finetuned_models"][DONOR]["machine"] == MACHINE
    assert entry["files"]["position_summary.csv"] == "summary.csv"
    assert entry["missing"] == [] and entry["published"]["time"]
    # the layout the paper table reads
    results = read_results(out, "tiny-llama")
    assert set(results.summaries) == {"position"} and set(results.contrasts) == {"position"}


def test_several_experiments_share_a_folder(tmp_path):
    out = tmp_path / "results"
    publish_run(make_run(tmp_path / "pos", extra=("top1_kinds",)), out)
    publish_run(make_run(tmp_path / "nec", "necessity"), out)
    # a second position run: its top1_kinds.csv cannot take the first one's name
    done = publish_run(make_run(tmp_path / "pos2", extra=("top1_kinds",)), out, "position_paper")
    assert "position_paper_top1_kinds.csv" in done.files
    record = read_provenance(out)
    assert set(record["experiments"]) == {"position", "necessity", "position_paper"}
    assert (out / "top1_kinds.csv").is_file() and (out / "necessity_summary.csv").is_file()


def test_publishing_again_replaces_the_entry_and_its_stale_files(tmp_path):
    out = tmp_path / "results"
    (tmp_path / "results").mkdir()
    (out / "position_summary.csv").write_text("old,table\n")  # before provenance existed
    first = publish_run(make_run(tmp_path / "a", extra=("top_tokens",)), out)
    assert first.replaced == ["position_summary.csv"]
    again = publish_run(make_run(tmp_path / "b"), out)
    assert again.removed == ["position_top_tokens.csv"]
    assert not (out / "position_top_tokens.csv").exists()
    assert read_provenance(out)["experiments"]["position"]["source"] == str(tmp_path / "b")


def test_a_lens_run_keeps_lens_summary_and_its_own_tables_go_under_lens_run(tmp_path):
    run = make_run(tmp_path / "lens", "lens", extra=("lens_summary", "lens_top_tokens"))
    done = publish_run(run, tmp_path / "r")
    assert done.files == {
        "lens_run_contrasts.csv": "contrasts.csv",
        "lens_summary.csv": "lens_summary.csv",
        "lens_top_tokens.csv": "lens_top_tokens.csv",
        "lens_run_summary.csv": "summary.csv",
    }


def test_a_combined_component_run_publishes_its_pairs_contrasts(tmp_path):
    root = make_run(tmp_path / "component", "component", pairs=["sft", "reversal"])
    (root / "contrasts.csv").unlink()
    for pair in ("sft", "reversal"):
        (root / pair).mkdir()
        pl.DataFrame({"group": [pair], "graft_a": ["O"], "graft_b": ["FFN"]}).write_csv(
            root / pair / "contrasts.csv"
        )
    done = publish_run(root, tmp_path / "r")
    table = pl.read_csv(tmp_path / "r" / "component_contrasts.csv")
    assert table["group"].to_list() == ["sft", "reversal"]
    assert done.files["component_contrasts.csv"] == "{sft,reversal}/contrasts.csv"
    assert read_provenance(tmp_path / "r")["experiments"]["component"]["pairs"] == [
        "sft",
        "reversal",
    ]


def test_a_patching_sweep_publishes_its_tables_with_its_first_runs_provenance(tmp_path):
    root = tmp_path / "sweep"
    first = make_run(root / "restore-weights", "patching")
    sweep = {
        "experiment": "patching",
        "runs": ["restore-weights"],
        "units": ["LT"],
        "n": 6,
        "command": "graft-exp patching --model tiny-llama --n 6",
        # its tables written by a later call at another commit: the rows' record stays
        "git_commit": "fedcba9876543210fedcba9876543210fedcba98",
        "created": "2099-01-01T00:00:00+00:00",
    }
    (root / ".graft-run").write_text("graft\n")
    (root / "config.json").write_text(json.dumps(sweep))
    with pytest.raises(ResultsError, match="holds no sweep.csv: the run has not finished"):
        publish_run(root, tmp_path / "r")
    for stem in ("sweep", "findings", "contrasts", "references"):
        pl.DataFrame({"x": [1]}).write_csv(root / f"{stem}.csv")
    done = publish_run(root, tmp_path / "r")
    assert set(done.files) == {
        "patching_sweep.csv",
        "patching_findings.csv",
        "patching_contrasts.csv",
        "patching_references.csv",
    }
    assert not done.missing  # the donors' records come from the first run
    entry = read_provenance(tmp_path / "r")["experiments"]["patching"]
    assert entry["command"] == sweep["command"]
    assert (
        entry["finetuned_models"]
        == json.loads((first / "config.json").read_text())["finetuned_models"]
    )
    first_record = json.loads((first / "config.json").read_text())
    assert entry["git_commit"] == first_record["git_commit"]  # the commit that computed rows
    assert entry["created"] == first_record["created"]


def test_an_older_run_is_refused_unless_allowed(tmp_path):
    config = run_config()
    for name in ("command", "machine", "git_dirty"):
        del config[name]
    del config["finetuned_models"][DONOR]["machine"]
    run = make_run(tmp_path / "old")
    (run / "config.json").write_text(json.dumps(config))
    assert missing_fields(config) == [
        "command",
        "git_dirty",
        "machine",
        f"finetuned_models[{DONOR}].machine",
    ]
    result = invoke(str(run), "--to", str(tmp_path / "r"), code=2)
    error = result.output.strip().splitlines()[-1]
    assert "does not record command, git_dirty, machine" in error and "--allow-incomplete" in error
    assert not (tmp_path / "r").exists()
    result = invoke(str(run), "--to", str(tmp_path / "r"), "--allow-incomplete")
    assert "recorded as missing: command" in result.output
    entry = read_provenance(tmp_path / "r")["experiments"]["position"]
    assert entry["missing"][:3] == ["command", "git_dirty", "machine"]
    assert entry["command"] is None and entry["machine"] is None


@pytest.mark.parametrize(
    ("setup", "args", "message"),
    [
        ("plain", [], "is not a run folder graft wrote"),
        ("unfinished", [], "holds no summary.csv: the run has not finished"),
        ("finished", ["--as", "bad/name"], "cannot publish as 'bad/name'"),
    ],
)
def test_bad_inputs_are_one_line_exit_2(tmp_path, setup, args, message):
    run = tmp_path / "run"
    if setup == "plain":
        run.mkdir()
    else:
        make_run(run)
    if setup == "unfinished":
        (run / "summary.csv").unlink()
    result = invoke(str(run), "--to", str(tmp_path / "r"), *args, code=2)
    assert message in result.output and result.output.count("Error:") == 1


def test_a_file_of_another_entry_is_not_taken(tmp_path):
    out = tmp_path / "r"
    write_benchmark_table(out, "position_summary", [{"a": 1}], command="python -m bench")
    with pytest.raises(ResultsError, match="benchmarks position_summary's"):
        publish_run(make_run(tmp_path / "run"), out)


def test_benchmark_table_records_its_command_and_machine(tmp_path):
    out = tmp_path / "r"
    path = write_benchmark_table(
        out,
        "speed",
        [{"shape": "gpt2-xl", "e1": 0.9}],
        "python -m benchmarks.x --n 2",
        settings={"prompts": 2},
    )
    assert pl.read_csv(path).to_dicts() == [{"shape": "gpt2-xl", "e1": 0.9}]
    entry = read_provenance(out)["benchmarks"]["speed"]
    assert entry["command"] == "python -m benchmarks.x --n 2"
    assert entry["machine"]["torch_threads"] == torch.get_num_threads()
    assert entry["device"] == "cpu" and entry["settings"] == {"prompts": 2}
    assert "git_commit" in entry and "torch" in entry["packages"]


@pytest.mark.slow
def test_publish_a_tiny_position_run(tmp_path, monkeypatch):
    from graft_experiments.cli import main

    args = [
        "position",
        *tiny_args(tmp_path / "ws", n=4, n_boot=20, out=tmp_path / "run"),
        "--positions",
        "FE,LT",
    ]
    # the command line the run records is the process's (here pytest's): as from a shell
    monkeypatch.setattr(sys, "argv", ["/venv/bin/graft-exp", *args])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, result.output
    finally:
        torch.set_num_threads(threads)
    out = tmp_path / "results" / "tiny"
    invoke(str(tmp_path / "run"), "--to", str(out))
    assert {p.name for p in out.glob("*.csv")} == {
        "position_summary.csv",
        "position_contrasts.csv",
        "top1_kinds.csv",
    }
    entry = read_provenance(out)["experiments"]["position"]
    assert entry["command"] == shlex.join(["graft-exp", *args])
    assert entry["machine"]["torch_threads"] == 1 and entry["machine"]["cpu"]
    assert "git_commit" in entry and "git_dirty" in entry and entry["missing"] == []
    (donor,) = entry["finetuned_models"].values()
    assert donor["seed"] == 0 and donor["machine"]["cpu"] and donor["versions"]["torch"]
    assert entry["grafts"] == ["PRE", "SFT", "FE", "LT"]


def test_the_per_prompt_rows_are_published_compressed(tmp_path):
    run = make_run(tmp_path / "run")
    rows = pl.DataFrame(
        {
            "graft": ["LT", "PRE"] * 50,
            "prompt_id": [f"p{i // 2}" for i in range(100)],
            "target_logprob": [float(-i) for i in range(100)],
            "hit@5": [i % 3 == 0 for i in range(100)],
        }
    )
    save_table(rows, run / "examples.parquet", "examples", "abc")  # with its marks
    out = tmp_path / "results"
    done = publish_run(run, out)
    assert done.files["position_examples.parquet"] == "examples.parquet"
    published = pl.read_parquet(out / "position_examples.parquet")
    assert published.equals(rows)
    import pyarrow.parquet as pq

    codec = pq.ParquetFile(out / "position_examples.parquet").metadata.row_group(0).column(0)
    assert codec.compression == "ZSTD"
    entry = read_provenance(out)["experiments"]["position"]
    assert entry["files"]["position_examples.parquet"] == "examples.parquet"
    # a run without them publishes its tables alone, and drops the old rows' file
    (run / "examples.parquet").unlink()
    again = publish_run(run, out)
    assert again.removed == ["position_examples.parquet"]
    assert not (out / "position_examples.parquet").exists()


def graft_run(folder: Path, n_boot: int = 50) -> Path:
    """A finished run folder as graft writes it: its config (the provenance fields filled
    in), its examples and its summary with their marks and CSV mirror."""
    from graft.results.folder import RunFolder

    run = RunFolder(folder)
    config = {k: v for k, v in run_config().items() if k not in ("run_key", "resumes")}
    options = {**config["options"], "n_boot": n_boot}
    run.write_config({**config, "options": options}, key=["experiment"])  # as a run's key
    run.append_batch("examples", pl.DataFrame({"graft": ["LT"], "hit@5": [True]}), "0")
    run.finalize("examples")
    run.write_summary(summary_frame())
    return folder


def other_options(run: Path, tmp_path: Path) -> None:
    """summary.parquet copied from a run of the same key but another --n-boot."""
    other = graft_run(tmp_path / "other", n_boot=20)
    (run / "summary.parquet").write_bytes((other / "summary.parquet").read_bytes())


def unmarked(run: Path, tmp_path: Path) -> None:
    """examples.parquet rewritten by another tool (no graft marks)."""
    pl.read_parquet(run / "examples.parquet").write_parquet(run / "examples.parquet")


@pytest.mark.parametrize("damage", [other_options, unmarked], ids=["other-options", "unmarked"])
def test_a_table_whose_marks_differ_is_refused_in_one_line(tmp_path, damage):
    """publish copied the tables without the marks check plot and compare make (#52)."""
    run = graft_run(tmp_path / "run")
    out = tmp_path / "results"
    invoke(str(run), "--to", str(out / "clean"))  # the folder as graft wrote it publishes
    damage(run, tmp_path)
    result = invoke(str(run), "--to", str(out / "x"), code=2)
    (line,) = [line for line in result.output.splitlines() if line.startswith("Error")]
    assert "Usage:" not in result.output and str(run) in line
    assert ("other options" if damage is other_options else "no graft marks") in line
    assert not (out / "x").exists()  # nothing published


def test_tracking_reads_a_summary_checked_against_its_record(tmp_path):
    from graft.errors import DamagedFileError
    from graft.results.tracking import Tracking, log_results

    run = graft_run(tmp_path / "run")
    other_options(run, tmp_path)
    tracking = Tracking("tensorboard", tmp_path / "tracking", "run")
    with pytest.raises(DamagedFileError, match="computed with other options"):
        log_results(tracking, "position", run)
    assert not (tmp_path / "tracking").exists()


def test_a_stale_mirror_it_may_not_rewrite_is_published_from_its_checked_table(
    tmp_path, monkeypatch
):
    """In a run this user may not write, an edited summary.csv stays: publish writes the
    checked table's CSV in its place instead of copying the edit."""
    import graft.results.run_tables
    from graft.errors import StorageError

    run = graft_run(tmp_path / "run")
    clean = (run / "summary.csv").read_text()
    edited = clean.replace(",0.1,", ",0.9,")
    assert edited != clean
    (run / "summary.csv").write_text(edited)

    def read_only(*args, **kwargs):
        raise StorageError("cannot write a table (Permission denied: summary.csv)")

    monkeypatch.setattr(graft.results.run_tables, "write_csv", read_only)
    done = publish_run(run, tmp_path / "results")
    assert (run / "summary.csv").read_text() == edited  # the run as it was
    assert (tmp_path / "results" / "position_summary.csv").read_text() == clean
    assert done.files["position_summary.csv"] == "summary.csv"
