"""What a run produces: per-example metrics, run folders, figures."""
