"""Plans before anything heavy loads: a model's size from its config, memory per part of a
finetune or a grafting run, the device's free memory, the rows a run will compute, and the
plans of a finetune, of a remote run and of a command."""
