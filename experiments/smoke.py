"""``graft-exp smoke``: a seconds-long self-check of the install on tiny random models."""

from __future__ import annotations

import click

from graft.models import TINY_FAMILIES
from graft_experiments import common


@click.command(cls=common.GraftCommand)
@click.option(
    "--family",
    type=click.Choice(["all", *TINY_FAMILIES]),
    default="all",
    show_default=True,
    help="Model family to check.",
)
def smoke(family: str) -> None:
    """Check this install on tiny random models of each FAMILY (seconds, no download).

    Grafting nothing must give the base model's own logits and grafting everything with the
    donor's head the donor's (within 1e-5); exit 1 otherwise. Also prints how far each graft
    moves the final logits away from the base, and the engine's path per family (``prefix``:
    every shortcut; ``whole``: the installed transformers offers no key/value cache argument
    graft knows, so rows run whole, slower, with a line saying why).
    """
    from graft.core import self_check
    from graft.models import tiny_pair

    families = TINY_FAMILIES if family == "all" else (family,)
    found = self_check((name, tiny_pair(name)) for name in families)
    click.echo("max |logit - base logit| per graft and family (tiny random models):")
    for line in found.lines():
        click.echo(line)
    if found.failures:
        raise click.ClickException("; ".join(found.failures))
    click.echo(found.ok_line())


if __name__ == "__main__":
    common.standalone(smoke)
