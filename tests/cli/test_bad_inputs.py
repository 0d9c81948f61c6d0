"""Property test: random and mutated inputs never end in a traceback.

Spec strings (mutations of valid specs: deleted, duplicated, swapped or inserted characters
and spec tokens, plus random text) go through ``graft.core.language.spec.parse_spec`` and resolution
on tiny architectures: they parse or raise a ``GraftError``. Command lines (every command, one
option at a time set to an out-of-range number, an empty string, unicode, an odd path, a bad
model name or device, a mutated spec) go through click's ``CliRunner`` on ``tiny-llama``
with ``--n 1``: exit code 0 or 2 and no exception but ``SystemExit``.

Deterministic (``derandomize=True``) and bounded (see ``N_SPECS``, ``N_COMMANDS``); the
number of inputs tried is printed at the end of the run.
"""

from __future__ import annotations

import contextlib
import json
import traceback
from collections import Counter
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graft.core.families.arch import architecture_of
from graft.core.language.spec import parse_spec
from graft.errors import GraftError
from graft.models.tiny import tiny_model
from graft_experiments.cli import main
from graft_experiments.common import REMOTE_PARAMS

N_SPECS = 400
N_COMMANDS = 80
TRIED: Counter = Counter()  # inputs tried, per kind
OUTCOMES: Counter = Counter()  # what became of them (so the test is seen not to be vacuous)

VALID_SPECS = [
    "none",
    "FE:all:all",
    "LT:all:all",
    "FE+LT:all:attn",
    "(FE+LT)^C:h2:o,ffn",
    "ALL:q4:q,k@task; LT:0-2:ffn_up",
    "LT:-1:block; head=donor",
    "M:all:embed; head=paper",
    "FE^C:1,3:v",
    "a=FE+R:all:all",
]
TOKENS = [
    ":",
    ";",
    "@",
    "+",
    "^C",
    "(",
    ")",
    ",",
    "-",
    "=",
    " ",
    "all",
    "h2",
    "q4",
    "-1",
    "999",
    "0-2",
    "3-1",
    "attn",
    "ffn",
    "q",
    "o",
    "block",
    "embed",
    "head=",
    "donor",
    "paper",
    "base",
    "FE",
    "LT",
    "M",
    "R",
    "ALL",
    "none",
    "sft",
    "task",
    "é",
    "\u200b",
    "\t",
    "Ω",
    "\\",
    "{}",
]


@st.composite
def mutated_specs(draw) -> str:
    """A valid spec with 1-3 character/token edits."""
    text = draw(st.sampled_from(VALID_SPECS))
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["delete", "duplicate", "swap", "insert", "replace"]))
        i = draw(st.integers(0, max(0, len(text) - 1)))
        if op == "delete":
            text = text[:i] + text[i + 1 :]
        elif op == "duplicate":
            text = text[: i + 1] + text[i:]
        elif op == "swap" and len(text) > 1:
            j = min(i + 1, len(text) - 1)
            text = text[:i] + text[j] + text[i] + text[j + 1 :]
        elif op == "insert":
            text = text[:i] + draw(st.sampled_from(TOKENS)) + text[i:]
        else:
            text = text[:i] + draw(st.sampled_from(TOKENS)) + text[i + 2 :]
    return text


SPEC_STRINGS = st.one_of(
    st.sampled_from(VALID_SPECS),  # unedited: the "resolved" outcome never rests on edits alone
    mutated_specs(),
    st.lists(st.sampled_from(TOKENS), max_size=8).map("".join),
    st.text(max_size=20),
)

# ------------------------------------------------------------------------------- specs


@pytest.fixture(scope="module", autouse=True)
def _report_counts(request):
    yield
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    line = (
        f"test_bad_inputs: {sum(TRIED.values())} inputs tried "
        f"({', '.join(f'{k}: {v}' for k, v in sorted(TRIED.items()))}); outcomes: "
        f"{', '.join(f'{k}: {v}' for k, v in sorted(OUTCOMES.items()))}"
    )
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():
            reporter.write_line(line)


ARCHS = {family: architecture_of(tiny_model(family)) for family in ("llama", "gpt2")}
SPANS = {"FE": [1, 2], "M": [3, 4, 5], "R": [6]}


