"""The provenance table of published results folders: one row per experiment and benchmark
a folder's ``provenance.json`` records (run | model, protocol, seeds | command | commit |
machine, threads | date), for :mod:`benchmarks.results_tables`' ``provenance`` marker.

An entry with a ``legacy`` object (``in_results_since``: the commit that added the folder,
``date``: its date) is a table published before graft recorded provenance: its command is the
one the documentation gave then, and its row says so instead of inventing the rest."""

from __future__ import annotations

from pathlib import Path

from benchmarks._graft_api import GRAFT, machine_label, protocol_of, provenance_entries
from benchmarks.md_table import escaped, md_row

HEADER = (
    "| run | model, protocol, seeds | command | commit | machine, threads | date |",
    "|---|---|---|---|---|---|",
)


def _seeds(entry: dict) -> str:
    seeds = entry.get("seeds") or {}
    parts = []
    if seeds.get("finetune_seeds"):
        parts.append("finetune seeds " + ", ".join(map(str, seeds["finetune_seeds"])))
    if seeds.get("data_seeds"):
        parts.append("data seeds " + ", ".join(map(str, seeds["data_seeds"])))
    elif "data_seed" in seeds:
        parts.append(f"data seed {seeds['data_seed']}")
    if "seed" in seeds:
        parts.append(f"seed {seeds['seed']}")
    if seeds.get("control"):
        parts.append("control donors")
    return ", ".join(parts)


def _presets(entry: dict) -> str:
    records = (entry.get("finetuned_models") or {}).values()
    names = sorted({str((r.get("config") or {}).get("name")) for r in records if r})
    return f"`{'`/`'.join(names)}` preset" if names else ""


def _setup(entry: dict) -> str:
    if entry.get("kind") == "benchmark":
        settings = entry.get("settings") or {}
        return ", ".join(f"{k} {v}" for k, v in settings.items()) or "—"
    protocol = protocol_of(entry.get("protocol") or GRAFT)
    parts = [
        str(entry.get("model")),
        protocol.title,
        _presets(entry),
        _seeds(entry),
        f"n = {entry['n']}" if entry.get("n") is not None else "n = all",
    ]
    return ", ".join(p for p in parts if p)


def _commit(entry: dict) -> str:
    commit = entry.get("git_commit")
    legacy = entry.get("legacy") or {}
    if not commit and legacy.get("in_results_since"):
        return f"not recorded (in results/ since `{legacy['in_results_since']}`)"
    if not commit:
        return "unknown"
    return f"`{commit[:12]}`" + (" (dirty)" if entry.get("git_dirty") else "")


def machine_cell(entry: dict) -> str:
    """``entry``'s machine and torch threads, or ``unknown``."""
    machine = entry.get("machine")
    if not isinstance(machine, dict):
        return "unknown"
    threads = machine.get("torch_threads")
    return f"{machine_label(machine)}, {threads} thread{'' if threads == 1 else 's'}"


def _date(entry: dict) -> str:
    legacy = entry.get("legacy") or {}
    if not entry.get("created") and legacy.get("date"):
        return f"before {legacy['date']}"
    created = str(entry.get("created") or "unknown")[:10]
    resumed = sorted({str(r.get("time", ""))[:10] for r in entry.get("resumes") or []} - {""})
    return created + (f" (resumed {', '.join(resumed)})" if resumed else "")


def rows(label: str, folder: Path) -> list[str]:
    """The table rows of every entry ``folder``'s provenance records, labelled ``label``."""
    lines = []
    for name, entry in provenance_entries(folder):
        missing = entry.get("missing") or []
        if entry.get("legacy"):
            note = " (published before provenance was recorded: the command as documented then)"
        else:
            note = f" (not recorded: {', '.join(missing)})" if missing else ""
        command = f"`{entry.get('command')}`" if entry.get("command") else "unknown"
        cells = [
            f"{label}: {name}",
            _setup(entry) + note,
            command,
            _commit(entry),
            machine_cell(entry),
            _date(entry),
        ]
        lines.append(md_row(escaped(c) for c in cells))
    return lines
