"""``--dry-run`` prints the plan and exits 0 without loading or writing anything; a run whose
plan does not fit the device is refused (exit 2) before anything loads, unless
``--skip-memory-check``."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

import graft.study.planning.run_plan
import graft.study.running.runner
from graft.results.folder import MARKER_FILE, MARKER_NOTE
from graft.study.planning.device_memory import DeviceMemory
from graft_experiments.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")

COMMON = ["--model", "tiny-llama", "--n-facts", "10", "--quiet"]


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _invoke(tmp_path: Path, *args: str, code: int = 0) -> str:
    workdir = tmp_path / "cwd"
    workdir.mkdir(exist_ok=True)
    old = os.getcwd()
    os.chdir(workdir)  # runs/ would be written here
    try:
        result = CliRunner().invoke(main, list(args))
    finally:
        os.chdir(old)
    assert result.exit_code == code, result.output
    return result.output


@pytest.mark.parametrize(
    "command",
    [
        ["position"],
        ["hybrid"],
        ["component", "--pairs", "sft,reversal"],
        ["custom", "--spec", "X=LT:all:o"],
        ["finetune", "--variant", "task"],
    ],
)
def test_dry_run_writes_nothing_and_exits_0(tmp_path, command):
    workspace = tmp_path / "ws"
    sample = [] if command[0] == "finetune" else ["--n", "2"]
    args = [*command, *COMMON, *sample, "--workspace", str(workspace), "--dry-run"]
    out = _invoke(tmp_path, *args)
    assert not workspace.exists() and _tree(tmp_path) == ["cwd"]
    name = command[0]
    assert out.startswith(f"plan of {name} (nothing loaded, nothing written):")
    assert "needs about" in out and ": fits" in out
    assert str(workspace / "finetuned" / "tiny-llama") in out  # where the donor would go
    if name != "finetune":
        assert "rows: " in out and " grafts = " in out and "grafting (base + " in out
    if name == "position":  # 126 pairs, less those whose prompt lacks the graft's span
        assert "prompt-graft pairs skipped: M, FE+M, M+LT on " in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["position", "--positions", "FE,LTT"], "names span(s) LTT that no test prompt has"),
        (["custom", "--spec", "FE=FE:all:all@sfz"], "uses donor(s) ['sfz'] not loaded"),
    ],
)
def test_dry_run_refuses_what_the_run_refuses_before_any_work(tmp_path, args, message):
    """It said "fits" for grafts the run then refused at once: a misspelled span, a donor
    the run does not load."""
    workspace = tmp_path / "ws"
    out = _invoke(
        tmp_path, *args, *COMMON, "--n", "2", "--workspace", str(workspace), "--dry-run", code=2
    )
    assert message in out and "fits" not in out
    assert not workspace.exists()


def test_dry_run_says_what_the_run_does_to_its_folder(tmp_path):
    workspace, out = tmp_path / "ws", tmp_path / "out"
    args = ["position", *COMMON, "--n", "2", "--workspace", str(workspace), "--out", str(out)]
    assert f"run folder: {out} (new)" in _invoke(tmp_path, *args, "--dry-run")
    out.mkdir()  # another experiment's results, as graft marks them
    (out / MARKER_FILE).write_text(MARKER_NOTE)
    (out / "config.json").write_text(json.dumps({"experiment": "lens", "options": {}}))
    before = _tree(tmp_path)
    said = _invoke(tmp_path, *args, "--dry-run")
    assert f"run folder: the run would stop here: {out} holds results of a different" in said
    assert "--overwrite to discard" in said and _tree(tmp_path) == before
    said = _invoke(tmp_path, *args, "--overwrite", "--dry-run")
    assert f"run folder: {out} (overwriting its old results)" in said


@pytest.mark.parametrize("command", [["position", "--n", "2"], ["finetune"]])
def test_the_pair_keeping_shuffle_reaches_the_donors_dataset(tmp_path, command):
    workspace = tmp_path / "ws"
    data = ["--dataset", "real_movies_shuffled", "--shuffle", "pairs"]
    out = _invoke(tmp_path, *command, *COMMON, *data, "--workspace", str(workspace), "--dry-run")
    assert "real_movies_shuffled-pairs-one-n10-seed0" in out  # the donor's dataset
    assert not workspace.exists() and _tree(tmp_path) == ["cwd"]
    refused = _invoke(tmp_path, *command, *COMMON, "--shuffle", "pairs", "--dry-run", code=2)
    assert "--shuffle" in refused and "real_movies_shuffled" in refused


def test_dry_run_on_a_full_device_prints_the_fix_and_still_exits_0(tmp_path, monkeypatch):
    """A device with 1 MiB free: nothing fits, and the plan says what would."""
    full = DeviceMemory("cpu", "CPU", 2**20, 2**30)
    monkeypatch.setattr(graft.study.planning.run_plan, "device_memory", lambda device: full)
    out = _invoke(tmp_path, "position", *COMMON, "--workspace", str(tmp_path / "ws"), "--dry-run")
    assert ": does not fit" in out and "no setting here makes it fit" in out
    assert _tree(tmp_path) == ["cwd"]


def test_a_run_that_does_not_fit_is_refused_before_anything_loads(tmp_path, monkeypatch):
    full = DeviceMemory("cpu", "CPU", 2**20, 2**30)
    monkeypatch.setattr(graft.study.planning.run_plan, "device_memory", lambda device: full)

    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(graft.study.running.runner, "load_model", no_loading)
    ws = str(tmp_path / "ws")
    out = _invoke(tmp_path, "position", *COMMON, "--workspace", ws, code=2)
    assert "this run needs about" in out and "--skip-memory-check" in out
    assert not (tmp_path / "cwd" / "runs").exists()


@pytest.mark.slow
def test_a_finetune_that_does_not_fit_names_its_flags(tmp_path, monkeypatch):
    """gpt2-xl's paper finetune with 16 GiB free: the command's own flags make it fit. (The
    model is a folder holding gpt2-xl's published config: a model that is neither here nor
    downloadable is not refused for memory, its loading says why it cannot run.)"""
    import graft.study.running.donor_job as donor_job
    from graft.models.paper import PAPER_CONFIGS

    sixteen = DeviceMemory("cpu", "CPU", 16 * 2**30, 32 * 2**30)
    # the one place the dry run and the real run read the device's memory
    monkeypatch.setattr(donor_job, "device_memory", lambda device: sixteen)
    model = tmp_path / "gpt2-xl"
    PAPER_CONFIGS["gpt2-xl"]().save_pretrained(model)  # config.json alone: no weights
    args = ["finetune", "--model", str(model), "--preset", "paper", "--n-facts", "10"]
    ws = ["--workspace", str(tmp_path / "ws")]
    out = _invoke(tmp_path, *args, *ws, "--dry-run")
    assert ": does not fit" in out
    assert "to fit the finetune: --weights-dtype bfloat16 with --gradient-checkpointing" in out
    refused = _invoke(tmp_path, *args, *ws, code=2)  # before loading: there are no weights
    assert "--weights-dtype bfloat16" in refused and "--skip-memory-check" in refused
    assert not (tmp_path / "ws" / "finetuned").exists()
    lean = _invoke(
        tmp_path,
        *args,
        *ws,
        "--weights-dtype",
        "bfloat16",
        "--gradient-checkpointing",
        "--dry-run",
    )
    assert ": fits" in lean and "bfloat16" in lean


@pytest.mark.parametrize("command", [["position"], ["finetune"]])
def test_a_gpu_job_is_planned_on_a_machine_without_one(tmp_path, monkeypatch, command):
    """``--device cuda --dry-run`` plans the GPU run where there is no GPU (a login node):
    memory against common GPU sizes, the GPU preset; the run itself is refused (exit 2)."""
    import torch

    from graft.models.paper import PAPER_CONFIGS

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    model = tmp_path / "gpt2-xl"
    PAPER_CONFIGS["gpt2-xl"]().save_pretrained(model)  # config.json alone: no weights
    ws = str(tmp_path / "ws")
    args = [*command, "--model", str(model), "--workspace", ws, "--device", "cuda"]
    out = _invoke(tmp_path, *args, "--dry-run")
    assert "device: cuda (not on this machine): free memory unknown" in out
    assert "paper preset" in out  # a GPU's preset, not the CPU's
    needs = [line for line in out.splitlines() if line.startswith("needs about")]
    assert needs and needs[-1].endswith("on a GPU of 24 GB no, 40 GB yes, 80 GB yes"), out
    refused = _invoke(tmp_path, *args, code=2)
    assert "--device 'cuda': CUDA is not available here" in refused
    assert _tree(tmp_path) == ["cwd", "gpt2-xl", "gpt2-xl/config.json"]


@pytest.mark.parametrize("mode", ["ship", "hosted"])
def test_a_remote_dry_run_plans_the_server_and_names_what_stays_here(tmp_path, monkeypatch, mode):
    """``--remote --dry-run``: the server's forward passes and requests, what they send
    (ship: the grafted donor modules, here the whole donor for SFT; hosted: no weights) and
    what comes back; the donor's finetune and the models loaded named as steps on this
    machine, and no grafting pass here. Nothing is sent, nothing written."""
    import graft.remote.client as client
    from graft.models.tiny import tiny_model
    from graft.remote.payload import estimate_payload_bytes, format_bytes
    from graft.study.specs.grafts import reference

    def no_server(*args, **kwargs):
        raise AssertionError("the plan contacted the server")

    monkeypatch.setattr(client, "send", no_server)
    monkeypatch.setattr(client, "check_reachable", no_server)
    remote = ["--remote", "--ndif-host", "http://ndif.invalid", "--donor-mode", mode]
    args = ["position", *COMMON, "--n", "2", "--workspace", str(tmp_path / "ws"), *remote]
    out = _invoke(tmp_path, *args, "--ndif-model-key", "K", "--dry-run")
    assert _tree(tmp_path) == ["cwd"]
    assert "grafting (base + " not in out and "no grafting pass runs here" in out
    assert "on this machine: 1 finetune (below), then the base and 1 donor loaded" in out
    assert "the 'one' model: finetuned first into" in out  # the local step, as planned today
    assert "on the NDIF server http://ndif.invalid (nothing is sent by this plan):" in out
    assert "model key: K" in out
    rows = re.search(r"^rows: .* = (\d+) rows(?: \(.*\))? in (\d+) batches", out, re.M)
    runs = re.search(r"runs: (\d+) rows in (\d+) forward passes .*, (\d+) requests;", out)
    assert rows and runs and runs.groups() == (*rows.groups(), rows.group(2))
    whole = estimate_payload_bytes(tiny_model("llama"), reference("SFT", "sft").spec)
    if mode == "ship":  # a batch with SFT's rows ships the whole donor, others less
        sent = f"donor modules of the grafted cells, {format_bytes(whole)} a request, "
        assert sent in out
        total = float(out.split(sent)[1].split(" KB in all")[0])
        assert whole / 1024 < total < int(rows.group(2)) * whole / 1024
    else:
        assert "sent (--donor-mode hosted): no weights" in out
    assert "returned: 22 numbers a row" in out
    unkeyed = _invoke(tmp_path, *args, "--dry-run")
    assert "model key: none: the base is 'tiny-llama', not a hub id" in unkeyed
    assert "--ndif-model-key" in unkeyed


def test_a_remote_dry_run_on_a_full_device_names_what_this_machine_holds(tmp_path, monkeypatch):
    full = DeviceMemory("cpu", "CPU", 2**10, 2**30)  # 1 KiB free: not even the tiny models
    monkeypatch.setattr(graft.study.planning.run_plan, "device_memory", lambda device: full)
    remote = ["--remote", "--ndif-model-key", "K"]
    out = _invoke(
        tmp_path, "position", *COMMON, "--workspace", str(tmp_path / "ws"), *remote, "--dry-run"
    )
    assert ": does not fit" in out and "the models a remote run loads here take about" in out
    assert _tree(tmp_path) == ["cwd"]