@settings(
    max_examples=N_SPECS,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(text=SPEC_STRINGS, length=st.integers(1, 10), family=st.sampled_from(sorted(ARCHS)))
def spec_strings_parse_or_raise_graft_error(text: str, length: int, family: str) -> None:
    TRIED["spec strings"] += 1
    try:
        spec = parse_spec(text)
    except GraftError:
        OUTCOMES["spec refused"] += 1
        return
    OUTCOMES["spec parsed"] += 1
    spans = {k: [p for p in v if p < length] for k, v in SPANS.items()}
    with contextlib.suppress(GraftError):
        spec.resolve(ARCHS[family], length, {k: v for k, v in spans.items() if v})
        OUTCOMES["spec resolved"] += 1


@pytest.mark.slow
def test_spec_strings_parse_or_raise_graft_error() -> None:
    """Every generated spec string parses (and resolves) or raises a GraftError; the draw is
    seen not to be vacuous: each outcome happens at least 5 times (the draw is derandomized:
    see the counts the module prints)."""
    before = Counter(OUTCOMES)
    spec_strings_parse_or_raise_graft_error()
    got = OUTCOMES - before
    assert sum(got.values()) >= N_SPECS
    for outcome in ("spec refused", "spec parsed", "spec resolved"):
        assert got[outcome] >= 5, (outcome, dict(got))


# ------------------------------------------------------------------------ command lines

INTS = ["-1", "0", "1", "3", "65", "1000000", str(2**63), "1.5", "nan", "", "x", "٣", "1e3"]
STRINGS = ["", " ", "é", "\u200b", "x" * 300, "/proc/x", "/dev/null", "../..", "a,b", "-"]
MODELS = [
    "",
    "tiny-",
    "TINY-LLAMA",
    "tiny-llama ",
    "tiny-gpt-neox",
    "tiny-gpt2",
    "gpt2/",
    "/",
    "a/b/c",
    "owner/name",
    "no-such-model",
    "./missing",
    "/proc",
    "é",
]
DEVICES = ["banana", "cuda", "cuda:1", "cuda:x", "", "meta", "mps", "CPU", "cpu:0", "cpu"]
DONORS = ["sft=bogus", "sft=", "=one", "sft=one=two", "sft=tiny-llama", "x=tiny-llama", "sft=/proc"]
SKIP = {"help", *REMOTE_PARAMS}  # remote: slow by nature


def _command(name: str) -> click.Command:
    return main.commands[name]


def _flag(command: click.Command, param: str) -> str | None:
    """The option string of parameter ``param`` (robust to renamed flags), or None."""
    for p in command.params:
        if p.name == param and isinstance(p, click.Option):
            return p.opts[0]
    return None


def _baseline(name: str, tmp: Path) -> list[str]:
    """Valid options that keep a run tiny (1 prompt per template, 1-step donor finetunes)."""
    command = _command(name)
    values = {
        "model": "tiny-llama",
        "n": "1",
        "n_facts": "2",
        "finetune_max_steps": "1",
        "max_steps": "1",  # finetune's --finetune-max-steps (FinetuneConfig.max_steps)
        "n_boot": "10",
        "workspace": str(tmp / "ws"),
        "quiet": None,
    }
    args = []
    for param, value in values.items():
        flag = _flag(command, param)
        if flag is not None:
            args += [flag] if value is None else [flag, value]
    if name == "custom":
        args += ["--donor", "sft=tiny-llama"]
    return args


# Valid but costly values stay out of the pools: huge step or example counts just run long,
# and a huge --n-boot exhausts memory (reported; it needs an upper bound).
COSTLY = {"finetune_max_steps", "n_boot", "epochs", "max_steps", "n_facts", "n"}


def _values_for(draw, param: click.Parameter) -> list[str] | None:
    """A bad (or occasionally good) value for ``param``, as command-line words."""
    if param.name == "model" or param.name == "base_arg":
        return [draw(st.sampled_from(MODELS))]
    if param.name == "device":
        return [draw(st.sampled_from(DEVICES))]
    if param.name == "specs":
        return [draw(SPEC_STRINGS)]
    if param.name == "donor_args":
        return [draw(st.sampled_from(DONORS))]
    if isinstance(param, click.Option) and param.is_flag:
        return []
    if isinstance(param.type, click.Choice):
        choices = [str(c) for c in param.type.choices]
        return [draw(st.sampled_from([*choices, "", "BANANA", choices[0].upper(), "é"]))]
    if isinstance(param.type, click.types._NumberParamTypeBase):
        cheap = [v for v in INTS if param.name not in COSTLY or v not in ("1000000", str(2**63))]
        return [draw(st.sampled_from(cheap))]
    return [draw(st.sampled_from([*STRINGS, *INTS[:3]]))]


# a group (study) has no options of its own: its sub-commands take a file (tests/cli/test_study.py)
COMMANDS = sorted(
    n for n, c in main.commands.items() if n != "smoke" and not isinstance(c, click.Group)
)


@st.composite
def command_lines(draw) -> tuple[str, str, list[str]]:
    """(command, option, words): the baseline plus one fuzzed option."""
    name = draw(st.sampled_from(COMMANDS))
    command = _command(name)
    params = [p for p in command.params if p.name not in SKIP]
    param = draw(st.sampled_from(params))
    values = _values_for(draw, param)
    words = ([param.opts[0]] if isinstance(param, click.Option) else []) + values
    return name, param.name or "", words


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("bad_inputs")


@settings(
    max_examples=N_COMMANDS,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(case=command_lines())
def command_lines_never_traceback(case, scratch: Path, monkeypatch) -> None:
    name, param, words = case
    TRIED[f"command lines ({name})"] += 1
    monkeypatch.chdir(scratch)
    run = scratch / f"run{TRIED.total()}"
    args = [name, *_baseline(name, scratch), *words]
    if _flag(_command(name), "out") and param != "out":
        args += [_flag(_command(name), "out"), str(run)]
    if name == "plot" and param != "run_folder":
        args += [str(run)]
    result = CliRunner().invoke(main, args)
    OUTCOMES[f"exit {result.exit_code}"] += 1
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        args,
        "".join(traceback.format_exception(*result.exc_info)),
    )
    assert result.exit_code in (0, 2), (args, result.output[-2000:])


@pytest.mark.slow
def test_command_lines_never_traceback(scratch: Path, monkeypatch) -> None:
    """Every generated command line exits 0 or 2 with no traceback; both exits happen (to at
    least 5% of the lines), so the draw reaches past the option parser and is refused too."""
    before = Counter(OUTCOMES)
    command_lines_never_traceback(scratch=scratch, monkeypatch=monkeypatch)
    got = OUTCOMES - before
    assert got["exit 0"] + got["exit 2"] >= N_COMMANDS, dict(got)
    assert got["exit 0"] >= N_COMMANDS // 20 and got["exit 2"] >= N_COMMANDS // 20, dict(got)


# ------------------------------------------------------------------ named cases, end to end


@pytest.fixture(scope="module")
def long_title_dataset(scratch: Path) -> Path:
    facts = scratch / "long.csv"
    title = "The " + "Very " * 29 + "Long Night"  # 159 characters: > tiny-gpt2's 64 positions
    facts.write_text(
        "movie_title,first_actor,second_actor\n"
        f"{title},Ana Smith,John Ponce\nRed Dog,Mia Lopez,Carl Berg\n"
    )
    result = CliRunner().invoke(main, ["data", "--facts", str(facts), "--out", str(scratch / "d")])
    assert result.exit_code == 0, result.output
    return scratch / "d"


def _custom(dataset: Path, out: Path) -> list[str]:
    return [
        "custom",
        "--model",
        "tiny-gpt2",
        "--dataset",
        str(dataset),
        "--spec",
        "LT:all:all",
        "--donor",
        "sft=tiny-gpt2",
        "--out",
        str(out),
        "--quiet",
        "--n-boot",
        "10",
    ]


@pytest.mark.slow
def test_prompt_longer_than_the_model_is_dropped_not_a_crash(long_title_dataset, scratch):
    import json

    out = scratch / "long_run"
    result = CliRunner().invoke(main, _custom(long_title_dataset, out))
    assert result.exit_code == 0 and result.exception is None, result.output
    drops = json.loads((out / "drops.json").read_text())["per_template"]
    assert drops["movie"] == {"too_long": 1} and drops["headline"] == {}


def test_truncated_jsonl_line_is_a_one_line_error_on_the_cli(long_title_dataset, scratch):
    import shutil

    broken = scratch / "broken"
    shutil.copytree(long_title_dataset, broken)
    lines = (broken / "test_prompts.jsonl").read_text().splitlines()
    lines[2] = lines[2][:30]
    (broken / "test_prompts.jsonl").write_text("\n".join(lines) + "\n")
    # a generated dataset records its files' hashes: the damage is caught before parsing
    result = CliRunner().invoke(main, _custom(broken, scratch / "broken_run"))
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.exc_info
    assert "test_prompts.jsonl does not match the sha256 in manifest.json" in result.output
    # a hand-made folder (no hashes) is parsed, and the bad line is named
    manifest = json.loads((broken / "manifest.json").read_text())
    manifest.pop("files")
    (broken / "manifest.json").write_text(json.dumps(manifest))
    result = CliRunner().invoke(main, _custom(broken, scratch / "broken_run2"))
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.exc_info
    assert "test_prompts.jsonl, line 3: not valid JSON" in result.output


def test_empty_dataset_folder_is_a_one_line_error_on_the_cli(scratch):
    empty = scratch / "empty_dataset"
    empty.mkdir()
    result = CliRunner().invoke(main, _custom(empty, scratch / "empty_run"))
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.exc_info
    assert "is empty; make one with" in result.output
