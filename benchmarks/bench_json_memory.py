"""Peak memory and time of loading large JSON traces (issue #29's bounds).

Writes two gzipped PyTorch-profiler (Kineto) JSON traces and loads each with
`neuron_explorer.load` in a fresh process, with the trace cache on (into a temporary
folder), as a user's first load does:

- bomb: one small event repeated, 0.85 MB of gzip inflating to 250 MB (2.35 M events);
  target: peak under 1 GiB;
- kineto: 1.2 M events, half CPU ops with 5 args, half kernels with 6 (lists included),
  273 MB inflated.

Each load runs `--repeat` times; prints the peak RSS (the process's, imports included)
and the wall time of each, and the import baseline (a process that only imports).

    .venv/bin/python benchmarks/bench_json_memory.py [--repeat 3] [--keep DIR]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

TARGET_BOMB_BYTES = 1 << 30
BOMB_EVENT = (b'{"ph":"X","cat":"cpu_op","name":"aten::add","pid":1,"tid":1,"ts":1.0,'
              b'"dur":1.0,"args":{"External id":1}}')


def write_bomb(path: Path, inflated: int = 250_000_000) -> int:
    n = inflated // (len(BOMB_EVENT) + 2)
    block = (BOMB_EVENT + b",\n") * 10_000
    with gzip.open(path, "wb", compresslevel=9) as f:
        f.write(b'{"traceEvents":[\n')
        for _ in range(n // 10_000):
            f.write(block)
        f.write(BOMB_EVENT + b"\n]}\n")
    return n // 10_000 * 10_000 + 1


def write_kineto(path: Path, pairs: int = 600_000) -> int:
    with gzip.open(path, "wt", compresslevel=6) as f:
        f.write('{"schemaVersion": 1, "deviceProperties": [], "traceEvents": [\n')
        for i in range(pairs):
            ts = 1000.0 + i * 2.5
            op = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1,
                  "ts": ts, "dur": 1.0, "args": {"External id": i, "Sequence number": i,
                                                 "Fwd thread id": 0, "Record function id": 0,
                                                 "Ev Idx": i}}
            kernel = {"ph": "X", "cat": "kernel", "name": "ampere_sgemm_128x64_nn", "pid": 0,
                      "tid": 7, "ts": ts + 0.5, "dur": 2.0,
                      "args": {"correlation": i, "device": 0, "stream": 7, "External id": i,
                               "grid": [1, 2, 1], "block": [128, 1, 1]}}
            f.write(("" if i == 0 else ",\n") + json.dumps(op) + ",\n" + json.dumps(kernel))
        f.write("\n]}\n")
    return 2 * pairs


LOAD = """
import resource, sys, time
t = time.perf_counter()
import neuron_explorer
if sys.argv[1] == "-":  # what a load imports, without loading
    import neuron_explorer.loaders.json_stream, neuron_explorer.trace, numba, pyarrow.parquet
    neuron_explorer.loaders.json_stream._compiled()
else:
    trace = neuron_explorer.load(sys.argv[1])
    assert len(trace.table("slices")) == int(sys.argv[2])
print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""


def measure(path: str, slices: int, cache: str) -> tuple[float, int]:
    """(seconds, peak RSS in bytes) of one load in a fresh process."""
    env = {**os.environ, "NEURON_EXPLORER_CACHE": cache}
    done = subprocess.run([sys.executable, "-c", LOAD, path, str(slices)], env=env,
                          capture_output=True, text=True, check=True)
    seconds, peak = done.stdout.split()
    return float(seconds), int(peak)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--keep", help="write the traces into this folder and keep them")
    args = parser.parse_args()
    folder = Path(args.keep or tempfile.mkdtemp(prefix="bench_json_"))
    folder.mkdir(parents=True, exist_ok=True)
    cases = {}
    for name, write in (("bomb", write_bomb), ("kineto", write_kineto)):
        path = folder / f"{name}.json.gz"
        cases[name] = (str(path), write(path))
        print(f"{name}: {path.stat().st_size / 1e6:.2f} MB gzip, {cases[name][1]:,} events",
              flush=True)
    _, baseline = measure("-", 0, "off")
    print(f"imports of a load (numba's compiled scan included): {baseline / 2**20:.0f} MiB")
    for name, (path, slices) in cases.items():
        runs = []
        for _ in range(args.repeat):
            with tempfile.TemporaryDirectory() as cache:
                runs.append(measure(path, slices, cache))
        peaks = sorted(p for _, p in runs)
        times = sorted(t for t, _ in runs)
        verdict = ""
        if name == "bomb":
            verdict = " (target < 1 GiB: " + ("met" if peaks[-1] < TARGET_BOMB_BYTES
                                              else "missed") + ")"
        print(f"{name}: peak {peaks[0] / 2**20:.0f}-{peaks[-1] / 2**20:.0f} MiB, "
              f"load {times[0]:.1f}-{times[-1]:.1f} s over {len(runs)} runs{verdict}",
              flush=True)
    print(f"(this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024} MiB)")


if __name__ == "__main__":
    main()
