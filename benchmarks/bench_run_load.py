"""Loading a multi-rank run: a 16-rank run folder, against loading its largest rank alone.

Writes N rank traces (each the synthetic training trace of bench_load.py, plus one
all-reduce per step on a collective queue) into a run folder, then measures, each in a
fresh process:
- `rank`: `neuron_explorer.load(rank0.pftrace)` and its summary, communication and
  findings (what a run keeps of each rank): time and peak memory;
- `run`: `neuron_explorer.load(run_folder)` with one worker process per core, then the
  run's communication, stragglers and findings: time, the client's peak memory, the
  largest worker's peak, and CPU use across cores.
Targets: the run's loading uses all cores (CPU time / wall time close to the core
count), and the client's peak memory stays under 1.5x the largest rank's load.
Run:
    .venv/bin/python benchmarks/bench_run_load.py [--ranks 16] [--slices 200000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import bench_load  # the single-rank trace generator

MEASURE = {
    "rank": "t = ne.load(PATH + '/rank0.pftrace'); t.summary(); t.communication(); "
            "t.bottlenecks(); n = len(t.table('slices'))",
    "run": "r = ne.load(PATH); r.communication(); r.stragglers(); r.bottlenecks(); n = len(r)",
}


def write_rank(path: Path, rank: int, ranks: int, n_slices: int) -> None:
    """bench_load's trace, with this rank's metadata and an all-reduce per step (the last
    rank arrives late at each by a tenth of its length, so the others wait for it)."""
    ev = bench_load.events(n_slices)
    st = ev["steps"]
    steps = bench_load.STEPS
    span = int(st["dur"][0]) // 4  # each step's all-reduce: a quarter of the step
    late = span // 10 if rank == ranks - 1 else 0

    def collectives(w, main: int, dev: int) -> None:
        w.metadata(main, 0, {"rank": rank, "world_size": ranks})
        queue = w.track("Collectives", dev)
        start = st["ts"] + st["dur"] // 2 + late
        w.slices(np.full(steps, queue), start, np.full(steps, span - late), ["all_reduce"],
                 np.zeros(steps, int), "collective",
                 int_args={"bytes": np.full(steps, 64 << 20), "seq": np.arange(steps),
                           "wait_ns": np.full(steps, span // 10 - late),
                           "transfer_ns": np.full(steps, span - span // 10)},
                 str_args={"collective": (["all_reduce"], np.zeros(steps, int)),
                           "group": ([json.dumps(list(range(ranks)))], np.zeros(steps, int))})

    bench_load.write_pftrace(path, ev, extra=collectives)


def measure(kind: str, folder: str) -> dict[str, float]:
    code = f"""
import json, resource, time
PATH = {folder!r}
import neuron_explorer as ne, pandas, numpy
import neuron_explorer.runs.run, neuron_explorer.rules
t0, c0 = time.perf_counter(), time.process_time()
{MEASURE[kind]}
dt, cpu = time.perf_counter() - t0, time.process_time() - c0
me = resource.getrusage(resource.RUSAGE_SELF)
kids = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({{"seconds": dt, "cpu_seconds": cpu + kids.ru_utime + kids.ru_stime,
                  "peak_bytes": me.ru_maxrss * 1024, "worker_peak_bytes": kids.ru_maxrss * 1024,
                  "n": n}}))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{kind} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=16)
    parser.add_argument("--slices", type=int, default=200_000, help="slices per rank")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="bench_run_")) / "train.run"
    folder.mkdir()
    t0 = time.perf_counter()
    for rank in range(args.ranks):
        write_rank(folder / f"rank{rank}.pftrace", rank, args.ranks, args.slices)
    size = sum(p.stat().st_size for p in folder.iterdir())
    print(f"wrote {args.ranks} ranks x {args.slices:,} slices ({size / 2**20:.0f} MiB) in "
          f"{time.perf_counter() - t0:.1f} s")
    runs: dict[str, list[dict[str, float]]] = {"rank": [], "run": []}
    for _ in range(args.repeat):  # interleaved, so both see the same machine load
        for kind, results in runs.items():
            results.append(measure(kind, str(folder)))
    cores = os.cpu_count() or 1
    for kind, results in runs.items():
        secs = sorted(r["seconds"] for r in results)
        peak = min(r["peak_bytes"] for r in results)
        print(f"{kind:5s} wall {secs[0]:6.2f}-{secs[-1]:6.2f} s  peak {peak / 2**20:6.0f} MiB")
    rank_peak = min(r["peak_bytes"] for r in runs["rank"])
    run_peak = min(r["peak_bytes"] for r in runs["run"])
    worker_peak = min(r["worker_peak_bytes"] for r in runs["run"])
    used = [r["cpu_seconds"] / r["seconds"] for r in runs["run"]]
    per_rank = min(r["seconds"] for r in runs["rank"])
    print(f"run client peak / one rank's load: {run_peak / rank_peak:.2f}x (target < 1.5x: "
          f"{'met' if run_peak < 1.5 * rank_peak else 'MISSED'}); largest worker "
          f"{worker_peak / 2**20:.0f} MiB")
    print(f"cores used while loading the run: {min(used):.2f}-{max(used):.2f} of {cores}")
    print(f"run / (ranks x one rank): {min(r['seconds'] for r in runs['run']) / per_rank:.1f}"
          f" / {args.ranks} (below {args.ranks} means the ranks loaded in parallel)")
    shutil.rmtree(folder.parent)
    return 0


if __name__ == "__main__":
    sys.exit(main())
