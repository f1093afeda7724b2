"""An NKI kernel whose matmuls do not use the full 128x128 Tensor Engine array (K or M
below 128), or stream so few moving columns that loading the stationary tile dominates."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from neuron_explorer.analyses.kernel_lines import analysed_nki
from neuron_explorer.rules import thresholds as th
from neuron_explorer.rules.finding import Finding, evidence, make, us
from neuron_explorer.rules.host_bound import device_saving

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

RULE_ID = "kernel_matmul_tile_shape"
ARRAY = 128 * 128  # a MultiplyMoving's executed FLOPs are 2 x 128 x 128 x moving free


def check(trace: Trace) -> list[Finding]:
    runs, ins = analysed_nki(trace)
    if not len(runs):
        return []
    findings = []
    for name, mine in runs.groupby("name", sort=False):
        hw = float(mine["hw_flops"].sum())
        if hw <= 0:
            continue
        fill = float(mine["flops"].sum()) / hw
        tensor = ins[(ins["kernel"] == name) & (ins["engine"] == "tensor")]
        moving = tensor[tensor["opcode"] == "MultiplyMoving"]
        stationary = tensor[tensor["opcode"] == "LoadStationary"]
        cols = moving["flops"].to_numpy(np.float64) / (2 * ARRAY)
        per_line = moving.assign(cols=cols).groupby("source")["cols"].median()
        narrow = per_line[per_line < th.KERNEL_MOVING_FREE_MIN]
        lost = float(tensor["dur"].sum()) * (1 - fill)
        lost += float(stationary[stationary["source"].isin(narrow.index)]["dur"].sum())
        if (fill >= th.KERNEL_ARRAY_MIN_FILL and not len(narrow)) or \
                lost < th.KERNEL_MIN_SHARE * float(mine["dur"].sum()):
            continue
        run = mine.iloc[0]
        items = [evidence(run["ts"], run["dur"], [run["id"]],
                          f"{name}: the matmuls fill {fill:.0%} of the 128x128 array")]
        items += [evidence(run["ts"], run["dur"], [run["id"]],
                           f"{src}: moving free size {c:.0f} columns (up to 512)")
                  for src, c in narrow.items()]
        lines = ", ".join(sorted(per_line.index)[:4])
        saving = device_saving(trace, lost)
        findings.append(make(
            trace, RULE_ID, f"Kernel {name}: matmul tiles smaller than the array",
            saving.time_lost_ns, items,
            f"{name}'s matmuls ({lines}) execute {1 / max(fill, 1e-9):.1f}x the FLOPs they "
            "need: the Tensor Engine runs all 128x128 cells whatever the contraction "
            "(partitions, K) and stationary free size (M) of a tile"
            + (f", and {len(narrow)} line(s) stream fewer than "
               f"{th.KERNEL_MOVING_FREE_MIN} moving columns, so loading the stationary tile "
               "costs as much as the multiply" if len(narrow) else "")
            + f". The time counted ({us(lost)}) is the padded part of the Tensor Engine's "
            "time and the stationary loads of the narrow matmuls." + saving.note,
            "Use tiles of nl.tile_size.pmax (128) partitions for K, "
            "nl.tile_size.gemm_stationary_fmax (128) for the stationary free size and up to "
            "nl.tile_size.gemm_moving_fmax (512) moving columns; reuse a stationary tile "
            "over several moving tiles.",
            symptom_ns=lost, saving_basis=saving.basis, after=saving.after))
    return findings
