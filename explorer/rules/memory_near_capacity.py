"""Device memory near capacity: one larger batch or activation away from running out."""

from __future__ import annotations

from typing import TYPE_CHECKING

from neuron_explorer.analyses.memory import peak_memory
from neuron_explorer.device_terms import device_terms
from neuron_explorer.peaks import hbm_capacity
from neuron_explorer.rules import thresholds as th
from neuron_explorer.rules.finding import Finding, evidence, make, trains

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

RULE_ID = "memory_near_capacity"


def capacity(trace: Trace) -> int | None:
    """Device memory capacity: the hardware figures, or a profiled GPU's totalGlobalMem."""
    cap = hbm_capacity(trace.hardware_figures)
    if cap:
        return cap
    props = trace.metadata.get("deviceProperties") or []
    if props and isinstance(props[0], dict) and props[0].get("totalGlobalMem"):
        return int(props[0]["totalGlobalMem"])
    return None


def check(trace: Trace) -> list[Finding]:
    cap = capacity(trace)
    peaks = peak_memory(trace)
    if not cap or not len(peaks):
        return []
    findings = []
    holders = trace.memory_at_peak()
    for device, peak, ts in peaks.itertuples(index=False):
        use = peak / cap
        if use < th.MEMORY_NEAR_CAPACITY:
            continue
        top = holders[holders["device"] == device].head(3)
        names = ", ".join(f"{r.op}{' in ' + r.module if r.module else ''} "
                          f"({r.bytes / 2**20:.0f} MiB)" for r in top.itertuples())
        findings.append(make(
            trace, RULE_ID, f"Device {device} memory at {use:.0%} of capacity", 0,
            [evidence(ts, 0, [], f"peak {peak / 2**30:.2f} GiB of {cap / 2**30:.2f} GiB")],
            f"Peak device memory reaches {use:.0%} of the {cap / 2**30:.2f} GiB available"
            + (f"; largest holders at the peak: {names}" if names else "") + ".",
            _resident_first(holders[holders["device"] == device]) + _advice(trace),
            severity_override="high" if use >= th.MEMORY_CRITICAL else "medium"))
    return findings


# a holder this share of the peak, made outside the model, is what fills the memory
RESIDENT_MIN_SHARE = 0.5


def _resident_first(holders) -> str:
    """Where one tensor made outside the model holds most of the peak (a buffer or table the
    program keeps): that, which no activation advice frees. A user's 10 GiB table held 92%
    of a peak, and checkpointing every block, as advised, took it to 88% for 17% slower
    steps."""
    if not len(holders):
        return ""
    first = holders.iloc[0]
    if first["share_of_peak"] < RESIDENT_MIN_SHARE or first["module"]:
        return ""
    return (f"{first['share_of_peak']:.0%} of the peak is one tensor made outside the model "
            f"({first['op']}, {first['bytes'] / 2**20:.0f} MiB): a buffer the program keeps, "
            "not what the steps make: free it when unused, keep it in bf16 or on the host, or "
            "shard it across devices; what follows, about the steps' own memory, cannot shrink "
            "it. ")


def _advice(trace: Trace) -> str:
    """What frees memory: in training, the activations kept for backward; in inference
    (nothing kept for a backward), the cache and batch sized to leave headroom."""
    if trains(trace):
        return ("Cut activation memory before it runs out: activation checkpointing "
                "(torch.utils.checkpoint) on the largest modules, which runs their forwards "
                "again in the backward (slower steps), a smaller micro-batch with gradient "
                "accumulation, bf16 activations, and freeing tensors kept for logging.")
    free = f"torch.{device_terms(trace.metadata).name}.mem_get_info()"
    return ("Leave headroom for each call's temporaries: size the KV cache or batch from the "
            f"memory actually free ({free}) rather than a fixed share, keep weights and cache "
            "in bf16, serve fewer sequences at once, and free tensors kept for logging.")
