"""Wall time per stage of a run (data and checks, finetuning, loading, grafting, summaries),
so that a user sees where the minutes of a command went."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from graft.results.run_log import file_only


@dataclass
class StageTimes:
    """Seconds spent per stage, in the order the stages first ran.

    Args:
        seconds: stage name -> wall seconds (a stage entered several times adds up).
    """

    seconds: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time the block as (part of) stage ``name``; its start and its end with its seconds
        go to the run's log (:func:`~graft.results.run_log.file_only`), not the console."""
        file_only().info("%s ...", name)
        start = time.perf_counter()
        try:
            yield
        finally:
            took = time.perf_counter() - start
            self.seconds[name] = self.seconds.get(name, 0.0) + took
            file_only().info("%s: %s", name, _fmt(took))

    def line(self) -> str:
        """``time: finetuning 255 s, loading 4.1 s, ... (total 302 s)``."""
        parts = [f"{name} {_fmt(s)}" for name, s in self.seconds.items()]
        return f"time: {', '.join(parts)} (total {_fmt(sum(self.seconds.values()))})"


def _fmt(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:,.0f} s"
