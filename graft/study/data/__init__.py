"""The study's data: facts and names, generated and user datasets, test prompts tokenized
for a model, the texts a finetune trains on, and an experiment's rows."""
