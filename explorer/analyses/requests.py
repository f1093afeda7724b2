"""Per request figures of a serving run: queueing, time to first token, time per output
token, end-to-end latency.

A request is what `neuron_explorer.request(id)` (or a list of ids, one per batch row)
marks: a model call serves the requests of every range it starts in. Its first call reads
its prompt and gives its first token; each later call one more. A token is ready when the
kernels its call launched end (the call's end without kernels). The first range naming a
request is its arrival (the work in it before the call, such as the input's upload, is
part of its latency): when that range holds no call of it (a mark entered as the request
came in), the time until its first call is its queueing. It is done when its last token is
ready or, where later, when the last range naming it ends (a read of its result there).

Without marks, each row of a generation's batch (`phases.generations`) is a request: they
arrive together with the prefill step and share its figures.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from neuron_explorer.common import trace_format as tf
from neuron_explorer.memo import memoised
from neuron_explorer.tables import kind_mask

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

COLUMNS = ["request", "arrival_ns", "queue_ns", "prompt_tokens", "tokens", "first_step",
           "last_step", "ttft_ns", "tpot_median_ns", "tpot_p90_ns", "e2e_ns"]
Mark = tuple[int, int, list[Any]]  # start, end, request ids


def request_marks(trace: Trace) -> list[Mark]:
    """The ranges `neuron_explorer.request` marked: (start, end, ids), in time order (a range
    split at a step boundary is several, with the same ids)."""
    s = trace.table("slices")[kind_mask(trace, (tf.CAT_ANNOTATION,))]
    if not len(s):
        return []
    texts = trace.slice_args.texts(tf.ARG_REQUEST, s["id"].to_numpy())
    ts, end = s["ts"].to_numpy(np.int64), (s["ts"] + s["dur"]).to_numpy(np.int64)
    marks = []
    for a, b, text in zip(ts.tolist(), end.tolist(), texts, strict=True):
        ids = _ids(text)
        if ids:
            marks.append((a, b, ids))
    return sorted(marks, key=lambda m: (m[0], -m[1]))  # an enclosing range before its inner


def _ids(text: str) -> list[Any]:
    """'[3, 7]' -> [3, 7]; anything else (absent, not a list of ids) -> []."""
    try:
        ids = json.loads(text) if text else None
    except ValueError:
        return []
    if not isinstance(ids, list):
        return []
    return [i for i in ids if isinstance(i, int | str) and not isinstance(i, bool)]


def served(marks: list[Mark], starts: np.ndarray) -> list[list[Any]]:
    """For each call start (in time order): the ids of the ranges it starts in, the
    outermost range's first (so batch row i serves the i-th), each id once."""
    out: list[list[Any]] = []
    active: list[Mark] = []  # ranges begun by the current start and maybe not ended
    n = 0
    for t in starts.tolist():
        while n < len(marks) and marks[n][0] <= t:
            active.append(marks[n])
            n += 1
        active = [m for m in active if t < m[1]]
        ids: list[Any] = []
        for _, _, marked in active:
            ids.extend(i for i in marked if i not in ids)
        out.append(ids)
    return out


def call_phases(marks: list[Mark], calls: pd.DataFrame) -> list[str | None]:
    """Per model call: `prefill` when it serves requests no call served before (their
    prompts), `decode` when every request it serves was served before, None unmarked.
    Where no request is served twice, nothing is generated: each call answers its requests
    whole (a classifier's), an `eval` pass, not a prefill with a time to first token."""
    from neuron_explorer.analyses.phases import DECODE, EVAL, PREFILL

    seen: set[Any] = set()
    out: list[str | None] = []
    for ids in served(marks, calls["ts"].to_numpy(np.int64)):
        if not ids:
            out.append(None)
            continue
        out.append(DECODE if all(i in seen for i in ids) else PREFILL)
        seen.update(ids)
    if DECODE not in out:
        return [EVAL if phase == PREFILL else phase for phase in out]
    return out


