"""The command line as one tool: one vocabulary across commands, help layout, early refusals."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import click
import pytest
import torch
from click.testing import CliRunner

import graft.results
import graft.study
import graft_experiments.data
import graft_experiments.finetune
import graft_experiments.plot
import graft_experiments.smoke
from graft.errors import (
    DamagedFileError,
    GraftError,
    HubUnavailable,
    RemoteError,
    ResultsError,
    RunFolderError,
    StorageError,
)
from graft.study import VARIANTS
from graft.study.data.datasets import load_manifest
from graft.study.specs.presets import resolve_config
from graft.study.training.finetune import is_finished
from graft.study.training.workspace import Workspace
from graft_experiments.cli import main
from graft_experiments.common import REMOTE_PARAMS, SHARED_NAMES

CLI_DOC = Path(__file__).resolve().parents[2] / "docs" / "reference" / "cli.md"
#: Options whose help or default depends on the command: the output of this command
#: (--out, --overwrite), the experiment's own position sets and specs (--positions, --spec).
PER_COMMAND = {"--out", "--overwrite", "--positions", "--spec"}
EXPERIMENTS = (
    "position",
    "necessity",
    "component",
    "hybrid",
    "layers",
    "tokens",
    "lens",
    "patching",
    "custom",
)


def invoke(*args: str) -> click.testing.Result:
    return CliRunner().invoke(main, list(args))


def _options(command: click.Command) -> dict[str, click.Option]:
    return {
        p.opts[0]: p
        for p in command.params
        if isinstance(p, click.Option) and p.opts[0] != "--help"
    }


def _commands() -> dict[str, click.Command]:
    return dict(main.commands)


def _signature(option: click.Option) -> tuple:
    return (option.type.to_info_dict(), option.default, option.is_flag, option.multiple)


def test_an_option_means_the_same_in_every_command():
    seen: dict[str, tuple[str, click.Option]] = {}
    for name, command in _commands().items():
        for opt, option in _options(command).items():
            if opt in seen and opt not in PER_COMMAND:
                first, other = seen[opt]
                if name == "data" or first == "data":
                    continue  # data's --dataset names the kind to generate: checked below
                if opt == "--variant" and "finetune" in (name, first):
                    # finetune has no --protocol: its default is "one", the experiments' the
                    # protocol's donor (one, or both under the paper's)
                    assert option.default in (None, "one") and other.default in (None, "one")
                    continue
                assert _signature(option) == _signature(other), f"{opt}: {name} vs {first}"
                if opt != "--variant":  # says whose variant it is
                    assert option.help == other.help, f"{opt}: {name} vs {first}"
            seen.setdefault(opt, (name, option))
    data = _options(_commands()["data"])
    position = _options(_commands()["position"])
    for opt in ("--n-facts", "--data-seed", "--shuffle", "--workspace"):
        assert _signature(data[opt]) == _signature(position[opt]) and data[opt].help == (
            position[opt].help
        )
    assert set(data["--dataset"].type.choices) >= {position["--dataset"].default}


def test_renamed_options_are_gone():
    """Old dialects: one name per meaning."""
    finetune = _options(_commands()["finetune"])
    for old in ("--data-kind", "--max-steps", "--split", "--direction", "--seed", "--train-seed"):
        assert old not in finetune
    assert "--batch-size" not in _options(_commands()["position"])
    assert {"--kind", "--seed"}.isdisjoint(_options(_commands()["data"]))
    assert "--rows-per-forward" in _options(_commands()["position"])
    assert "--finetune-max-steps" in finetune and "--finetune-seed" in finetune


def _readme_table() -> dict[str, list[str]]:
    """option -> [meaning, commands, default/range] from docs/reference/cli.md's vocabulary table."""
    text = CLI_DOC.read_text()
    section = text[text.index("## Command-line vocabulary") :]
    section = section[: section.index("\n## ", 5)]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        match = re.fullmatch(r"`(--[a-z0-9-]+)`", cells[0]) if len(cells) == 4 else None
        if match:
            rows[match.group(1)] = cells[1:]
    return rows


