"""Collectives on `neuron`: simulated bus bandwidth, and the host overhead over gloo.

    .venv/bin/python benchmarks/bench_collectives.py              # both parts
    .venv/bin/python benchmarks/bench_collectives.py --model-only # just the bandwidth table

1. Bus bandwidth (as collective benchmarks define it) against message size for
   all-reduce and all-gather on trn1 and trn2, from the interconnect cost model, for a
   group on one chip, on one instance (16 chips) and on 4 instances.
2. Host overhead: two ranks all-reduce a 1 MiB float32 tensor; the time of gloo alone
   on CPU tensors against the neuron backend on neuron tensors (which runs gloo on
   their host views and adds the arrival exchange and the bookkeeping), interleaved
   in rounds in the same processes, as median and quartiles. Target: <= 1.5x gloo.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time

SIZES = [1 << k for k in range(10, 31, 2)]  # 1 KiB .. 1 GiB


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n}{unit}"
        n //= 1024
    return f"{n}TiB"


def bandwidth_table() -> None:
    from neuron_explorer.backend.distributed.interconnect import (
        ALL_GATHER,
        ALL_REDUCE,
        bus_bandwidth,
        link_for,
        preset_collective_cost,
    )
    from neuron_explorer.backend.distributed.topology import topology_for
    from neuron_explorer.common.presets import PRESETS

    for name in ("trn1", "trn2"):
        preset = PRESETS[name]
        topo = topology_for(preset, "")
        per_instance = topo.ranks_per_chip * topo.chips_per_instance
        groups = {"1 chip": topo.ranks_per_chip, "1 instance": per_instance,
                  "4 instances": 4 * per_instance}
        for collective in (ALL_REDUCE, ALL_GATHER):
            print(f"\n{name} {collective}, fp32: bus bandwidth GB/s (algorithm)")
            print(f"{'size':>8} " + " ".join(f"{g + f' ({n})':>22}" for g, n in groups.items()))
            for nbytes in SIZES:
                cells = []
                for n in groups.values():
                    ranks = tuple(range(n))
                    cost = preset_collective_cost(preset, collective, nbytes, n,
                                                  link_for(preset, topo, ranks), 4)
                    bw = bus_bandwidth(collective, nbytes, n, cost.transfer_ns / 1e9) / 1e9
                    cells.append(f"{bw:14.1f} ({cost.algorithm.split()[0]:>4})")
                print(f"{_size(nbytes):>8} " + " ".join(f"{c:>22}" for c in cells))


def _worker(rank: int, port: int, rounds: int, nbytes: int) -> None:
    import datetime

    import torch
    import torch.distributed as dist
    from neuron_explorer.backend.distributed.process_group import ProcessGroupNeuron

    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0)
    timeout = datetime.timedelta(seconds=60)
    gloo = dist.ProcessGroupGloo(dist.PrefixStore("bench", store), rank, 2, timeout)
    neuron = ProcessGroupNeuron(dist.PrefixStore("neuron", store), rank, 2, timeout)
    n = nbytes // 4
    host = torch.ones(n)
    device = torch.ones(n, device="neuron")
    times: dict[str, list[float]] = {"gloo": [], "neuron": []}
    for i in range(rounds + 3):
        for name in ("gloo", "neuron") if i % 2 else ("neuron", "gloo"):
            t0 = time.perf_counter()
            if name == "gloo":
                gloo.allreduce([host]).wait()
            else:
                neuron.allreduce([device]).wait()
            if i >= 3:  # warm-up rounds left out
                times[name].append(time.perf_counter() - t0)
    if rank == 0:
        for name, values in times.items():
            q = statistics.quantiles(values, n=4)
            print(f"{name:>7}: median {statistics.median(values) * 1e6:8.0f} us  "
                  f"(min {min(values) * 1e6:.0f}, p25 {q[0] * 1e6:.0f}, p75 {q[2] * 1e6:.0f}, "
                  f"{len(values)} rounds)")
        ratios = [a / b for a, b in zip(times["neuron"], times["gloo"], strict=True)]
        q = statistics.quantiles(ratios, n=4)
        print(f"  neuron / gloo, per round: median {statistics.median(ratios):.2f}x "
              f"(p25 {q[0]:.2f}x, p75 {q[2]:.2f}x); of the fastest rounds: "
              f"{min(times['neuron']) / min(times['gloo']):.2f}x (target <= 1.5x)")


def host_overhead(rounds: int, nbytes: int) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    print(f"\nhost time of one {_size(nbytes)} all-reduce on 2 ranks")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", str(r), str(port),
                               str(rounds), str(nbytes)], env=env) for r in range(2)]
    for p in procs:
        p.wait(timeout=600)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-only", action="store_true")
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--bytes", type=int, default=1 << 20)
    parser.add_argument("--worker", nargs=4, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(*args.worker)
        return
    bandwidth_table()
    if not args.model_only:
        host_overhead(args.rounds, args.bytes)


if __name__ == "__main__":
    main()
