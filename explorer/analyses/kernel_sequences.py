"""Frequent sequences of kernels: candidates for fusion.

A sequence is `n` kernels that ran back to back on one device queue (stream), each
launched by the same op as the one before it or by the host's very next launch on the
same thread (no other launch in between). Copies and memsets are not kernels to fuse
(`transfers`: kind memcpy or memset, a name that says it crosses the host link, as our
`copy_host_to_device`, or an op with a host<->device `direction`): one launched between
two kernels ends a sequence (device-side copies with no launch in the trace, as MTIA's
DMA requests, are left out). Sequences are counted as sliding windows,
so one long run of kernels holds several (overlapping) sequences; a row's time counts
each kernel once (rows of different sequences share kernels, so their shares add to more
than the whole).

With `op`, HTA 0.5's definition (`get_frequent_cuda_kernel_sequences`) instead: the host
slices whose name holds `op`, the shallowest of them, each with at least `n` launches; a
row per distinct (op name, every kernel, copy and memset it launched, in time order), with
its count, its kernels' time and the ops' own time. HTA's depth links the autograd thread
under the main one; here a slice's depth is on its own thread.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

COLUMNS = ["sequence", "count", "total_ns", "mean_ns", "share"]
OP_COLUMNS = ["op", "sequence", "kernels", "count", "total_ns", "mean_ns", "op_ns", "share"]
SEPARATOR = " | "
# names of copies across the host link (Kineto's Memcpy HtoD/DtoH, our copy_host_to_device)
CROSSING = re.compile(r"htod|dtoh|h2d|d2h|host_to_device|device_to_host|to_host|to_device",
                      re.IGNORECASE)
CROSSING_DIRECTIONS = ("host_to_device", "device_to_host")


def transfers(trace: Trace, k: pd.DataFrame) -> np.ndarray:
    """Which rows of the kernels table `k` are copies or memsets rather than kernels: kind
    memcpy or memset, a name that crosses the host link (our recordings write transfers
    as kind `kernel`, named `copy_host_to_device` / `copy_device_to_host`), or launched by
    an op whose `direction` arg is host_to_device or device_to_host."""
    from neuron_explorer.tables import map_unique, text

    if not len(k):
        return np.zeros(0, bool)
    out = k["kind"].isin(["memcpy", "memset"]).to_numpy(bool, na_value=False).copy()
    out |= map_unique(k["name"], lambda n: bool(CROSSING.search(str(n))), bool)
    ops = k["op_slice_id"].to_numpy(np.int64)
    has_op = np.flatnonzero(ops >= 0)
    if len(has_op):
        direction = text(trace.slice_args.column("direction", ops[has_op]))
        out[has_op] |= np.isin(direction, CROSSING_DIRECTIONS)
    return out


def kernel_sequences(trace: Trace, n: int = 3, top: int | None = None, op: str | None = None,
                     hta_window: bool = False, compiled: bool = False) -> pd.DataFrame:
    """The distinct sequences of `n` kernels (`COLUMNS`): sequence (names joined by " | "),
    count, total_ns (their kernels' time, each kernel once), mean_ns (an occurrence's
    kernels' time), share (of all kernel, copy and memset time), most frequent first, the
    `top` of them (all: None). `op`: HTA's per-op patterns instead (`OP_COLUMNS`).
    `hta_window`: over the kernels HTA keeps: launched in the trace, before the last
    ProfilerStep of a trace of two or more.
    `compiled` (without `op`): a column `compiled_ns` too, the fusion the compiler would
    do on our device (`compiled_times`; NaN where the trace cannot say)."""
    if n < 1:
        raise ValueError(f"a sequence has at least one kernel, not n={n}")
    k = launched(trace, hta_window)
    columns = COLUMNS if op is None else OP_COLUMNS
    if compiled and op is None:
        columns = [*COLUMNS, "compiled_ns"]
    found = _windows(trace, k, n) if op is None else _op_patterns(trace, k, op, n, hta_window)
    if not len(found):
        return pd.DataFrame(columns=columns)
    total = float(k["dur"].sum())
    if "mean_ns" not in found:
        found["mean_ns"] = found["total_ns"] / found["count"]
    found["share"] = found["total_ns"] / total if total > 0 else 0.0
    found = found.sort_values(["count", "total_ns", "sequence"], ascending=[False, False, True],
                              ignore_index=True)
    found = found if top is None else found.head(top)
    if "compiled_ns" in columns:
        found = found.assign(compiled_ns=compiled_times(trace, found["sequence"].tolist(), n))
    return found[columns]


def compiled_times(trace: Trace, sequences: list[str], n: int) -> list[float]:
    """Per sequence of `n` kernels, the device time of its first occurrence's ops (those
    that launched its kernels) run as one compiled program on the recorded hardware, as
    `whatif --mode compiled` builds a graph (every op's lowering in one kernel: no launch
    or fixed kernel cost between them, one op's loads overlapping the compute before it;
    values still through HBM). NaN where the trace holds no op keys for those ops (a
    PyTorch-profiler trace, a compiled run's graph launches, a prediction) or the program
    is too large to schedule while a report waits."""
    from neuron_explorer.backend.hardware import DeviceTimeline
    from neuron_explorer.backend.replay import ReplayOptions
    from neuron_explorer.common import op_key_codec
    from neuron_explorer.common import trace_format as tf
    from neuron_explorer.device_terms import device_terms
    from neuron_explorer.what_if.compiled import ProgramTooLarge, build_program
    from neuron_explorer.what_if.replay import PREDICTION_MAX_DEPENDENCIES, replayable

    out = [float("nan")] * len(sequences)
    if not sequences or not replayable(trace) or not device_terms(trace.metadata).recorded_here:
        return out
    windows = sequence_windows(trace, n)
    first = windows[windows["sequence"].isin(sequences)].groupby("sequence")["window"].min()
    op_of = trace.kernels.set_index("id")["op_slice_id"]
    names = trace.table("slices")["name"].to_numpy(object)
    preset = ReplayOptions(trace.hardware or "trn2").preset()
    for i, sequence in enumerate(sequences):
        if sequence not in first.index:
            continue
        ids = windows.loc[windows["window"] == first[sequence], "id"].to_numpy(np.int64)
        ops = np.asarray(list(dict.fromkeys(op_of.reindex(ids).tolist())), np.int64)
        if (ops < 0).any():
            continue
        keys = trace.slice_args.column(tf.ARG_OP_KEY, ops)
        if any(key is None for key in keys):
            continue
        shapes = trace.slice_args.texts(tf.ARG_SHAPES, ops)
        dtypes = trace.slice_args.texts(tf.ARG_DTYPES, ops)
        try:
            decoded = [op_key_codec.decode(*row) for row in
                       zip(names[ops].tolist(), shapes.tolist(), dtypes.tolist(), keys.tolist(),
                           strict=True)]
            program = build_program(decoded, preset, "fused", PREDICTION_MAX_DEPENDENCIES)
        except (op_key_codec.OpKeyError, ProgramTooLarge):
            continue
        if program is not None:
            start, end = DeviceTimeline(preset).schedule(program, 0)
            out[i] = float(end - start)
    return out


def launched(trace: Trace, hta_window: bool) -> pd.DataFrame:
    """The kernels table with each one's launch: its runtime call (PyTorch-profiler
    traces) or op (ours), -1 when not in the trace; `track` is the kernel's queue."""
    from neuron_explorer.tables import kernel_launches

    k = trace.kernels
    s = trace.table("slices")
    launch = kernel_launches(trace)
    k = k.assign(launch=launch, track=s["track_id"].to_numpy()[k["id"].to_numpy(np.int64)])
    if hta_window:
        keep = launch >= 0
        if len(trace.steps) >= 2:
            launched_at = s["ts"].to_numpy(np.int64)[np.maximum(launch, 0)]
            keep &= launched_at < int(trace.steps["ts"].max())
        k = k[keep]
    return k


