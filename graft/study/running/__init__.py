"""The one experiment runner: inputs, stored batches, whole-name scoring, the run record,
summaries and stage times."""
