"""Plans before anything heavy loads: memory per part of a finetune or a grafting run, the
device's free memory, and the plans of a finetune and of a command."""