def test_readme_table_lists_every_shared_option_with_its_commands():
    table = _readme_table()
    used: dict[str, set[str]] = {}
    for name, command in _commands().items():
        for opt in _options(command):
            used.setdefault(opt, set()).add(name)
    shared = {opt for opt, commands in used.items() if len(commands) > 1}
    assert shared <= set(table) <= set(used)
    for opt in table:
        commands, listed = used[opt], table[opt][1]
        if commands >= set(EXPERIMENTS):
            assert "experiments" in listed, opt
            commands = commands - set(EXPERIMENTS)
        for name in commands:
            assert f"`{name}`" in listed, f"{opt}: docs/reference/cli.md does not list {name}"


@pytest.mark.parametrize("command", EXPERIMENTS)
def test_help_puts_shared_options_first_and_remote_options_last(command):
    names = [p.name for p in _commands()[command].params]
    shared = [names.index(n) for n in SHARED_NAMES]
    remote = [names.index(n) for n in REMOTE_PARAMS]
    assert shared == sorted(shared) and max(shared) < min(remote)
    assert remote == list(range(len(names) - len(remote), len(names)))
    text = invoke(command, "--help").output
    assert text.index("--model") < text.index("--remote") and "--dtype" in text
    dtype = next(p for p in _commands()[command].params if p.name == "dtype")
    assert dtype.help and "float32" in dtype.help


def test_finetune_help_is_sectioned_and_lists_variants():
    text = " ".join(invoke("finetune", "--help").output.split())
    assert text.index("Model and data:") < text.index("Finetuning:") < text.index("Output:")
    for variant in VARIANTS:
        assert variant in text


@pytest.mark.parametrize(
    "args",
    [
        ["--ndif-host", "http://h:1"],
        ["--ndif-model-key", "k"],
        ["--donor-mode", "hosted"],
        ["--hosted-donor", "sft=/m"],
        ["--max-payload-mb", "64"],
        ["--remote-timeout", "5"],
        ["--remote-retries", "0"],
    ],
)
def test_remote_options_without_remote_are_refused(tmp_path, args):
    result = invoke("position", "--workspace", str(tmp_path / "ws"), *args)
    assert result.exit_code == 2, result.output
    assert f"{args[0]} applies only to remote runs: add --remote" in result.output
    assert not (tmp_path / "ws").exists()


@pytest.mark.parametrize("command", ["position", "finetune"])
@pytest.mark.parametrize(
    ("device", "message"),
    [("banana", "unknown device 'banana'"), ("cuda:99", "cuda")],
)
def test_bad_device_is_refused_before_anything_runs(tmp_path, command, device, message):
    if device.startswith("cuda") and torch.cuda.device_count() > 99:
        pytest.fail("this test assumes fewer than 100 GPUs")
    result = invoke(command, "--device", device, "--workspace", str(tmp_path / "ws"))
    assert result.exit_code == 2, result.output
    assert "--device" in result.output and message in result.output
    assert not (tmp_path / "ws").exists()


@pytest.mark.parametrize(
    ("command", "args", "message"),
    [
        ("finetune", ["--finetune-max-steps", "0"], "1<=x<=1000000"),
        (
            "finetune",
            ["--max-steps", "5"],
            "No such option '--max-steps'. Did you mean '--finetune-max-steps'",
        ),
        ("finetune", ["--n-facts", "0"], "x>=1"),
        ("finetune", ["--lr", "0"], "0<x<=1"),
        ("finetune", ["--batch-size", "0"], f"1<=x<={sys.maxsize}"),
        ("finetune", ["--dataset", "bogus"], "neither a dataset folder nor a data kind"),
        ("finetune", ["--variant", "sideways"], "'sideways' is not one of"),
        ("position", ["--seed", "-1"], "0<=x<=4294967295"),
        ("position", ["--finetune-max-steps", "0"], "1<=x<=1000000"),
        ("position", ["--rows-per-forward", "0"], "x>=1"),
        ("data", ["--data-seed", "-1"], "0<=x<=4294967295"),
        ("data", ["--n-facts", "0"], "x>=1"),
    ],
)
def test_out_of_range_values_exit_2(tmp_path, command, args, message):
    result = invoke(command, *args, "--workspace", str(tmp_path / "ws"))
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert not (tmp_path / "ws").exists()


