"""How a predicted trace names itself in reports, diffs and the dashboard."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

META_WHATIF = "whatif"  # the metadata entry of a trace `whatif` predicted


def prediction_text(trace: Trace) -> str:
    """'what-if prediction from run.pftrace (trn1): trn3, compiled, bf16 matmuls' for a
    predicted trace; '' for a recorded one."""
    meta = trace.metadata.get(META_WHATIF)
    if not isinstance(meta, dict):
        return ""
    parts = [str(meta.get("hardware")), str(meta.get("mode"))]
    if meta.get("dtype"):
        parts.append(f"{meta['dtype']} matmuls")
    return (f"what-if prediction from {meta.get('from')} ({meta.get('recorded_hardware')}): "
            + ", ".join(parts) + " (not a recording; docs/whatif.md)")


def hardware_label(trace: Trace) -> str | None:
    """The trace's hardware, marked "predicted" for a what-if prediction."""
    if isinstance(trace.metadata.get(META_WHATIF), dict):
        return f"{trace.hardware}, predicted"
    return trace.hardware
