"""The paper's grafting experiments as designs: position (E1, E2), necessity, hybrid (E4),
layers (E7), tokens (E6) and custom specs. Each function takes the resolved specs and the
experiment's own choices and returns a :class:`~graft.study.designs.design.Design`;
``variant=None`` is the protocol's donor (the both-direction model under the paper's)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import polars as pl

from graft.core import GraftSpec
from graft.core.execution.engine import LocalExecutor
from graft.errors import ExperimentError, SpecError
from graft.models import device_type, load_model, resolve_dtype
from graft.models.configs import model_config
from graft.results import LAYER_SEP, top1_kinds_wide, top_tokens_table
from graft.storage import write_csv
from graft.study.analyses.top1 import TOP1_KINDS, group_columns, write_top1_kinds
from graft.study.designs.common import (
    graft_list,
    layer_reuse_note,
    one_run,
    protocol_fields,
    sft_design,
    specs_for,
)
from graft.study.designs.design import Design, DesignRun
from graft.study.planning.model_size import model_size
from graft.study.specs.choices import TOKEN_SPECS
from graft.study.specs.config import ModelSource
from graft.study.specs.grafts import (
    POSITIONS,
    NamedGraft,
    head_suffix,
    hybrid_grafts,
    layer_windows,
    necessity_grafts,
    paper_token_graft,
    position_grafts,
    reference,
    with_protocol,
)
from graft.study.specs.run import RunSpecs
from graft.study.training.sources import resolve_model_path
from graft.study.training.workspace import parse_variant

#: The table ``tokens`` adds to its run folder (``.parquet`` and ``.csv``).
TOP_TOKENS = "top_tokens"


def position(
    specs: RunSpecs, positions: Sequence[str] = POSITIONS, variant: str | None = None
) -> Design:
    """E1/E2: every component of every layer grafted from SFT into PRE at each position set,
    PRE and SFT as references; also the share of rows whose top-1 token is an actor's name,
    a title, punctuation or a function word (``top1_kinds``)."""
    specs = specs_for(specs, "position")
    grafts = position_grafts(positions, specs.analysis.head_policy, protocol=specs.protocol)
    return sft_design(specs, grafts, variant, finish=_top1_kinds)


def _top1_kinds(done: DesignRun) -> None:
    run = done.run
    table = write_top1_kinds(run.folder, run.examples, run.record)
    with pl.Config(tbl_rows=-1, tbl_cols=-1, tbl_hide_dataframe_shape=True, fmt_str_lengths=20):
        wide = str(top1_kinds_wide(table, group_columns(run.examples)))
    done.files[TOP1_KINDS] = run.folder.path / f"{TOP1_KINDS}.csv"
    done.lines += ["top-1 token kinds, share (count) of rows:", wide]
    done.lines.append(f"top-1 kinds: {done.files[TOP1_KINDS]}")


def necessity(
    specs: RunSpecs, positions: Sequence[str] = POSITIONS, variant: str | None = None
) -> Design:
    """SFT run with PRE's weights grafted back at each position set: a drop shows the
    finetuned weights there are needed (the paper tested sufficiency only)."""
    specs = specs_for(specs, "necessity")
    variant = variant or specs.protocol.donor_variant
    grafts = necessity_grafts(positions, specs.analysis.head_policy, protocol=specs.protocol)
    return one_run(
        specs,
        grafts,
        base=ModelSource(variant),
        donors={"pre": ModelSource("pretrained")},
        **protocol_fields(specs.protocol, variant),
    )


def hybrid(specs: RunSpecs, lt_layers: str | None = None) -> Design:
    """E4: at LT, ATTN from the task model (fact set A) and O+FFN from the relation model
    (set B) over ``lt_layers`` (None: the protocol's split); at FE each component set from
    the task model in every layer; tested on set B's prompts."""
    specs = specs_for(specs, "hybrid", split=True)
    task, relation = specs.protocol.hybrid_variants
    return one_run(
        specs,
        hybrid_grafts(lt_layers, specs.analysis.head_policy, protocol=specs.protocol),
        donors={"task": ModelSource(task), "relation": ModelSource(relation)},
        **protocol_fields(specs.protocol, task),
    )


def layers(
    specs: RunSpecs,
    n_layers: int | None = None,
    positions: Sequence[str] = ("FE", "LT", "FE+LT"),
    windows: str | None = None,
    components: Sequence[str] = ("block",),
    variant: str | None = None,
    reuse: bool = True,
) -> Design:
    """E7: SFT grafted into PRE at each position set x layer window x component set of a
    model of ``n_layers`` layers (None: the model's, from its config) (``windows`` None: the
    protocol's, quarters under the paper's, eighths otherwise); heatmaps per component set.
    ``reuse``: on this machine, each row runs from its window's first layer on, the layers
    below it once per prompt (:mod:`graft.core.execution.resume`; equal to rounding); False,
    or a remote run: every row its whole forward.

    Raises:
        ExperimentError: windows the protocol's layer rule cannot make, or no such windows.
        SpecError: a position set or component set that is no spec.
    """
    specs = specs_for(specs, "layers")
    reuse = reuse and not specs.execution.remote_run
    found_layers, hidden, kv = _sizes(specs) if reuse or not n_layers else (n_layers, 0, 0)
    n_layers = n_layers or found_layers
    windows = windows or specs.protocol.layer_windows
    if windows in specs.protocol.refused_windows:
        raise ExperimentError(
            f"{windows}: the paper's layer rule has halves and quarters only (its code's "
            "eighths were broken); use quarters, halves, single or a width K, or protocol "
            "graft",
            param="windows",
        )
    try:
        windows_list = layer_windows(n_layers, windows)
    # ValueError: Python's int() of a digit string it refuses ("²", over 4,300 digits)
    except (ExperimentError, ValueError):
        raise ExperimentError(
            f"windows {windows!r}: use halves, quarters, eighths, single or a positive "
            "integer width",
            param="windows",
        ) from None
    grafts = [reference("PRE", None), reference("SFT", "sft")]
    head = head_suffix(specs.analysis.head_policy)
    for comps in dict.fromkeys(components):  # an item named twice runs once, never pooled
        for pos in dict.fromkeys(positions):
            for win in windows_list:
                try:
                    spec = GraftSpec.parse(f"{pos}:{win}:{comps}{head}")
                except SpecError as err:
                    raise SpecError(f"position set {pos!r}, components {comps!r}: {err}") from None
                grafts.append(NamedGraft(f"{pos}{LAYER_SEP}{win}", spec, group=comps))
    grafts = with_protocol(grafts, specs.protocol)
    design = sft_design(
        specs,
        grafts,
        variant,
        extra_config={"layer_reuse": reuse},
        executor=LocalExecutor(resume_layers=True) if reuse else None,
    )
    if not reuse:
        return design
    # the dtype the run's models load in, resolved as graft.models.load_model does (the
    # device by its type: a --dry-run plans a GPU run on a machine without one)
    device = device_type(specs.execution.device)
    itemsize = resolve_dtype(specs.execution.dtype, device).itemsize
    note = layer_reuse_note(n_layers, hidden, itemsize, specs.execution.batch_size, kv_width=kv)
    return replace(design, notes=(*design.notes, note))


def _sizes(specs: RunSpecs) -> tuple[int, int, int]:
    """The pretrained model's layer count, width and key/value width
    (:attr:`~graft.study.planning.model_size.ModelSize.kv_width`): from its config where it is on this
    machine, else from the model itself (loaded once)."""
    found = model_config(specs.donors.model)
    if found is None:
        path = resolve_model_path(specs, ModelSource())
        config = load_model(path, dtype=specs.execution.dtype, device="cpu").model.config
    else:
        config = found.config
    text = config.get_text_config()
    return int(text.num_hidden_layers), int(text.hidden_size), model_size(config).kv_width


def tokens(
    specs: RunSpecs,
    graft_specs: Sequence[str] = TOKEN_SPECS,
    paper_graft: bool = False,
    per_graft: int = 5,
    variant: str | None = None,
) -> Design:
    """E6: the top-10 next tokens with probabilities for ``per_graft`` sampled examples of
    each graft and template: PRE, SFT and ``graft_specs`` (``NAME=SPEC`` or ``SPEC``), or
    with ``paper_graft`` the one graft the paper's token tables show for the model's family
    (in its own run folder)."""
    specs = specs_for(specs, "tokens")
    policy, protocol = specs.analysis.head_policy, specs.protocol
    chosen = graft_list(graft_specs, policy, protocol)
    extra = {}
    if paper_graft:
        graft, line = paper_token_graft(specs.donors.model, policy, protocol)
        chosen, extra = [graft], {"paper_graft": line}
    grafts = [reference("PRE", None), reference("SFT", "sft"), *chosen]
    design = sft_design(
        specs,
        grafts,
        variant,
        "paper-grafts" if paper_graft else "",  # its own folder: other grafts would refuse it
        extra_config=extra,
        finish=lambda done: _top_tokens(done, per_graft),
        figures=False,
    )
    return design


def _top_tokens(done: DesignRun, per_graft: int) -> None:
    run = done.run
    # one group per replicate: several finetune or data seeds must not be pooled
    groups = [c for c in ("data_seed", "finetune_seed") if c in run.examples.columns]
    by = [*groups, "template", "graft"]
    seed = done.design.runs[""].specs.analysis.seed
    table = top_tokens_table(run.examples, by=by, per_group=per_graft, seed=seed)
    run.folder.write_table(TOP_TOKENS, table)  # with its metadata, atomically
    lists = [c for c, t in table.schema.items() if isinstance(t, pl.List)]
    done.files[TOP_TOKENS] = run.folder.path / f"{TOP_TOKENS}.csv"
    write_csv(table.drop(lists), done.files[TOP_TOKENS])
    # the first sampled example of each group (sampled indices need not include 0)
    first_example = pl.col("example") == pl.col("example").min().over(by)
    first = table.filter(first_example).select([*by, "rank", "token", "prob", "is_target"])
    with pl.Config(tbl_rows=60, fmt_str_lengths=30, tbl_hide_dataframe_shape=True):
        done.lines.append(str(first.head(60)))
    done.lines.append(f"top tokens: {done.files[TOP_TOKENS]}")


def custom(
    specs: RunSpecs,
    graft_specs: Sequence[str],
    donors: Mapping[str, ModelSource] | None = None,
    base: ModelSource = ModelSource("pretrained"),  # noqa: B008 - frozen dataclass
    references: bool = True,
) -> Design:
    """Any graft specs on the dataset's test prompts, with any donors (None: ``sft``, the
    protocol's donor variant) and base; ``references`` adds PRE and (with a donor ``sft``)
    SFT. Under the paper's protocol the test prompts come from the both-direction dataset
    when a variant model is trained on both directions."""
    specs = specs_for(specs, "custom")
    donors = dict(donors or {"sft": ModelSource(specs.protocol.donor_variant)})
    grafts = graft_list(graft_specs, specs.analysis.head_policy, specs.protocol)
    if references:
        refs = [reference("PRE", None)] + ([reference("SFT", "sft")] if "sft" in donors else [])
        grafts = refs + grafts
    variants = [s.variant for s in (base, *donors.values()) if not s.path]
    both = any(v != "pretrained" and parse_variant(v)[0] == "both" for v in variants)
    fields = protocol_fields(specs.protocol, "both" if both else "one")
    return one_run(specs, grafts, base=base, donors=donors, **fields)


__all__ = [
    "TOKEN_SPECS",
    "TOP_TOKENS",
    "custom",
    "hybrid",
    "layers",
    "necessity",
    "position",
    "tokens",
]
