"""FP32 matmuls that could run in BF16 (four times the Tensor Engine rate)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from neuron_explorer.analyses.roofline import main_dtype
from neuron_explorer.peaks import peak_flops
from neuron_explorer.rules import thresholds as th
from neuron_explorer.rules.finding import Finding, evidence, make, step_time, top, us
from neuron_explorer.tables import map_unique

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

RULE_ID = "fp32_matmul"
MATMUL = re.compile(r"(?:^|::)(?:mm|addmm|bmm|baddbmm|matmul|linear|conv\w*|einsum|"
                    r"_scaled_dot\w*)(?:\.|$)")


def check(trace: Trace) -> list[Finding]:
    ops = trace.ops
    if not len(ops):
        return []
    is_mm = map_unique(ops["name"], lambda n: bool(MATMUL.search(str(n))), bool)
    fp32 = map_unique(ops["dtypes"], lambda d: main_dtype(d) == "float32", bool)
    mm = ops[is_mm & fp32 & (ops["device_dur"].to_numpy() > 0)]
    if not len(mm):
        return []
    figs = trace.hardware_figures
    bf16, f32 = peak_flops(figs, "bfloat16"), peak_flops(figs, "float32")
    slowdown = bf16 / f32 if bf16 and f32 and f32 < bf16 else th.FP32_SLOWDOWN_DEFAULT
    lost = float(mm["device_dur"].sum()) * (1 - 1 / slowdown)
    if lost < th.FP32_MATMUL_MIN_SHARE * step_time(trace):
        return []
    items = [evidence(r.ts, r.dur, [r.id], f"{r.name} in float32, {us(r.device_dur)} on the "
                      f"device" + (f" ({r.module})" if r.module else ""))
             for r in top(mm, "device_dur").itertuples()]
    return [make(
        trace, RULE_ID, f"{len(mm)} matmuls run in FP32", lost, items,
        f"FP32 matmuls run {slowdown:g}x slower than BF16 on the Tensor Engine; the estimate "
        "assumes they would run at the BF16 rate.",
        "Run the model's matmuls in bfloat16: wrap the forward pass in "
        "torch.autocast('neuron', dtype=torch.bfloat16) or cast the model with "
        "model.to(torch.bfloat16), keeping an FP32 master copy of weights in the optimizer.")]
