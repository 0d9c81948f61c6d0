"""Analyses on top of the runner: the logit lens, activation and residual patching and the
layer-by-layer patching sweep, and the kinds of top-1 tokens."""