@pytest.mark.parametrize(
    ("command", "args", "message"),
    [
        ("finetune", ["--lr", "nan"], "'nan' is not a finite number"),
        ("finetune", ["--lr", "inf"], "inf is not in the range 0<x<=1"),
        ("finetune", ["--lr", "1e30"], "1e+30 is not in the range 0<x<=1"),
        ("finetune", ["--weight-decay", "nan"], "'nan' is not a finite number"),
        ("finetune", ["--epochs", "nan"], "'nan' is not a finite number"),
        ("finetune", ["--epochs", "1e9"], "0<x<=1000"),
        ("finetune", ["--finetune-seed", str(2**32)], "0<=x<=4294967295"),
        ("finetune", ["--finetune-max-steps", str(10**12)], "1<=x<=1000000"),
        ("finetune", ["--device", "cpu:1"], "torch runs on one CPU device"),
        ("data", ["--data-seed", "99999999999999999999999"], "0<=x<=4294967295"),
        ("position", ["--data-seed", "99999999999999999999999"], "0<=x<=4294967295"),
        ("position", ["--data-seeds", f"0,{2**32}"], "whole numbers from 0 to 4294967295"),
        ("position", ["--finetune-seeds", f"{2**40}"], "whole numbers from 0 to 4294967295"),
        ("position", ["--seed", f"{2**32}"], "0<=x<=4294967295"),
        ("position", ["--finetune-max-steps", str(10**12)], "1<=x<=1000000"),
        ("position", ["--device", "cpu:1"], "torch runs on one CPU device"),
        ("position", ["--remote", "--remote-timeout", "inf"], "inf is not in the range"),
        ("position", ["--remote", "--remote-timeout", "nan"], "'nan' is not a finite number"),
        ("position", ["--remote", "--max-payload-mb", "inf"], "inf is not in the range"),
        ("position", ["--remote", "--max-payload-mb", "nan"], "'nan' is not a finite number"),
        ("position", ["--remote", "--remote-retries", "1000"], "0<=x<=10"),
    ],
)
def test_non_finite_or_huge_numbers_are_refused_before_anything_runs(
    tmp_path, monkeypatch, command, args, message
):
    """nan passed click's float ranges (and inf those without an upper bound); seeds above
    2**32-1 reached numpy; cpu:1 was taken for cpu."""

    def ran(*args, **kwargs):
        raise AssertionError("the command got past its option checks")

    monkeypatch.setattr(graft_experiments.common, "make_config", ran)
    monkeypatch.setattr(graft.study, "run_donor_job", ran)
    monkeypatch.setattr(graft.study, "generate_dataset", ran)
    result = invoke(command, *args, "--workspace", str(tmp_path / "ws"))
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert not (tmp_path / "ws").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["data", "--n-facts", "100000"], "choose --n-facts between 1 and 912"),
        (["finetune", "--n-facts", "100000"], "choose --n-facts between 1 and 912"),
        (["data", "--facts", "{tmp}/nope.csv"], "pass a readable UTF-8 CSV/JSONL file as --facts"),
    ],
)
def test_library_errors_name_the_flags_the_user_typed(tmp_path, args, message):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    result = invoke(*args, "--workspace", str(tmp_path / "ws"))
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "n_facts" not in result.output and "facts_path" not in result.output


def test_parameter_names_become_flags_only_where_the_command_has_them():
    from graft.errors import ExperimentError, RemoteError
    from graft_experiments.command import in_user_words

    position, custom = main.commands["position"], main.commands["custom"]
    err = RemoteError("max_payload_mb must be positive; or use donor_mode='hosted'", kind="config")
    assert (
        in_user_words(err, position)
        == "--max-payload-mb must be positive; or use --donor-mode hosted"
    )
    err = ExperimentError(
        "templates foo: not in the dataset; pick other templates", param="templates"
    )
    assert in_user_words(err, position).startswith("--templates foo: not in the dataset")
    stored = ExperimentError("options.score_full_name stored true; the model differs")
    assert in_user_words(stored, position) == str(stored)  # a JSON key and prose stay
    missing = ExperimentError("add the missing one to donors", param="donors")
    assert in_user_words(missing, custom) == "add the missing one to --donor"
    assert in_user_words(missing, position) == str(missing)  # position has no --donor
    assert in_user_words(missing) == str(missing)  # outside a command: the library's words
    attribution = main.commands["attribution"]
    several = ExperimentError(
        "dataset takes the prompts from the dataset: drop texts and entity",
        param="dataset",
        params=("texts", "entity"),
    )
    assert (
        in_user_words(several, attribution)
        == "--dataset takes the prompts from the dataset: drop --text and --entity"
    )
    stored_json = ExperimentError('options stored {"multi_cell": true}, now {"multi_cell": false}')
    assert in_user_words(stored_json, attribution) == str(stored_json)


