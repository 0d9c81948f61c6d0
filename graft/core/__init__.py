"""The grafting engine and what it stands on: the spec language, the family tables, token spans, tiny models. Imports nothing of graft above it."""
