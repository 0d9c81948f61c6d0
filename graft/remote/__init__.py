"""Running grafts on an NDIF server: the client, payload accounting, hosted graft pairs."""