WINDOW_COLUMNS = ["window", "sequence", "position", "id"]


def sequence_windows(trace: Trace, n: int = 3) -> pd.DataFrame:
    """Each window of `n` linked kernels (the occurrences `kernel_sequences` counts), one
    row per kernel in it (`WINDOW_COLUMNS`): window (its number), sequence, position (0
    to n - 1, in time order) and id (the kernel's slice)."""
    frame, starts = _linked(trace, launched(trace, False), n)
    if not len(starts):
        return pd.DataFrame(columns=WINDOW_COLUMNS)
    rows = (starts[:, None] + np.arange(n)[None, :]).ravel()
    # each distinct run of names worded once: a trace holds few sequences, many windows
    codes, names = pd.factorize(frame["name"], use_na_sentinel=False)
    runs, which = _distinct_rows(codes[rows].reshape(-1, n), len(names))
    names = np.asarray(names, object)
    sequence = np.array([SEPARATOR.join(map(str, names[run])) for run in runs], object)
    return pd.DataFrame({"window": np.repeat(np.arange(len(starts)), n),
                         "sequence": np.repeat(sequence[which], n),
                         "position": np.tile(np.arange(n), len(starts)),
                         "id": frame["id"].to_numpy(np.int64)[rows]}, columns=WINDOW_COLUMNS)