def _no_ndif(handler_base):
    """A web server answering HTTP 200 with a page to everything (no NDIF server)."""

    class Garbage(handler_base):
        def _answer(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "4")
            self.end_headers()
            self.wfile.write(b"page")

        do_GET = do_POST = _answer

        def log_message(self, *args) -> None:
            pass

    return Garbage


@pytest.fixture
def no_ndif_url():
    import http.server
    import threading

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), _no_ndif(http.server.BaseHTTPRequestHandler)
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    thread.join()


def _custom(tmp_path, spec: str, *more: str) -> click.testing.Result:
    """``custom --spec SPEC`` on a tiny-llama donor ``sft`` (1 prompt, 2 facts), ``more`` after."""
    return invoke(
        "custom",
        "--spec",
        spec,
        "--donor",
        "sft=tiny-llama",
        "--model",
        "tiny-llama",
        "--n",
        "1",
        "--n-facts",
        "2",
        "--n-boot",
        "10",
        "--quiet",
        "--workspace",
        str(tmp_path / "ws"),
        "--out",
        str(tmp_path / "run"),
        *more,
    )


def test_a_quiet_run_keeps_the_console_short_and_logs_everything(tmp_path):
    """``--quiet``: the plan line, the table and the warnings on the console, no info lines;
    run.log in the run folder holds the plan, the stages with their times and the summary."""
    result = _custom(tmp_path, "LT:all:o")
    assert result.exit_code == 0, result.output
    assert "data and checks ..." not in result.output and "unverified" not in result.output
    plan = next(line for line in result.output.splitlines() if line.startswith("custom: "))
    log = (tmp_path / "run" / "run.log").read_text(encoding="utf-8")
    assert plan in log and "summary:" in log
    assert re.search(r"graft.log: loading: [\d.]+ s", log)
    assert re.search(r"graft.log: time: .*\(total [\d.]+ s\)", log)


@pytest.mark.parametrize("quiet", [True, False])
def test_quiet_hides_info_lines_from_the_console_not_from_the_run_log(tmp_path, capsys, quiet):
    import logging

    from graft.results.run_log import RunLog, console_logging

    logger = logging.getLogger("graft.study.running.runner")
    hub_client = logging.getLogger("huggingface_hub.utils._http")
    with console_logging(quiet=quiet), RunLog(tmp_path / "run.log").capture() as log:
        log.start()
        logger.info("a stage line")
        logger.warning("a warning")
        # the hub client's "Retrying in 8s [Retry 5/5]" lines: not under --quiet
        assert hub_client.isEnabledFor(logging.WARNING) is not quiet
    assert hub_client.isEnabledFor(logging.WARNING)
    err = capsys.readouterr().err
    assert ("a stage line" in err) is not quiet and "a warning" in err
    text = (tmp_path / "run.log").read_text(encoding="utf-8")
    assert "INFO graft.study.running.runner: a stage line" in text and "a warning" in text


@pytest.mark.parametrize("quiet", [True, False])
def test_a_command_says_a_library_warning_once_and_none_under_quiet(tmp_path, monkeypatch, quiet):
    """transformers' "(65 > 64)" warning was said by each run of a command, under --quiet
    too (#52 item 5)."""
    import io
    import logging

    from graft.results import console_logging
    from graft.results.run_log import RunLog

    stream = io.StringIO()  # transformers' own console: its root logger's handler
    library = logging.getLogger("transformers")
    monkeypatch.setattr(library, "handlers", [logging.StreamHandler(stream)])
    monkeypatch.setattr(library, "propagate", False)
    with console_logging(quiet=quiet):
        for i in range(2):
            with RunLog(tmp_path / f"run{i}" / "run.log").capture() as log:
                log.start()
                logging.getLogger("transformers.tokenization").warning("too long (65 > 64)")
    assert stream.getvalue() == ("" if quiet else "too long (65 > 64)\n")
    assert "(65 > 64)" in (tmp_path / "run1" / "run.log").read_text(encoding="utf-8")


