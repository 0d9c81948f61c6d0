"""What a study run is: its configs (datasets, experiments, model sources, replicates), the
finetune presets, the paper's text templates and relations, the named grafts and the
attribution experiment's request. The lowest layer of :mod:`graft.study`: imports nothing
else of it."""
