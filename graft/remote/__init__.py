"""Running grafts on an NDIF server: config, payload accounting, the nnsight client, the
remote executor, hosted graft pairs."""