def test_a_library_warning_once_when_the_library_loads_mid_command():
    """transformers imported after the command's console started (a model loaded mid-run)
    added its own console handler, and each of its warnings was said twice, once plain and
    once by graft's console."""
    code = (
        "import logging, sys\n"
        "from graft.results import console_logging\n"
        "assert 'transformers' not in sys.modules\n"
        "with console_logging():\n"
        "    import transformers\n"
        "    logging.getLogger('transformers.tokenization').warning('too long (66 > 64)')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("too long (66 > 64)") == 1, done.stderr


def _remote_custom(tmp_path, *remote: str) -> click.testing.Result:
    return _custom(tmp_path, "LT:all:o", "--remote", *remote)


@pytest.mark.slow
def test_a_failing_server_exits_1_and_a_bad_remote_setting_2(tmp_path, no_ndif_url):
    """Exit 2 means "fix the command line"; a server that fails (here: no NDIF server at
    all) is no usage error: exit 1, and no run folder is left behind."""
    args = ("--ndif-host", no_ndif_url, "--remote-retries", "0")
    failed = _remote_custom(tmp_path, *args, "--ndif-model-key", "k")
    assert failed.exit_code == 1, failed.output
    assert "Usage:" not in failed.output and "HTTP 200: the reply is not an NDIF response" in (
        failed.output
    )
    assert "check that --ndif-host (or env NDIF_HOST) points at an NDIF server" in failed.output
    assert not (tmp_path / "run").exists()
    refused = _remote_custom(tmp_path, *args)  # tiny-llama has no hub id: a key is needed
    assert refused.exit_code == 2, refused.output
    assert "set --ndif-model-key" in refused.output


def test_a_storage_error_is_one_line_without_usage(tmp_path, monkeypatch):
    """A full disk is no usage error: one line, no "Usage: ... Try --help" above it, exit 2
    (docs/reference/errors.md), and nothing is left."""
    import errno

    def full(self, data):
        raise OSError(errno.ENOSPC, "No space left on device", str(self))

    monkeypatch.setattr(Path, "write_bytes", full)
    out = tmp_path / "d"
    result = CliRunner().invoke(main, ["data", "--n-facts", "2", "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)  # click's exit, no traceback
    assert "Usage:" not in result.output and "--help" not in result.output
    assert result.output.strip() == (
        f"Error: cannot write the dataset to {out}: No space left on device; choose another folder"
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("error", "code", "usage"),
    [
        (StorageError("cannot write the run config (No space left on device: c.json)"), 2, False),
        (DamagedFileError("r/summary.parquet does not match the digest of its content"), 2, False),
        (
            RunFolderError("r is not a finished run folder; give the output folder of a run"),
            2,
            False,
        ),
        (RemoteError("the server failed the request", kind="server"), 1, False),
        (RemoteError("the server did not answer in 60 s", kind="timeout"), 1, False),
        (HubUnavailable("openwebtext could not be read from the hub (ConnectionError)"), 1, False),
        (ResultsError("unknown metric 'x'; use one of acc@5"), 2, True),
        (RemoteError("NDIF host 'x' is not a URL", kind="config"), 2, True),
        (GraftError("an error of no kind is bad input"), 2, True),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, GraftError) else None,
)
def test_each_kind_of_graft_error_has_its_exit_code_and_one_line(
    tmp_path, monkeypatch, error, code, usage
):
    """docs/reference/errors.md's mapping: bad input is a usage error (exit 2); storage one line, exit 2;
    a server or library failing one line, exit 1."""

    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(graft.study, "draw_run_figures", fail)
    result = CliRunner().invoke(main, ["plot", str(tmp_path)])
    assert result.exit_code == code, result.output
    assert ("Usage:" in result.output) is usage, result.output
    assert [line for line in result.output.splitlines() if "Error" in line] == [f"Error: {error}"]
    if not usage:
        assert result.output.strip() == f"Error: {error}"


def test_a_figure_that_cannot_be_written_points_to_figures_dir(tmp_path, monkeypatch):
    error = StorageError("cannot write the figure f.png (Read-only file system: f.png)")

    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(graft.study, "draw_run_figures", fail)
    result = CliRunner().invoke(main, ["plot", str(tmp_path)])
    assert result.exit_code == 2 and "Usage:" not in result.output
    assert (
        result.output.strip()
        == f"Error: {error}; or draw the figures elsewhere: --figures-dir FOLDER"
    )


def test_custom_names_the_missing_donor_and_the_fix(tmp_path):
    result = _custom(tmp_path, "LT:all:o@nodonor")
    assert result.exit_code == 2, result.output
    assert "uses donor(s) ['nodonor'] not loaded (loaded: ['sft'])" in result.output
    assert "write a loaded one after '@' in its spec, or add the missing one to --donor" in (
        result.output
    )


@pytest.mark.parametrize("command", ["position", "finetune"])
def test_dataset_folder_with_generation_options_is_refused(tmp_path, command):
    folder = tmp_path / "data"
    assert invoke("data", "--n-facts", "3", "--out", str(folder)).exit_code == 0
    result = invoke(
        command, "--dataset", str(folder), "--n-facts", "3", "--workspace", str(tmp_path / "ws")
    )
    assert result.exit_code == 2, result.output
    assert "--n-facts and --data-seed describe a generated dataset" in result.output


@pytest.mark.parametrize("command", ["position", "finetune"])
def test_a_dataset_folder_refuses_the_shuffle(tmp_path, command):
    folder = tmp_path / "data"
    made = invoke(
        "data", "--dataset", "real_movies_shuffled", "--n-facts", "3", "--out", str(folder)
    )
    assert made.exit_code == 0, made.output
    result = invoke(
        command,
        "--dataset",
        str(folder),
        "--shuffle",
        "relations",
        "--workspace",
        str(tmp_path / "ws"),
    )
    assert result.exit_code == 2, result.output
    assert "keeps the shuffle it was made with" in result.output
    assert not (tmp_path / "ws").exists()


def test_finetune_refuses_a_variant_the_folder_lacks(tmp_path):
    folder = tmp_path / "data"
    assert invoke("data", "--n-facts", "3", "--out", str(folder)).exit_code == 0
    result = invoke(
        "finetune",
        *("--model", "tiny-llama", "--dataset", str(folder), "--variant", "both"),
        *("--workspace", str(tmp_path / "ws")),
    )
    assert result.exit_code == 2, result.output
    assert "has direction 'one', the variant asks for 'both'" in result.output


def test_data_writes_where_experiments_read(tmp_path):
    ws = tmp_path / "ws"
    result = invoke("data", "--n-facts", "3", "--data-seed", "2", "--workspace", str(ws))
    assert result.exit_code == 0, result.output
    written = ws / "datasets" / "fake_movies_real_actors-one-n3-seed2"
    assert str(written) in result.output
    manifest = load_manifest(written)
    read = Workspace(ws).generated_dataset("fake_movies_real_actors", n_facts=3, seed=2)
    assert read == written and load_manifest(read) == manifest  # found, not regenerated


@pytest.mark.slow
def test_finetune_variant_trains_the_donor_experiments_look_for(tmp_path):
    ws = tmp_path / "ws"
    result = invoke(
        "finetune",
        *("--model", "tiny-llama", "--variant", "task", "--n-facts", "5"),
        *("--finetune-max-steps", "1", "--workspace", str(ws), "--quiet"),
    )
    assert result.exit_code == 0, result.output
    cfg = resolve_config("cpu", max_steps=1)
    expected = Workspace(ws).find_or_finetune(
        "tiny-llama", "fake_movies_real_actors", "task", cfg, n_facts=5
    )
    assert is_finished(expected) and expected.parts[-2] == "A"
    assert "trained 1 steps; training loss" in result.output  # the Trainer's metrics, said
    assert sorted(p.name for p in (ws / "finetuned").rglob("eval.json")) == ["eval.json"]


def test_smoke_checks_its_invariants(monkeypatch):
    result = invoke("smoke", "--family", "llama")
    assert result.exit_code == 0, result.output
    assert "ok: grafting nothing gives the base's logits" in result.output
    import graft.core.api.selfcheck as selfcheck

    original = selfcheck.run_grafts
    monkeypatch.setattr(selfcheck, "run_grafts", lambda *a, **k: original(*a, **k) + 1e-3)
    result = invoke("smoke", "--family", "llama")
    assert result.exit_code == 1
    assert "'none' differs from the base by 1.00e-03" in result.output
