"""The command line answers at once: ``--help`` of graft-exp and of every command, and every
option usage error, load none of the heavy libraries (a fresh interpreter, ``sys.modules``
read after each)."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("torch", "transformers", "nnsight", "scipy", "statsmodels", "matplotlib", "polars")

_PROBE = """
import json, sys
from click.testing import CliRunner
from graft_experiments.cli import main
cases = json.loads(sys.argv[1])
out = []
for args in cases:
    result = CliRunner().invoke(main, args)
    heavy = sorted({m.split(".")[0] for m in sys.modules} & set(json.loads(sys.argv[2])))
    out.append([args, result.exit_code, heavy, result.output[-300:]])
print(json.dumps(out))
"""


def _probe(cases: list[list[str]]) -> list:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(cases), json.dumps(HEAVY)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout)


def test_help_and_usage_errors_load_no_heavy_library():
    from graft_experiments.cli import COMMANDS

    cases = [["--help"], *([name, "--help"] for name, _ in COMMANDS)]
    cases += [["study", sub, "--help"] for sub in ("plan", "run", "status", "collect", "submit")]
    cases += [
        ["position", "--bogus"],
        ["position", "--n", "0"],
        ["position", "--device", "banana"],
        ["position", "--protocol", "nope"],
        ["finetune", "--lr", "2"],
        ["component", "--finetune-seeds", "1,1"],
        ["nosuchcommand"],
    ]
    results = _probe(cases)
    for args, code, heavy, output in results:
        assert heavy == [], f"{args} loaded {heavy}"
        assert code == (0 if args[-1] == "--help" else 2), (args, code, output)
    assert "Error: Invalid value for '--device'" in results[-5][3]  # parsed, without torch
    assert {args[0] for args, *_ in results} >= {"study", "data", "patching", "smoke"}


def test_every_command_is_listed_with_its_short_help():
    from graft_experiments.cli import COMMANDS, main

    assert sorted(main.commands) == sorted(name for name, _ in COMMANDS)
    assert all(command.get_short_help_str() for command in main.commands.values())