def call_ready(trace: Trace, calls: pd.DataFrame) -> np.ndarray:
    """When each model call's work is done: the end of the kernels launched inside it (by
    their op's start), or the call's end when later or without kernels."""
    ready = calls["end"].to_numpy(np.int64).copy()
    k = trace.kernels
    if not len(k) or not len(calls):
        return ready
    op = k["op_slice_id"].to_numpy(np.int64)
    launch = np.where(op >= 0, trace.table("slices")["ts"].to_numpy(np.int64)[np.maximum(op, 0)],
                      -1)
    starts = calls["ts"].to_numpy(np.int64)
    call = np.searchsorted(starts, launch, side="right") - 1
    inside = (op >= 0) & (call >= 0)
    inside[inside] = launch[inside] < ready[call[inside]]
    np.maximum.at(ready, call[inside], (k["ts"] + k["dur"]).to_numpy(np.int64)[inside])
    return ready


def requests(trace: Trace) -> pd.DataFrame:
    """One row per request (`COLUMNS`): request (its id; `G/B` for batch row B of generation
    G when none are marked), arrival_ns, queue_ns (NaN where the trace shows no arrival
    before its first call), prompt_tokens (as its first call saw them, NaN where unknown),
    tokens (output tokens: one per call, per sequence it holds), first_step, last_step,
    ttft_ns (arrival to first token), tpot_median_ns and tpot_p90_ns (between its
    consecutive tokens), e2e_ns (arrival to its answer: its last token, or the end of the
    last range naming it where later, as a read of the result in it ends it)."""
    served_requests = marked_requests(trace)
    if not served_requests:
        return _by_batch_row(trace)
    rows = []
    for r in served_requests:
        gaps = np.diff(r.times)
        rows.append({
            "request": r.id, "arrival_ns": r.arrival, "queue_ns": r.queue_ns,
            "prompt_tokens": r.prompt_tokens, "tokens": r.tokens, "first_step": r.first_step,
            "last_step": r.last_step, "ttft_ns": int(r.times[0] - r.arrival),
            "tpot_median_ns": float(np.median(gaps)) if len(gaps) else np.nan,
            "tpot_p90_ns": float(np.percentile(gaps, 90)) if len(gaps) else np.nan,
            "e2e_ns": int(r.done - r.arrival)})
    return pd.DataFrame(rows, columns=COLUMNS).sort_values(
        "arrival_ns", kind="stable", ignore_index=True)


@dataclass
class Served:
    """A marked request as the trace shows it: when it arrived (and whether it waited),
    when each of its tokens was ready, its prompt and output tokens and its steps."""

    id: Any
    arrival: int
    queue_ns: float  # NaN: no arrival shown before its first call
    times: np.ndarray  # when each call serving it was done: a token (per sequence) each
    done: int  # when its answer was the host's: its last token, or its last range's end
    prompt_tokens: float
    tokens: int
    first_step: int
    last_step: int


def marked_requests(trace: Trace) -> list[Served]:
    """The requests `neuron_explorer.request` marked, in the order first served ([] when
    none are)."""
    return memoised(trace, "marked_requests", lambda: _marked_requests(trace))