def _distinct_rows(rows: np.ndarray, base: int) -> tuple[np.ndarray, np.ndarray]:
    """The distinct rows of small codes (each below `base`) and each row's number among
    them. A row is one number in base `base` where it fits 63 bits, hashed by pandas
    (np.unique's rows sort as records: 9% of a 3 M-event trace's findings)."""
    n = rows.shape[1]
    if base ** n >= 1 << 62:
        runs, which = np.unique(rows, axis=0, return_inverse=True)
        return runs, which.ravel()
    place = np.int64(max(base, 1)) ** np.arange(n, dtype=np.int64)
    which, keys = pd.factorize(rows.astype(np.int64) @ place)
    return (keys[:, None] // place[None, :]) % max(base, 1), which


def _windows(trace: Trace, k: pd.DataFrame, n: int) -> pd.DataFrame:
    """Every window of `n` linked kernels on one queue, grouped by their names."""
    frame, starts = _linked(trace, k, n)
    if not len(starts):
        return pd.DataFrame()
    codes, names = pd.factorize(frame["name"])
    dur = frame["dur"].to_numpy(np.int64)
    cum = np.r_[0, np.cumsum(dur)]
    windows = pd.DataFrame({f"k{j}": codes[starts + j] for j in range(n)})
    windows["window_ns"] = cum[starts + n] - cum[starts]
    keys = [f"k{j}" for j in range(n)]
    by = windows.groupby(keys, sort=False)
    group = by.ngroup().to_numpy(np.int64)
    grouped = by["window_ns"].agg(["size", "sum"]).reset_index()
    names = np.asarray(names, dtype=object)
    sequence = [SEPARATOR.join(names[list(row)])
                for row in grouped[keys].itertuples(index=False)]
    return pd.DataFrame({"sequence": sequence, "count": grouped["size"].to_numpy(np.int64),
                         "total_ns": _covered_ns(dur, starts, group, n, len(grouped)),
                         "mean_ns": grouped["sum"].to_numpy(np.int64) / grouped["size"]
                         .to_numpy(np.int64)})


def _covered_ns(dur: np.ndarray, starts: np.ndarray, group: np.ndarray, n: int,
                groups: int) -> np.ndarray:
    """Per group of windows, the time of the kernels its windows hold, each kernel once:
    windows overlap in a run of one repeated kernel (64 launches of one kernel are 62
    windows of 3), and summed per window they once made a row 228% of the device time."""
    rows = (starts[:, None] + np.arange(n)).ravel()
    owner = np.repeat(group, n)
    pair = np.unique(owner * np.int64(len(dur)) + rows)
    return np.bincount(pair // len(dur), weights=dur[pair % len(dur)],
                       minlength=groups).astype(np.int64)


def _linked(trace: Trace, k: pd.DataFrame, n: int) -> tuple[pd.DataFrame, np.ndarray]:
    """The kernels by queue in time order (copies and memsets left out), and the first
    row of every window of `n` of them, each linked to the next."""
    s = trace.table("slices")
    launch = k["launch"].to_numpy(np.int64)
    # each launch's place in its thread's order of launches
    thread = np.where(launch >= 0, s["track_id"].to_numpy()[np.maximum(launch, 0)], -1)
    launch_ts = s["ts"].to_numpy(np.int64)[np.maximum(launch, 0)]
    order = np.lexsort((launch, launch_ts, thread))
    place = np.empty(len(k), np.int64)
    place[order] = np.arange(len(k))
    frame = pd.DataFrame({"id": k["id"].to_numpy(np.int64), "track": k["track"].to_numpy(),
                          "ts": k["ts"].to_numpy(np.int64),
                          "dur": k["dur"].to_numpy(np.int64), "name": k["name"].to_numpy(),
                          "launch": launch, "thread": thread, "place": place,
                          "op": k["op_slice_id"].to_numpy(np.int64)})
    # copies and memsets are not fused: their launches count above, they do not below
    frame = frame[(k["kind"] == "kernel").to_numpy(bool, na_value=False)
                  & ~transfers(trace, k)]
    if len(frame) < n:
        return frame, np.zeros(0, np.int64)
    frame = frame.sort_values(["track", "ts"], kind="stable", ignore_index=True)
    nxt = frame.shift(-1)
    same_op = (frame["op"] >= 0) & (frame["op"] == nxt["op"])
    next_launch = ((frame["launch"] >= 0) & (frame["thread"] == nxt["thread"])
                   & (nxt["place"] == frame["place"] + 1))
    # links[i]: kernel i and kernel i + 1 may be in one sequence
    links = ((frame["track"] == nxt["track"]) & (same_op | next_launch)).to_numpy()
    broken = np.r_[0, np.cumsum(~links)]  # broken[i]: breaks before kernel i
    starts = np.flatnonzero(broken[n - 1:len(frame)] == broken[:len(frame) - n + 1])
    return frame, starts


def _op_patterns(trace: Trace, k: pd.DataFrame, op: str, n: int,
                 hta_window: bool) -> pd.DataFrame:
    """HTA's patterns: per shallowest host slice named like `op`, all the work it launched."""
    from neuron_explorer.tables import innermost_in

    s = trace.table("slices")
    host_tracks = trace.tracks.loc[trace.tracks["device"] < 0, "track_id"].to_numpy()
    names = s["name"].astype(str)
    candidate = (names.str.contains(op, regex=False)
                 & s["track_id"].isin(host_tracks)).to_numpy(copy=True)
    if hta_window and len(trace.steps) >= 2:
        candidate &= s["ts"].to_numpy(np.int64) < int(trace.steps["ts"].max())
    if not candidate.any():
        return pd.DataFrame()
    depth = s["depth"].to_numpy()
    root = candidate & (depth == depth[candidate].min())
    # the root around each kernel's launch (the launch itself included)
    owner = innermost_in(s["parent_id"].to_numpy(np.int64), root,
                         k["launch"].to_numpy(np.int64))
    work = k.assign(owner=owner)
    work = work[work["owner"] >= 0].sort_values(["owner", "ts"], kind="stable")
    per_op = work.groupby("owner", sort=False).agg(
        kernels=("name", list), total_ns=("dur", "sum"), size=("dur", "size"))
    per_op = per_op[per_op["size"] >= n]
    if not len(per_op):
        return pd.DataFrame()
    ids = per_op.index.to_numpy(np.int64)
    per_op = per_op.assign(op=names.to_numpy()[ids], op_ns=s["dur"].to_numpy(np.int64)[ids],
                           sequence=[SEPARATOR.join(map(str, v)) for v in per_op["kernels"]])
    grouped = per_op.groupby(["op", "sequence"], sort=False).agg(
        kernels=("size", "first"), count=("size", "size"), total_ns=("total_ns", "sum"),
        op_ns=("op_ns", "sum")).reset_index()
    return grouped
