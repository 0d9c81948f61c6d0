"""Finetuned donors: finetuning, evaluation, checksums, where models come from and the
workspace that holds datasets and donors."""
