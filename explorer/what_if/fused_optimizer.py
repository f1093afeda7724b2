"""The optimizer steps of a recording replayed as `fused=True` would run them.

A foreach optimizer (PyTorch's default for Adam, AdamW and SGD) updates the parameters in
one pass over every parameter-sized list per formula term: Adam's step reads and writes
its moments about seven times. `fused=True` runs the whole update as one kernel that
reads each parameter, gradient and moment once and writes them back once. The saving is
the recorded passes' device time less that kernel's, lowered by the simulator for the
parameters the passes updated (`backend.replay.lower_key`), per optimizer step of the
analysed steps. The state-step increments stay: the fused step keeps them.

`fused=True` changes `zero_grad(set_to_none=False)` too: PyTorch zeroes the gradients
with one `_foreach_zero_` where the optimizer is fused (or foreach=True), one `zero_` a
gradient otherwise (foreach left unset, the default). The replay makes each such
zero_grad one foreach op: a trial's Adam with gradients zeroed in place saved 744 us a
step fused where the step alone was claimed at 299.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
from neuron_explorer import tables
from neuron_explorer.analyses.steady_state import in_analysed_steps
from neuron_explorer.common import trace_format as tf
from neuron_explorer.common.op_families import base_name
from neuron_explorer.memo import memoised
from neuron_explorer.trace import Trace
from neuron_explorer.what_if.counterfactual import op_host_ns, op_kernel_rows

# optimizer class -> its fused op, as `fused=True` calls it
FUSED_OPS = {"Adam": "aten::_fused_adam_", "AdamW": "aten::_fused_adamw_",
             "SGD": "aten::_fused_sgd_"}


# ops that make a first step's state (moments zeroed): the fused step makes them too
_STATE_INIT = frozenset({"empty", "empty_like", "empty_strided", "zero", "zeros", "zeros_like",
                         "fill", "full", "full_like"})  # base names: no trailing "_"


@dataclass(frozen=True)
class FusedOptimizerSaving:
    """What `fused=True` saves on the analysed steps' optimizer steps."""

    device_ns: float  # device time saved over the analysed steps
    optimizers: tuple[str, ...]  # the classes replayed ("Adam")
    passes: int  # the kernels a recorded step ran over each parameter (or list of them)
    steps: int  # optimizer steps replayed
    # the analysed steps' saving, host and device: the run replayed with each optimizer
    # step one launch of the fused kernel (None where the trace cannot be re-timed)
    step_ns: float | None = None
    # that replay's changes, for a replay of more fixes at once: the op slices removed, and
    # kernel rows of `trace.kernels` -> their lengths fused
    replay: tuple[np.ndarray, dict[int, int]] | None = None
    # the gradients each zero_grad zeroes one op apiece, which fused=True zeroes in one op
    # (0: none), and what that part alone saves the analysed steps
    zeroed: int = 0
    zeroing_step_ns: float = 0.0
    # what the first step, where an Adam's state is made, costs more fused (in `step_ns`
    # already): fused=True makes each parameter's step counter on the device there, an
    # `empty` and a `zero_` apiece (a foreach Adam keeps them on the host)
    state_steps_ns: float = 0.0
    # the recorded steps ran each pass one op per parameter (the single-tensor step, which
    # foreach=False selects, or fused=False passed, which turns PyTorch's foreach default
    # off), over this many parameters
    single_tensor: bool = False
    parameters: int = 0


def fused_optimizer_saving(trace: Trace) -> FusedOptimizerSaving | None:
    """The device time the analysed steps' unfused optimizer steps would save fused, and
    the steps' own saving; None where there are none (already fused, another optimizer,
    no op keys). Computed once per trace (two rules ask)."""
    return memoised(trace, "fused_optimizer_saving", lambda: _saving(trace))


