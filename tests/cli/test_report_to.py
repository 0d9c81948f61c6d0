"""``--report-to``: a missing tracker package refused in one line before any work; a tiny
position run reporting to TensorBoard (its event files read back with TensorBoard's own
reader) and to W&B offline (its run files read back with W&B's record format)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

from graft.results import tracking
from graft_experiments.cli import main
from tests.cli.tiny_runs import tiny_args

pytestmark = pytest.mark.usefixtures("one_thread")


def _position(tmp_path: Path, tracker: str) -> tuple[Path, str]:
    out = tmp_path / "run"
    args = ["position", *tiny_args(tmp_path / "ws", n_boot=20, templates="headline", out=out)]
    result = CliRunner().invoke(main, [*args, "--report-to", tracker])
    assert result.exit_code == 0, result.output
    return out, result.output


def _sft_acc5(out: Path) -> float:
    summary = pl.read_parquet(out / "summary.parquet")
    row = summary.filter((pl.col("graft") == "SFT") & (pl.col("group") == ""))
    return float(row["acc@5"][0])


def test_a_missing_tracker_package_is_refused_in_one_line_before_any_work(tmp_path, monkeypatch):
    monkeypatch.setitem(tracking.PACKAGES, "tensorboard", "graft_no_such_package")
    args = ["position", *tiny_args(tmp_path / "ws", out=tmp_path / "run")]
    result = CliRunner().invoke(main, [*args, "--report-to", "tensorboard"])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "pip install 'graft-interp[tracking]'" in lines[0], lines
    assert not (tmp_path / "ws").exists() and not (tmp_path / "run").exists()


@pytest.mark.slow
def test_tensorboard_event_files_hold_the_finetune_and_the_summary(tmp_path):
    import tensorboard  # noqa: F401  (the dev extra installs it: an ImportError is a broken install)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, output = _position(tmp_path, "tensorboard")
    runs = out / "tracking" / "tensorboard" / "run"
    assert f"tracking: {out / 'tracking'} (tensorboard)" in output
    recorded = json.loads((out / "config.json").read_text())["tracking"]
    assert recorded == {
        "tracker": "tensorboard",
        "folder": str(out / "tracking"),
        "wandb_mode": None,
        "offline_reason": None,
    }

    def read(folder: Path) -> EventAccumulator:
        events = EventAccumulator(str(folder), size_guidance={"scalars": 0, "images": 0})
        return events.Reload()

    results = read(runs / "results")
    [acc] = results.Scalars("summary/headline/SFT/acc@5")
    assert acc.value == pytest.approx(_sft_acc5(out))
    assert results.Tags()["images"] == ["figures/position_headline_acc5"]
    [finetune] = [p for p in runs.iterdir() if p.name.startswith("finetune-tiny-llama")]
    losses = read(finetune).Scalars("train/loss")
    assert [e.step for e in losses] == [1, 2] and all(e.value > 0 for e in losses)


# ------------------------------------------------------------------- W&B's run files


def _wandb_records(path: Path):
    """The records of a W&B run file (``run-<id>.wandb``): W&B's header, then LevelDB's log
    format (32 KiB blocks of checksummed chunks), each record a ``wandb_internal_pb2.Record``."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", path
    block, header = 32768, 7
    pos, pending = 7, b""
    while pos + header <= len(data):
        left = block - pos % block
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + header])
        if left < header or (kind == 0 and length == 0):  # a block's zero padding
            pos += left
            continue
        chunk = data[pos + header : pos + header + length]
        pos += header + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):  # a whole record, or the last chunk of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record


def _wandb_run(folder: Path) -> tuple[str, dict, dict]:
    """A W&B offline run folder's display name, last summary values and history (key ->
    values in order)."""
    import json

    [file] = folder.glob("run-*.wandb")
    name, summary, history = "", {}, {}
    for record in _wandb_records(file):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            name = record.run.display_name
        elif kind in ("summary", "history"):
            items = record.summary.update if kind == "summary" else record.history.item
            for item in items:
                key = item.key or "/".join(item.nested_key)
                value = json.loads(item.value_json)
                if kind == "summary":
                    summary[key] = value
                else:
                    history.setdefault(key, []).append(value)
    return name, summary, history


@pytest.mark.slow
def test_wandb_runs_offline_into_the_run_folder_with_the_metrics(tmp_path, monkeypatch):
    import wandb  # noqa: F401  (the dev extra installs it: an ImportError is a broken install)

    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL", "WANDB_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))  # no key: offline
    out, output = _position(tmp_path, "wandb")
    assert "W&B offline (no W&B API key" in output  # said, under --quiet too
    recorded = json.loads((out / "config.json").read_text())["tracking"]  # and recorded
    assert (recorded["tracker"], recorded["wandb_mode"]) == ("wandb", "offline")
    assert recorded["offline_reason"].startswith("no W&B API key")
    folders = sorted((out / "tracking" / "wandb").glob("offline-run-*"))
    runs = {name: (summary, history) for name, summary, history in map(_wandb_run, folders)}
    assert set(runs) == {"run/results", next(n for n in runs if n.startswith("run/finetune-"))}
    summary, history = runs["run/results"]
    assert summary["headline/SFT/acc@5"] == pytest.approx(_sft_acc5(out))
    # the figure, as a W&B image (its fields nested under its key)
    assert history["figures/position_headline_acc5/_type"] == ["image-file"]
    results_folder = next(f for f in folders if _wandb_run(f)[0] == "run/results")
    assert list((results_folder / "files" / "media" / "images").glob("figures/*.png"))
    finetune = next(v for n, v in runs.items() if n != "run/results")
    assert len(finetune[1]["train/loss"]) == 2 and finetune[0]["train_loss"] > 0


@pytest.mark.slow
def test_finetune_alone_reports_its_losses_to_tensorboard(tmp_path):
    import tensorboard  # noqa: F401  (the dev extra installs it: an ImportError is a broken install)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ws = tmp_path / "ws"
    args = ["finetune", "--model", "tiny-llama", "--n-facts", "5", "--finetune-max-steps", "2"]
    result = CliRunner().invoke(
        main, [*args, "--workspace", str(ws), "--quiet", "--report-to", "tensorboard"]
    )
    assert result.exit_code == 0, result.output
    assert f"tracking: {ws / 'tracking'} (tensorboard)" in result.output
    [run] = (ws / "tracking" / "tensorboard" / "finetune").iterdir()
    events = EventAccumulator(str(run), size_guidance={"scalars": 0}).Reload()
    assert [e.step for e in events.Scalars("train/loss")] == [1, 2]
    assert not list((ws / "finetuned").rglob("tracking"))  # the donor folder holds its files
