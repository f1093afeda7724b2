"""Communication on one trace: its collectives, and how much of their time compute hides.

A collective is a slice of kind `collective` in our traces (args: collective, bytes,
group, seq, algorithm, wait_ns, transfer_ns; docs/trace-format.md), or a
communication kernel in a PyTorch-profiler trace (NCCL or RCCL kernels, named
`ncclKernel_*`/`ncclDevKernel_*`). The other device kernels are computation, copies
and memsets are memory: the same split Holistic Trace Analysis makes.

Overlap follows HTA's definition: the share of communication time during which
the same device also runs computation. Exposed communication is the rest: time the
device spends only communicating.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from neuron_explorer import tables
from neuron_explorer.common import trace_format as tf
from neuron_explorer.common.dtypes import dtype_bytes
from neuron_explorer.common.intervals import Union
from neuron_explorer.memo import memoised

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

COLLECTIVE_COLUMNS = ["id", "device", "seq", "collective", "ts", "dur", "arrival", "bytes",
                      "group", "group_size", "algorithm", "wait_ns", "host_wait_ns", "transfer_ns",
                      "step"]
COMMUNICATION_COLUMNS = ["device", "compute_ns", "communication_ns", "overlap_ns",
                         "overlap_pct", "exposed_ns", "memory_ns", "collectives"]
STATS_COLUMNS = ["device", "collective", "count", "bytes", "time_ns", "transfer_ns",
                 "algbw_gbps", "busbw_gbps"]
KERNEL_TYPE_COLUMNS = ["device", "kernel_type", "ns", "share", "sum_ns"]
TEMPORAL_COLUMNS = ["device", "span_ns", "idle_ns", "compute_ns", "non_compute_ns",
                    "idle_share", "compute_share", "non_compute_share"]

# NCCL/RCCL kernel names: ncclKernel_AllReduce_RING_LL_Sum_float, ncclDevKernel_AllGather_...
_COMM_KERNEL = re.compile(r"^(?:void\s+)?(?:nccl|rccl)\w*?(?:Kernel|DevKernel)_?([A-Za-z]+)",
                          re.IGNORECASE)
_NAME_ALIASES = {
    "allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
    "broadcast": "broadcast", "reduce": "reduce", "sendrecv": "send_recv", "send": "send",
    "recv": "recv", "alltoall": "all_to_all", "alltoallv": "all_to_all",
    "allgatherintotensor": "all_gather", "reducescattertensor": "reduce_scatter",
    "alltoallbase": "all_to_all", "allgatherbase": "all_gather",
    "reducescatterbase": "reduce_scatter", "barrier": "barrier",
}
# Bus bandwidth = algorithm bandwidth x this factor of the group size n (as nccl-tests
# defines it): the bytes each link carries relative to the message.
_BUS_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
}


def canonical_collective(name: Any) -> str:
    """`allreduce`, `AllReduce`, `all_reduce`, `nccl:all_reduce` -> `all_reduce`."""
    text = str(name or "").strip()
    text = text.split(":", 1)[-1] if ":" in text else text
    key = re.sub(r"[^a-z]", "", text.lower())
    return _NAME_ALIASES.get(key, re.sub(r"(?<!^)(?=[A-Z])", "_", text).lower() or "unknown")


def comm_kernel_name(name: str) -> str | None:
    """The collective an NCCL/RCCL kernel runs, or None if the name is no such kernel."""
    m = _COMM_KERNEL.match(name)
    return canonical_collective(m.group(1)) if m else None


def bus_factor(collective: str, group_size: int) -> float:
    """Bus bandwidth / algorithm bandwidth for a collective over `group_size` ranks."""
    factor = _BUS_FACTOR.get(collective)
    if factor is None or group_size < 1:
        return 1.0
    return float(factor(group_size))


def collectives(trace: Trace) -> pd.DataFrame:
    """One row per collective call: its kind, bytes, group and (where recorded) the time it
    waited for the last rank to arrive (`wait_ns`) and moved data (`transfer_ns`)."""
    return memoised(trace, "collectives", lambda: _collectives(trace))


def _collectives(trace: Trace) -> pd.DataFrame:
    s = trace.table("slices")
    ours = tables.kind_mask(trace, (tf.CAT_COLLECTIVE,))
    kernels = tables.kind_mask(trace, ("kernel",))
    comm_kernel = np.zeros(len(s), bool)
    if kernels.any():
        kernel_rows = np.flatnonzero(kernels)
        names = s["name"].array[kernel_rows]  # categorical: no string per slice
        hit = tables.map_unique(names, lambda n: comm_kernel_name(str(n)) is not None, bool)
        tagged = trace.slice_args.texts(tf.ARG_COLLECTIVE, s["id"].to_numpy()[kernel_rows]) != ""
        comm_kernel[kernel_rows[hit | tagged]] = True
    rows = s[ours | comm_kernel]
    if not len(rows):
        return tables.empty(COLLECTIVE_COLUMNS)
    ids = rows["id"].to_numpy()
    texts = trace.slice_args.texts
    out = pd.DataFrame({"id": ids, "ts": rows["ts"].to_numpy(), "dur": rows["dur"].to_numpy()})
    out["device"] = _devices(trace, rows)
    # what the program called, from the most direct record to the least
    collective = texts(tf.ARG_COLLECTIVE, ids)
    message = _message_bytes(trace, rows)
    host_name, host_bytes = _launching_annotations(trace, ids)
    collective = np.where(collective != "", collective, host_name)
    message = np.where(message >= 0, message, host_bytes)
    from_kernel = tables.map_unique(rows["name"].to_numpy(),
                                    lambda n: comm_kernel_name(str(n)) or "unknown")
    collective = np.where(collective != "", collective, from_kernel)
    out["collective"] = tables.map_unique(collective, canonical_collective)
    out["bytes"] = np.maximum(message, 0)
    out["group"] = texts(tf.ARG_GROUP, ids)
    size = tables.map_unique(out["group"].to_numpy(), _group_size, np.int64)
    kineto_size = tables.number(trace, "Group size", ids, default=0)
    world = _world_size(trace)
    out["group_size"] = np.where(size > 0, size, np.where(kineto_size > 0, kineto_size, world))
    out["algorithm"] = texts(tf.ARG_ALGORITHM, ids)
    out["seq"] = tables.number(trace, tf.ARG_SEQ, ids, default=-1)
    out["wait_ns"] = tables.number(trace, tf.ARG_WAIT_NS, ids, default=-1)
    out["host_wait_ns"] = tables.number(trace, tf.ARG_HOST_WAIT_NS, ids, default=0)
    transfer = tables.number(trace, tf.ARG_TRANSFER_NS, ids, default=-1)
    known_wait = out["wait_ns"].to_numpy() >= 0
    out["transfer_ns"] = np.where(transfer >= 0, transfer,
                                  np.where(known_wait, out["dur"] - out["wait_ns"], -1))
    # When this rank reached the call: the slice's start when it spans the wait too, else
    # that much before it (a slice of the transfer alone, with the wait as an arg)
    wait = out["wait_ns"].to_numpy()
    spans_wait = out["dur"].to_numpy() >= np.maximum(wait, 0) + np.maximum(
        out["transfer_ns"].to_numpy(), 0)
    out["arrival"] = out["ts"].to_numpy() - np.where(known_wait & ~spans_wait, wait, 0)
    # the step that issued the call: a rank whose host ran ahead of its waiting device
    # ran its last 9 all-reduces after its last step, outside every step by their own time
    out["step"] = tables.assign_steps(launch_times(trace, ids, out["ts"].to_numpy()),
                                      trace.steps)
    out = out.sort_values(["device", "ts"], ignore_index=True)
    _number_unsequenced(out)
    return out[COLLECTIVE_COLUMNS]


def _devices(trace: Trace, rows: pd.DataFrame) -> np.ndarray:
    dev = trace.tracks.set_index("track_id")["device"]
    track_dev = dev.reindex(rows["track_id"].to_numpy()).fillna(-1).to_numpy().astype(np.int64)
    arg_dev = tables.number(trace, tf.ARG_DEVICE, rows["id"].to_numpy(), default=-1)
    return np.where(track_dev >= 0, track_dev, np.maximum(arg_dev, 0))


def _message_bytes(trace: Trace, rows: pd.DataFrame) -> np.ndarray:
    """Bytes of each collective's message: our `bytes` arg, or Kineto's `In msg nelems` x
    the dtype's size (older PyTorch-profiler traces: see `_launching_annotations`)."""
    ids = rows["id"].to_numpy()
    ours = tables.number(trace, tf.ARG_BYTES, ids, default=-1)
    nelems = tables.number(trace, "In msg nelems", ids, default=-1)
    dtype = trace.slice_args.texts("dtype", ids)
    size = np.asarray([_element_bytes(d) for d in dtype], np.int64)
    kineto = np.where((nelems >= 0) & (size > 0), nelems * size, -1)
    return np.where(ours >= 0, ours, kineto)