def _saving(trace: Trace) -> FusedOptimizerSaving | None:
    calls = optimizer_steps(trace)
    if calls is None or not len(calls):
        return None
    from neuron_explorer.backend.replay import ReplayOptions, lower_key
    from neuron_explorer.what_if.replay import op_keys

    preset = ReplayOptions(trace.hardware or "trn2").preset()
    ops = tables.of_kind(trace, tf.CAT_OP)
    op_ids = ops["id"].to_numpy(np.int64)
    is_call = np.zeros(len(trace.table("slices")), bool)
    is_call[calls["id"].to_numpy(np.int64)] = True
    owner = tables.ancestor_in(trace, op_ids, is_call)
    device_dur = trace.ops.set_index("id")["device_dur"].reindex(op_ids).fillna(0).to_numpy()
    fused_ns: dict[tuple, float] = {}
    saved, names = 0.0, set()
    passes = Counter[tuple[int, bool, int]]()  # (passes, single-tensor, parameters) a step
    kernel_rows = op_kernel_rows(trace)
    fused_alone_ns: dict[tuple, float] = {}  # the fused kernel without the increments
    removed: list[np.ndarray] = []  # every op of a replayed step but the one kept
    counters_made = 0  # step counters a fused first step would make on the device
    state_ops: list[np.ndarray] = []  # the ops that made the recorded steps' state
    lengths: dict[int, int] = {}  # the kept op's kernels: the fused kernel, then nothing
    for call in calls.itertuples():
        mine = np.flatnonzero(owner == call.id)
        keys = op_keys(trace, op_ids[mine])
        if keys is None or any("_fused_" in k[0] for k in keys):
            continue
        over_parameters = [i for i, k in enumerate(keys) if any(s for s, _ in k[1])
                           and base_name(k[0]) not in _STATE_INIT]
        found = _parameters([keys[i] for i in over_parameters])
        if found is None:
            continue
        params, per_parameter = found
        cls = str(call.name).split(".")[0]
        # the fused step's state steps live on the device: a foreach step kept them on
        # the host, and their increments cost the device nothing there
        increments = cls != "SGD" and not any(k[1] and not any(s for s, _ in k[1])
                                              for k in keys)
        key = (_fused_key(cls, params, per_parameter), increments)
        if key not in fused_ns:
            fused_ns[key] = _lowered_ns(lower_key, preset, key[0], len(params) if increments
                                        else 0)
        if np.isnan(fused_ns[key]):
            continue
        saved += float(device_dur[mine[over_parameters]].sum()) - fused_ns[key]
        making = [i for i, k in enumerate(keys) if base_name(k[0]) in _STATE_INIT]
        if increments and making:
            counters_made += len(params)  # this step makes the state
            state_ops.append(op_ids[mine[making]])
        passes[per_parameter, len(over_parameters) > per_parameter, len(params)] += 1
        names.add(cls)
        # the step as fused=True runs it: its passes over the parameters one op (a pass
        # that ran on the device stands in for it, its host time for the fused op's)
        # launching the fused kernel; what the fused step does too (the state's first
        # zeros, the state-step increments) stays as recorded
        passes_ids = op_ids[mine[over_parameters]]
        launching = [int(i) for i in passes_ids if kernel_rows.get(int(i))]
        if launching:
            if key[0] not in fused_alone_ns:
                fused_alone_ns[key[0]] = _lowered_ns(lower_key, preset, key[0], 0)
            # the fused kernel, and where the fused step moves the state-step increments
            # onto the device, their `_foreach_add_`: a launch of its own
            kept = {launching[0]: fused_alone_ns[key[0]]}
            if increments and len(launching) > 1:
                kept[launching[1]] = fused_ns[key] - fused_alone_ns[key[0]]
            removed.append(passes_ids[~np.isin(passes_ids, list(kept))])
            for op, length in kept.items():
                first, *rest = kernel_rows[op]
                lengths[first] = int(length)
                lengths.update(dict.fromkeys(rest, 0))
    if not names:
        return None
    from neuron_explorer.what_if.counterfactual import removal_saving_ns

    zeroing = _zero_grads_in_one_op(trace, names, preset, kernel_rows)
    zeroed, zeroing_ns = 0, 0.0
    if zeroing is not None:
        zero_removed, zero_lengths, zero_device_ns, zeroed = zeroing
        saved += zero_device_ns
        removed.append(zero_removed)
        lengths.update(zero_lengths)
        zeroing_ns = removal_saving_ns(trace, zero_removed, "fused zero_grad",
                                       zero_lengths) or 0.0
    step_ns, replay = None, None
    # a counter is made as the recorded state is, an allocation and a zero_: at what those
    # ops took on the host, a pair apiece
    counters_ns = counters_made * 2 * float(op_host_ns(trace, np.concatenate(state_ops)).mean()) \
        if counters_made else 0.0
    if removed:
        replay = (np.concatenate(removed), lengths)
        step_ns = removal_saving_ns(trace, replay[0], "fused optimizer", lengths)
        if step_ns is not None:
            # the replay removes ops and re-times kernels, it adds none: the counters'
            # launches are host time on the first step's host, which a host-bound step
            # pays in full (a trial's AdamW of 28 parameters: step 0 1.7 ms slower fused)
            step_ns -= counters_ns
    # the passes of most steps (SGD's first also copies each gradient into its momentum)
    most, single, parameters = passes.most_common(1)[0][0]
    return FusedOptimizerSaving(max(saved, 0.0), tuple(sorted(names)), most, len(calls),
                                step_ns, replay, zeroed, zeroing_ns, counters_ns, single,
                                parameters)


