"""A 64-rank run at cluster scale: cold load in local processes and on a Dask LocalCluster,
cached reload, a DuckDB query over every rank's slices, and the client's peak memory.

Writes N rank traces (bench_run_load.py's synthetic training rank: steps, ops, kernels,
engine instructions, one all-reduce per step) into a run folder, then measures, each in
a fresh process with its own empty or warm trace cache:
- `cold_local`: `load(run, processes=P)` with an empty cache (every rank parsed, its store
  written), then the run's communication, stragglers and findings;
- `cold_dask`: the same on a `LocalCluster` of P workers (`scheduler="local"`);
- `cached`: the same again with the cache warm (each rank read from Parquet);
- `sql`: a DuckDB query over all ranks' slices (`run.sql`, reading the Parquet files in
  place) and one over all ranks' kernels.
Each reports wall time, the client's peak RSS and the largest worker's. The client never
holds every rank's slices: compare its peak with `all ranks' slices` (the sum of each
rank's slices frame in memory, measured on one rank).
Run (64 x 50k slices takes a few minutes on 2 cores):
    .venv/bin/python benchmarks/bench_run64.py [--ranks 64] [--slices 50000] [--processes 2]
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

sys.path.insert(0, str(Path(__file__).parent))
from bench_run_load import write_rank  # the synthetic rank

ANALYSE = "r.communication(); r.stragglers(); r.bottlenecks(); n = len(r)"
MEASURE = {
    "cold_local": f"r = ne.load(PATH, processes=P); {ANALYSE}",
    "cold_dask": f"r = ne.load(PATH, processes=P, scheduler='local'); {ANALYSE}",
    "cached": f"r = ne.load(PATH, processes=P); {ANALYSE}",
    "sql": "r = ne.load(PATH, processes=P); t1 = time.perf_counter(); "
           "q = r.sql('SELECT rank, kind, count(*) AS n, sum(dur) AS d FROM slices "
           "GROUP BY ALL ORDER BY ALL'); "
           "k = r.sql('SELECT rank, name, count(*) AS n, avg(dur) AS d FROM kernels "
           "GROUP BY ALL'); query_s = time.perf_counter() - t1; n = int(q['n'].sum())",
    "one_rank": "t = ne.load(PATH + '/rank0.pftrace', cache=False); "
                "n = int(t.table('slices').memory_usage(deep=True).sum())",
}


def measure(kind: str, folder: str, cache: str, processes: int) -> dict[str, float]:
    code = f"""
import json, resource, time
PATH, P = {folder!r}, {processes}
import neuron_explorer as ne, pandas, numpy, pyarrow.parquet
import neuron_explorer.runs.run, neuron_explorer.rules, neuron_explorer.store.cache
query_s = None
def hwm():  # this process's peak RSS (ru_maxrss would count the parent's, kept by exec)
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
t0 = time.perf_counter()
if __name__ == "__main__":
    {MEASURE[kind]}
    dt = time.perf_counter() - t0
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(json.dumps({{"seconds": dt, "peak_bytes": hwm(),
                      "worker_peak_bytes": kids.ru_maxrss * 1024, "n": n,
                      "query_seconds": query_s}}))
"""
    script = Path(cache).parent / f"measure_{kind}.py"  # Dask's workers re-import __main__
    script.write_text(code)
    env = {**os.environ, "NEURON_EXPLORER_CACHE": cache}
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          check=False, env=env, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"{kind} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--slices", type=int, default=50_000, help="slices per rank")
    parser.add_argument("--processes", type=int, default=os.cpu_count() or 1,
                        help="local worker processes, and the LocalCluster's workers")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--keep", help="write the run into this folder and keep it")
    parser.add_argument("--no-dask", action="store_true", help="skip the LocalCluster load")
    args = parser.parse_args()
    base = Path(args.keep or tempfile.mkdtemp(prefix="bench_run64_"))
    folder = base / "train.run"
    if not folder.is_dir() or len(list(folder.glob("*.pftrace"))) != args.ranks:
        folder.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        for rank in range(args.ranks):
            write_rank(folder / f"rank{rank}.pftrace", rank, args.ranks, args.slices)
        print(f"wrote {args.ranks} ranks in {time.perf_counter() - t0:.1f} s")
    size = sum(p.stat().st_size for p in folder.glob("*.pftrace"))
    print(f"run: {args.ranks} ranks x {args.slices:,} slices ({size / 2**20:.0f} MiB), "
          f"{args.processes} processes / workers")
    one = measure("one_rank", str(folder), str(base / "cache-none"), 1)
    results: dict[str, list[dict[str, float]]] = {k: [] for k in
                                                  ("cold_local", "cold_dask", "cached", "sql")}
    for i in range(args.repeat):
        for kind in ("cold_local",) if args.no_dask else ("cold_local", "cold_dask"):
            cache = base / f"cache-{kind}-{i}"  # empty: every rank parsed and stored
            results[kind].append(measure(kind, str(folder), str(cache), args.processes))
        warm = str(base / f"cache-cold_local-{i}")
        results["cached"].append(measure("cached", str(folder), warm, args.processes))
        results["sql"].append(measure("sql", str(folder), warm, args.processes))
    for kind, runs in results.items():
        if not runs:
            continue
        secs = sorted(r["seconds"] for r in runs)
        peak = max(r["peak_bytes"] for r in runs)
        worker = max(r["worker_peak_bytes"] for r in runs)
        extra = ""
        if kind == "sql":
            q = sorted(r["query_seconds"] for r in runs)
            extra = f"  (the two queries alone {q[0]:.2f}-{q[-1]:.2f} s)"
        print(f"{kind:10s} wall {secs[0]:7.2f}-{secs[-1]:7.2f} s  client peak "
              f"{peak / 2**20:6.0f} MiB  largest worker {worker / 2**20:6.0f} MiB{extra}")
    all_slices = one["n"] * args.ranks
    client = max(r["peak_bytes"] for runs in results.values() for r in runs if runs)
    print(f"all ranks' slices in memory would be {all_slices / 2**20:.0f} MiB; the client's "
          f"largest peak {client / 2**20:.0f} MiB")
    if not args.keep:
        shutil.rmtree(base)
    return 0


if __name__ == "__main__":
    sys.exit(main())
