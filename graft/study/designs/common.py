"""What the paper's designs share: specs made for an experiment, the protocol's run fields
(its test prompts from the donor's own dataset, a run folder of its own), the SFT donor's
one-run design, and the design folder."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from graft.errors import SpecError
from graft.study.designs.design import Design, Finish
from graft.study.specs.config import ModelSource
from graft.study.specs.grafts import NamedGraft, protocol_notes, spec_graft
from graft.study.specs.protocol import Protocol
from graft.study.specs.request import RunRequest
from graft.study.specs.run import RunSpecs, resolve
from graft.study.training.workspace import parse_variant


def specs_for(specs: RunSpecs, experiment: str, **options: Any) -> RunSpecs:
    """``specs`` as the run of ``experiment`` with the options ``options`` set (resolved
    again only where something changes)."""
    wanted = {"experiment": experiment, **options}
    if all(getattr(specs.options, k) == v for k, v in wanted.items()):
        return specs
    return resolve(replace(specs.options, **wanted))


def graft_list(texts: Sequence[str], head_policy: str, protocol: Protocol) -> list[NamedGraft]:
    """The named grafts of ``texts`` (``NAME=SPEC`` or ``SPEC``), each without ``head=``
    given ``head_policy`` and resolved under ``protocol`` where it names none.

    Raises:
        SpecError: a text that is no spec (its parameter: ``graft_specs``).
    """
    try:
        return [spec_graft(text, head_policy, protocol) for text in texts]
    except SpecError as err:
        raise SpecError(str(err), param="graft_specs") from None


def protocol_fields(protocol: Protocol, variant: str, out_tag: str = "") -> dict[str, Any]:
    """:class:`RunRequest` fields of ``protocol`` for a donor of ``variant``: under the
    paper's, the test prompts from the donor's own dataset (no second dataset generated)
    and a run folder of its own (``-paper``), before ``out_tag``."""
    tag = "-".join(t for t in (protocol.run_tag, out_tag) if t)
    fields: dict[str, Any] = {"out_tag": tag} if tag else {}
    if protocol.test_prompts_from_donor:
        fields["data_direction"] = parse_variant(variant)[0]
    return fields


def one_run(
    specs: RunSpecs,
    grafts: Sequence[NamedGraft],
    *,
    notes: Sequence[str] | None = None,
    extra_config: dict[str, Any] | None = None,
    finish: Finish | None = None,
    figures: bool = True,
    **fields: Any,
) -> Design:
    """The design of one run of ``grafts`` (``fields``: the request's other fields); its
    protocol notes (computed unless given) are said first and stored in ``config.json``."""
    notes = protocol_notes(grafts, specs.protocol) if notes is None else list(notes)
    extra = dict(extra_config or {}) | ({"protocol_notes": list(notes)} if notes else {})
    request = RunRequest(specs=specs, grafts=tuple(grafts), extra_config=extra, **fields)
    folder = specs.out_folder(request.out_tag)
    return Design(specs.experiment, folder, {"": request}, tuple(notes), finish, figures)


def sft_design(
    specs: RunSpecs,
    grafts: Sequence[NamedGraft],
    variant: str | None = None,
    out_tag: str = "",
    **design: Any,
) -> Design:
    """One run of ``grafts`` on the pretrained base with the finetuned ``variant`` (None:
    the protocol's) as donor ``sft``; ``design``: :func:`one_run`'s other arguments."""
    variant = variant or specs.protocol.donor_variant
    fields = protocol_fields(specs.protocol, variant, out_tag)
    return one_run(specs, grafts, donors={"sft": ModelSource(variant)}, **fields, **design)


def layer_reuse_note(
    n_layers: int,
    hidden: int,
    itemsize: int,
    batch_size: int,
    patching: bool = False,
    positions: int = 64,
    kv_width: int = 0,
) -> str:
    """What running each row from its first changed layer and column holds
    (:mod:`graft.core.execution.resume`, :mod:`graft.core.execution.windows`): each distinct
    prompt's layer inputs and, where ``kv_width`` (the width of one position's keys, and of
    its values, all heads: :attr:`~graft.study.planning.model_size.ModelSize.kv_width`), its
    layers' keys and values (and, with ``patching``, the other model's site outputs), kept
    across batches up to
    :data:`graft.core.execution.prompt_values.KEEP_BYTES` or one forward's prompts (at most
    ``batch_size``), sized for prompts of ``positions`` tokens of a model of ``n_layers``
    layers of width ``hidden`` in ``itemsize``-byte floats."""
    from graft.core.execution.prompt_values import KEEP_BYTES
    from graft.core.execution.resume import saved_bytes

    per_prompt = saved_bytes(n_layers, 1, positions, hidden, itemsize, kv_width)
    most = max(KEEP_BYTES, batch_size * per_prompt)
    what = "layer inputs" + (", keys and values" if kv_width else "")
    what += " and patching's donor outputs are" if patching else " are"
    return (
        f"layer reuse: each row runs from its first changed layer and column; each prompt's {what} "
        f"computed once ({per_prompt / 2**20:.1f} MiB per distinct prompt of {positions} tokens) "
        f"and kept up to {most / 2**20:.0f} MiB; --no-reuse runs every row whole"
    )
