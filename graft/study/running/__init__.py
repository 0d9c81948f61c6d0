"""The one experiment runner: inputs, each replicate's grafts, stored batches, whole-name
scoring, the run record, summaries and stage times."""
