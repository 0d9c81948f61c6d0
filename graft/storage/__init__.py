"""Storage: files that are either whole or absent (atomic writes), cross-process locks, and
tables that carry their provenance in their metadata. Imports only :mod:`graft.errors`."""
