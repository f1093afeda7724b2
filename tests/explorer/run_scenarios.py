"""Multi-rank runs with known answers: one trace per rank, written into a run folder.

`two_ranks`: 4 steps of 1 ms on each rank (times from the step start, ns):
- rank 0: compute kernel [0, 600k), all_reduce of 64 MiB [400k, 900k), recorded wait 100k
  (it waits for rank 1), transfer 400k. Communication overlaps compute for [400k, 600k):
  exactly 40% of its 500k; exposed 300k, of which data moving 300k ([600k, 900k)).
- rank 1: compute kernel [0, 700k), all_reduce [500k, 900k), no wait, transfer 400k:
  overlap 200k of 400k (50%), exposed 200k.
So rank 1 arrives last at every call (100k after rank 0): rank 0 loses 400k of its 4 ms to
it (10%); compute differs by 100k per step (600k against 700k).
Every rank's host queues its work by 300k and then waits for the device until 900k (a sync
slice): the ranks are device-bound, so a wait at the all-reduce makes the step longer.
"""

from __future__ import annotations

import json
from pathlib import Path

from synthetic import TraceBuilder

STEP = 1_000_000
STEPS = 4
MIB64 = 64 << 20


def write_rank(folder: Path, rank: int, world: int, compute: int, coll_start: int,
               wait: int, *, coll_bytes: int = MIB64, small_per_step: int = 0,
               fmt: str = "pftrace", late_step: int | None = None,
               transfer_slices: bool = False, setup_wait: int | None = None) -> Path:
    """One rank: per step a compute kernel [0, compute) and an all-reduce of `coll_bytes`
    from `coll_start` to 900k that waits `wait` first; with `small_per_step`, that many
    64 KiB all-reduces of 10 us each run first from `coll_start`, and the large one
    then fills the rest up to 900k. With `late_step`, the rank arrives 150k late (at
    `coll_start` + 150k, no wait) in that step and waits 150k in every other step. With
    `transfer_slices`, a collective's slice covers its transfer only (the wait is an arg).
    With `setup_wait`, everything moves 3 ms later and a setup all-gather (before the first
    step, as process-group creation does) ends at 2.5 ms after waiting `setup_wait`."""
    b = TraceBuilder()
    host = b.thread()
    kernels = b.device_track(rank, "Kernels")
    queue = b.device_track(rank, "Collectives")
    b.metadata(host, {"hardware": "trn2", "command": "torchrun train.py", "rank": rank,
                      "world_size": world})
    group = json.dumps(list(range(world)))
    seq = 0

    def collective(ts: int, dur: int, nbytes: int, waited: int) -> None:
        nonlocal seq
        if transfer_slices:
            ts, dur = ts + waited, dur - waited
        b.slice(queue, ts, dur, "all_reduce", "collective",
                {"collective": "all_reduce", "bytes": nbytes, "group": group, "seq": seq,
                 "algorithm": "ring", "wait_ns": waited,
                 "transfer_ns": dur - (0 if transfer_slices else waited),
                 "device": rank})
        seq += 1

    offset = 0
    if setup_wait is not None:
        offset = 3 * STEP
        b.slice(queue, 2_500_000 - 100_000 - setup_wait, 100_000 + setup_wait, "all_gather",
                "collective", {"collective": "all_gather", "bytes": 16, "group": group,
                               "seq": 1000, "wait_ns": setup_wait, "transfer_ns": 100_000,
                               "device": rank})
    for s in range(STEPS):
        t0 = offset + s * STEP
        b.slice(host, t0, STEP, f"step {s}", "step", {"step": s})
        b.slice(host, t0 + 300_000, 600_000, "sync (item)", "sync", {"kind": "item"})
        b.slice(kernels, t0, compute, "fused_forward_backward", "kernel",
                {"kernel_id": 1 + s, "step": s, "device": rank})
        start = t0 + coll_start
        for _ in range(small_per_step):
            collective(start, 10_000, 64 << 10, 0)
            start += 10_000
        waited = wait
        if late_step is not None:
            start, waited = (start + 150_000, 0) if s == late_step else (start, 150_000)
        collective(start, t0 + 900_000 - start, coll_bytes, waited)
    path = folder / f"rank{rank}.{'pftrace' if fmt == 'pftrace' else 'json'}"
    return b.write_pftrace(path) if fmt == "pftrace" else b.write_json(path)


