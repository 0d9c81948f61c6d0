"""The paper's study: datasets, finetuning, the workspace, the named grafts and the runner.

Datasets: ``templates`` (texts and fields) < ``names`` (name filter, fakes) < ``facts`` (the
facts of each data kind) < ``datasets`` (a dataset folder: build, write, read) < ``prompts``
(test prompts tokenized for a tokenizer); ``files`` reads and writes their JSONL and corpora.
Donors: ``presets`` (finetune configs) < ``training_data`` < ``evaluate`` (``eval.json``
through :mod:`graft.results.metrics`) < ``finetune`` (training) < ``workspace`` (datasets
and donors on disk, found or made). Experiments: ``config`` < ``grafts`` < ``rows``,
``sources`` < ``runner`` (:func:`~graft.study.running.runner.run_experiment`).
"""
