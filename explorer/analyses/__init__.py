"""Analyses of a loaded trace: one module per question, each a function of a `Trace`
returning DataFrames (nothing draws). `Trace`'s methods are the usual way in.

- step_breakdown: where each step's time goes, device side and host side
- idle: device idle gaps and their reasons
- statistics: op, module and kernel statistics
- engine_utilisation: per-engine utilisation over time
- efficiency: MFU, HFU and MBU per step
- roofline: arithmetic intensity and compute/memory bound per op
- memory: HBM in use over time, its peak and what holds it
- compilation: compiled graphs, graph breaks, recompiles
- summary: the headline numbers
- intervals: interval unions used by the others
"""
