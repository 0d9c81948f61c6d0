"""How long the command line takes to answer: ``graft-exp --help``, a command's ``--help`` and
an option's usage error, each a fresh process, beside ``python -c pass`` (the interpreter's
own start), medians of ``--repeats`` runs interleaved so that the machine's noise falls on
all alike. Prints seconds and the ratio to ``python -c pass``; the goal is well under a
second for each.

    python -m benchmarks.cli_start --repeats 5
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import time

from benchmarks.cli import benchmark_parser

CASES = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "graft-exp --help": ["graft-exp", "--help"],
    "graft-exp position --help": ["graft-exp", "position", "--help"],
    "graft-exp position --n 0 (usage error)": ["graft-exp", "position", "--n", "0"],
}


def _seconds(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, capture_output=True, check=False)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    ap = benchmark_parser("cli_start", __doc__ or "")
    ap.add_argument("--repeats", type=int, default=5, help="runs of each case (median)")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    exe = shutil.which("graft-exp")
    if exe is None:
        ap.error("graft-exp is not on PATH: install graft (pip install -e .) first")
    times: dict[str, list[float]] = {name: [] for name in CASES}
    for _ in range(args.repeats):
        for name, case in CASES.items():
            times[name].append(_seconds([exe, *case[1:]] if case[0] == "graft-exp" else case))
    base = statistics.median(times["python -c pass"])
    print(f"{'case':<42}{'median s':>10}{'x python':>10}")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:<42}{median:>10.3f}{median / base:>10.1f}")


if __name__ == "__main__":
    main()
