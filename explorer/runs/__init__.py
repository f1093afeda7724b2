"""Runs: the traces of one job's ranks read together (`Run`), their per-rank digests,
the files that make a run, its report, and the cluster that loads them in parallel."""
