"""The locked environment: the README's tested versions, the lock and what is installed agree,
and CI runs exactly the README's test command."""

from __future__ import annotations

import importlib.metadata
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REQUIREMENTS = ROOT / "requirements"
#: Written by scripts/setup.sh into the venv: how it installed (``locked``/``unlocked``).
SETUP_RECORD = Path(sys.prefix) / "graft-setup.json"


def locked_versions() -> dict[str, str]:
    """``name -> version`` of every package the lock files pin."""
    pins = {}
    for name in ("lock.txt", "torch-cpu.txt", "embedded.txt"):
        for match in re.finditer(
            r"^([A-Za-z0-9_.-]+)==(\S+)", (REQUIREMENTS / name).read_text(), re.M
        ):
            pins[match[1].lower().replace("_", "-")] = match[2]
    return pins


def test_every_pin_has_a_hash():
    for name in ("lock.txt", "torch-cpu.txt", "embedded.txt"):
        entries = re.split(r"\n(?=[A-Za-z0-9])", (REQUIREMENTS / name).read_text())
        pinned = [e for e in entries if re.match(r"[A-Za-z0-9_.-]+==", e)]
        assert pinned, name
        assert all("--hash=sha256:" in e for e in pinned), name


def test_the_readme_states_the_locked_versions():
    readme = (ROOT / "README.md").read_text()
    line = re.search(r"\*\*Tested versions\*\* \(from the lock\): ([^(]+)\(", readme, re.S)
    assert line, "the README's 'Tested versions' line is missing"
    stated = dict(re.findall(r"(torch|transformers|nnsight) (\S+?),?\s", line[1] + " "))
    pins = locked_versions()
    assert stated == {k: pins[k] for k in ("torch", "transformers", "nnsight")}


def test_the_lock_covers_what_pyproject_requires():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = project["dependencies"] + project["optional-dependencies"]["dev"]
    names = {re.match(r"[A-Za-z0-9_.-]+", w)[0].lower().replace("_", "-") for w in wanted}
    assert names <= set(locked_versions())


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    command = re.search(r"\*\*Tests\*\*[^\n]*\n(?:[^\n]+\n)*\n    ([^\n]+)\n", readme)
    assert command, "the README's test command is missing"
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert command[1] in ci
    # the command runs every stage, the setup and both tiers included
    script = (ROOT / "scripts" / "test.sh").read_text()
    assert command[1] == "bash scripts/test.sh"
    stages = re.search(r'GRAFT_TEST_STAGES:-([^}"]+)', script)
    assert stages and stages[1].split() == ["setup", "checks", "fast", "slow", "newest", "ndif"]
    for stage in stages[1].split():
        assert re.search(rf"^run_stage {stage} ", script, re.M), stage


def test_a_locked_setup_installed_exactly_the_lock():
    if not SETUP_RECORD.is_file():
        pytest.skip(f"this environment was not made by scripts/setup.sh ({SETUP_RECORD} missing)")
    record = json.loads(SETUP_RECORD.read_text())
    if record["mode"] != "locked":
        pytest.skip("installed from pyproject's ranges (GRAFT_UNLOCKED or another platform)")
    pins = locked_versions()
    if "TORCH_SPEC" in record.get("env", {}):
        pins.pop("torch")
    installed = {
        name: importlib.metadata.version(name) for name in pins if _installed(name) is not None
    }
    assert {n: v for n, v in pins.items() if installed.get(n) != v} == {}


def _installed(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _newest_differs():
    """scripts/newest_differs.py as a module (scripts/ is not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "newest_differs", ROOT / "scripts" / "newest_differs.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _report(tmp_path: Path, *packages: tuple[str, str]) -> str:
    path = tmp_path / "report.json"
    install = [{"metadata": {"name": name, "version": version}} for name, version in packages]
    path.write_text(json.dumps({"install": install}))
    return str(path)


def test_the_newest_stage_runs_when_a_run_time_package_differs(tmp_path, capsys):
    differs = _newest_differs()
    transformers = importlib.metadata.version("transformers")
    differs.main(_report(tmp_path, ("graft-interp", "0.1.0"), ("transformers", "999.0")))
    out, err = capsys.readouterr()
    assert out == f"transformers {transformers} -> 999.0\n" and err == ""
    # a dependency of a dependency counts too (tokenizers comes with transformers)
    differs.main(_report(tmp_path, ("tokenizers", "999.0")))
    assert capsys.readouterr().out.startswith("tokenizers ")


def test_the_newest_stage_skips_when_only_dev_tools_or_nothing_differ(tmp_path, capsys):
    differs = _newest_differs()
    mypy = importlib.metadata.version("mypy")
    transformers = importlib.metadata.version("transformers")
    differs.main(
        _report(
            tmp_path, ("graft-interp", "0.1.0"), ("mypy", "999.0"), ("transformers", transformers)
        )
    )
    out, err = capsys.readouterr()
    assert out == "" and err == f"mypy {mypy} -> 999.0 (not a run-time package of graft)\n"
    differs.main(_report(tmp_path))
    assert capsys.readouterr() == ("", "")
