"""One rank of a distributed test: `python rank_worker.py SCENARIO RESULT.json`.

Each scenario runs on the `neuron` backend and writes what the test checks as JSON.
"""

from __future__ import annotations

import datetime
import json
import os
import sys

import torch
import torch.distributed as dist
from neuron_explorer.backend.events import EventSink, hub


class Collectives(EventSink):
    """Keeps the collectives this rank ran, as the recorder would see them."""

    def __init__(self) -> None:
        self.runs = []

    def collective_ran(self, ev) -> None:
        self.runs.append({"collective": ev.collective, "seq": ev.seq, "arrival": ev.arrival_ns,
                          "start": ev.start_ns, "end": ev.end_ns, "wait": ev.wait_ns,
                          "transfer": ev.transfer_ns, "algorithm": ev.algorithm,
                          "bytes": ev.nbytes, "group": list(ev.group)})


def init() -> tuple[int, int, torch.device]:
    dist.init_process_group("neuron", timeout=datetime.timedelta(seconds=30))
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("neuron", rank % torch.neuron.device_count())
    torch.neuron.set_device(device.index)
    return rank, world, device


def collectives() -> dict:
    """Every collective's numbers, on rank-dependent inputs."""
    rank, world, dev = init()
    out: dict = {}
    for name in ("SUM", "AVG", "MAX", "MIN", "PRODUCT"):
        t = torch.arange(4.0, device=dev) + rank + 1
        dist.all_reduce(t, op=getattr(dist.ReduceOp, name))
        out[f"all_reduce_{name}"] = t.cpu().tolist()
    t = torch.arange(3, device=dev, dtype=torch.int64) * (rank + 1)
    dist.all_reduce(t)
    out["all_reduce_int64"] = t.cpu().tolist()
    t = torch.full((3,), float(rank), device=dev)
    dist.broadcast(t, src=world - 1)
    out["broadcast"] = t.cpu().tolist()
    parts = [torch.empty(2, device=dev) for _ in range(world)]
    dist.all_gather(parts, torch.full((2,), float(rank), device=dev))
    out["all_gather"] = [p.cpu().tolist() for p in parts]
    flat = torch.empty(2 * world, device=dev)
    dist.all_gather_into_tensor(flat, torch.full((2,), float(rank), device=dev))
    out["all_gather_into_tensor"] = flat.cpu().tolist()
    mine = torch.empty(2, device=dev)
    dist.reduce_scatter_tensor(mine, torch.arange(2.0 * world, device=dev) * (rank + 1))
    out["reduce_scatter_tensor"] = mine.cpu().tolist()
    parts_in = [torch.full((2,), (rank + 1.0) * (k + 1), device=dev) for k in range(world)]
    mine = torch.empty(2, device=dev)
    dist.reduce_scatter(mine, parts_in)
    out["reduce_scatter"] = mine.cpu().tolist()
    got = torch.empty(world, device=dev)
    dist.all_to_all_single(got, torch.arange(float(world), device=dev) + 10 * rank)
    out["all_to_all_single"] = got.cpu().tolist()
    if rank == 0:
        dist.send(torch.tensor([7.0, 8.0], device=dev), 1)
    elif rank == 1:
        r = torch.empty(2, device=dev)
        dist.recv(r, 0)
        out["recv"] = r.cpu().tolist()
    got = torch.empty(2, device=dev)
    chunks = [torch.full((2,), 10.0 * k, device=dev) for k in range(world)] if rank == 0 else None
    dist.scatter(got, chunks, src=0)
    out["scatter"] = got.cpu().tolist()
    gathered = [torch.empty(1, device=dev) for _ in range(world)] if rank == 0 else None
    dist.gather(torch.tensor([rank + 0.5], device=dev), gathered, dst=0)
    out["gather"] = [g.cpu().tolist() for g in gathered] if gathered else None
    t = torch.full((2,), rank + 1.0, device=dev)
    dist.reduce(t, dst=0)
    out["reduce"] = t.cpu().tolist()
    strided = torch.zeros(4, 2, device=dev)[:, 0]  # not contiguous
    strided.fill_(rank + 1.0)
    dist.all_reduce(strided)
    out["all_reduce_strided"] = strided.cpu().tolist()
    work = dist.all_reduce(torch.ones(2, device=dev), async_op=True)
    out["async_type"] = type(work).__name__
    out["async_wait"] = work.wait()
    out["async_future"] = [t.cpu().tolist() for t in work.get_future().value()]
    dist.barrier()
    for label, call in (
        ("complex_avg",
         lambda: dist.all_reduce(torch.ones(2, device=dev, dtype=torch.float8_e4m3fn))),
        ("all_to_all", lambda: dist.all_to_all([torch.ones(2, device=dev)] * world,
                                               [torch.ones(2, device=dev)] * world)),
        ("premul", lambda: dist.all_reduce(torch.ones(2, device=dev),
                                           op=dist._make_nccl_premul_sum(2.0))),
    ):
        try:
            call()
            out[f"error_{label}"] = None
        except Exception as exc:  # noqa: BLE001 - the test reads the message
            out[f"error_{label}"] = f"{type(exc).__name__}: {exc}"
    dist.destroy_process_group()
    return out


