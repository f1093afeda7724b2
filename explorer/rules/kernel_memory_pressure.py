"""An NKI kernel whose SBUF or PSUM high-water mark is near the capacity: there is no
room left for more buffers, and a larger tile or one more live tile overflows."""

from __future__ import annotations

from typing import TYPE_CHECKING

from neuron_explorer.analyses.kernel_lines import nki_runs
from neuron_explorer.rules import thresholds as th
from neuron_explorer.rules.finding import Finding, evidence, make

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

RULE_ID = "kernel_memory_pressure"
MEMORIES = (("sbuf_bytes", "SBUF"), ("psum_bytes", "PSUM"))


def check(trace: Trace) -> list[Finding]:
    runs = nki_runs(trace)
    figures = trace.hardware_figures or {}
    if not len(runs):
        return []
    findings = []
    for name, mine in runs.groupby("name", sort=False):
        for column, memory in MEMORIES:
            capacity = float(figures.get(column) or 0)
            if not capacity or column not in mine:
                continue
            peak = mine.loc[mine[column].idxmax()]
            share = float(peak[column]) / capacity
            if share < th.KERNEL_MEMORY_PRESSURE:
                continue
            item = evidence(peak["ts"], peak["dur"], [peak["id"]],
                            f"{name}: {memory} high-water {peak[column] / 2**10:.0f} KiB of "
                            f"{capacity / 2**10:.0f} KiB ({share:.0%})")
            fix = ("keep fewer accumulation groups in flight (each [128, 512] fp32 tile is "
                   "one of the 8 PSUM banks) and copy results out of PSUM as soon as they "
                   "are complete" if memory == "PSUM" else
                   "use smaller blocks (fewer tiles per block), drop references to tiles no "
                   "longer needed, or store intermediate results in a smaller dtype")
            findings.append(make(
                trace, RULE_ID, f"Kernel {name}: {memory} {share:.0%} full", 0.0, [item],
                f"{name} holds {share:.0%} of {memory} at its peak. No time is counted: the "
                "kernel runs, but there is no room for more buffers (so loads cannot run "
                "further ahead) and a larger tile or one more live tile overflows.",
                f"Leave headroom: {fix}.",
                severity_override="high" if share >= 0.97 else "medium"))
    return findings
