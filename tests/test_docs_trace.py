"""docs/reference/trace.md's recipes run, in order, in one namespace (the remote block excepted: it
needs a server): a recipe that stops working fails here, not in a reader's notebook."""

from __future__ import annotations

import linecache
import re
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[1] / "docs" / "reference" / "trace.md"

pytestmark = pytest.mark.usefixtures("one_thread")


def page_blocks() -> list[str]:
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.DOTALL)
    return [b for b in blocks if "RemoteExecutor" not in b]


def test_the_page_has_its_recipes():
    text = "\n".join(page_blocks())
    for needed in ("g.invoke(", "grad=True", "attention=True", "graft.generate(", "graft.Graft("):
        assert needed in text, needed


def test_every_recipe_runs_in_order(capsys):
    namespace: dict = {}
    for i, block in enumerate(page_blocks()):
        name = f"<docs/reference/trace.md block {i}>"
        # nnsight reads a `with` block's source through linecache, as it does for a notebook
        linecache.cache[name] = (len(block), None, block.splitlines(keepends=True), name)
        try:
            exec(compile(block, name, "exec"), namespace)
        except Exception as exc:
            raise AssertionError(
                f"docs/reference/trace.md block {i} failed: {exc!r}\n{block}"
            ) from exc
    printed = capsys.readouterr().out
    assert printed.count("\n") >= 4  # each recipe that prints printed
    assert namespace["attribution"].shape == (4, namespace["acts"][0].shape[1])
    assert len(namespace["out"].texts) == 2
