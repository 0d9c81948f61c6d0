"""graft builds as a wheel under its distribution name, graft-interp, and that wheel installs
into a fresh virtual environment, where ``import graft`` and ``graft-exp --help`` work from
the installed files (not from this checkout). Offline: the wheel is built without build
isolation by this interpreter's setuptools, and installed without an index; the fresh venv
sees this interpreter's packages (torch, click, ...) through a path file, not graft."""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _run(*args: str | Path, cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"{args}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_the_distribution_name_is_not_the_import_name():
    # "graft" on the package index is an unrelated project (0.0.1, 2020)
    assert PROJECT["name"] == "graft-interp"
    from graft.results.provenance import DISTRIBUTION

    assert PROJECT["name"] == DISTRIBUTION
    newest = (ROOT / "scripts" / "newest_differs.py").read_text()  # no package: its text
    assert f'DISTRIBUTION = "{PROJECT["name"]}"' in newest
    assert set(PROJECT["optional-dependencies"]) >= {"corpus", "tracking", "dev"}


@pytest.mark.slow
def test_the_wheel_installs_in_a_fresh_venv_and_runs(tmp_path):
    # a copy of what the wheel is built from: the build writes its egg-info and build
    # folders beside the sources, never into the checkout
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("graft", "experiments"):
        shutil.copytree(ROOT / name, source / name, ignore=ignore)
    wheels = tmp_path / "wheels"
    _run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "--no-index",
        "-q",
        "-w",
        wheels,
        source,
        cwd=tmp_path,
    )
    [wheel] = wheels.glob("*.whl")
    assert wheel.name.startswith(f"graft_interp-{PROJECT['version']}-py3-none-any")

    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    fresh_site = Path(
        _run(
            python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))", cwd=tmp_path
        ).strip()
    )
    # the dependencies come from this interpreter's site-packages (a plain path line: the
    # path files there, graft's editable install among them, are not read)
    (fresh_site / "dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    _run(
        sys.executable,
        "-m",
        "pip",
        "--python",
        python,
        "install",
        "--no-deps",
        "--no-index",
        "-q",
        wheel,
        cwd=tmp_path,
    )

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    probe = (
        "import importlib.metadata as m, graft, graft_experiments; "
        "print(m.version('graft-interp'), graft.__file__, graft_experiments.__file__)"
    )
    version, graft_file, commands_file = _run(python, "-c", probe, cwd=tmp_path, env=env).split()
    assert version == PROJECT["version"]
    for path in (graft_file, commands_file):
        assert Path(path).is_relative_to(fresh_site), path  # the installed copy, not the checkout
    assert (Path(graft_file).parent / "resources").is_dir()  # package data came along
    help_text = _run(env_dir / "bin" / "graft-exp", "--help", cwd=tmp_path, env=env)
    assert "position" in help_text and "Usage: graft-exp" in help_text