def _marked_requests(trace: Trace) -> list[Served]:
    from neuron_explorer.analyses.phases import model_calls

    marks = request_marks(trace)
    if not marks:
        return []
    calls = model_calls(trace)
    ready = call_ready(trace, calls)
    batch, new = calls["batch"].to_numpy(), calls["new"].to_numpy()
    steps, starts = calls["step"].to_numpy(), calls["ts"].to_numpy(np.int64)
    per: dict[Any, list[tuple[int, int]]] = {}  # id -> (call, sequences it holds in it)
    for c, ids in enumerate(served(marks, starts)):
        # a batch of one row per request; else its rows split evenly, else one each
        rows = batch[c] // len(ids) if ids and batch[c] > 0 and batch[c] % len(ids) == 0 else 1
        for i in ids:
            per.setdefault(i, []).append((c, int(rows)))
    first_mark: dict[Any, tuple[int, int]] = {}
    last_end: dict[Any, int] = {}
    for a, b, ids in marks:
        for i in ids:
            first_mark.setdefault(i, (a, b))
            last_end[i] = max(last_end.get(i, b), b)
    out = []
    for rid, served_in in per.items():
        first, last = served_in[0][0], served_in[-1][0]
        a, b = first_mark[rid]
        # an earlier range with none of its calls: its arrival, and then it waited
        queued = not a <= starts[first] < b
        times = ready[[c for c, _ in served_in]]
        out.append(Served(
            # it arrives as its first range begins: the work in it before the model call
            # (the input's upload, tokenizing) is part of its latency
            id=rid, arrival=a,
            queue_ns=float(starts[first] - a) if queued else np.nan,
            times=times,
            # its answer is the host's once its last range ends (a read of the result
            # inside it: `.cpu()`, `.item()`), not when the device's last kernel does
            done=max(int(times[-1]), last_end[rid]),
            prompt_tokens=float(new[first] * served_in[0][1]) if new[first] > 0 else np.nan,
            tokens=sum(n for _, n in served_in), first_step=int(steps[first]),
            last_step=int(steps[last])))
    return out


def _by_batch_row(trace: Trace) -> pd.DataFrame:
    """Unmarked: each batch row of each generation is a request with its figures."""
    from neuron_explorer.analyses.phases import generations, phases, token_ready

    p = phases(trace)
    sv = trace.serving()
    if not len(sv):
        return _empty()
    ready = token_ready(trace, p)
    rows = []
    for g, (i, j) in zip(sv.itertuples(index=False), generations(trace, p), strict=True):
        start = int(p.at[i, "ts"])
        seqs = int(g.batch) if g.batch > 0 else 1  # unknown batch: the generation as one
        for b in range(seqs):
            rows.append({"request": f"{g.generation}/{b}", "arrival_ns": start,
                         "queue_ns": np.nan,
                         "prompt_tokens": g.prompt_tokens / seqs if g.batch > 0 else np.nan,
                         "tokens": j - i, "first_step": int(p.at[i, "step"]),
                         "last_step": int(p.at[j - 1, "step"]), "ttft_ns": int(g.ttft_ns),
                         "tpot_median_ns": g.tpot_median_ns, "tpot_p90_ns": g.tpot_p90_ns,
                         "e2e_ns": int(ready[j - 1] - start)})
    return pd.DataFrame(rows, columns=COLUMNS)


def _empty() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=object if c == "request" else "float64")
                         for c in COLUMNS})


PERCENTILES = (50, 90, 99)


def request_percentiles(frame: pd.DataFrame) -> pd.DataFrame:
    """p50, p90, p99 and max over requests of queueing, time to first token, time per
    output token (each request's median) and end-to-end latency (NaN rows dropped)."""
    rows = []
    # requests answered by one call each (a classifier's): their first token is their
    # answer, and "time to first token" would name a generation that never ran
    answered_whole = bool(len(frame)) and frame["tpot_median_ns"].isna().all()
    for label, column in (("queueing", "queue_ns"), ("time to first token", "ttft_ns"),
                          ("per output token (median)", "tpot_median_ns"),
                          ("end to end", "e2e_ns")):
        if answered_whole and column == "ttft_ns":
            continue
        values = frame[column].dropna().to_numpy(np.float64)
        if len(values):
            rows.append({"figure": label, "requests": len(values),
                         **{f"p{q}": float(np.percentile(values, q)) for q in PERCENTILES},
                         "max": float(values.max())})
    return pd.DataFrame(rows, columns=["figure", "requests", *(f"p{q}" for q in PERCENTILES),
                                       "max"])
