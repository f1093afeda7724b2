"""What a trace recorded: `--level framework` has no ops or kernels, `op` no engine events,
and a PyTorch-profiler trace of a CPU-only program no device at all.

Figures that need what was not recorded (device time, MFU, engines) are "not recorded
at this level" or "no device in this trace", never 0%.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from neuron_explorer.common import trace_format as tf

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

LEVELS = tf.LEVELS


def recorded_level(trace: Trace) -> str | None:
    """The recording level of one of our traces (None: unknown, e.g. a PyTorch-profiler trace)."""
    level = trace.metadata.get(tf.META_LEVEL)
    return level if level in LEVELS else None


def records_device(trace: Trace) -> bool:
    """Whether the trace can say what the device did: ops and kernels were recorded, and
    (for a trace from another profiler) it has a device at all."""
    level = recorded_level(trace)
    if level is not None:
        return level != "framework"
    return bool((trace.tracks["device"] >= 0).any())


def not_recorded(trace: Trace) -> str:
    """The words for a figure the trace did not record."""
    level = recorded_level(trace)
    return f"not recorded at --level {level}" if level else "no device in this trace"


def modelled_host_clock(trace: Trace) -> bool:
    """Whether the host's times are the ops' modelled costs (`NEURON_HOST_CLOCK=modelled`):
    data loading, sleeps, I/O, Python work between ops and compiling count nothing there."""
    clock = trace.metadata.get(tf.META_HOST_CLOCK)
    return isinstance(clock, dict) and clock.get("source") == "modelled"
