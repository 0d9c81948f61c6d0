"""One source for options: the command line is the config dataclasses' fields.

Every field of ExperimentConfig, FinetuneConfig, RemoteConfig and AttributionRequest has a
flag in ``graft_experiments.options`` or a stated reason to have none; every flag names a
field (or is one of the few command-line-only flags); the commands take exactly those flags,
with the field's default, and hand the values on to the dataclass unchanged.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from graft.remote.config import RemoteConfig
from graft.study.running.runner import ExperimentConfig
from graft.study.specs.attribution import AttributionRequest
from graft.study.specs.config import DatasetConfig
from graft.study.specs.presets import FinetuneConfig
from graft_experiments.cli import COMMANDS, main
from graft_experiments.common import (
    REMOTE_PARAMS,
    SHARED_NAMES,
    GraftCommand,
    quiet_option,
    remote_options,
)
from graft_experiments.options import (
    CLI_ONLY,
    FIELD_DEFAULT,
    FINETUNE_FLAGS,
    FLAGS,
    REMOTE_FLAGS,
    field_default,
)
from tests.cli.test_cli import EXPERIMENTS

ROOT = Path(__file__).resolve().parents[2]

#: config class -> {field without a flag: why} (a new field gets a flag in
#: graft_experiments.options, or a line here).
NOT_ON_CLI: dict[type, dict[str, str]] = {
    AttributionRequest: {},
    DatasetConfig: {
        "relations": "library only (the paper's relation templates)",
        "protocol": "set by an experiment's --protocol (graft-exp data: library only so far)",
    },
    ExperimentConfig: {
        "experiment": "the command's name",
        "split": "set by the command (hybrid needs fact sets A and B)",
        "directions": "set by the command (custom: its own --directions)",
        "remote": "built from the remote options (REMOTE_FLAGS)",
        "progress": "the inverse of --quiet",
    },
    FinetuneConfig: {
        "name": "--preset",
        "warmup_steps": "preset only",
        "val_fraction": "preset only",
        "fp16_on_cuda": "preset only",
        "generic_ratio": "preset only",
        "generic_corpus_id": "fixed from --generic-corpus (graft.study.data.generic_corpus.settle)",
        "max_length": "preset only",
    },
    RemoteConfig: {
        "api_key": "env NDIF_API_KEY only (keeps keys out of shell history)",
        "retry_wait_s": "library only",
        "rows_per_request": "library only",
        "compress": "library only",
        "verbose": "library only",
    },
}


@pytest.mark.parametrize("config", list(FLAGS), ids=lambda c: c.__name__)
def test_every_field_has_a_flag_or_a_reason_and_every_flag_a_field(config):
    fields = {f.name for f in dataclasses.fields(config)}
    flagged, excused = set(FLAGS[config]), set(NOT_ON_CLI[config])
    assert not flagged & excused, "a field is both on the command line and excused"
    assert flagged <= fields, f"flags without a field: {flagged - fields}"
    assert fields <= flagged | excused, f"fields without a flag: {fields - flagged - excused}"
    assert all(reason.strip() for reason in NOT_ON_CLI[config].values())


def _option(command: click.Command, name: str) -> click.Option:
    return next(p for p in command.params if p.name == name)


@pytest.mark.parametrize("command", EXPERIMENTS)
def test_experiment_commands_take_the_table_flags_with_the_fields_defaults(command):
    cmd = main.commands[command]
    names = [p.name for p in cmd.params if isinstance(p, click.Option)]
    shared = set(names) & ({*FLAGS[ExperimentConfig], *CLI_ONLY} | set(REMOTE_PARAMS))
    assert shared == set(SHARED_NAMES) | set(REMOTE_PARAMS)
    for config, table in (
        (ExperimentConfig, FLAGS[ExperimentConfig]),
        (RemoteConfig, REMOTE_FLAGS),
    ):
        for name, flag in table.items():
            option = _option(cmd, name)
            assert option.opts[0] == flag.decl and option.help == flag.help
            if flag.default is FIELD_DEFAULT:
                assert option.default == field_default(config, name), name
    assert set(SHARED_NAMES) - set(FLAGS[ExperimentConfig]) == set(CLI_ONLY)


def test_finetune_overrides_reach_the_finetune_config(tmp_path, monkeypatch):
    seen = {}

    def fake_finetune(model, folder, out, cfg, **kwargs):
        seen["cfg"] = cfg
        return out

    import graft.study.running.donor_job as donor_job

    monkeypatch.setattr(donor_job, "finetune", fake_finetune)
    cmd = main.commands["finetune"]
    assert set(FINETUNE_FLAGS) <= {p.name for p in cmd.params}
    args = ["--model", "tiny-llama", "--n-facts", "3", "--workspace", str(tmp_path / "ws")]
    args += ["--lr", "0.5", "--epochs", "2", "--batch-size", "3", "--weight-decay", "0.25"]
    args += ["--finetune-seed", "7", "--finetune-max-steps", "4", "--preset", "gentle"]
    (tmp_path / "corpus.txt").write_text("A generic passage.\n")
    args += ["--generic-corpus", str(tmp_path / "corpus.txt")]
    result = CliRunner().invoke(main, ["finetune", *args])
    assert result.exit_code == 0, result.output
    cfg: FinetuneConfig = seen["cfg"]
    assert (cfg.learning_rate, cfg.epochs, cfg.batch_size, cfg.weight_decay) == (0.5, 2, 3, 0.25)
    assert (cfg.seed, cfg.max_steps, cfg.name) == (7, 4, "gentle")
    assert cfg.generic_corpus == str((tmp_path / "corpus.txt").resolve())
    assert cfg.generic_corpus_id is not None
    assert cfg.generic_corpus_id.startswith("file:corpus.txt;sha256=")


def test_remote_options_give_the_command_a_config():
    seen = {}

    @click.command()
    @remote_options
    def cmd(remote):
        seen["cfg"] = remote

    runner = CliRunner()
    assert runner.invoke(cmd, []).exit_code == 0
    assert seen["cfg"] is None  # local: no remote config at all
    args = ["--remote", "--ndif-host", "http://h:1", "--donor-mode", "hosted"]
    args += ["--hosted-donor", "sft=/m/sft", "--max-payload-mb", "64", "--remote-retries", "0"]
    result = runner.invoke(cmd, args)
    assert result.exit_code == 0, result.output
    cfg = seen["cfg"]
    assert (cfg.mode, cfg.host, cfg.donor_mode, cfg.max_payload_mb, cfg.retries) == (
        "remote",
        "http://h:1",
        "hosted",
        64.0,
        0,
    )
    assert cfg.hosted_donors == {"sft": "/m/sft"}
    assert cfg.timeout_s == field_default(RemoteConfig, "timeout_s")
    bad = runner.invoke(cmd, ["--remote", "--hosted-donor", "sft"])
    assert bad.exit_code == 2 and "write NAME=SOURCE" in bad.output


@pytest.mark.slow
def test_the_library_does_not_depend_on_click():
    code = (
        "import sys, graft.remote.config, graft.study.running.runner; print('click' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


# ------------------------------------------------------------------------------ logging


@click.command(cls=GraftCommand)
@quiet_option()
def _chatty(quiet):
    logging.getLogger("graft.study.something").info("library info")
    logging.getLogger("graft.study.something").warning("library warning")


@pytest.mark.parametrize(("args", "shown"), [([], True), (["--quiet"], False)])
def test_library_messages_go_to_stderr_and_quiet_keeps_warnings(args, shown):
    logger = logging.getLogger("graft")
    before = (logger.level, list(logger.handlers))
    result = CliRunner().invoke(_chatty, args)
    assert result.exit_code == 0, result.output
    assert result.stdout == ""
    assert ("library info" in result.stderr) is shown
    assert "library warning" in result.stderr
    # the command leaves the library's logging as it found it (notebooks, other tests)
    assert (logger.level, list(logger.handlers)) == before


# --------------------------------------------------------------- experiment files


COMMAND_FILES = sorted({module for module, _ in COMMANDS} | {"cli"})


@pytest.mark.slow
@pytest.mark.parametrize("module", COMMAND_FILES)
def test_every_experiment_file_runs_on_its_own(module):
    path = ROOT / "experiments" / f"{module}.py"
    result = subprocess.run(
        [sys.executable, str(path), "--help"], capture_output=True, text=True, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith(f"Usage: {module}.py")


def test_every_command_file_is_registered():
    files = {p.stem for p in (ROOT / "experiments").glob("*.py")}
    helpers = {
        "__init__",
        "cli",
        "click_types",
        "command",
        "command_flags",
        "common",
        "options",
        "shared",
    }
    assert files - {module for module, _ in COMMANDS} == helpers


# ----------------------------------------------------------------- ranges, one source


def _library_config(config: type, **values):
    """``config`` built from its defaults plus ``values`` (FinetuneConfig: the cpu preset)."""
    if config is FinetuneConfig:
        from graft.study.specs.presets import CPU

        return dataclasses.replace(CPU, **values)
    if config is ExperimentConfig:
        return ExperimentConfig(experiment="t", **values)
    return config(**values)


BAD_NUMBERS = [
    (FinetuneConfig, "learning_rate", float("nan"), "must be a finite number"),
    (FinetuneConfig, "learning_rate", float("inf"), "must be a finite number"),
    (FinetuneConfig, "learning_rate", 1e30, "must be at most 1, got 1e+30"),
    (FinetuneConfig, "weight_decay", float("nan"), "must be a finite number"),
    (FinetuneConfig, "epochs", float("nan"), "must be a finite number"),
    (FinetuneConfig, "epochs", 0, "must be positive, got 0"),
    (FinetuneConfig, "max_steps", 10**12, "must be at most 1000000"),
    (FinetuneConfig, "seed", 2**32, "must be at most 4294967295"),
    (FinetuneConfig, "val_fraction", 1.0, "must be below 1"),
    (ExperimentConfig, "data_seed", 99999999999999999999999, "must be at most 4294967295"),
    (ExperimentConfig, "seed", -1, "must be >= 0"),
    (ExperimentConfig, "finetune_max_steps", 10**12, "must be at most 1000000"),
    (ExperimentConfig, "n_boot", 10**9, "must be at most 100000"),
    (ExperimentConfig, "n", 0, "must be at least 1"),
    (ExperimentConfig, "finetune_seeds", (0, 2**32), "from 0 to 4294967295"),
    (RemoteConfig, "timeout_s", float("inf"), "must be a finite number"),
    (RemoteConfig, "max_payload_mb", float("inf"), "must be a finite number"),
]


@pytest.mark.parametrize(
    ("config", "field", "value", "message"),
    BAD_NUMBERS,
    ids=[f"{c.__name__}.{f}={v!r}" for c, f, v, _ in BAD_NUMBERS],
)
def test_the_library_refuses_what_the_command_line_refuses(config, field, value, message):
    """API users get the command line's ranges: a one-line GraftError naming the field."""
    from graft.errors import GraftError

    with pytest.raises(GraftError, match=re.escape(message)) as info:
        _library_config(config, **{field: value})
    assert info.value.param == field and str(info.value).startswith(field)
    assert "\n" not in str(info.value)


def test_control_data_seeds_stay_seeds():
    from graft.errors import ExperimentError
    from graft.ranges import MAX_SEED
    from graft.study.specs.config import CONTROL_DATA_SEED_OFFSET

    highest = MAX_SEED - CONTROL_DATA_SEED_OFFSET
    assert ExperimentConfig(experiment="t", data_seed=highest, control=True).control
    with pytest.raises(ExperimentError, match=f"data seeds must be at most {highest}"):
        ExperimentConfig(experiment="t", data_seed=highest + 1, control=True)


@pytest.mark.parametrize(
    ("config", "table"),
    [(FinetuneConfig, FINETUNE_FLAGS), (RemoteConfig, REMOTE_FLAGS)],
    ids=["finetune", "remote"],
)
def test_every_float_option_refuses_nan_and_inf(config, table):
    floats = [flag for flag in table.values() if isinstance(flag.type, click.FloatRange)]
    assert floats, "no float option found: the test would check nothing"
    for flag in floats:
        for bad in ("nan", "inf", "-inf"):
            with pytest.raises(click.BadParameter):
                flag.type.convert(bad, None, None)
