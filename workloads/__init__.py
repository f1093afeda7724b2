"""Reference workloads: the models and training loops used by the demo, tests and benchmarks."""
