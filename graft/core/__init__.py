"""The grafting engine and what it stands on: the spec language, the family tables, batch
plans, the trace code, the execution loop, token spans, tiny models. Imports nothing of
graft above it."""
