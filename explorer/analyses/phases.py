"""The run split into phases: training steps, eval passes, and generation's prefill and decode.

A phase is read from the model's outermost calls (the top-level module with the most
forward time): the recorder writes on each one `grad: 0` when grad mode is off and,
when its first argument holds token ids, their shape.
- `train`: a step with a grad-enabled call, a backward or an optimizer step, in a run
  that trains (a recording where no step has a backward or an optimizer step serves,
  grad mode on or not);
- `eval`: a call without grad inside a training step (an eval pass between two optimizer
  steps: the recorder holds it in the next training step, which starts after it here),
  unless the recorder saw the model in train mode then (no `model.eval()`: the step's own
  no-grad work, a target or teacher pass, whose time is the step's), or an inference
  step that is not generation;
- `prefill` and `decode`: inference steps where each call adds one token per sequence
  (one new token with a KV cache, or the previous length + 1 without one) after a call
  that took the prompt;
- with requests marked (`neuron_explorer.request`), a call is `prefill` when it serves
  requests no call served before, `decode` when it serves only requests served before
  (a continuous-batching server's batch changes every few steps); where no request is
  served twice, nothing is generated and the calls are `eval`;
- whatever `neuron_explorer.phase(name)` marked: the name of the range a model call
  starts in wins (models called with keyword arguments show no token ids to the hooks).
Traces where no call ran without grad (older recordings, PyTorch-profiler traces) have
one phase: `eval` for an inference loop (steps ended by the model's return), `train`
otherwise.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from neuron_explorer.analyses.data_flow import model_call_reads_last
from neuron_explorer.analyses.levels import recorded_level
from neuron_explorer.analyses.steady_state import (
    completed_steps,
    in_analysed_steps,
    training_steps,
)
from neuron_explorer.common import trace_format as tf
from neuron_explorer.memo import memoised
from neuron_explorer.tables import assign_steps, kind_mask

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

COLUMNS = ["phase", "step", "ts", "dur", "tokens"]
SERVING_COLUMNS = ["generation", "step", "batch", "prompt_tokens", "decode_steps", "new_tokens",
                   "ttft_ns", "tpot_median_ns", "tpot_p90_ns", "tokens_per_s", "prefill_mfu",
                   "decode_mbu", "kv_cache", "kv_bytes", "kv_bytes_per_token"]
KV_COLUMNS = ["generation", "phase", "step", "ts", "held_bytes"]
TOKEN_COLUMNS = ["generation", "token", "phase", "step", "ready", "gap_ns"]
TRAIN, EVAL, PREFILL, DECODE = "train", "eval", "prefill", "decode"


def _shape(text: str) -> tuple[int, int] | None:
    """'[4, 39]' -> (batch 4, 39 tokens each); '[39]' -> (1, 39); '' -> None."""
    try:
        dims = json.loads(text) if text else None
    except ValueError:
        return None
    if not isinstance(dims, list) or not 1 <= len(dims) <= 2:
        return None
    return (1, int(dims[0])) if len(dims) == 1 else (int(dims[0]), int(dims[1]))


def model_calls(trace: Trace) -> pd.DataFrame:
    """The model's outermost forward calls: id (the call's slice), ts, end, step, grad (1,
    0, or -1: unknown, not our trace), training (on calls without grad: the model's training
    flag, 1 or 0; -1 where unknown), batch and new (token ids' shape, -1 where unknown)."""
    calls = _top_level_calls(trace)
    if not len(calls):
        return pd.DataFrame({c: pd.Series(dtype="int64")
                             for c in ["id", "ts", "end", "step", "grad", "training", "batch",
                                       "new"]})
    calls = calls[calls["module"] == model_name(trace)]
    ids = calls["id"].to_numpy()
    ts = calls["ts"].to_numpy(np.int64)
    shapes = [_shape(t) for t in trace.slice_args.texts(tf.ARG_TOKENS, ids).tolist()]
    return pd.DataFrame({
        "id": ids.astype(np.int64), "ts": ts, "end": ts + calls["dur"].to_numpy(np.int64),
        "step": assign_steps(ts, trace.steps),
        # ours write grad only when it is off; other traces do not say
        "grad": trace.slice_args.numbers(tf.ARG_GRAD, ids, 1 if recorded_level(trace) else -1,
                                         "int64"),
        "training": trace.slice_args.numbers(tf.ARG_TRAINING, ids, -1, "int64"),
        "batch": [s[0] if s else -1 for s in shapes],
        "new": [s[1] if s else -1 for s in shapes],
    }).sort_values("ts", ignore_index=True)


def _top_level_calls(trace: Trace) -> pd.DataFrame:
    m = trace.modules
    return m[(m["depth"] == 0) & (m["phase"] == "forward")] if len(m) else m


def model_name(trace: Trace) -> str:
    """The model's name as the recording calls it ("model"): the top-level module with the
    most forward time, not a loss function or tokenizer called beside it, and in a run that
    trains, one called with grad: a frozen teacher's longer forwards under no_grad, in
    eval mode, read as eval passes and were taken out of every training step (a student's
    step read 1.38x faster); "model" where none ran."""
    return memoised(trace, "model_name", lambda: _model_name(trace))


def _model_name(trace: Trace) -> str:
    calls = _top_level_calls(trace)
    if not len(calls):
        return "model"
    grad = trace.slice_args.numbers(tf.ARG_GRAD, calls["id"].to_numpy(), 1, "int64")
    trained = calls[grad != 0]
    if len(trained) and len(trained) < len(calls) and training_steps(trace):
        calls = trained
    return str(calls.groupby("module")["dur"].sum().idxmax()) or "model"


def phases(trace: Trace) -> pd.DataFrame:
    """One row per step of each phase: phase, step (the recorded step holding it: eval
    passes share their training step's number), ts, dur, tokens (NA where unknown)."""
    return memoised(trace, "phases", lambda: _phases(trace))


def _phases(trace: Trace) -> pd.DataFrame:
    steps = trace.steps
    if not len(steps):
        return pd.DataFrame({c: pd.Series(dtype="Int64" if c == "tokens" else
                                          (object if c == "phase" else "int64"))
                             for c in COLUMNS})
    calls = model_calls(trace)
    by_step = {int(n): group for n, group in calls.groupby("step", sort=False)}
    tails = _eval_tails(trace)
    training = training_steps(trace)
    after_last = set(steps["step"]) - set(completed_steps(trace)["step"])
    no_args = not len(calls) or not (calls["grad"] == 0).any()  # older or others' traces
    inference_loop = trace.metadata.get("step_boundary") == "forward"
    # every model call runs without grad: a step with none of them (the rest of an
    # iteration a model's return split) trains no more than the others
    all_inference = bool(len(calls)) and bool((calls["grad"] == 0).all())
    # a recording of ours in which nothing trains (no backward, no optimizer step) serves,
    # even with grad mode on (model.eval() and no_grad forgotten: train_mode_inference)
    never_trains = bool(len(calls)) and not training and bool((calls["grad"] >= 0).all())
    rows: list[dict[str, Any]] = []
    for step in steps.itertuples(index=False):
        start, end = int(step.ts), int(step.ts + step.dur)
        own = by_step.get(step.step, calls.iloc[:0])
        if step.step in after_last and step.step not in training and not len(own):
            continue  # the code after the last step mark, with no model call: no phase
        # inference: every model call without grad (or, unrecorded, a loop of model calls)
        inference = step.step not in training and (
            bool(len(own)) and bool((own["grad"] == 0).all()) or (no_args and inference_loop)
            or (not len(own) and all_inference) or never_trains)
        if not inference:
            rows.extend(_train_rows(int(step.step), start, end, own, tails))
            continue
        first = own.iloc[0] if len(own) else None
        tokens = int((own["batch"] * own["new"]).sum()) if len(own) and \
            (own["new"] > 0).all() else None
        rows.append({"phase": EVAL, "step": int(step.step), "ts": start, "dur": end - start,
                     "tokens": tokens, "batch": -1 if first is None else int(first["batch"]),
                     "new": -1 if first is None else int(first["new"]),
                     "anchor": start if first is None else int(first["ts"])})
    _mark_generation(rows, lambda step, last: model_call_reads_last(trace, step, last))
    _apply_requests(rows, trace, calls)
    _apply_marks(rows, _marks(trace))
    out = pd.DataFrame(rows)
    out["tokens"] = out["tokens"].astype("Int64")
    return out[COLUMNS].sort_values("ts", kind="stable", ignore_index=True)


def _eval_tails(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of what may close an eval pass: host syncs (a metric's `.item()`) and
    outermost module calls without grad (its loss), in time order."""
    s = trace.table("slices")
    mask = kind_mask(trace, (tf.CAT_SYNC,))
    ts, end = s["ts"].to_numpy(np.int64), (s["ts"] + s["dur"]).to_numpy(np.int64)
    m = trace.modules
    if len(m):
        top = m[(m["depth"] == 0) & (m["phase"] == "forward")]
        grad = trace.slice_args.numbers(tf.ARG_GRAD, top["id"].to_numpy(), -1, "int64")
        top = top[grad == 0]
        starts = np.r_[ts[mask], top["ts"].to_numpy(np.int64)]
        ends = np.r_[end[mask], (top["ts"] + top["dur"]).to_numpy(np.int64)]
    else:
        starts, ends = ts[mask], end[mask]
    order = np.argsort(starts, kind="stable")
    return starts[order], ends[order]


def _train_rows(step: int, start: int, end: int, own: pd.DataFrame,
                tails: tuple[np.ndarray, np.ndarray]) -> list[dict[str, Any]]:
    """A training step and the eval passes recorded in it, each its own row: an eval call
    runs to the next model call; the last one before the training step's own call, to the
    end of the last loss call or sync after it (what follows prepares the training step's
    inputs). The training step starts after the eval passes before its own call."""
    rows: list[dict[str, Any]] = []
    grad = own[own["grad"] == 1]
    first_grad = int(grad["ts"].iloc[0]) if len(grad) else end
    starts = own["ts"].to_numpy(np.int64)
    train_start, eval_ns = start, 0
    for i, call in enumerate(own.itertuples(index=False)):
        if call.grad != 0 or call.training == 1:  # the training step's own work
            continue
        stop = int(starts[i + 1]) if i + 1 < len(own) else end
        if stop == first_grad:
            after = (tails[0] >= call.ts) & (tails[1] <= first_grad)
            stop = int(max(call.end, tails[1][after].max(initial=0)))
        known = call.new > 0
        rows.append({"phase": EVAL, "step": step, "ts": int(call.ts), "dur": stop - int(call.ts),
                     "tokens": call.batch * call.new if known else None, "batch": -1, "new": -1,
                     "anchor": int(call.ts)})
        if call.ts < first_grad:
            train_start = max(train_start, stop)
        else:
            eval_ns += stop - int(call.ts)
    tokens = int((grad["batch"] * grad["new"]).sum()) if len(grad) and \
        (grad["new"] > 0).all() else None
    rows.append({"phase": TRAIN, "step": step, "ts": train_start,
                 "dur": end - train_start - eval_ns, "tokens": tokens, "batch": -1, "new": -1,
                 "anchor": first_grad if len(grad) else train_start})
    return rows


def _mark_generation(rows: list[dict[str, Any]],
                     reads_last: Callable[[int, int], bool | None]) -> None:
    """Inference steps that add one token per sequence to the one before are `decode`;
    the step that starts such a run (the prompt) is `prefill`. A call one token longer
    than the last that reads none of its results (`reads_last(step, last step)`: False)
    is a request of its own: a server's padded batches, 38 then 39 tokens long, read as a
    prompt and its decode step."""
    previous: dict[str, Any] | None = None
    for row in rows:
        if row["phase"] == TRAIN:
            previous = None
            continue
        if _no_call(row):
            continue  # a piece of the iteration before it (below)
        if previous is not None and row["batch"] > 0 and row["batch"] == previous["batch"] \
                and (row["new"] == 1 or row["new"] == previous["new"] + 1
                     and reads_last(row["step"], previous["step"]) is not False):
            if previous["phase"] == EVAL:
                previous["phase"] = PREFILL
            row["phase"] = DECODE
            row["tokens"] = row["batch"]  # one new token per sequence, cache or not
        previous = row if row["phase"] != TRAIN and row["new"] > 0 else None
    # A step mark after the prompt's call (`neuron_explorer.step()` after the prefill,
    # whose return the recorder had marked) ends a piece without a call: the first
    # token's argmax and read, part of the prefill. It broke the chain: the first decode
    # step was taken for the prefill, and the time to first token left the prefill out.
    kept: list[dict[str, Any]] = []
    for i, row in enumerate(rows):
        ahead = rows[i + 1]["phase"] if i + 1 < len(rows) else None
        if _no_call(row) and ahead == DECODE and kept and kept[-1]["phase"] in (PREFILL, DECODE):
            kept[-1]["dur"] = row["ts"] + row["dur"] - kept[-1]["ts"]
            continue
        kept.append(row)
    rows[:] = kept


def _no_call(row: dict[str, Any]) -> bool:
    """An inference step without a model call."""
    return row["phase"] == EVAL and row["batch"] < 0 and row["new"] < 0


def _apply_requests(rows: list[dict[str, Any]], trace: Trace, calls: pd.DataFrame) -> None:
    """Inference rows whose model call serves marked requests: prefill or decode by
    whether those requests were served before (`requests.call_phases`)."""
    from neuron_explorer.analyses.requests import call_phases, request_marks

    marks = request_marks(trace)
    if not marks:
        return
    by_start = dict(zip(calls["ts"].tolist(), call_phases(marks, calls), strict=True))
    for row in rows:
        phase = by_start.get(row["anchor"]) if row["phase"] != TRAIN else None
        if phase is None:
            continue
        row["phase"] = phase
        known = row["batch"] > 0 and row["new"] > 0
        # a decode step: one new token a sequence; a prefill: every prompt token it read
        row["tokens"] = (row["batch"] if phase == DECODE else row["batch"] * row["new"]) \
            if known else None


def _marks(trace: Trace) -> list[tuple[int, int, str]]:
    """The ranges marked with `neuron_explorer.phase(name)`: (start, end, name), in time
    order (a range split at step boundaries is several)."""
    s = trace.table("slices")[kind_mask(trace, (tf.CAT_ANNOTATION,))]
    if not len(s):
        return []
    names = trace.slice_args.texts(tf.ARG_PHASE, s["id"].to_numpy())
    ts, end = s["ts"].to_numpy(np.int64), (s["ts"] + s["dur"]).to_numpy(np.int64)
    marks = [(int(a), int(b), str(n)) for a, b, n in zip(ts, end, names, strict=True) if n]
    return sorted(marks)


def _apply_marks(rows: list[dict[str, Any]], marks: list[tuple[int, int, str]]) -> None:
    """A row whose model call starts in a marked range is that range's phase (the
    innermost, latest begun, when ranges nest)."""
    for row in rows if marks else []:
        inside = [name for start, end, name in marks if start <= row["anchor"] < end]
        if inside:
            row["phase"] = inside[-1]
            if row["phase"] == DECODE and row["batch"] > 0:
                row["tokens"] = row["batch"]


def split_phases(trace: Trace) -> bool:
    """Whether the run trains and also does something else (eval passes, generation):
    per-step figures then count the training steps alone."""
    names = set(phases(trace)["phase"])
    return TRAIN in names and len(names) > 1


def training_windows(trace: Trace) -> pd.DataFrame:
    """step, ts, dur of the training steps, without the eval passes recorded in them."""
    p = phases(trace)
    return p.loc[p["phase"] == TRAIN, ["step", "ts", "dur"]].reset_index(drop=True)


def without_eval(trace: Trace, frame: pd.DataFrame, clip: bool = False) -> pd.DataFrame:
    """Rows of a table with `step` and `ts` (ops, modules, kernels) less those of the eval
    passes: those that start before their step's training part, and those of a step with
    none (sampling after training: the per-step figures are the training steps'; counted,
    a diffusion model's eight sampling steps made its findings claim 136% of the time
    analysed). `clip` (a table of spans with `dur`: idle gaps): a row that runs into the
    training part is kept, from the part's start."""
    if not len(frame) or not split_phases(trace):
        return frame
    start = training_windows(trace).set_index("step")["ts"].reindex(frame["step"]).to_numpy()
    ts = frame["ts"].to_numpy()
    before = np.isnan(start) | (ts < start)
    if "kind" in frame and "dur" in frame:  # an eval's last sync, that waited 0 ns as its
        # pass ended (where the training part starts): its own
        before |= ((frame["kind"].to_numpy() == tf.CAT_SYNC) & (ts == start)
                   & (frame["dur"].to_numpy() == 0))
    if clip:
        end = ts + frame["dur"].to_numpy()
        across = before & (end > start)
        if across.any():
            frame = frame.copy()
            frame.loc[across, "ts"] = start[across].astype(np.int64)
            frame.loc[across, "dur"] = (end[across] - start[across]).astype(np.int64)
            before &= ~across
    return frame[~before]


def in_analysed_work(trace: Trace, frame: pd.DataFrame, clip: bool = False) -> pd.DataFrame:
    """Rows of an event table (ops, kernels, idle gaps: `step`, `ts`) in the analysed steps,
    without the eval passes recorded inside training steps (`without_eval`): what the
    per-step figures and the findings count."""
    return without_eval(trace, in_analysed_steps(trace, frame), clip)


PHASE_SUMMARY_COLUMNS = ["phase", "steps", "median_ns", "total_ns", "paced_ns", "tokens",
                         "device_ns", "mfu", "mbu", "tokens_per_s"]


def phase_summary(trace: Trace) -> pd.DataFrame:
    """Per phase, in the order they first run, over every recorded step of it: steps,
    median and total time (the host's), `paced_ns` (each step as long as its host time or
    its kernels' device time, whichever is longer: a compiled prefill's host returns in
    60 us while its device works 713), tokens, and its own figures: the device time of its
    kernels (`device_ns`), MFU, MBU and tokens/s over its paced time (NaN where unknown).
    An eval pass's kernels are its own, not its training step's."""
    from neuron_explorer.peaks import hbm_bandwidth, peak_flops

    p = phases(trace)
    if not len(p):
        return pd.DataFrame(columns=PHASE_SUMMARY_COLUMNS)
    per_row = _work_per_row(trace, p)
    p = p.assign(paced=np.maximum(p["dur"].to_numpy(np.float64),
                                  per_row["dur"].fillna(0).to_numpy(np.float64)))
    g = p.groupby("phase", sort=False)
    out = pd.DataFrame({"steps": g.size(), "median_ns": g["dur"].median(),
                        "total_ns": g["dur"].sum(), "paced_ns": g["paced"].sum(),
                        "tokens": g["tokens"].sum(min_count=1)})
    work = per_row.assign(phase=p["phase"].to_numpy()).groupby("phase")[
        ["dur", "flops", "bytes"]].sum(min_count=1).reindex(out.index)
    total_s = out["paced_ns"].to_numpy(np.float64) / 1e9
    figures = trace.hardware_figures
    out["device_ns"] = work["dur"]
    out["mfu"] = work["flops"] / ((peak_flops(figures) or np.nan) * total_s)
    out["mbu"] = work["bytes"] / ((hbm_bandwidth(figures) or np.nan) * total_s)
    out["tokens_per_s"] = out["tokens"].astype("float64") / total_s
    return out.reset_index()[PHASE_SUMMARY_COLUMNS]


def _work_per_row(trace: Trace, p: pd.DataFrame) -> pd.DataFrame:
    """Per row of `p`: its kernels' device time, model FLOPs and HBM bytes (NaN without
    device work). A kernel belongs to the row of its step that began last before it
    (an eval pass in a training step, or the step's training part), else its step's first."""
    from neuron_explorer.analyses.levels import records_device

    k = trace.kernels
    if not len(k) or not records_device(trace):
        return pd.DataFrame(index=pd.RangeIndex(len(p)), columns=["dur", "flops", "bytes"],
                            dtype="float64")
    rows = p[["phase", "step", "ts"]].assign(row=np.arange(len(p)))
    rows = rows.astype({"step": "int64", "ts": "int64"}).sort_values("ts")
    kern = k[["ts", "step", "dur", "flops", "bytes"]].astype({"step": "int64", "ts": "int64"})
    kern = kern[kern["step"].isin(rows["step"])].sort_values("ts")
    found = pd.merge_asof(kern, rows[["ts", "step", "row"]], on="ts", by="step",
                          direction="backward")
    first = rows.groupby("step")["row"].min()
    row = found["row"].fillna(found["step"].map(first)).to_numpy(np.int64)
    return found.assign(row=row).groupby("row")[["dur", "flops", "bytes"]].sum() \
        .reindex(pd.RangeIndex(len(p))).astype("float64")


def serving(trace: Trace) -> pd.DataFrame:
    """One row per generation (a prefill and the decode steps after it): batch, prompt
    tokens, decode steps, new tokens, time to first token, time per output token (median,
    p90) and tokens/s (token counts NaN where unknown). A token is ready when its step's
    device work ends (its host step end when the trace has no kernels).

    Then the figures that matter for each part: the prefill's MFU (it is compute-bound:
    a whole prompt through every matmul) and the decode steps' MBU (memory-bound: every
    weight and the whole cache read for one token each); NaN where the trace records no
    device work or no hardware figures. Whether the decode steps use a KV cache
    (`kv_cache`: True where each call feeds one new token per sequence, False where it
    feeds the whole sequence so far, NA where the token ids went unseen). And the cache
    from the allocator (`kv_cache()`): what the generation holds through its last step
    (`kv_bytes`) and what each new token adds per sequence (`kv_bytes_per_token`, the
    median over the decode steps); NaN without a cache (what grows then is no cache).

    With requests marked (`neuron_explorer.request`), requests join and leave the batch
    at every step, so the run is one row pooling them (`_pooled_requests`), and
    `requests()` has each request's figures."""
    p = phases(trace)
    if not len(p) or not (p["phase"] == PREFILL).any():
        return pd.DataFrame({c: pd.Series(dtype="float64") for c in SERVING_COLUMNS})
    ready = token_ready(trace, p)
    work = _device_work(trace, p)
    if _marked(trace):
        return pd.DataFrame([_pooled_requests(trace, p, ready, work)],
                            columns=SERVING_COLUMNS).astype({"kv_cache": "boolean"})
    held = kv_cache(trace)
    cached = caches(trace, p)
    compiling = _compile_time(trace)
    rows: list[dict[str, Any]] = []
    for n, (i, j) in enumerate(generations(trace, p)):
        times = ready[i:j]
        start = int(p.at[i, "ts"])
        # sequences: a decode step's tokens (NA where the model's token ids went unseen)
        batch = _known(p.at[i + 1, "tokens"]) if j > i + 1 else np.nan
        gaps = np.diff(times)
        # compile time is left out (the compile findings' own): a compiled generation's
        # first steps compile for seconds, which no serving rate should average in
        ttft = times[0] - start - compiling(start, times[0])
        decoding = times[-1] - times[0] - compiling(times[0], times[-1]) if len(gaps) else 0
        new = batch * (j - i)  # the prefill's token and one per decode step
        total = ttft + decoding
        rows.append({"generation": n, "step": int(p.at[i, "step"]), "batch": batch,
                     "prompt_tokens": _known(p.at[i, "tokens"]), "decode_steps": j - i - 1,
                     "new_tokens": new, "ttft_ns": int(ttft),
                     "tpot_median_ns": float(np.median(gaps)) if len(gaps) else np.nan,
                     "tpot_p90_ns": float(np.percentile(gaps, 90)) if len(gaps) else np.nan,
                     "tokens_per_s": new / (total / 1e9) if total > 0 else np.nan,
                     "prefill_mfu": work["flops"][i] / (work["peak"] * ttft / 1e9),
                     "decode_mbu": (work["bytes"][i + 1:j].sum() / (work["bw"] * decoding / 1e9)
                                    if decoding > 0 else np.nan),
                     "kv_cache": cached[n],
                     **_kv_figures(held[held["generation"] == n], batch)})
    return pd.DataFrame(rows, columns=SERVING_COLUMNS).astype({"kv_cache": "boolean"})


def without_cache(kv_cache: Any) -> bool:
    """Whether a serving row's `kv_cache` says its decode steps read none (not unknown)."""
    return bool(pd.notna(kv_cache)) and not bool(kv_cache)


def _compile_time(trace: Trace) -> Any:
    """ns of compiling (Dynamo's spans) between two times, as a function of them."""
    from neuron_explorer.analyses.compilation import compile_spans
    from neuron_explorer.common.intervals import Union

    spans = compile_spans(trace)
    ts = spans["ts"].to_numpy(np.int64)
    union = Union(ts, ts + spans["dur"].to_numpy(np.int64))

    def within(a: int, b: int) -> int:
        return int(union.covered(np.array([a], np.int64), np.array([b], np.int64))[0])
    return within


def _pooled_requests(trace: Trace, p: pd.DataFrame, ready: np.ndarray,
                     work: dict[str, Any]) -> dict[str, Any]:
    """The serving row of a run with requests marked, from its first prefill to its last
    token: batch (the median decode step's sequences), prompt tokens (every prefill's),
    new tokens (every request's), time to first token (the median request's), time per
    output token (median and p90 of every gap between a request's consecutive tokens),
    tokens/s, MFU over the prefill steps and MBU over the decode steps (each step from its
    start to its token). No KV cache figures: the allocator cannot tell one request's
    cache from another's as they come and go, nor see a cache allocated up front."""
    from neuron_explorer.analyses.requests import marked_requests

    served = marked_requests(trace)
    ((i, j),) = generations(trace, p)
    phase = p["phase"].to_numpy()[i:j]
    pre, dec = phase == PREFILL, phase == DECODE
    tokens = p["tokens"].to_numpy(dtype=object)[i:j]
    busy = (ready - p["ts"].to_numpy(np.int64))[i:j]  # each step: its start to its token
    gaps = np.concatenate([np.diff(r.times) for r in served])
    new = sum(r.tokens for r in served)
    total = ready[i:j].max() - int(p.at[i, "ts"])
    flops, moved = work["flops"][i:j], work["bytes"][i:j]
    return {
        "generation": 0, "step": int(p.at[i, "step"]),
        "batch": float(np.median([_known(t) for t in tokens[dec]])) if dec.any() else np.nan,
        "prompt_tokens": float(sum(_known(t) for t in tokens[pre])),
        "decode_steps": int(dec.sum()), "new_tokens": new,
        "ttft_ns": float(np.median([r.times[0] - r.arrival for r in served])),
        "tpot_median_ns": float(np.median(gaps)) if len(gaps) else np.nan,
        "tpot_p90_ns": float(np.percentile(gaps, 90)) if len(gaps) else np.nan,
        "tokens_per_s": new / (total / 1e9) if total > 0 else np.nan,
        "prefill_mfu": flops[pre].sum() / (work["peak"] * busy[pre].sum() / 1e9),
        "decode_mbu": (moved[dec].sum() / (work["bw"] * busy[dec].sum() / 1e9)
                       if dec.any() and busy[dec].sum() > 0 else np.nan),
        "kv_cache": pd.NA, "kv_bytes": np.nan, "kv_bytes_per_token": np.nan}


def _marked(trace: Trace) -> bool:
    """Whether `neuron_explorer.request` marked the model's calls."""
    from neuron_explorer.analyses.requests import marked_requests

    return bool(marked_requests(trace))


def generations(trace: Trace, p: pd.DataFrame) -> list[tuple[int, int]]:
    """(first row, row after the last) of each prefill and the decode steps after it; with
    requests marked, one span from the first prefill to the last prefill or decode step
    (requests interleave: a prefill does not end the decode steps before it)."""
    phase = p["phase"].to_numpy()
    if _marked(trace) and (phase == PREFILL).any():
        rows = np.flatnonzero((phase == PREFILL) | (phase == DECODE))
        return [(int(rows[0]), int(rows[-1]) + 1)]
    spans = []
    for i in np.flatnonzero(phase == PREFILL).tolist():
        j = i + 1
        while j < len(p) and phase[j] == DECODE:
            j += 1
        spans.append((i, j))
    return spans


def _device_work(trace: Trace, p: pd.DataFrame) -> dict[str, Any]:
    """Per phase row: its kernels' model FLOPs and HBM bytes; the hardware's peaks (NaN
    where the trace has no kernels or no figures, so the ratios are NaN)."""
    from neuron_explorer.analyses.levels import records_device
    from neuron_explorer.peaks import hbm_bandwidth, peak_flops

    k = trace.kernels
    steps = p["step"].to_numpy()
    if len(k) and records_device(trace):
        sums = k.groupby("step")[["flops", "bytes"]].sum().reindex(steps, fill_value=0)
        flops, moved = sums["flops"].to_numpy(np.float64), sums["bytes"].to_numpy(np.float64)
    else:
        flops = moved = np.full(len(steps), np.nan)
    figures = trace.hardware_figures
    return {"flops": flops, "bytes": moved, "peak": peak_flops(figures) or np.nan,
            "bw": hbm_bandwidth(figures) or np.nan}


def caches(trace: Trace, p: pd.DataFrame) -> list[Any]:
    """Per generation, whether its decode steps read a KV cache: True where each model call
    feeds one new token per sequence, False where it feeds the whole sequence so far (the
    previous length + 1), NA where the token ids went unseen or nothing was decoded."""
    calls = model_calls(trace)
    new = calls.groupby("step")["new"].max()
    steps = p["step"].to_numpy()
    found: list[Any] = []
    for i, j in generations(trace, p):
        fed = new.reindex(steps[i + 1:j]).to_numpy()
        if not len(fed) or np.isnan(fed).any() or (fed < 1).any():
            found.append(pd.NA)
        else:
            found.append(bool((fed == 1).all()))
    return found


def kv_cache(trace: Trace) -> pd.DataFrame:
    """Per prefill and decode step: the least device memory in use during the step, less
    the same during its generation's prefill (`held_bytes`). The least is what stays
    allocated through the step: the weights and the KV cache the step reads, without the
    call's temporaries or the previous cache (freed as the step starts, when the caller
    lets go of it). Empty without memory events; no rows for a generation without a cache
    (`caches`), whose growing sequence is no cache."""
    p = phases(trace)
    memory = trace.memory_timeline() if len(p) else pd.DataFrame()
    rows = []
    cached = caches(trace, p) if len(memory) else []
    for n, (i, j) in enumerate(generations(trace, p) if len(memory) else []):
        if without_cache(cached[n]):
            continue
        ts = p["ts"].to_numpy(np.int64)[i:j]
        floor = _least_in_use(memory, ts, ts + p["dur"].to_numpy(np.int64)[i:j])
        rows.append(pd.DataFrame({"generation": n, "phase": p["phase"].to_numpy()[i:j],
                                  "step": p["step"].to_numpy()[i:j], "ts": ts,
                                  "held_bytes": floor - floor[0]}))
    if not rows:
        return pd.DataFrame({c: pd.Series(dtype="int64") for c in KV_COLUMNS})
    return pd.concat(rows, ignore_index=True)[KV_COLUMNS]


def _least_in_use(memory: pd.DataFrame, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """The least device memory in use in each window [start, end), each device's least
    (its samples in the window and the one in force when it opens) summed."""
    total = np.zeros(len(start), np.int64)
    for _, samples in memory.groupby("device"):
        times = samples["ts"].to_numpy(np.int64)
        values = samples["in_use_bytes"].to_numpy(np.int64)
        first = np.searchsorted(times, start, side="left")
        last = np.searchsorted(times, end, side="left")
        for w, (a, b) in enumerate(zip(first.tolist(), last.tolist(), strict=True)):
            window = values[max(a - 1, 0):b] if b > 0 else values[:0]
            total[w] += int(window.min()) if len(window) else 0
    return total


def _kv_figures(held: pd.DataFrame, batch: float) -> dict[str, float]:
    """The generation's KV cache held through its last step, and its growth per new
    token and sequence (the median step's growth over the batch)."""
    if not len(held):
        return {"kv_bytes": np.nan, "kv_bytes_per_token": np.nan}
    grown = np.diff(held.loc[held["phase"] == DECODE, "held_bytes"].to_numpy())
    per_token = float(np.median(grown)) / batch if len(grown) and batch > 0 else np.nan
    return {"kv_bytes": float(held["held_bytes"].iloc[-1]), "kv_bytes_per_token": per_token}


def _known(value: Any) -> float:
    """A token count, NaN where unknown."""
    return np.nan if pd.isna(value) else float(value)


def token_times(trace: Trace) -> pd.DataFrame:
    """Per generated token (a prefill's or a decode step's, for the whole batch): its
    generation, number, phase, step, when it was ready (`ready`, ns) and the time it took
    (`gap_ns`: from the prefill's start for the first token, the time to first token;
    from the token before for the others, the time per output token)."""
    p = phases(trace)
    ready = token_ready(trace, p) if len(p) else np.zeros(0, np.int64)
    parts = []
    for n, (i, j) in enumerate(generations(trace, p)):
        times = ready[i:j]
        parts.append(pd.DataFrame({
            "generation": n, "token": np.arange(j - i), "phase": p["phase"].to_numpy()[i:j],
            "step": p["step"].to_numpy()[i:j], "ready": times,
            "gap_ns": np.diff(times, prepend=int(p.at[i, "ts"]))}))
    if not parts:
        return pd.DataFrame({c: pd.Series(dtype="int64") for c in TOKEN_COLUMNS})
    return pd.concat(parts, ignore_index=True)[TOKEN_COLUMNS]


def token_ready(trace: Trace, p: pd.DataFrame) -> np.ndarray:
    """When each phase row's work is done: its host end, or later its kernels' end."""
    end = (p["ts"] + p["dur"]).to_numpy(np.int64)
    k = trace.kernels
    if not len(k):
        return end
    last = (k["ts"] + k["dur"]).groupby(k["step"]).max()
    device = last.reindex(p["step"]).fillna(0).to_numpy(np.int64)
    return np.maximum(end, device)
