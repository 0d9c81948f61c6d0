"""The patching sweep as a design: weight grafting beside activation patching, layer by layer
(or in windows), per position unit and kind of site, in each direction; one run per
(direction, method), then the sweep's report (effects, contrasts, findings, maps)."""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from graft.core import architecture_of, parse_spec
from graft.errors import ExperimentError
from graft.models import LoadedModel, context_length, load_model
from graft.study.analyses.patching import executor_for
from graft.study.analyses.patching_report import write_sweep_report
from graft.study.analyses.patching_sweep import check_choices, direction_models, sweep_grafts
from graft.study.data.rows import load_examples, sample_examples
from graft.study.designs.common import layer_reuse_note, specs_for
from graft.study.designs.design import Design, DesignRun
from graft.study.planning.model_size import model_size
from graft.study.specs.choices import METHODS, PATCH_MODES, SITE_KINDS, UNITS, WHOLE_DEPTH
from graft.study.specs.config import ModelSource
from graft.study.specs.grafts import with_protocol
from graft.study.specs.request import RunRequest
from graft.study.specs.run import RunSpecs
from graft.study.training.sources import dataset_dir, resolve_model_path


def run_methods(methods: Sequence[str], kinds: Sequence[str], whole: Sequence[str]) -> list[str]:
    """The runs of one direction: ``weights`` (every kind), ``activation`` (attention and
    MLP outputs, and the whole-depth cells) and ``residual`` (layer outputs)."""
    runs = ["weights"] if "weights" in methods else []
    if "patching" in methods:
        if {"attn", "mlp"} & set(kinds) or whole:
            runs.append("activation")
        if "residual" in kinds:
            runs.append("residual")
    return runs


def patching(
    specs: RunSpecs,
    units: Sequence[str] = UNITS,
    kinds: Sequence[str] = SITE_KINDS,
    modes: Sequence[str] = PATCH_MODES,
    window: int = 1,
    methods: Sequence[str] = METHODS,
    whole_depth: Sequence[str] = WHOLE_DEPTH,
    variant: str | None = None,
    model: LoadedModel | None = None,
    reuse: bool = True,
) -> Design:
    """The sweep of the finetuned ``variant`` (None: the protocol's) against the pretrained
    model (``model``: it, loaded; None: loaded here, on the CPU, for its architecture and
    tokenizer): each unit x layer (``window`` layers centred on
    it) x kind of site, by each method, in each mode (``restore``: PRE runs and SFT's
    values go in; ``break``: the reverse); ``whole_depth`` position sets also in every layer
    at once. Each (mode, method) runs into ``<folder>/<mode>-<method>``; the report goes
    into the folder itself. ``reuse``: each cell runs from its first changed layer on, the
    layers below it once per prompt (:mod:`graft.core.execution.resume`; equal to rounding);
    False: every cell its whole forward.

    Raises:
        SpecError: a unit or whole-depth set that is no position expression; a kind, mode
            or method graft does not know.
        ExperimentError: no unit, a window wider than the model, or a remote run.
    """
    specs = specs_for(specs, "patching")
    units = list(units)
    for pos in (*units, *whole_depth):
        parse_spec(f"{pos}:all:all")
    kinds = check_choices(list(kinds), SITE_KINDS, "kinds")
    modes = check_choices(list(modes), PATCH_MODES, "modes")
    methods = check_choices(list(methods), METHODS, "methods")
    if not units:
        raise ExperimentError("name at least one position unit, e.g. LT", param="positions")
    if specs.execution.remote_run:
        raise ExperimentError("patching runs on this machine only; drop the remote options")
    if model is None:
        path = resolve_model_path(specs, ModelSource())
        model = load_model(path, dtype=specs.execution.dtype, device="cpu")
    arch = architecture_of(model.model)
    if window > arch.n_layers:
        raise ExperimentError(
            f"window {window} is more than the model's {arch.n_layers} layers", param="window"
        )
    variant = variant or specs.protocol.donor_variant
    folder = specs.out_folder()
    runs, grafts, references = {}, {}, {}
    for mode in modes:
        direction = direction_models(mode, variant)
        references[mode] = (direction.base_label, direction.donor_label)
        for method in run_methods(methods, kinds, whole_depth):
            policy = specs.analysis.head_policy
            made = sweep_grafts(arch, method, direction, units, window, kinds, policy, whole_depth)
            grafts[(mode, method)] = with_protocol(made, specs.protocol)
            runs[f"{mode}-{method}"] = RunRequest(
                specs=specs_for(specs, "patching", out=str(folder / f"{mode}-{method}")),
                grafts=tuple(grafts[(mode, method)]),
                base=direction.base,
                donors=direction.donors,
                extra_config={"patching_method": method, "direction": mode},
                executor=executor_for(method, reuse=reuse),
            )
    config = {
        "experiment": "patching",
        "model": specs.donors.model,
        "variant": variant,
        "units": units,
        "kinds": kinds,
        "directions": modes,
        "window": window,
        "methods": methods,
        "whole_depth": list(whole_depth),
        "runs": list(runs),
        "n": specs.data.n,
        "seed": specs.analysis.seed,
        "protocol": specs.protocol.name,
        "head_policy": specs.analysis.head_policy,
        "layer_reuse": reuse,
    }

    def report(done: DesignRun) -> None:
        assert model is not None  # loaded above
        found, _ = load_examples(
            dataset_dir(specs), model.tokenizer, specs.data, context_length(model.model)
        )
        prompts = sample_examples(found, specs.data.n, specs.data.sample_seed)
        result = write_sweep_report(
            folder,
            grafts,
            references,
            arch,
            prompts,
            config,
            units=units,
            model=specs.donors.model,
            n_boot=max(specs.analysis.n_boot, 1),
            seed=specs.analysis.seed,
        )
        done.result = result
        done.lines += summary_lines(result.findings)
        done.figures += result.figures
        done.lines.append(f"results: {folder}")

    notes = [reuse_note(model, specs.execution.batch_size)] if reuse else []
    return Design("patching", folder, runs, finish=report, figures=False, notes=tuple(notes))


def reuse_note(model: LoadedModel, batch_size: int) -> str:
    """What reusing the layers below each cell holds for ``model``
    (:func:`~graft.study.designs.common.layer_reuse_note`), patching's donor outputs too."""
    config = model.model.config
    text = getattr(config, "get_text_config", lambda: config)()
    itemsize = next(model.model.parameters()).element_size()
    return layer_reuse_note(
        int(text.num_hidden_layers),
        int(text.hidden_size),
        itemsize,
        batch_size,
        patching=True,
        kv_width=model_size(config).kv_width,
    )


def summary_lines(findings: pl.DataFrame) -> list[str]:
    """One line per (direction, kind, unit, method) of a sweep's findings."""
    lines = []
    for r in findings.iter_rows(named=True):
        half = "never" if r["first_layer_half"] is None else f"layer {r['first_layer_half']}"
        differ = ""
        if r.get("layers_tested"):
            differ = f"; methods differ at {r['layers_differ']} of {r['layers_tested']} layers"
        lines.append(
            f"{r['direction']} {r['kind']} {r['unit']} [{r['method']}]: peak effect "
            f"{r['peak_effect']:.2f} at layer {r['peak_layer']}, half reached {half}{differ}"
        )
    return lines
