"""FP32 matmuls that could run in BF16 (four times the Tensor Engine rate), eager ops and
the matmuls inside compiled graphs alike (a graph's sections say their matmul's dtype).

Judged on device time: in a host-bound run the device idles most of the step, so a
matmul's share of the step is small even when it is most of what the device does,
and fixing the host-bound issue makes it the next bottleneck.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from neuron_explorer.analyses.compiled_sections import compiled_matmuls
from neuron_explorer.analyses.engine_utilisation import shortened_by_tensor_cut
from neuron_explorer.analyses.phases import in_analysed_work
from neuron_explorer.analyses.roofline import main_dtype
from neuron_explorer.analyses.step_breakdown import step_windows
from neuron_explorer.common import trace_format as tf
from neuron_explorer.common.op_families import runs_matmuls
from neuron_explorer.common.trace_format import ARG_WHOLE_BF16_NS
from neuron_explorer.device_terms import device_terms
from neuron_explorer.peaks import peak_flops
from neuron_explorer.rules import thresholds as th
from neuron_explorer.rules.finding import Finding, evidence, make, step_time, top, trains, us
from neuron_explorer.rules.host_bound import (
    NEAR_ALL,
    DeviceSaving,
    batch_only_note,
    device_saving,
)
from neuron_explorer.tables import map_unique, number
from neuron_explorer.what_if.lower_precision import autocast_cast_count, predicted_bf16_saving_ns

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

RULE_ID = "fp32_matmul"
LOW_PRECISION = ("bfloat16", "float16")


_SHOWN = ["id", "ts", "dur", "name", "module", "source", "device_dur", "graph"]


def _compiled_saving_ns(trace: Trace, inside: pd.DataFrame, slowdown: float,
                        cast_whole: bool) -> tuple[pd.Series, int]:
    """What casting the model whole to bfloat16 saves the compiled graphs whose FP32
    matmul sections are `inside` (`compiled_matmuls` rows), over their runs, and how many
    of those runs the backend timed (the rest are estimated; all of them, unless
    `cast_whole`): per run (kernel id -> ns saved).

    The backend builds each such program again with every float32 tensor in bfloat16
    (`whole_bf16_ns` on its kernel slices): its matmuls at the BF16 rate and half the
    bytes moved. Counting the Tensor Engine alone claimed 0.06x of what a memory-bound
    decode saved. A recording without it (older ones) gets the estimate: per run, the
    Tensor Engine time cut by the slowdown, the program shortening only down to the
    busiest of its other engines (DMA, Vector, Scalar, GpSimd) or its Tensor Engine's new
    time (a DMA-bound compiled CNN once claimed 5.6x what bf16 saved it)."""
    if not len(inside):
        return pd.Series(dtype=np.float64), 0
    k = trace.kernels.set_index("id")
    fp32 = inside.groupby("id")["device_dur"].sum()
    fp32 = fp32[fp32.index.isin(k.index)]
    runs = k.loc[fp32.index]
    cut = fp32.to_numpy(np.float64) * (1 - 1 / slowdown)
    saved = shortened_by_tensor_cut(runs, cut)
    if not cast_whole:
        return pd.Series(saved, fp32.index), 0
    whole = number(trace, ARG_WHOLE_BF16_NS, fp32.index.to_numpy(np.int64), default=-1)
    timed = whole >= 0
    saved[timed] = np.maximum(runs["dur"].to_numpy(np.float64)[timed] - whole[timed], 0.0)
    return pd.Series(saved, fp32.index), int(timed.sum())


def _graphs_replay_ns(trace: Trace, run_saved: pd.Series, cast_whole: bool) -> float | None:
    """What the analysed steps save replayed with each compiled graph run of `run_saved`
    (kernel id -> ns) that much shorter; with `cast_whole` (the model cast whole to
    bfloat16, the fix advised) every run of the whole run as long as the backend's build
    of its program in bfloat16 (`whole_bf16_ns`) where it has one, and each eager op of one
    kernel (the optimizer's fused step, which then updates bfloat16 weights) as long as its
    key cast whole lowers to. None where the trace cannot be replayed."""
    from neuron_explorer.what_if.counterfactual import removal_saving_ns

    k = trace.kernels
    kernel_ids = k["id"].to_numpy(np.int64)
    new = pd.Series(k["dur"].to_numpy(np.float64), kernel_ids).reindex(run_saved.index) \
        - run_saved
    if cast_whole:
        # the whole run cast: a first analysed step's sync waits on the step before's work
        every = compiled_matmuls(trace)
        ids = np.unique(every.loc[every["dtype"] == "float32", "id"].to_numpy(np.int64))
        whole = number(trace, ARG_WHOLE_BF16_NS, ids, default=-1)
        new = pd.concat([pd.Series(whole[whole >= 0].astype(np.float64), ids[whole >= 0]),
                         new[~new.index.isin(ids[whole >= 0])]])
    rows = np.flatnonzero(np.isin(kernel_ids, new.index.to_numpy(np.int64)))
    lengths = {int(row): int(max(new[kernel_ids[row]], 0.0)) for row in rows.tolist()}
    if cast_whole:
        lengths.update(_eager_cast_whole_lengths(trace))
    return removal_saving_ns(trace, np.zeros(0, np.int64),
                             f"fp32 graphs {'cast whole' if cast_whole else 'in bf16'}",
                             lengths)


def _eager_cast_whole_lengths(trace: Trace) -> dict[int, int]:
    """Per row of `trace.kernels`, the length of the run's eager ops of one kernel each,
    their keys cast whole to bfloat16 (those without a key left out)."""
    from neuron_explorer.backend.mixed_precision import cast_whole
    from neuron_explorer.backend.replay import ReplayOptions, lower_key
    from neuron_explorer.what_if.counterfactual import op_kernel_rows
    from neuron_explorer.what_if.replay import op_keys

    kernel_rows = op_kernel_rows(trace)
    ops = trace.ops
    ids = np.array([i for i in ops.loc[ops["graph_id"].to_numpy() < 0, "id"].tolist()
                    if len(kernel_rows.get(int(i), ())) == 1], np.int64)
    if len(ids):
        ids = ids[np.array([k is not None for k in
                            trace.slice_args.column(tf.ARG_OP_KEY, ids)], bool)]
    keys = op_keys(trace, ids)
    if keys is None:  # none, or one damaged
        return {}
    preset = ReplayOptions(trace.hardware or "trn2").preset()
    lengths: dict[int, int] = {}
    lowered: dict[tuple, int | None] = {}
    for op, recorded in zip(ids.tolist(), keys, strict=True):
        key = cast_whole(recorded, "bf16")
        if key not in lowered:
            kernel, on_host = lower_key(key, preset)
            lowered[key] = None if kernel is None or on_host else int(kernel.duration_ns)
        length = lowered[key]
        if length is not None:
            lengths[kernel_rows[op][0]] = length
    return lengths


def check(trace: Trace) -> list[Finding]:
    ops = in_analysed_work(trace, trace.ops)
    compiled = in_analysed_work(trace, compiled_matmuls(trace))
    if not len(ops) and not len(compiled):
        return []
    # matmuls, convolutions and attention (common/op_families.py)
    # and the whole layers PyTorch's fast path runs as one op at inference (an fp32
    # TransformerEncoder's, 97% of a run's device time, got no finding)
    is_mm = map_unique(ops["name"], lambda n: runs_matmuls(str(n)), bool)
    dtype = map_unique(ops["dtypes"], main_dtype)
    timed = ops["device_dur"].to_numpy() > 0
    eager = ops[is_mm & (dtype == "float32") & timed].assign(graph="")
    inside = compiled[(compiled["dtype"] == "float32") & (compiled["device_dur"] > 0)]
    mm = pd.concat([eager[_SHOWN], inside[_SHOWN]], ignore_index=True) if len(inside) else eager
    if not len(mm):
        return []
    figs = trace.hardware_figures
    bf16, f32 = peak_flops(figs, "bfloat16"), peak_flops(figs, "float32")
    slowdown = bf16 / f32 if bf16 and f32 and f32 < bf16 else th.FP32_SLOWDOWN_DEFAULT
    fp32_ns = float(mm["device_dur"].sum())
    low = is_mm & timed & map_unique(ops["dtypes"], lambda d: main_dtype(d) in LOW_PRECISION,
                                     bool)
    mixed = bool(low.any()) or bool(compiled["dtype"].isin(LOW_PRECISION).any())
    # beside bf16 matmuls the fix is to move these into autocast, not to cast the model
    run_saved, timed_runs = _compiled_saving_ns(trace, inside, slowdown, not mixed)
    compiled_ns = float(run_saved.sum())
    lost = float(eager["device_dur"].sum()) * (1 - 1 / slowdown) + compiled_ns
    # every graph run rebuilt by the backend, no eager matmul to estimate
    rebuilt = not len(eager) and timed_runs == inside["id"].nunique()
    device_ns = float(in_analysed_work(trace, trace.kernels)["dur"].sum())
    device_share = fp32_ns / device_ns if device_ns else 0.0
    matmul_ns = (float(ops.loc[is_mm & timed, "device_dur"].sum())
                 + float(compiled["device_dur"].sum()))
    on_device = (fp32_ns >= th.FP32_MATMUL_MIN_MATMUL_SHARE * matmul_ns
                 and device_share >= th.FP32_MATMUL_MIN_DEVICE_SHARE)
    if lost < th.FP32_MATMUL_MIN_SHARE * step_time(trace) and not on_device:
        return []
    items = [evidence(r.ts, r.dur, [r.id], f"{r.name} in float32"
                      + (f" inside compiled {r.graph}, {us(r.device_dur)} on the Tensor Engine"
                         if r.graph else f", {us(r.device_dur)} on the device")
                      + (f" ({r.module})" if r.module else "")
                      + (f" at {r.source}" if r.source else ""))
             for r in top(mm, "device_dur").itertuples()]
    explanation = (f"{len(mm)} FP32 matmuls take {us(fp32_ns)} of device time "
                   f"({device_share:.0%} of the device's busy time, "
                   f"{fp32_ns / matmul_ns:.0%} of matmul time); FP32 runs {slowdown:g}x slower "
                   "than BF16 on the Tensor Engine"
                   + ("." if rebuilt else
                      ", and the estimate assumes they would run at the BF16 rate."))
    if timed_runs:
        explanation += (f" For the compiled graphs the backend built each program again "
                        f"with the model cast whole to bfloat16 (every float32 tensor of the "
                        f"graph: matmuls at the BF16 rate, half the bytes moved): their runs "
                        f"take {us(compiled_ns)} less device time.")
    elif len(inside):
        explanation += (" Inside a compiled graph a faster Tensor Engine shortens the program "
                        "only down to its other engines' busy time (its DMA queues, the "
                        "Vector Engine that also runs autocast's casts): the estimate is "
                        "capped there, per graph.")
    if mixed:
        explanation += (" Other matmuls of this run ran in bfloat16 (autocast or a bf16 model): "
                        "these ran outside it, on float32 inputs, at the FP32 rate.")
    cast_whole = not mixed and not trains(trace)
    # a compiled graph cannot be re-timed op by op: the replay predicts eager matmuls only
    predicted = predicted_bf16_saving_ns(trace, mm["id"].to_numpy()) if not len(inside) else None
    if predicted is not None:  # the what-if replay of the run under bf16 autocast
        if predicted < th.FP32_MATMUL_MIN_PREDICTED_GAIN * fp32_ns:
            return []  # bf16 would not make them faster: nothing to advise
        lost = predicted
        explanation = explanation.replace(
            ", and the estimate assumes they would run at the BF16 rate.", ".")
        explanation += (f" A what-if replay of the run under autocast in bfloat16 on "
                        f"{trace.hardware or 'this preset'} predicts {us(predicted)} less "
                        "device time: these matmuls, and the ops after them that then run "
                        "in bfloat16 too, less the casts autocast adds "
                        "(`neuron-explorer whatif TRACE --dtype bf16`).")
        whole = predicted_bf16_saving_ns(trace, mm["id"].to_numpy(), casts=False)
        # serving keeps no FP32 master weights: the model cast whole is the fix, and its
        # saving the headline (an fp32 scorer: autocast's 472 us a step claimed, the model
        # cast whole saved 1.08 ms)
        cast_whole = cast_whole and whole is not None and whole > predicted
        if cast_whole and whole is not None:
            explanation += (f" At inference the model and its inputs can be cast to "
                            f"bfloat16 whole, which pays none of autocast's casts: "
                            f"{us(whole)}, the saving stated (autocast, with its casts: "
                            f"{us(predicted)}).")
            lost = whole
        elif whole is not None and whole > 1.25 * predicted:
            explanation += (f" A model and inputs cast to bfloat16 whole pay no casts: up "
                            f"to {us(whole)}.")
    casts_ns = _casts_host_ns(trace) if predicted is not None and not cast_whole else 0.0
    saving = device_saving(trace, lost, casts_ns)
    graphs_replayed = False
    if len(inside) and not len(eager) and not saving.after:
        # no host fix to wait on: what the steps save now, replayed (the critical path's
        # estimate claimed 37 us a step where casting whole saved 78, and 9 where it saved
        # none)
        replayed = _graphs_replay_ns(trace, run_saved, not mixed)
        if replayed is not None:
            graphs_replayed = True
            how = ("with each graph's run as long as its bfloat16 build and each eager op's "
                   "kernel (the optimizer's step too) as long as in bfloat16" if not mixed
                   else "with each graph's run as much shorter as estimated")
            saving = DeviceSaving(
                replayed, "",
                f" Replayed {how}, the analysed steps take {us(replayed)} less" + (
                    "." if replayed >= NEAR_ALL * lost else
                    ": past that, the host's own work sets their length."
                    + batch_only_note(trace)),
                "the run replayed with the model cast whole: each compiled graph's run as "
                "long as the backend's bfloat16 build of its program, each eager op's "
                "kernel lowered in bfloat16" if not mixed else
                "the run replayed with each compiled graph's run shortened by its matmuls' "
                "estimated saving")
    explanation += saving.note
    name, module = mm.groupby(["name", "module"], sort=False)["device_dur"].sum().idxmax()
    # the group's first op: the forward's line (backward ops carry the backward() call's)
    first = mm[(mm["name"] == name) & (mm["module"] == module)].sort_values("ts").iloc[0]
    where = name + (f" in {module}" if module else "") + \
        (f" at {first['source']}" if first["source"] else "")
    if mixed:
        # autocast casts a matmul's inputs whatever their dtype (a `.float()` inside its
        # region does nothing): an FP32 matmul beside bf16 ones ran outside it. Told to
        # cast its input, a loss head outside the region crashed on its float32 weight.
        recommendation = (f"Run {where} in bfloat16: it ran outside autocast (after the "
                          "`with torch.autocast(...)` block, or where autocast is disabled), "
                          "so its float32 inputs kept it in FP32. Move it inside the autocast "
                          "region, which casts a layer's weight too; a matmul of two "
                          "activations (attention's scores) can cast both operands with "
                          ".to(torch.bfloat16) instead (both: one alone fails on mismatched "
                          "dtypes), or compute attention with "
                          "F.scaled_dot_product_attention on bfloat16 q, k and v.")
    elif len(inside) and not len(eager):
        # inside compiled graphs autocast's casts are sections of the program that move
        # data: three compiled CNNs saved -11%, -4% and 18% of this estimate with autocast,
        # one 1.6x with the model cast whole (half the bytes its DMA-bound program moved)
        master = (": pair it with an optimizer that keeps an FP32 copy of the weights (their "
                  "small updates need it)" if trains(trace) else "")
        inputs = (f" ({where} first){master}. Its inputs are integer ids (every upload "
                  "of the steps is): they stay as they are. " if _uploads_ids(trace) else
                  f", with its inputs ({where} first){master}. {INPUTS_ON_THE_HOST} ")
        recommendation = ("Cast the model to bfloat16 whole, model.to(torch.bfloat16)"
                          f"{inputs}Inside a compiled graph "
                          "torch.autocast adds casts that are work of their own and move "
                          "more bytes: on three compiled CNNs it saved 18% of this estimate "
                          "once and made the step slower twice.")
    elif cast_whole:
        ids = _uploads_ids(trace)
        recommendation = ("Cast the model to bfloat16 whole, model.to(torch.bfloat16)"
                          + (f" ({where} first; its inputs, integer ids, stay as they are)"
                             if ids else f", and make its inputs bfloat16 ({where} first)")
                          + ": a model that only serves needs no FP32 copy of its weights, "
                          "and pays none of autocast's casts. "
                          + ("" if ids else f"{INPUTS_ON_THE_HOST} ")
                          + f"torch.autocast('{device_terms(trace.metadata).name}', "
                          "dtype=torch.bfloat16) saves less: it casts the weights again at "
                          "every call.")
    else:
        # a master copy is for training: an optimizer's updates are too small for bf16 weights
        master = (" (autocast keeps the weights in FP32, the FP32 master copy of weights the "
                  "optimizer's small updates need; model.to(torch.bfloat16) trains them in "
                  "bf16: pair it with an optimizer that keeps its own FP32 copy)"
                  if trains(trace) else "")
        recommendation = (f"Run the model's matmuls ({where} first) in bfloat16: wrap the "
                          f"forward pass in torch.autocast('{device_terms(trace.metadata).name}', "
                          f"dtype=torch.bfloat16) or cast the model with model.to(torch.bfloat16)"
                          f"{master}.")
    return [make(trace, RULE_ID, f"{len(mm)} matmuls run in FP32", saving.time_lost_ns, items,
                 explanation, recommendation, symptom_ns=lost,
                 saving_basis=("replay: " if predicted is not None or rebuilt or graphs_replayed
                               else "estimate: ")
                 + saving.basis, after=saving.after)]


# the replay of a model cast whole has its inputs arrive in bfloat16: cast on the device
# instead, a trial's compiled CNN saved 234 us of the 741 claimed (916 cast on the host)
INPUTS_ON_THE_HOST = ("Cast the inputs on the host, before they move to the device "
                      "(x.to(torch.bfloat16).to(device)): cast after the move, each is one "
                      "more op on the device and an upload of twice the bytes.")


def _uploads_ids(trace: Trace) -> bool:
    """Whether every upload of the analysed steps is of integers: the model's inputs are
    token ids, which a model cast to bfloat16 still takes as they are (a token model was
    told to cast its inputs too)."""
    from neuron_explorer.rules.host_device_copies import analysed_copies

    uploads = analysed_copies(trace)
    uploads = uploads[uploads["name"].astype(str).str.contains("host_to_device")]
    if not len(uploads) or not len(trace.kernels):
        return False
    ops = trace.kernels.set_index("id")["op_slice_id"].reindex(uploads["id"].to_numpy())
    dtypes = trace.ops.set_index("id")["dtypes"].reindex(ops.to_numpy()).astype(str)
    return bool(dtypes.str.fullmatch(r"\[u?int\d+\]").all())


def _casts_host_ns(trace: Trace) -> float:
    """The host time autocast's casts would add to the eager run: each is an op
    the host launches, at this run's mean host time per op (its analysed steps' host
    windows less the host's waits on the device, over their ops). An fp32 MLP's host step
    grew from 4.23 to 5.22 ms under autocast (11 casts a step): device-paced before, the
    run became host-bound, and saved 0.2-0.7 ms a step where the device saved 0.83."""
    from neuron_explorer.analyses.critical_path import host_waits_per_step

    casts = autocast_cast_count(trace)
    ops = in_analysed_work(trace, trace.ops)
    if not casts or not len(ops):
        return 0.0
    own = float(step_windows(trace)["dur"].sum()) - float(host_waits_per_step(trace).sum())
    return casts * max(own, 0.0) / len(ops)