def _zero_grads_in_one_op(trace: Trace, classes: set[str], preset: Any,
                          kernel_rows: dict[int, list[int]]
                          ) -> tuple[np.ndarray, dict[int, int], float, int] | None:
    """The analysed steps' `zero_grad(set_to_none=False)` calls of `classes` that zeroed
    the gradients one `zero_` apiece, each made one `_foreach_zero_` over them as fused=True
    makes it: (the ops removed, kernel rows -> lengths, the device time saved, the
    gradients a call zeroes); None where there are none."""
    from neuron_explorer.backend.replay import lower_key
    from neuron_explorer.rules.zeroed_gradients import zeroing
    from neuron_explorer.what_if.replay import op_keys

    calls, ops = zeroing(trace)
    mine_class = calls["name"].astype(str).str.split(".").str[0].isin(list(classes))
    ops = ops[ops["call"].isin(calls.loc[mine_class.to_numpy(), "id"])]
    removed: list[int] = []
    lengths: dict[int, int] = {}
    saved, zeroed = 0.0, Counter[int]()
    lowered: dict[tuple, float] = {}
    for _, part in ops.groupby("call", sort=False):
        mine = part["id"].to_numpy(np.int64)
        keys = op_keys(trace, mine)
        if keys is None or any(k[0] == "aten::_foreach_zero_" for k in keys):
            continue  # already one op (foreach=True)
        zeros = [(int(i), k) for i, k in zip(mine.tolist(), keys, strict=True)
                 if k[0] == "aten::zero_" and k[1] and kernel_rows.get(int(i))]
        if len(zeros) < 2:
            continue
        grads = tuple(k[1][0] for _, k in zeros)
        key = ("aten::_foreach_zero_", grads, grads, ())
        if key not in lowered:
            kernel = lower_key(key, preset)[0]
            lowered[key] = float("nan") if kernel is None else float(kernel.duration_ns)
        if np.isnan(lowered[key]):
            continue
        ids = [i for i, _ in zeros]
        saved += float(part.set_index("id")["device_dur"].reindex(ids).fillna(0).sum()) \
            - lowered[key]
        zeroed[len(ids)] += 1
        removed.extend(ids[1:])  # the first stands in for the foreach op
        first, *rest = kernel_rows[ids[0]]
        lengths[first] = int(lowered[key])
        lengths.update(dict.fromkeys(rest, 0))
    if not zeroed:
        return None
    return np.asarray(removed, np.int64), lengths, saved, zeroed.most_common(1)[0][0]


