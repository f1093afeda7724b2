"""The per-tile steps of an op, read from the eager lowering table.

Ops whose eager kernel is a plain stream (elementwise, reductions, row-wise norms)
can share one stream with their neighbours; a fused kernel strings their steps
together. Reading the steps from the eager table keeps one source of truth for
which engine runs what and at what cost.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

from neuron_explorer.backend.hardware import lower_pointwise as pointwise
from neuron_explorer.backend.hardware.optable import (
    NO_DEVICE_WORK,
    STREAM_FAMILIES,
    lowering_for,
)
from neuron_explorer.backend.hardware.streaming import Step, vec
from neuron_explorer.common.op_families import base_name

_COPY_STEP = vec("TensorCopy", 1, 0.0)


def steps_for(op_name: str, n_tensor_inputs: int, converts_dtype: bool = False
              ) -> list[Step] | None:
    """Steps of `op_name` ("aten::add" or "add") on one tile; [] for ops with no device
    work; None when the op's kernel is not a plain stream and cannot share one."""
    base = base_name(op_name)
    if base in NO_DEVICE_WORK:
        return []
    fn = lowering_for(base)
    if fn is pointwise.lower_copy:
        # In SBUF a copy is free unless it converts the dtype.
        return [_COPY_STEP] if converts_dtype else []
    if isinstance(fn, partial) and fn.func in STREAM_FAMILIES and "steps" in fn.keywords:
        return resolve_arith(fn.keywords["steps"], n_tensor_inputs)
    return None


def resolve_arith(steps: Sequence[Step], n_tensor_inputs: int) -> list[Step]:
    """The table's "Arith" placeholder is TensorTensor with two tensor operands, else
    TensorScalar (as the eager pointwise lowering resolves it)."""
    out = []
    for st in steps:
        if st.opcode == pointwise.ARITH:
            n = max(1, min(n_tensor_inputs, 3))
            st = Step(st.engine, "TensorTensor" if n >= 2 else "TensorScalar", n, st.flops,
                      st.cycles_per_element, st.free_scale)
        out.append(st)
    return out


def scaled(steps: Sequence[Step], share: float) -> list[Step]:
    """Steps of an op that touches `share` of the stream's elements on each tile."""
    if share >= 1.0:
        return list(steps)
    return [Step(st.engine, st.opcode, st.n_inputs, st.flops * share, st.cycles_per_element,
                 st.free_scale * share) for st in steps]
