"""An NKI kernel whose SBUF or PSUM high-water mark is near the capacity: there is no
room left for more buffers, and a larger tile or one more live tile overflows. A kernel
whose live SBUF tiles exceed the capacity spills them to HBM and reloads them
(backend/hardware/spills.py): that traffic, and the time it runs with no compute engine
busy, is the finding then."""

from __future__ import annotations

from typing import TYPE_CHECKING

from neuron_explorer.analyses.kernel_lines import nki_instructions, nki_runs
from neuron_explorer.common.engine_profile import SPILL_OPCODES, spill_profile
from neuron_explorer.render import fmt_ns
from neuron_explorer.rules import thresholds as th
from neuron_explorer.rules.finding import Finding, evidence, make
from neuron_explorer.rules.host_bound import device_saving

if TYPE_CHECKING:
    import pandas as pd
    from neuron_explorer.trace import Trace

RULE_ID = "kernel_memory_pressure"
MEMORIES = (("sbuf_bytes", "SBUF"), ("psum_bytes", "PSUM"))


def check(trace: Trace) -> list[Finding]:
    runs = nki_runs(trace)
    figures = trace.hardware_figures or {}
    if not len(runs):
        return []
    findings = []
    spilled = _spills(trace)
    for name, mine in runs.groupby("name", sort=False):
        if name in spilled:
            findings.append(_spill_finding(trace, name, mine, spilled[name], figures))
            continue
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


def _spills(trace: Trace) -> dict[str, dict]:
    """Per NKI kernel that spills: its runs' spill bytes, reload bytes and spill time
    (summed), transfers, and per source line the bytes its spills and reloads moved."""
    ins = nki_instructions(trace)
    if not len(ins) or not ins["opcode"].isin(SPILL_OPCODES).any():
        return {}
    out = {}
    for name, mine in ins.groupby("kernel", sort=False):
        spill = mine[mine["opcode"].isin(SPILL_OPCODES)]
        if not len(spill):
            continue
        total = {"spill_bytes": 0, "reload_bytes": 0, "spill_ns": 0}
        for _kid, run in mine.groupby("kernel_id"):
            prof = spill_profile(run["engine"].to_numpy(), run["opcode"].to_numpy(),
                                 run["bytes"].to_numpy(), run["ts"].to_numpy(),
                                 run["end"].to_numpy())
            for key in total:
                total[key] += prof[key]
        lines = spill.groupby("source")["bytes"].sum().sort_values(ascending=False)
        out[str(name)] = {**total, "transfers": len(spill), "lines": lines}
    return out


def _spill_finding(trace: Trace, name: str, mine: pd.DataFrame, spill: dict,
                   figures: dict) -> Finding:
    capacity = float(figures.get("sbuf_bytes") or 0)
    run = mine.iloc[0]
    runs = len(mine)
    stored = spill["spill_bytes"] - spill["reload_bytes"]
    items = [evidence(run["ts"], run["dur"], [run["id"]],
                      f"{source}: its tiles' spills and reloads moved {nbytes / 2**20:.1f} MiB")
             for source, nbytes in spill["lines"].items()]
    lost = float(spill["spill_ns"])
    saving = device_saving(trace, lost)
    per_partition = f" ({capacity / 2**10 / 128:.0f} KiB per partition)" if capacity else ""
    over = f" over {runs} runs" if runs > 1 else ""
    found = make(
        trace, RULE_ID, f"Kernel {name}: SBUF spills", saving.time_lost_ns, items,
        f"{name}'s live tiles need more than the SBUF{per_partition}: the allocation stores "
        f"{stored / 2**20:.1f} MiB of them to HBM and reloads {spill['reload_bytes'] / 2**20:.1f}"
        f" MiB ({spill['transfers']} spill and reload transfers{over}), and "
        f"{fmt_ns(lost)} of that traffic runs while no compute engine works: the engines wait "
        "for the reloads, and new tiles for the space the stores free. The time counted is "
        "that part." + saving.note,
        "Keep fewer bytes live at once: tile the free dimension (loop over blocks of the long "
        "dimension, e.g. 512 columns, instead of whole rows), create tiles just before their "
        "first use and stop using them early, or hold them in a smaller dtype.",
        symptom_ns=lost, saving_basis=saving.basis, after=saving.after)
    if found.severity == "low":  # the memory is full, as a high-water of 100% says
        found.severity = "medium"
    return found
