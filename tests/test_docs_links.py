"""Every relative link of the README, the CHANGELOG, results/HISTORY.md and docs/ points at a
file that exists, and every ``#anchor`` at a heading of its page (GitHub's anchors): a page
moved or a heading renamed cannot leave a link to nothing."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s{0,3}(```|~~~)")


def _lines_outside_code(path: Path) -> list[tuple[int, str]]:
    lines, fence = [], None
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        mark = FENCE.match(line)
        if mark:
            fence = None if fence == mark.group(1) else (fence or mark.group(1))
            continue
        if fence is None:
            lines.append((number, line))
    return lines


def _anchors(path: Path) -> set[str]:
    return {
        "#" + re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        for _, line in _lines_outside_code(path)
        if line.startswith("#")
    }


def test_every_relative_link_resolves():
    pages = [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "results" / "HISTORY.md"]
    pages += sorted((ROOT / "docs").rglob("*.md"))
    broken = []
    for page in pages:
        name = page.relative_to(ROOT).as_posix()
        for number, line in _lines_outside_code(page):
            for url in LINK.findall(line):
                if re.match(r"^[a-z]+:", url):
                    continue
                path, _, anchor = url.partition("#")
                target = (page.parent / path).resolve() if path else page
                if not target.exists():
                    broken.append(f"{name}:{number}: {url} (no such file)")
                elif anchor and target.suffix == ".md" and f"#{anchor}" not in _anchors(target):
                    broken.append(f"{name}:{number}: {url} (no such heading)")
    assert not broken, "\n".join(broken)
