"""What a trace recorded: `--level framework` has no ops or kernels, `op` no engine events.

Figures that need what was not recorded (device time, MFU, engines) are "not recorded
at this level", never 0%.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from neuron_explorer import trace_format as tf

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

LEVELS = tf.LEVELS


def recorded_level(trace: Trace) -> str | None:
    """The recording level of one of our traces (None: unknown, e.g. a PyTorch-profiler trace)."""
    level = trace.metadata.get(tf.META_LEVEL)
    return level if level in LEVELS else None


def records_device(trace: Trace) -> bool:
    """Whether the trace can say what the device did: ops and kernels were recorded."""
    return recorded_level(trace) != "framework"


def not_recorded(trace: Trace) -> str:
    """The words for a figure the trace's level did not record."""
    return f"not recorded at --level {recorded_level(trace)}"