def coupling() -> dict:
    """Rank 0 queues ~8 ms of device work first: every rank's collective ends at the same
    time, and none starts before the work queued ahead of it on its own device."""
    sink = Collectives()
    hub.subscribe(sink)
    rank, _, dev = init()
    x = torch.randn(2048, 2048, device=dev)
    if rank == 0:
        for _ in range(3):
            x = x @ x / 64
    ready_before = torch.neuron.current_stream().ready_time()
    dist.all_reduce(x)
    big = torch.ones(1 << 18, device=dev)
    work = dist.all_reduce(big, async_op=True)
    finish_before_wait = torch.neuron.current_stream().ready_time()
    work.wait()
    finish_after_wait = torch.neuron.current_stream().ready_time()
    dist.destroy_process_group()
    hub.unsubscribe(sink)
    return {"runs": sink.runs, "ready_before": ready_before,
            "before_wait": finish_before_wait, "after_wait": finish_after_wait}


def late_peer() -> dict:
    """The last rank reaches an all-reduce 300 ms after the others: how the others'
    waits inside it went (polls of gloo's work, and whether one blocked before the work
    completed), and the sum."""
    import time

    from neuron_explorer.backend.distributed import busy_wait

    rank, world, dev = init()
    t = torch.full((4,), float(rank + 1), device=dev)
    dist.all_reduce(t)  # the communicator's set-up, so the next call waits for the peer only
    waits: list[dict] = []
    spin = busy_wait.wait

    def watched(work) -> None:
        class Watched:
            polls = 0

            def is_completed(self) -> bool:
                Watched.polls += 1
                return work.is_completed()

            def wait(self) -> bool:
                waits.append({"polls": Watched.polls, "blocked": not work.is_completed()})
                return work.wait()

        spin(Watched())

    busy_wait.wait = watched
    busy_wait.SPIN_NS = 30_000_000_000  # this wait is never past the limit, however slow
    if rank == world - 1:
        time.sleep(0.3)
    dist.all_reduce(t)
    busy_wait.wait = spin
    out = {"waits": waits, "sum": t.cpu().tolist()}
    dist.destroy_process_group()
    return out


def default_backend() -> dict:
    """`init_process_group()` picks gloo for CPU tensors and neuron for neuron tensors;
    DTensor's redistributions run on the neuron group."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor

    dist.init_process_group(timeout=datetime.timedelta(seconds=30))
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("neuron", rank)
    out: dict = {"backend": dist.get_backend(), "current_device": torch.neuron.current_device()}
    host = torch.full((2,), rank + 1.0)
    dist.all_reduce(host)
    out["cpu_all_reduce"] = host.tolist()
    mesh = init_device_mesh("neuron", (world,))
    full = torch.arange(8.0 * world).reshape(2 * world, 4)
    sharded = distribute_tensor(full.to(dev), mesh, [Shard(0)])
    out["local_shard"] = sharded.to_local().cpu().tolist()
    out["gathered_equal"] = bool(torch.equal(sharded.redistribute(mesh, [Replicate()])
                                             .to_local().cpu(), full))
    partial = distribute_tensor(torch.ones(3, device=dev), mesh, [Replicate()])
    summed = partial.redistribute(mesh, [Replicate()])
    out["replicate"] = summed.to_local().cpu().tolist()
    from torch.distributed.tensor import DTensor

    p = DTensor.from_local(torch.full((3,), rank + 1.0, device=dev), mesh, [Partial()])
    out["partial_to_replicate"] = p.redistribute(mesh, [Replicate()]).to_local().cpu().tolist()
    dist.destroy_process_group()
    return out


def dead_rank() -> dict:
    """The last rank dies (SIGKILL) before its second all-reduce; the others must fail."""
    rank, world, dev = init()
    t = torch.ones(4, device=dev)
    dist.all_reduce(t)
    if rank == world - 1:
        os.kill(os.getpid(), 9)
    try:
        dist.all_reduce(t)
        return {"error": None}
    except Exception as exc:  # noqa: BLE001 - the test reads the message
        return {"error": f"{type(exc).__name__}: {exc}"}


if __name__ == "__main__":
    scenario, result_path = sys.argv[1], sys.argv[2]
    result = globals()[scenario]()
    with open(result_path, "w") as f:
        json.dump(result, f)
    sys.stdout.flush()
    os._exit(0)  # a dead peer must not keep this rank in gloo's shutdown