def two_ranks(folder: Path, fmt: str = "pftrace", transfer_slices: bool = False,
              setup_skew: bool = False) -> Path:
    """`setup_skew`: rank 0 starts 2 ms late, so rank 1 waits 2 ms in a setup all-gather
    before the first step (not training: no rank is to blame for it)."""
    folder.mkdir(parents=True, exist_ok=True)
    write_rank(folder, 0, 2, compute=600_000, coll_start=400_000, wait=100_000, fmt=fmt,
               transfer_slices=transfer_slices, setup_wait=0 if setup_skew else None)
    write_rank(folder, 1, 2, compute=700_000, coll_start=500_000, wait=0, fmt=fmt,
               transfer_slices=transfer_slices,
               setup_wait=2_000_000 if setup_skew else None)
    (folder / "manifest.json").write_text(json.dumps({"world_size": 2, "preset": "trn2"}))
    return folder


def balanced_small_messages(folder: Path) -> Path:
    """Two equal ranks; per step 40 all-reduces of 64 KiB, 10 us each, in [400k, 800k),
    then one of 64 MiB in [800k, 900k) (671 GB/s). At that bandwidth the small ones' 2.5 MiB
    would take 3.9 us: the rest of their 400 us is per-call latency."""
    folder.mkdir(parents=True, exist_ok=True)
    for rank in (0, 1):
        write_rank(folder, rank, 2, compute=600_000, coll_start=400_000, wait=0,
                   small_per_step=40)
    return folder


def kineto_rank(rank: int, world: int, kernel_start_us: float) -> dict:
    """A PyTorch-profiler trace of one GPU rank: one step, a compute kernel [0, 600) us and
    an NCCL all-reduce kernel starting at `kernel_start_us` and ending at 900 us, launched
    from an `nccl:all_reduce` range over 1M floats (4 MB). No wait is recorded."""
    dur = 900.0 - kernel_start_us
    return {
        "schemaVersion": 1,
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world},
        "traceEvents": [
            {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#7", "pid": 1,
             "tid": 1, "ts": 0, "dur": 1000},
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1,
             "dur": 5, "args": {"External id": 1}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
             "ts": 2, "dur": 2, "args": {"correlation": 10}},
            {"ph": "X", "cat": "user_annotation", "name": "nccl:all_reduce", "pid": 1,
             "tid": 1, "ts": 10, "dur": 10,
             "args": {"Input Dims": [[1048576]], "Input type": ["float"]}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
             "ts": 11, "dur": 2, "args": {"correlation": 11}},
            {"ph": "X", "cat": "kernel", "name": "ampere_sgemm_128x64_nn", "pid": 0,
             "tid": 7, "ts": 0, "dur": 600,
             "args": {"correlation": 10, "device": 0, "stream": 7}},
            {"ph": "X", "cat": "kernel",
             "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long)",
             "pid": 0, "tid": 20, "ts": kernel_start_us, "dur": dur,
             "args": {"correlation": 11, "device": 0, "stream": 20}},
        ],
    }


def rotating_late_rank(folder: Path) -> Path:
    """Four equal ranks; in step s rank s arrives 150k late at the all-reduce and the other
    three wait 150k for it. Each rank costs the others 150k of 4 ms (3.75%: no straggler),
    while every rank waits 3 x 150k in all."""
    folder.mkdir(parents=True, exist_ok=True)
    for rank in range(4):
        write_rank(folder, rank, 4, compute=600_000, coll_start=400_000, wait=0,
                   late_step=rank)
    return folder
