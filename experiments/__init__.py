"""Thin Click commands, one per experiment, over the graft library."""
