"""The paper's study: datasets, finetuning, the named grafts and the experiment runner."""