def _lowered_ns(lower_key, preset, key: tuple, increments: int) -> float:
    """The device time of the fused step `key` and of `increments` state-step increments
    (`_foreach_add_` over 0-d tensors, as the fused step makes them); NaN where the
    simulator has no lowering."""
    step = ((), "float32")
    keys = [key] + ([("aten::_foreach_add_", (step,) * increments, (step,) * increments, ())]
                    if increments else [])
    kernels = [lower_key(k, preset)[0] for k in keys]
    if any(k is None for k in kernels):
        return float("nan")
    return float(sum(k.duration_ns for k in kernels))


def optimizer_steps(trace: Trace):
    """The `<Optimizer>.step` ranges of a class `FUSED_OPS` knows, in the analysed steps."""
    ranges = tables.of_kind(trace, tf.CAT_OPTIMIZER)
    if not len(ranges) or not len(trace.steps):
        return None
    names = ranges["name"].astype(str)
    known = names.str.endswith(".step") & names.str.split(".").str[0].isin(list(FUSED_OPS))
    calls = ranges[known.to_numpy()].copy()
    calls["step"] = tables.assign_steps(calls["ts"].to_numpy(np.int64), trace.steps)
    return in_analysed_steps(trace, calls)


def _parameters(keys: list[tuple]) -> tuple[tuple, int] | None:
    """(the (shape, dtype) of each parameter the passes update, the passes a step makes
    over them), or None where the keys do not tell. A foreach step makes each pass once,
    over every parameter: the longest list a pass writes (`_foreach_sqrt`'s results, an
    in-place pass's first list), or the period of a pass's inputs (older recordings keyed
    an in-place pass by its first tensor only). A single-tensor step (`foreach=False`)
    makes each pass once a parameter: the op made least often writes one tensor of each
    parameter's shape."""
    counts = Counter(k[0] for k in keys)
    if not keys:
        return None
    # a foreach step: AdamW's makes one pass twice (`_foreach_mul_`, for the weight decay
    # and the second moment), which read as a single-tensor step once claimed one
    # parameter of 34 and a fused kernel an eighth of the recorded one's length
    if max(counts.values()) == 1 or any(base_name(k[0]).startswith("_foreach_") for k in keys):
        longest = max(keys, key=lambda k: len(k[2]))
        params = tuple(longest[2]) if len(longest[2]) > 1 else _period(keys[0][1])
        return (params, len(keys)) if params else None
    rarest = min(counts, key=counts.__getitem__)
    params = tuple(sig for k in keys if k[0] == rarest for sig in k[2][:1])
    return params, len(keys) // len(params)


def _period(sigs: tuple) -> tuple | None:
    """The parameters of a pass's input lists: the shortest period of their shapes (one
    shape throughout tells no lists apart: None)."""
    tensors = [sig for sig in sigs if sig[0]]
    for size in range(2, len(tensors)):
        if len(tensors) % size == 0 and all(
                tensors[i][0] == tensors[i % size][0] for i in range(len(tensors))):
            return tuple(tensors[:size])
    return None


def _fused_key(cls: str, params: tuple, passes: int) -> tuple:
    """The op key `fused=True` records for one step over `params`: Adam's parameters,
    gradients, two moments and state steps; SGD's parameters, gradients and, with
    momentum (more than one pass), their momentum buffers."""
    step = ((), "float32")
    if cls == "SGD":
        lists = 3 if passes > 1 else 2
        return (FUSED_OPS[cls], params * lists, params, ())
    return (FUSED_OPS[cls], params * 4 + (step,) * len(params), params,
            (("amsgrad", False), ("maximize", False)))
