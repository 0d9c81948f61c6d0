"""The ``graft-exp`` console script: one sub-command per experiment."""

from __future__ import annotations

import importlib

import click

# (module under experiments/, attribute): each attribute is a click.Command.
COMMANDS: list[tuple[str, str]] = [
    ("data", "data"),
    ("finetune", "finetune"),
    ("position", "position"),
    ("component", "component"),
    ("hybrid", "hybrid"),
    ("layers", "layers"),
    ("tokens", "tokens"),
    ("lens", "lens"),
    ("necessity", "necessity"),
    ("patching", "patching"),
    ("attribution", "attribution"),
    ("custom", "custom"),
    ("plot", "plot"),
    ("compare", "compare"),
    ("publish", "publish"),
    ("accept", "accept"),
    ("repair", "repair"),
    ("smoke", "smoke"),
    ("study", "study"),
]


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="graft")
def main() -> None:
    """Dynamic weight grafting experiments (paper: "Multiple Streams of Knowledge Retrieval")."""


for _module, _attr in COMMANDS:
    main.add_command(getattr(importlib.import_module(f"graft_experiments.{_module}"), _attr))


if __name__ == "__main__":
    main()
