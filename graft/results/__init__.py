"""What a run produces: per-example metrics and summaries, run folders and their records,
publishing into ``results/``; ``stats`` (intervals, paired tests, verdicts and their
words), ``paper`` (the paper's numbers and their tests against a run) and ``plots``
(figures)."""

from graft.lazy import lazy_exports

#: public name -> the module that defines it (imported on first access).
_EXPORTS = {
    "accept_run_tables": "graft.results.accept",
    "unmarked_tables": "graft.results.accept",
    "repair_run_folder": "graft.results.repair",
    "KEY_CONTRASTS": "graft.results.compare",
    "compare_run": "graft.results.compare",
    "format_comparison": "graft.results.compare",
    "RunFolder": "graft.results.folder",
    "GraftEntry": "graft.results.record",
    "ModelEntry": "graft.results.record",
    "ReplicateEntry": "graft.results.record",
    "RunRecord": "graft.results.record",
    "read_run_record": "graft.results.record",
    "top_tokens_table": "graft.results.metrics",
    "machine_info": "graft.results.provenance",
    "PROVENANCE_FILE": "graft.results.publish",
    "machine_label": "graft.results.benchmark_tables",
    "provenance_entries": "graft.results.publish",
    "publish_run": "graft.results.publish",
    "write_benchmark_table": "graft.results.benchmark_tables",
    "LAYER_SEP": "graft.results.report",
    "draw_figures": "graft.results.report",
    "draw_summary_figures": "graft.results.report",
    "top1_kinds_wide": "graft.results.top1_kinds",
    "Check": "graft.results.paper.agreement",
    "check_run": "graft.results.paper.agreement",
    "read_csv_table": "graft.results.paper.agreement",
    "read_results": "graft.results.paper.agreement",
    "PaperNumber": "graft.results.paper.numbers",
    "PAPER_NUMBERS": "graft.results.paper.numbers",
    "paper_model_of": "graft.results.paper.numbers",
    "ALPHA": "graft.results.stats.agreement",
    "MARGIN": "graft.results.stats.agreement",
    "rules_summary": "graft.results.stats.agreement",
    "rules_text": "graft.results.stats.agreement",
    "format_p": "graft.results.stats.verdict",
    "seed_level_p": "graft.results.stats.paired",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
