"""The paper's study in six rooms, lowest first (each imports only those below it; a
contract in pyproject.toml):

- ``specs``: what a run is: configs (datasets, experiments, model sources, replicates), the
  finetune presets, the protocols, the paper's templates, the named grafts;
- ``data``: facts and names, datasets on disk, test prompts tokenized for a model, the
  texts a finetune trains on, an experiment's rows;
- ``training``: finetuned donors: finetuning, evaluation, checksums, model sources and the
  workspace that holds datasets and donors;
- ``planning``: plans before anything heavy loads (memory, device, a finetune, a command);
- ``running``: the one experiment runner
  (:func:`~graft.study.running.runner.run_experiment`), its batches and record;
- ``analyses``: on top of the runner: the logit lens, patching sweeps, top-1 kinds.
"""

from graft.lazy import lazy_exports

#: public name -> the module that defines it (imported on first access).
_EXPORTS = {
    "accept_donor": "graft.study.training.donors",
    "LensAnalysis": "graft.study.analyses.lens",
    "LensRun": "graft.study.analyses.lens",
    "check_lens_config": "graft.study.analyses.lens",
    "draw_lens_figures": "graft.study.analyses.lens",
    "LENS_SUMMARY": "graft.study.analyses.lens_tables",
    "LENS_TABLE": "graft.study.analyses.lens_tables",
    "LENS_TOP_TOKENS": "graft.study.analyses.lens_tables",
    "DEFAULT_TOP_K": "graft.study.analyses.lens_trace",
    "executor_for": "graft.study.analyses.patching",
    "write_sweep_report": "graft.study.analyses.patching_report",
    "PATCH_MODES": "graft.study.analyses.patching_sweep",
    "SITE_KINDS": "graft.study.analyses.patching_sweep",
    "UNITS": "graft.study.analyses.patching_sweep",
    "WHOLE_DEPTH": "graft.study.analyses.patching_sweep",
    "check_choices": "graft.study.analyses.patching_sweep",
    "direction_models": "graft.study.analyses.patching_sweep",
    "sweep_grafts": "graft.study.analyses.patching_sweep",
    "TOP1_KINDS": "graft.study.analyses.top1",
    "group_columns": "graft.study.analyses.top1",
    "write_top1_kinds": "graft.study.analyses.top1",
    "DatasetConfig": "graft.study.data.datasets",
    "default_dataset_name": "graft.study.data.datasets",
    "generate_dataset": "graft.study.data.datasets",
    "load_manifest": "graft.study.data.datasets",
    "DEFAULT_N_FACTS": "graft.study.data.facts",
    "KINDS": "graft.study.data.facts",
    "load_real_actors": "graft.study.data.names",
    "name_exclusion_reason": "graft.study.data.names",
    "load_examples": "graft.study.data.rows",
    "sample_examples": "graft.study.data.rows",
    "device_memory": "graft.study.planning.device_memory",
    "needed_bytes": "graft.study.planning.device_memory",
    "finetune_lines": "graft.study.planning.finetune_plan",
    "plan_donor": "graft.study.planning.finetune_plan",
    "plan_finetune": "graft.study.planning.finetune_plan",
    "scratch_workspace": "graft.study.planning.finetune_plan",
    "MemoryPlan": "graft.study.planning.memory",
    "estimate_finetune_bytes": "graft.study.planning.memory",
    "estimate_grafting_bytes": "graft.study.planning.memory",
    "check_fits": "graft.study.planning.run_plan",
    "plan_experiment": "graft.study.planning.run_plan",
    "ExperimentRun": "graft.study.running.runner",
    "default_out": "graft.study.running.runner",
    "print_summary": "graft.study.running.runner",
    "run_experiment": "graft.study.running.runner",
    "EXPERIMENT_RANGES": "graft.study.specs.config",
    "ExperimentConfig": "graft.study.specs.config",
    "ModelSource": "graft.study.specs.config",
    "SHUFFLES": "graft.study.specs.config",
    "COMPONENT_SETS": "graft.study.specs.grafts",
    "NamedGraft": "graft.study.specs.grafts",
    "POSITIONS": "graft.study.specs.grafts",
    "check_layer_rule": "graft.study.specs.grafts",
    "component_grafts": "graft.study.specs.grafts",
    "head_suffix": "graft.study.specs.grafts",
    "hybrid_grafts": "graft.study.specs.grafts",
    "layer_windows": "graft.study.specs.grafts",
    "necessity_grafts": "graft.study.specs.grafts",
    "paper_token_graft": "graft.study.specs.grafts",
    "position_grafts": "graft.study.specs.grafts",
    "protocol_notes": "graft.study.specs.grafts",
    "reference": "graft.study.specs.grafts",
    "spec_graft": "graft.study.specs.grafts",
    "with_protocol": "graft.study.specs.grafts",
    "FINETUNE_RANGES": "graft.study.specs.presets",
    "FinetuneConfig": "graft.study.specs.presets",
    "PRESETS": "graft.study.specs.presets",
    "STEPS": "graft.study.specs.presets",
    "WEIGHTS_DTYPES": "graft.study.specs.presets",
    "resolve_config": "graft.study.specs.presets",
    "Protocol": "graft.study.specs.protocol",
    "RunSpecs": "graft.study.specs.run",
    "resolve": "graft.study.specs.run",
    "DIRECTIONS": "graft.study.specs.templates",
    "TEST_TEMPLATES": "graft.study.specs.templates",
    "finetune": "graft.study.training.finetune",
    "resolve_model_path": "graft.study.training.sources",
    "GENERATED_KINDS": "graft.study.training.workspace",
    "VARIANT_ALIASES": "graft.study.training.workspace",
    "Workspace": "graft.study.training.workspace",
    "default_workspace": "graft.study.training.workspace",
    "parse_variant": "graft.study.training.workspace",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
