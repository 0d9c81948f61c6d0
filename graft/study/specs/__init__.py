"""What a study run is: its configs (datasets, experiments, model sources, replicates), the
finetune presets, the paper's text templates and relations, and the named grafts. The lowest
layer of :mod:`graft.study`: imports nothing else of it."""
