"""Time per kernel source line per engine: the line profile of NKI kernels.

NKI kernels' instructions carry the kernel line that issued them (their `source`
arg); this sums each line's instruction time per engine (DMA queues together) over
every run of the kernel in the trace.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from neuron_explorer.common import trace_format as tf
from neuron_explorer.common.engine_profile import ENGINE_COLUMNS, engine_profile, spill_profile

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

COLUMNS = ["source", "file", "line", *(f"{e}_ns" for e in ENGINE_COLUMNS), "total_ns",
           "stall_ns", "instructions", "share"]


def kernel_lines(trace: Trace, kernel: object) -> pd.DataFrame:
    """One row per source line of `kernel` (its name, or the @nki.jit kernel itself):
    busy ns per engine, total, stall (how long the compute engines sat idle just before
    the line's instructions, waiting for their inputs), instruction count and share of
    the kernel's instruction time, in file and line order. Empty when the trace holds no
    engine-level records of the kernel."""
    name = kernel if isinstance(kernel, str) else getattr(kernel, "__name__", str(kernel))
    kernels = trace.kernels
    ids = kernels.loc[kernels["name"] == name, "kernel_id"].to_numpy()
    ins = trace.instructions
    ins = ins[np.isin(ins["kernel_id"].to_numpy(), ids)]
    if not len(ins):
        return pd.DataFrame(columns=COLUMNS)
    source = trace.slice_args.texts(tf.ARG_SOURCE, ins["id"].to_numpy())
    engine = np.where(pd.Series(ins["engine"]).str.startswith("dma").to_numpy(), "dma",
                      ins["engine"].to_numpy())
    starts = kernels.set_index("kernel_id")["ts"]
    frame = pd.DataFrame({"source": source, "engine": engine, "dur": ins["dur"].to_numpy(),
                          "stall": _stall(ins, starts)})
    frame = frame[frame["source"] != ""]
    busy = frame.pivot_table(index="source", columns="engine", values="dur", aggfunc="sum",
                             fill_value=0)
    out = pd.DataFrame(index=busy.index)
    for e in ENGINE_COLUMNS:
        out[f"{e}_ns"] = busy[e].astype(np.int64) if e in busy else 0
    out["total_ns"] = out[[f"{e}_ns" for e in ENGINE_COLUMNS]].sum(axis=1)
    compute = frame[frame["engine"] != "dma"]
    out["stall_ns"] = compute.groupby("source")["stall"].sum().reindex(out.index).fillna(
        0).astype(np.int64)
    out["instructions"] = frame.groupby("source").size()
    out["share"] = out["total_ns"] / max(int(out["total_ns"].sum()), 1)
    out = out.reset_index()
    parts = out["source"].str.rsplit(":", n=1)
    out["file"] = parts.str[0]
    out["line"] = pd.to_numeric(parts.str[1], errors="coerce").fillna(0).astype(np.int64)
    return out.sort_values(["file", "line"], ignore_index=True)[COLUMNS]


def _stall(ins: pd.DataFrame, kernel_start: pd.Series) -> np.ndarray:
    """Idle time of each instruction's engine (or DMA queue) just before it, within its
    kernel run: its start minus the latest end of the earlier ones (from kernel start)."""
    ts = ins["ts"].to_numpy()
    frame = pd.DataFrame({"kernel": ins["kernel_id"].to_numpy(),
                          "engine": ins["engine"].to_numpy(), "ts": ts,
                          "end": ts + ins["dur"].to_numpy()})  # positional index
    frame = frame.sort_values(["kernel", "engine", "ts"], kind="stable")
    # the latest end before each: shifted, then a running max, per (kernel, engine), in
    # pandas' compiled group ops (a Python function per group took 0.4 s for 536 groups)
    keys = [frame["kernel"], frame["engine"]]
    prev = frame["end"].groupby(keys).shift(1).groupby(keys).cummax()
    first = kernel_start.reindex(frame["kernel"].to_numpy()).to_numpy()
    prev = np.where(prev.isna().to_numpy(), first, prev.to_numpy())
    stall = np.zeros(len(frame), np.int64)
    stall[frame.index.to_numpy()] = np.maximum(frame["ts"].to_numpy() - prev, 0)
    return stall


def kernel_shapes(trace: Trace, kernel: object) -> pd.DataFrame:
    """The runs of `kernel` grouped by the input shapes of the op that launched them, the
    most-run shapes first: shapes (the op's `shapes` arg), runs, kernel_ids (a list)."""
    name = kernel if isinstance(kernel, str) else getattr(kernel, "__name__", str(kernel))
    runs = trace.kernels[trace.kernels["name"] == name]
    cols = ["shapes", "runs", "kernel_ids"]
    if not len(runs):
        return pd.DataFrame(columns=cols)
    ops = trace.ops
    shapes_of = dict(zip(ops["op_id"].tolist(), ops["shapes"].astype(str).tolist(), strict=True)) \
        if len(ops) and "shapes" in ops else {}
    frame = pd.DataFrame({"kernel_id": runs["kernel_id"].to_numpy(),
                          "shapes": [shapes_of.get(o, "") for o in runs["op_id"].tolist()]})
    groups = [(shapes, len(g), g["kernel_id"].tolist())
              for shapes, g in frame.groupby("shapes", sort=False)]
    groups.sort(key=lambda g: -g[1])  # stable: ties keep the order of their first run
    return pd.DataFrame(groups, columns=cols)


def kernel_profile(trace: Trace, kernel: object,
                   kernel_ids: list[int] | None = None) -> pd.DataFrame:
    """One row per run of `kernel` (those in `kernel_ids`, if given): duration, engine
    busy %, DMA/compute overlap %, SBUF/PSUM high-water marks, the critical engine, and
    SBUF spills: bytes its spill stores and reloads moved, reload bytes and the time they
    ran with no compute engine busy (`spill_bytes`, `reload_bytes`, `spill_ns`)."""
    name = kernel if isinstance(kernel, str) else getattr(kernel, "__name__", str(kernel))
    runs = trace.kernels[trace.kernels["name"] == name]
    if kernel_ids is not None:
        runs = runs[runs["kernel_id"].isin(kernel_ids)]
    ins = trace.instructions
    rows = []
    for run in runs.itertuples():
        mine = ins[ins["kernel_id"] == run.kernel_id]
        engine = np.where(mine["engine"].str.startswith("dma").to_numpy(), "dma",
                          mine["engine"].to_numpy())
        ts = mine["ts"].to_numpy()
        end = ts + mine["dur"].to_numpy()
        prof = engine_profile(engine, ts, end, run.dur)
        spills = spill_profile(engine, mine["opcode"].astype(str).to_numpy(),
                               mine["bytes"].to_numpy(), ts, end)
        rows.append({"kernel_id": run.kernel_id, "dur_ns": int(run.dur),
                     **{f"busy_{e}_pct": v for e, v in prof["busy_pct"].items()},
                     "dma_compute_overlap_pct": prof["dma_compute_overlap_pct"],
                     "sbuf_bytes": int(run.sbuf_bytes), "psum_bytes": int(run.psum_bytes),
                     "critical_engine": prof["critical_engine"], **spills})
    return pd.DataFrame(rows)


NKI_OP_PREFIX = "nki::"


def nki_runs(trace: Trace) -> pd.DataFrame:
    """The kernel rows (runs) of NKI kernels: kernels launched by ops named
    `nki::<kernel>`."""
    kernels, ops = trace.kernels, trace.ops
    if not len(kernels) or not len(ops) or "op_id" not in kernels:
        return kernels.iloc[:0]
    nki_ops = ops.loc[ops["name"].astype(str).str.startswith(NKI_OP_PREFIX), "op_id"]
    return kernels[kernels["op_id"].isin(nki_ops.to_numpy())]


def nki_kernels(trace: Trace) -> list[str]:
    """Names of the kernels NKI ops launched (ops named `nki::<kernel>`), longest total
    time first."""
    mine = nki_runs(trace)
    if not len(mine):
        return []
    total = (mine.groupby("name", sort=False)["dur"].sum()
             .sort_values(ascending=False, kind="stable"))
    return [str(n) for n in total.index]


def source_text(trace: Trace, file: str, line: int) -> str:
    """The kernel source line as written, when its file can be found: as recorded
    (relative to the working directory), else the longest tail of its path found under
    the working directory or the trace's folder and its parents (a trace moved or read
    elsewhere); '' when not found."""
    import linecache
    from pathlib import Path

    if not line or not file:
        return ""
    recorded = Path(file)
    if recorded.is_file():
        return linecache.getline(str(recorded), int(line)).rstrip()
    here = Path(str(getattr(trace, "path", "") or ".")).resolve().parent
    roots = [Path.cwd(), here, *here.parents]
    parts = [p for p in recorded.parts if p not in ("..", ".", recorded.anchor)]
    for start in range(len(parts)):
        tail = Path(*parts[start:])
        for root in roots:
            if (root / tail).is_file():
                return linecache.getline(str(root / tail), int(line)).rstrip()
    return ""


def line_profile(trace: Trace, kernel: object) -> pd.DataFrame:
    """`kernel_lines` with, per line, the engine it spends most time on (`engine`) and
    its source text (`code`, '' when the file is not found)."""
    lines = kernel_lines(trace, kernel)
    busy = lines[[f"{e}_ns" for e in ENGINE_COLUMNS]]
    engine = busy.idxmax(axis=1).str.removesuffix("_ns") if len(lines) else pd.Series(dtype=str)
    return lines.assign(
        engine=np.where(busy.sum(axis=1).to_numpy() > 0, engine, ""),
        code=[source_text(trace, f, n) for f, n in zip(lines["file"], lines["line"], strict=True)])


def kernel_instructions(trace: Trace, kernel: object, run: int = 0,
                        kernel_ids: list[int] | None = None) -> pd.DataFrame:
    """The instructions of one run of `kernel` (the first by default; of those in
    `kernel_ids`, if given) with their source line: ts, dur, engine (DMA queues as
    `dma`), queue (the recorded engine), opcode, bytes, source."""
    name = kernel if isinstance(kernel, str) else getattr(kernel, "__name__", str(kernel))
    runs = trace.kernels[trace.kernels["name"] == name]
    if kernel_ids is not None:
        runs = runs[runs["kernel_id"].isin(kernel_ids)]
    cols = ["ts", "dur", "engine", "queue", "opcode", "bytes", "source"]
    if len(runs) <= run:
        return pd.DataFrame(columns=cols)
    ins = trace.instructions
    mine = ins[ins["kernel_id"].to_numpy() == runs["kernel_id"].iloc[run]]
    queue = mine["engine"].astype(str).to_numpy()
    return pd.DataFrame({
        "ts": mine["ts"].to_numpy(), "dur": mine["dur"].to_numpy(),
        "engine": np.where(np.char.startswith(queue.astype(str), "dma"), "dma", queue),
        "queue": queue, "opcode": mine["opcode"].astype(str).to_numpy(),
        "bytes": mine["bytes"].to_numpy(),
        "source": trace.args.texts(tf.ARG_SOURCE, mine["id"].to_numpy())})[cols]


def nki_instructions(trace: Trace) -> pd.DataFrame:
    """Every instruction of NKI kernel runs, with its kernel's name, the engine with DMA
    queues as `dma`, and its source line: id, ts, dur, end, engine, opcode, bytes, flops,
    kernel_id, kernel, source."""
    runs = nki_runs(trace)
    cols = ["id", "ts", "dur", "end", "engine", "opcode", "bytes", "flops", "kernel_id",
            "kernel", "source"]
    ins = trace.instructions
    if not len(runs) or not len(ins):
        return pd.DataFrame(columns=cols)
    mine = ins[np.isin(ins["kernel_id"].to_numpy(), runs["kernel_id"].to_numpy())]
    queue = mine["engine"].astype(str).to_numpy()
    names = runs.set_index("kernel_id")["name"]
    return pd.DataFrame({
        "id": mine["id"].to_numpy(), "ts": mine["ts"].to_numpy(), "dur": mine["dur"].to_numpy(),
        "end": (mine["ts"] + mine["dur"]).to_numpy(),
        "engine": np.where(np.char.startswith(queue.astype(str), "dma"), "dma", queue),
        "opcode": mine["opcode"].astype(str).to_numpy(), "bytes": mine["bytes"].to_numpy(),
        "flops": mine["flops"].to_numpy(), "kernel_id": mine["kernel_id"].to_numpy(),
        "kernel": names.reindex(mine["kernel_id"].to_numpy()).to_numpy(),
        "source": trace.args.texts(tf.ARG_SOURCE, mine["id"].to_numpy())})[cols]


def dma_compute_overlap(ins: pd.DataFrame) -> tuple[int, int, int]:
    """(DMA busy, compute busy, both at once) in ns over `ins` (one kernel run)."""
    from neuron_explorer.common.intervals import Union

    dma = ins["engine"].to_numpy() == "dma"
    d = Union(ins["ts"].to_numpy()[dma], ins["end"].to_numpy()[dma])
    c = Union(ins["ts"].to_numpy()[~dma], ins["end"].to_numpy()[~dma])
    both = Union.of((d.starts, d.ends), (c.starts, c.ends))
    return d.total, c.total, d.total + c.total - both.total


def rotated_lengths(trace: Trace) -> dict[tuple[str, int], int]:
    """Per NKI kernel and scheduled length (one per set of input sizes): its length with
    its SBUF tiles rotated, a fresh buffer for each write (recorded on the kernel's compile
    span; none in recordings older than that)."""
    s = trace.table("slices")
    spans = s[s["category"] == tf.CAT_COMPILE]
    if not len(spans):
        return {}
    ids = spans["id"].to_numpy(np.int64)
    args = trace.slice_args
    rotated = args.numbers(tf.ARG_KERNEL_ROTATED, ids, -1, "int64")
    length = args.numbers(tf.ARG_KERNEL_DURATION, ids, -1, "int64")
    names = args.texts(tf.ARG_NKI_KERNEL, ids)
    return {(str(n), int(d)): int(r)
            for n, d, r in zip(names, length.tolist(), rotated.tolist(), strict=True)
            if r >= 0 and d >= 0}


def analysed_nki(trace: Trace) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The NKI kernel runs of the analysed steps and their instructions (`nki_runs`,
    `nki_instructions`): what a finding's time is summed over. All ten runs of a kernel
    were counted against nine analysed steps, its first run's in the warm-up."""
    from neuron_explorer.analyses.steady_state import in_analysed_steps

    runs = in_analysed_steps(trace, nki_runs(trace))
    ins = nki_instructions(trace)
    return runs, ins[ins["kernel_id"].isin(runs["kernel_id"].to_numpy())]
