"""The paper's study in eight rooms, lowest first (each imports only those below it; a
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
- ``analyses``: on top of the runner: the logit lens, patching sweeps, top-1 kinds;
- ``designs``: the paper's experiments as library objects (a design: its runs, how their
  tables combine, its figures), run by one function with the one runner; the attribution
  experiment (a request run into a run folder by :func:`run_attribution`);
- ``studies``: models x finetune seeds x experiments from one TOML file, planned, run,
  reported and collected as one study.
"""

from graft.lazy import lazy_exports

#: module -> the public names it defines (each imported on first access; ``name=attr``
#: where the module calls it otherwise).
_EXPORTS = {
    "graft.study.studies.study_file": ("Study", "read_study"),
    "graft.study.studies.plan": ("StudyPlan", "plan_study"),
    "graft.study.studies.execute": ("StudyResult", "run_study"),
    "graft.study.studies.status": ("RunStatus", "status_lines", "study_status"),
    "graft.study.studies.collect": ("Collected", "collect_study"),
    "graft.study.studies.slurm": ("Submission", "slurm_status_lines", "submit_study"),
    "graft.study.designs.design": ("Design", "DesignRun", "plan_design", "run_design"),
    "graft.study.designs.component": ("component_design=component", "PAIRS"),
    "graft.study.designs.paper": (
        "custom_design=custom",
        "hybrid_design=hybrid",
        "layers_design=layers",
        "necessity_design=necessity",
        "position_design=position",
        "tokens_design=tokens",
    ),
    "graft.study.designs.lens": ("lens_design=lens",),
    "graft.study.designs.attribution": ("AttributionRun", "attribution_lines", "run_attribution"),
    "graft.study.specs.attribution": ("AttributionRequest",),
    "graft.study.designs.patching": ("patching_design=patching",),
    "graft.study.specs.request": ("RunRequest",),
    "graft.study.specs.donor": ("DatasetRequest", "DonorRequest"),
    "graft.study.running.donor_job": ("run_donor_job", "donor_job_lines", "plan_donor_job"),
    "graft.study.designs.common": ("sft_design",),
    "graft.study.training.sources": (
        "finetune_record",
        "model_fingerprint",
        "model_sources",
        "resolve_model_path",
    ),
    "graft.study.training.donors": ("accept_donor",),
    "graft.study.running.placement": (
        "MODEL_FOLDER",
        "RUN_FOLDER",
        "check_out_placement",
        "folder_kind",
    ),
    "graft.study.training.recall": (
        "MIN_GAIN",
        "model_recall",
        "trained_model_lines",
        "training_line",
    ),
    "graft.study.analyses.lens": (
        "LensAnalysis",
        "LensRun",
        "check_lens_config",
        "draw_lens_figures",
        "draw_run_figures",
    ),
    "graft.study.analyses.lens_tables": ("LENS_SUMMARY", "LENS_TABLE", "LENS_TOP_TOKENS"),
    "graft.study.analyses.patching": ("executor_for",),
    "graft.study.analyses.patching_report": ("write_sweep_report",),
    "graft.study.analyses.patching_sweep": (
        "check_choices",
        "direction_models",
        "sweep_grafts",
    ),
    "graft.study.analyses.top1": ("TOP1_KINDS", "group_columns", "write_top1_kinds"),
    "graft.study.data.datasets": (
        "DatasetConfig",
        "default_dataset_name",
        "generate_dataset",
        "load_manifest",
    ),
    "graft.study.data.dataset_folder": ("dataset_line",),
    "graft.study.specs.choices": (
        "DEFAULT_N_FACTS",
        "DEFAULT_TOP_K",
        "METHODS",
        "PATCH_MODES",
        "SITE_KINDS",
        "TOKEN_SPECS",
        "UNITS",
        "WHOLE_DEPTH",
        "GENERATED_KINDS",
        "KINDS",
        "POSITIONS",
        "VARIANT_ALIASES",
        "VARIANTS",
    ),
    "graft.study.data.names": ("load_real_actors", "name_exclusion_reason"),
    "graft.study.data.rows": ("load_examples", "sample_examples"),
    "graft.study.data.prompts": ("entity_prompts",),
    "graft.study.planning.device_memory": ("device_memory", "needed_bytes"),
    "graft.study.planning.finetune_plan": (
        "finetune_lines",
        "plan_donor",
        "plan_finetune",
        "scratch_workspace",
    ),
    "graft.study.planning.memory": (
        "MemoryPlan",
        "estimate_finetune_bytes",
        "estimate_grafting_bytes",
    ),
    "graft.study.planning.run_plan": ("check_fits", "plan_experiment"),
    "graft.study.running.runner": (
        "ExperimentRun",
        "print_summary",
        "run_experiment",
    ),
    "graft.study.specs.config": (
        "EXPERIMENT_RANGES",
        "ExperimentConfig",
        "ModelSource",
        "SHUFFLES",
    ),
    "graft.study.specs.grafts": (
        "COMPONENT_SETS",
        "NamedGraft",
        "check_layer_rule",
        "component_grafts",
        "head_suffix",
        "hybrid_grafts",
        "layer_windows",
        "necessity_grafts",
        "paper_token_graft",
        "position_grafts",
        "protocol_notes",
        "reference",
        "spec_graft",
        "with_protocol",
    ),
    "graft.study.specs.presets": (
        "FINETUNE_RANGES",
        "FinetuneConfig",
        "PRESETS",
        "STEPS",
        "WEIGHTS_DTYPES",
        "resolve_config",
    ),
    "graft.study.specs.protocol": ("Protocol", "GRAFT", "PAPER", "protocol_of"),
    "graft.study.specs.run": ("RunSpecs", "default_out", "resolve"),
    "graft.study.specs.templates": ("DIRECTIONS", "TEST_TEMPLATES"),
    "graft.study.training.finetune": ("finetune",),
    "graft.study.training.workspace": (
        "Workspace",
        "default_workspace",
        "parse_variant",
    ),
}
__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS, globals())
