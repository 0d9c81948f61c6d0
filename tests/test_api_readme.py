"""The documentation's code runs as written: the README's "Python API" example and
docs/how-to/your-experiment.md (adapting an experiment).

Both blocks are taken from the documentation itself, so it cannot drift from the code.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
import torch
from click.testing import CliRunner

import graft

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
EXPERIMENTS_DOC = ROOT / "docs" / "how-to" / "your-experiment.md"
#: The activation-patching examples of TransformerLens' and nnsight's docs take about 15
#: lines (a hook function, its registration per layer, the patched run); graft's must be
#: shorter.
LONGEST_API_EXAMPLE = 12
#: The issue's bound on the adapted experiment.
LONGEST_ADAPTED_EXPERIMENT = 30


def readme_block(section: str, path: Path = README) -> str:
    """The first ```python block of section ``section`` (a ``## `` heading, up to the next
    one or the end) of ``path``; with ``section`` empty, of the page's text before its first
    ``## `` heading."""
    text = "\n" + path.read_text()
    start = text.index(f"\n## {section}\n") if section else 0
    end = text.find("\n## ", start + 1) % (len(text) + 1)  # the next section or the end
    match = re.search(r"```python\n(.*?)```", text[start:end], re.DOTALL)
    assert match, f"{path.name} section {section!r} has no python block"
    return match.group(1)


def _import_lines(code: str) -> list[str]:
    return [line for line in code.splitlines() if re.match(r"(import|from) \S+", line)]


def test_python_api_example_needs_one_import_and_is_short():
    code = readme_block("Python API")
    assert _import_lines(code) == ["import graft"]
    assert len([line for line in code.splitlines() if line.strip()]) <= LONGEST_API_EXAMPLE


@pytest.mark.slow
def test_python_api_example_runs_and_prints_each_specs_target_metrics(capsys):
    namespace: dict = {}
    exec(compile(readme_block("Python API"), "README.md:Python API", "exec"), namespace)
    logits, specs, tok = namespace["logits"], namespace["specs"], namespace["tok"]
    assert logits.ndim == 2 and len(logits) == len(specs)
    assert namespace["scores"]["graft"].to_list() == specs
    printed = capsys.readouterr().out
    assert "target_rank" in printed and "FE+LT:all:all" in printed
    # the API's numbers are the engine's: spec "none" is the base model's own forward pass
    ids = tok("Keanu Reeves starred in a movie with", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        plain = namespace["base"](ids).logits[0, -1]
    torch.testing.assert_close(logits[0], plain.float(), atol=1e-5, rtol=0)


def test_target_metrics_are_example_metrics_of_the_target():
    base, donor = graft.tiny_pair("gpt2")
    tok = graft.tiny_tokenizer()
    logits = graft.graft_texts(base, donor, tok, ["ab c", "xyz"], ["none", "LT:all:all"])
    table = graft.target_metrics(logits, tok, [5, 6, 7, 8])
    expected = graft.example_metrics(logits.reshape(4, -1), [5, 6, 7, 8], tok)
    assert table.equals(expected)
    by_text = graft.target_metrics(logits[0, 1], tok, " c")
    assert by_text["target_id"].to_list() == tok(" c", add_special_tokens=False)["input_ids"][:1]


@pytest.mark.parametrize(
    ("target", "labels", "message"),
    [([1, 2, 3], None, "3 targets for 2 rows"), (1, ["a"], "1 labels for 2 rows"), ("", None, "")],
)
def test_target_metrics_refuse_mismatches(target, labels, message):
    tok = graft.tiny_tokenizer()
    with pytest.raises(graft.GraftError, match=message or "tokenizes to nothing"):
        graft.target_metrics(torch.zeros(2, 96), tok, target, labels=labels)


def test_import_graft_imports_no_library_module():
    code = (
        "import sys, graft; print(sorted(m for m in sys.modules if m.startswith('graft.')),"
        " 'torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    # only the few lines that make the lazy names: no library module, no torch
    assert out.stdout.strip() == "['graft.lazy'] False"
    assert set(graft.__all__) == {*graft._LAZY_NAMES, "target_metrics"} and set(
        graft.__all__
    ) <= set(dir(graft))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        graft.nope  # noqa: B018


# ------------------------------------------------------------------ adapting an experiment


def _load_command(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


@pytest.mark.slow
def test_adapted_experiment_runs_with_its_own_grafts_and_metric(tmp_path, monkeypatch):
    code = readme_block("", EXPERIMENTS_DOC)
    assert len(code.splitlines()) < LONGEST_ADAPTED_EXPERIMENT
    path = tmp_path / "attn_only.py"
    path.write_text(code)
    monkeypatch.chdir(tmp_path)
    command = _load_command(path, "attn_only")
    args = ["--model", "tiny-llama", "--n-facts", "10", "--finetune-max-steps", "2"]
    args += ["--n", "2", "--n-boot", "20", "--workspace", "ws", "--out", "run", "--quiet"]
    result = CliRunner().invoke(command, args)
    assert result.exit_code == 0, result.output
    score = pl.read_csv(tmp_path / "run" / "mean_logprob.csv")
    assert score["graft"].to_list() == ["PRE", "SFT", "FE", "LT", "FE+LT"]
    examples = pl.read_parquet(tmp_path / "run" / "examples.parquet")
    expected = examples.group_by("graft", maintain_order=True).agg(
        pl.col("target_logprob").mean().alias("mean_logprob")
    )
    assert score["graft"].to_list() == expected["graft"].to_list()
    assert (score["mean_logprob"] - expected["mean_logprob"]).abs().max() < 1e-12
    specs = dict(examples.select("graft", "spec").unique().iter_rows())
    assert specs["LT"] == str(graft.parse_spec("LT:all:attn"))
    # and it runs on its own, as a file
    help_text = subprocess.run(
        [sys.executable, str(path), "--help"], capture_output=True, text=True, cwd=ROOT
    )
    assert help_text.returncode == 0, help_text.stderr
    assert "--rows-per-forward" in help_text.stdout and "--remote" in help_text.stdout


def test_the_readme_defines_its_terms_before_the_first_python_example():
    text = README.read_text()
    lines = text.splitlines()
    first_example = lines.index("```python") + 1
    assert first_example < 60, f"the first Python example starts at line {first_example}"
    start = text.index("\n## What the output means\n")
    meaning = text[start : text.index("\n## ", start + 1)]
    for term in ("**PRE**", "**SFT**", "**acc@5**", "**FE**", "**LT**", "`(FE+LT)^C`", "`q4`"):
        assert term in meaning, f"the README does not define {term}"
    assert "**reversal pair**" in meaning


@pytest.mark.slow
def test_a_paper_experiment_runs_from_python_as_docs_api_shows(tmp_path, monkeypatch):
    code = readme_block("A paper experiment from Python", ROOT / "docs" / "reference" / "api.md")
    assert len(code.splitlines()) <= 6
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    lines: list[str] = []
    monkeypatch.setattr("builtins.print", lines.append)
    quiet = code.replace("n=3))", "n=3, workspace='ws', progress=False))")
    assert quiet != code
    exec(compile(quiet, "docs/reference/api.md", "exec"), namespace)
    summary = namespace["summary"]
    assert {"PRE", "SFT", "Q", "K", "V", "ATTN+O+FFN"} <= set(summary["graft"].to_list())
    done = namespace["done"]
    assert done.runs["sft"].folder.path == done.design.folder / "sft"
    assert (tmp_path / done.design.folder / "sft" / "summary.parquet").is_file()
    assert any(line.startswith("results: ") for line in lines)
