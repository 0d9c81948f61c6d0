"""What a run produces: per-example metrics and summaries, run folders and their records,
publishing into ``results/``; ``stats`` (intervals, paired tests, verdicts and their
words), ``paper`` (the paper's numbers and their tests against a run) and ``plots``
(figures)."""

from graft.lazy import lazy_exports

#: module -> the public names it defines (each imported on first access; ``name=attr``
#: where the module calls it otherwise).
_EXPORTS = {
    "graft.results.accept": ("accept_run_tables", "unmarked_tables"),
    "graft.results.attribution_agreement": (
        "MIN_INTERVAL_PROMPTS",
        "cell_summary",
        "multicell_summary",
        "pearson_interval",
        "pooled_agreement",
        "reported_interval",
    ),
    "graft.results.repair": ("repair_run_folder",),
    "graft.results.compare": ("KEY_CONTRASTS", "compare_run", "format_comparison"),
    "graft.results.folder": ("RunFolder",),
    "graft.results.record": (
        "GraftEntry",
        "ModelEntry",
        "ReplicateEntry",
        "RunRecord",
        "read_run_record",
    ),
    "graft.results.metrics": ("top_tokens_table",),
    "graft.results.run_log": ("console_logging", "console_session"),
    "graft.results.provenance": ("git_commit", "git_dirty", "machine_info"),
    "graft.results.publish": ("PROVENANCE_FILE", "provenance_entries", "publish_run"),
    "graft.results.benchmark_tables": ("machine_label", "write_benchmark_table"),
    "graft.results.report": ("LAYER_SEP", "draw_figures", "draw_summary_figures"),
    "graft.results.top1_kinds": ("top1_kinds_wide",),
    "graft.results.plots.heatmap": ("attribution_map",),
    "graft.results.plots.style": ("save_figure",),
    "graft.results.tracking": (
        "TRACKERS",
        "Tracking",
        "close",
        "log_results",
        "missing_package",
        "reporting",
        "tracking_for",
    ),
    "graft.results.paper.agreement": ("Check", "check_run", "read_csv_table", "read_results"),
    "graft.results.paper.numbers": ("PaperNumber", "PAPER_NUMBERS", "paper_model_of"),
    "graft.results.stats.agreement": ("ALPHA", "MARGIN", "rules_summary", "rules_text"),
    "graft.results.stats.wording": ("format_p", "reason_text", "short_text", "test_text"),
    "graft.results.stats.paired": ("seed_level_p",),
}
__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS, globals())