def launch_times(trace: Trace, ids: np.ndarray, ts: np.ndarray) -> np.ndarray:
    """When the host launched each device slice of `ids` (the start of the slice a flow
    leads from: our op, a PyTorch profiler's runtime call), else its own start `ts`."""
    flows = trace.flows
    out = np.asarray(ts, np.int64).copy()
    if not len(flows) or not len(ids):
        return out
    src = pd.Series(flows["src_id"].to_numpy(np.int64), index=flows["dst_id"].to_numpy(np.int64))
    src = src[~src.index.duplicated()].reindex(np.asarray(ids, np.int64)).fillna(-1)
    src = src.to_numpy(np.int64)
    s = trace.table("slices")
    known = (src >= 0) & (src < len(s))
    out[known] = s["ts"].to_numpy(np.int64)[src[known]]
    return out


def _launching_annotations(trace: Trace, kernel_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Older PyTorch-profiler traces name a collective only on the host: the `nccl:*` (or
    `record_param_comms`) range around the runtime call that launched the kernel gives the
    collective the program called and its input sizes. Returns (names, bytes); '' and -1
    where there is no such range."""
    s = trace.table("slices")
    names_out = np.full(len(kernel_ids), "", dtype=object)
    bytes_out = np.full(len(kernel_ids), -1, np.int64)
    runtime = tables.launch_calls(
        trace, tables.number(trace, tf.ARG_KERNEL_ID, kernel_ids, default=-1))
    has = np.flatnonzero(runtime >= 0)
    if not len(has):
        return names_out, bytes_out
    ann = tables.ancestor_of_kind(trace, runtime[has], ("annotation", "op"))
    names = s["name"].to_numpy()
    for i, a in zip(has.tolist(), ann.tolist(), strict=True):
        if a < 0:
            continue
        name = str(names[a])
        if name.startswith("nccl:"):
            names_out[i] = name
        elif not name.startswith("record_param_comms"):
            continue
        one = np.asarray([a])
        bytes_out[i] = _dims_bytes(trace.slice_args.texts("Input Dims", one)[0],
                                   trace.slice_args.texts("Input type", one)[0])
    return names_out, bytes_out


def _dims_bytes(dims: str, types: str) -> int:
    """Bytes of the first input from Kineto's `Input Dims` and `Input type` texts."""
    numbers = re.findall(r"\d+", dims.split("]", 1)[0]) if dims else []
    if not numbers:
        return 0
    first_type = re.findall(r"[A-Za-z:][\w: ]*", types)
    size = _element_bytes(first_type[0]) if first_type else 0
    return int(np.prod([int(n) for n in numbers], dtype=np.int64)) * size


def _element_bytes(dtype: Any) -> int:
    """A dtype's element size as a trace names it (torch's names, or the C++ types
    PyTorch-profiler traces give); 0 for a name the table does not know."""
    return dtype_bytes(str(dtype).strip().lower(), default=0)


def _group_size(group: Any) -> int:
    text = str(group or "")
    return len(re.findall(r"-?\d+", text)) if text else 0


def _world_size(trace: Trace) -> int:
    from neuron_explorer.runs.files import distributed_info

    info = distributed_info(trace.metadata)
    return int(info.get("world_size") or 1)


def _number_unsequenced(out: pd.DataFrame) -> None:
    """Collectives without a recorded sequence number are numbered per device, group and
    kind in time order: the n-th all-reduce of a group is the same call on every rank."""
    missing = out["seq"].to_numpy() < 0
    if missing.any():
        sub = out[missing]
        numbers = sub.groupby(["device", "group", "collective"], sort=False).cumcount()
        out.loc[missing, "seq"] = numbers.to_numpy()


def _intervals(frame: pd.DataFrame) -> Union:
    ts = frame["ts"].to_numpy(np.int64)
    return Union(ts, ts + frame["dur"].to_numpy(np.int64))


def exposed_transfer(trace: Trace) -> np.ndarray:
    """Per row of `communication(trace)`: time moving data that no compute hides. The wait
    for a late rank is left out (it is the straggler's cost, not the link's)."""
    frame = communication(trace)
    coll = collectives(trace)
    k = trace.kernels
    measure = in_steps(trace)
    comm_ids = set(coll["id"].tolist())
    compute = k[~k["id"].isin(comm_ids) & ~k["kind"].isin(["memcpy", "memset"])]
    out = []
    for device in frame["device"].tolist():
        rows = coll[coll["device"] == device]
        wait = np.maximum(rows["wait_ns"].to_numpy(np.int64), 0)
        start = rows["ts"].to_numpy(np.int64) + np.minimum(wait, rows["dur"].to_numpy(np.int64))
        moving = Union(start, rows["ts"].to_numpy(np.int64) + rows["dur"].to_numpy(np.int64))
        c = compute[compute["device"] == device]
        cts = c["ts"].to_numpy(np.int64)
        work = Union(cts, cts + c["dur"].to_numpy(np.int64))
        both = Union.of((moving.starts, moving.ends), (work.starts, work.ends))
        out.append(measure(both) - measure(work))
    return np.asarray(out, np.int64)


def in_steps(trace: Trace) -> Any:
    """How much of a Union lies in the analysed steps (the steady state, as every per-step
    figure; all of it when there are no steps): setup before the first step
    (process-group creation, the first broadcasts, ranks starting at different times) and
    compile steps are not steady training and would swamp the figures."""
    from neuron_explorer.analyses.step_breakdown import step_windows

    if not len(trace.steps):
        return lambda u: u.total
    windows = _intervals(step_windows(trace))
    return lambda u: int(u.covered(windows.starts, windows.ends).sum())


def communication(trace: Trace, hta_window: bool = False) -> pd.DataFrame:
    """Per device: compute, communication and memory time inside the steps, how much of the
    communication overlaps compute (`overlap_pct`, 0..100) and how much is exposed.
    `hta_window`: over the kernels HTA keeps (`hta_kept`) from the first to the last,
    not the analysed steps: HTA's `get_comm_comp_overlap`."""
    if hta_window:
        return memoised(trace, "communication:hta", lambda: _communication(trace, True))
    return memoised(trace, "communication", lambda: _communication(trace))


def _communication(trace: Trace, hta_window: bool = False) -> pd.DataFrame:
    coll = collectives(trace)
    k = trace.kernels
    if hta_window:
        k, coll = hta_kept(trace, k, coll)
    if not len(coll) and not len(k):
        return tables.empty(COMMUNICATION_COLUMNS)
    comm_ids = set(coll["id"].tolist())
    is_comm = k["id"].isin(comm_ids).to_numpy()
    is_memory = k["kind"].isin(["memcpy", "memset"]).to_numpy()
    compute = k[~is_comm & ~is_memory]
    memory = k[is_memory]
    rows = []
    measure = (lambda u: u.total) if hta_window else in_steps(trace)
    devices = sorted(set(k["device"].tolist()) | set(coll["device"].tolist()))
    for device in devices:
        comp = _intervals(compute[compute["device"] == device])
        comm_rows = coll[coll["device"] == device]
        comm = _intervals(comm_rows)
        both = Union.of((comp.starts, comp.ends), (comm.starts, comm.ends))
        comp_ns, comm_ns = measure(comp), measure(comm)
        overlap = comp_ns + comm_ns - measure(both)
        rows.append({
            "device": int(device), "compute_ns": comp_ns, "communication_ns": comm_ns,
            "overlap_ns": overlap,
            "overlap_pct": 100.0 * overlap / comm_ns if comm_ns else float("nan"),
            "exposed_ns": comm_ns - overlap,
            "memory_ns": measure(_intervals(memory[memory["device"] == device])),
            "collectives": int((comm_rows["step"] >= 0).sum())
            if len(trace.steps) and not hta_window else len(comm_rows),
        })
    return pd.DataFrame(rows, columns=COMMUNICATION_COLUMNS)


def collective_stats(trace: Trace) -> pd.DataFrame:
    """Per device and collective kind: calls, bytes, time, and the achieved algorithm and
    bus bandwidth (GB/s) over the time spent moving data (the wait for late ranks is not
    the link's fault, so it is left out where it was recorded)."""
    return stats_of(collectives(trace))


def stats_of(coll: pd.DataFrame, keys: tuple[str, ...] = ("device", "collective")) -> pd.DataFrame:
    """`collective_stats` of a collectives table, grouped by `keys`."""
    columns = [*keys, *STATS_COLUMNS[2:]]
    if not len(coll):
        return tables.empty(columns)
    moving = np.where(coll["transfer_ns"].to_numpy() >= 0, coll["transfer_ns"].to_numpy(),
                      coll["dur"].to_numpy())
    frame = coll.assign(moving=moving,
                        bus_bytes=[b * bus_factor(c, int(n)) for b, c, n in
                                   zip(coll["bytes"], coll["collective"], coll["group_size"],
                                       strict=True)])
    g = frame.groupby(list(keys), sort=True).agg(
        count=("id", "size"), bytes=("bytes", "sum"), time_ns=("dur", "sum"),
        transfer_ns=("moving", "sum"), bus_bytes=("bus_bytes", "sum")).reset_index()
    with np.errstate(divide="ignore", invalid="ignore"):
        g["algbw_gbps"] = np.where(g["transfer_ns"] > 0, g["bytes"] / g["transfer_ns"], np.nan)
        g["busbw_gbps"] = np.where(g["transfer_ns"] > 0, g["bus_bytes"] / g["transfer_ns"],
                                   np.nan)
    return g[columns]


def kernel_types(trace: Trace, hta_window: bool = False) -> pd.DataFrame:
    """Per device, Holistic Trace Analysis's kernel-type breakdown over the whole trace
    (with `hta_window`, over the kernels HTA keeps: those launched in the steps before
    the last one, when the trace has two or more; HTA drops the last profiler step):
    the time covered by computation, communication and memory kernels alone, and by each
    overlap of them ("computation overlapping communication"), as HTA's
    `get_gpu_kernel_breakdown` counts it (each type's kernels merged into intervals, then
    swept; HTA leaves memory out unless asked). `ns` is that time, `share` its part of the
    device's kernel-covered time (HTA's percentage), `sum_ns` the plain sum of the type's
    kernel durations (overlap rows: 0)."""
    every = _typed_work(trace, hta_window)
    if not len(every):
        return tables.empty(KERNEL_TYPE_COLUMNS)
    rows = []
    for device, mine in every.groupby("device", sort=True):
        sums = mine.groupby("kernel_type")["dur"].sum()
        for label, ns in _swept(mine).items():
            rows.append((int(device), label, ns, int(sums.get(label, 0))))
    frame = pd.DataFrame(rows, columns=["device", "kernel_type", "ns", "sum_ns"])
    frame["share"] = frame["ns"] / frame.groupby("device")["ns"].transform("sum")
    return frame[KERNEL_TYPE_COLUMNS]


def hta_kept(trace: Trace, k: pd.DataFrame,
             coll: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The kernels and collectives HTA keeps when the trace has two or more steps: those
    whose launching CPU op started before the last step (HTA drops the last profiler
    step); all of them otherwise."""
    if len(trace.steps) < 2:
        return k, coll
    last_start = int(trace.steps["ts"].max())
    s_ts = trace.table("slices")["ts"].to_numpy(np.int64)
    op = k["op_slice_id"].to_numpy(np.int64)
    launched = np.where(op >= 0, s_ts[np.maximum(op, 0)], k["ts"].to_numpy(np.int64))
    k = k[launched < last_start]
    coll = coll[coll["id"].isin(set(k["id"].tolist())) | (coll["ts"] < last_start)]
    return k, coll


def _typed_work(trace: Trace, hta_window: bool) -> pd.DataFrame:
    """Every kernel and collective (device, ts, dur) with its HTA kernel type."""
    k = trace.kernels
    coll = collectives(trace)
    if hta_window:
        k, coll = hta_kept(trace, k, coll)
    comm_ids = set(coll["id"].tolist())
    kind = np.where(k["id"].isin(comm_ids), "communication",
                    np.where(k["kind"].isin(["memcpy", "memset"]), "memory", "computation"))
    frames = [k[["device", "ts", "dur"]].assign(kernel_type=kind)]
    own_queue = coll[~coll["id"].isin(set(k["id"].tolist()))]  # ours: not kernels
    if len(own_queue):
        frames.append(own_queue[["device", "ts", "dur"]].assign(kernel_type="communication"))
    return pd.concat(frames, ignore_index=True)


def temporal_breakdown(trace: Trace, hta_window: bool = False) -> pd.DataFrame:
    """Per device, Holistic Trace Analysis's temporal breakdown over the whole trace (with
    `hta_window`, over the kernels HTA keeps): `span_ns` from the first kernel's start to
    the last one's end (HTA's kernel_time), `idle_ns` the part of it no kernel, copy,
    memset or collective covers, `compute_ns` the part computation kernels cover,
    `non_compute_ns` the rest (communication and memory alone), and each as a share of
    the span."""
    every = _typed_work(trace, hta_window)
    if not len(every):
        return tables.empty(TEMPORAL_COLUMNS)
    rows = []
    for device, mine in every.groupby("device", sort=True):
        ts = mine["ts"].to_numpy(np.int64)
        end = ts + mine["dur"].to_numpy(np.int64)
        span = int(end.max() - ts.min())
        busy = Union(ts, end).total
        comp = mine["kernel_type"].to_numpy() == "computation"
        compute = Union(ts[comp], end[comp]).total
        rows.append((int(device), span, span - busy, compute, busy - compute))
    frame = pd.DataFrame(rows, columns=TEMPORAL_COLUMNS[:5])
    for part in ("idle", "compute", "non_compute"):
        frame[f"{part}_share"] = frame[f"{part}_ns"] / frame["span_ns"].where(
            frame["span_ns"] > 0)
    return frame[TEMPORAL_COLUMNS]


_TYPE_ORDER = ("computation", "communication", "memory")  # HTA's order, memory last


def _swept(kernels: pd.DataFrame) -> dict[str, int]:
    """Time covered by each combination of kernel types running at once, named as HTA
    names them ("computation overlapping communication")."""
    times, steps = [], []
    for bit, kernel_type in enumerate(_TYPE_ORDER):
        part = kernels[kernels["kernel_type"] == kernel_type]
        ts = part["ts"].to_numpy(np.int64)
        merged = Union(ts, ts + part["dur"].to_numpy(np.int64))
        times += [merged.starts, merged.ends]
        steps += [np.full(len(merged.starts), 1 << bit), np.full(len(merged.ends), -(1 << bit))]
    t = np.concatenate(times)
    order = np.argsort(t, kind="stable")
    t = t[order]
    running = np.cumsum(np.concatenate(steps)[order])
    spans = np.diff(t)
    out: dict[str, int] = {}
    for state in np.unique(running[:-1]):
        if state <= 0:
            continue
        names = [n for bit, n in enumerate(_TYPE_ORDER) if state & (1 << bit)]
        label = " overlapping ".join(names)
        out[label] = out.get(label, 0) + int(spans[running[:-1] == state].sum())
    return out
