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
    from graft.core import SMOKE_SPECS, TOLERANCE, check_family, path_word
    from graft.models import tiny_pair

    families = TINY_FAMILIES if family == "all" else (family,)
    failures, columns, paths = [], [], {}
    for name in families:
        shifts, failed, paths[name] = check_family(*tiny_pair(name))
        failures += failed
        columns.append([shift for _, shift in shifts])
    click.echo("max |logit - base logit| per graft and family (tiny random models):")
    click.echo(f"{'graft':<24}" + "".join(f"{name:>10}" for name in families))
    for i, spec in enumerate(SMOKE_SPECS):
        click.echo(f"{spec:<24}" + "".join(f"{col[i]:>10.4f}" for col in columns))
    click.echo(f"{'engine path':<24}" + "".join(f"{path_word(p):>10}" for p in paths.values()))
    for reason in dict.fromkeys(r for p in paths.values() for r in p["fallbacks"]):
        click.echo(f"slow path: {reason}")
    if failures:
        raise click.ClickException("; ".join(failures))
    click.echo(
        f"ok: grafting nothing gives the base's logits and grafting everything with the "
        f"donor's head the donor's, within {TOLERANCE:g}, in {len(families)} "
        f"famil{'y' if len(families) == 1 else 'ies'}"
    )


if __name__ == "__main__":
    common.standalone(smoke)
