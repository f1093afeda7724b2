"""Load speed and memory: a trace of 1 million slices, against Holistic Trace Analysis.

Writes one synthetic training trace twice: as our .pftrace (with the collectors'
trace writer) and as PyTorch-profiler (Kineto) JSON holding the same events. Each
measurement runs in a fresh process (time and peak RSS of that process):

- ours: `neuron_explorer.load(.pftrace)` (slices, tracks, counters, flows; slice args
  are decoded on first use), and, separately, load + the ops and kernels tables
  (which decodes the args);
- ours on the JSON: `neuron_explorer.load(.json)`;
- HTA: `hta.common.trace_parser.parse_trace_dataframe(.json)`, HTA's parser.

A run of many ranks (a folder, loaded in worker processes) is measured by
bench_run_load.py beside this script.

Prints the times, the peak memory and the ratios HTA / ours. Targets: load in at
most 5 s, under 2 GB, 10x faster than HTA. Each figure is the best of a few runs.

Then the store (docs/scale.md), on the synthetic trace and on an engine-level trace
recorded from examples/gpt.py: first load to every table ready (parsed, derived tables,
args, the Parquet store written into the trace cache), target >= 1 M slices/s; cached
reload of every table, and of the slices and steps alone, target >= 10 M slices/s; peak
memory above the imports <= 3x the file. The rates are judged on CPU time (the fairer
figure on a shared machine); the wall-clock rates are printed beside them.

First, each real PyTorch-profiler trace the tests keep (HTA's own test traces among them)
against HTA's parser, in fresh processes: CPU time after the imports and with them, peak
memory above the imports. Target: 5x faster than HTA, no more memory.

Then the nesting case: N identical slices (each nests in the one before: depth N)
in both formats, at N and 4N; the load must grow about linearly (target: 4N takes
at most 6x N's time; a pass per depth made it 16x).
Run:
    .venv/bin/python benchmarks/bench_load.py [--slices 1000000] [--keep DIR]
        [--recorded TRACE | --record-steps 30] [--store-only | --real-only]
(needs the `bench` extra: pip install -c constraints.txt -e .[bench])
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

STEPS = 100
ENGINES = ("Tensor Engine", "Vector Engine", "Scalar Engine", "GpSimd Engine")


def layout(n_slices: int) -> dict[str, int]:
    """How the slices split: a tenth ops, a tenth kernels, the rest instructions."""
    ops = n_slices // 10
    return {"ops": ops, "kernels": ops, "instructions": n_slices - 2 * ops - STEPS,
            "steps": STEPS}


def events(n_slices: int) -> dict[str, dict[str, np.ndarray]]:
    """Columns of every event: steps, ops, kernels, instructions (times in ns)."""
    n = layout(n_slices)
    rng = np.random.default_rng(0)
    op_gap = 2000
    op_ts = np.arange(n["ops"], dtype=np.int64) * op_gap
    step_len = int(op_ts[-1] + op_gap) // STEPS + 1
    k_ts = op_ts + 1500
    k_dur = np.full(n["kernels"], 1800, np.int64)
    per = n["instructions"] // n["kernels"] + 1
    ins_k = np.repeat(np.arange(n["kernels"]), per)[: n["instructions"]]
    slot = np.tile(np.arange(per), n["kernels"])[: n["instructions"]]
    ins_ts = k_ts[ins_k] + slot * (1800 // per)
    return {
        "steps": {"ts": np.arange(STEPS, dtype=np.int64) * step_len,
                  "dur": np.full(STEPS, step_len - 10, np.int64)},
        "ops": {"ts": op_ts, "dur": np.full(n["ops"], 1200, np.int64),
                "name": rng.integers(0, 8, n["ops"]), "op_id": np.arange(1, n["ops"] + 1),
                "flops": rng.integers(1, 10**9, n["ops"]),
                "bytes": rng.integers(1, 10**7, n["ops"]), "step": op_ts // step_len},
        "kernels": {"ts": k_ts, "dur": k_dur, "kernel_id": np.arange(1, n["kernels"] + 1),
                    "op_id": np.arange(1, n["kernels"] + 1)},
        "instructions": {"ts": ins_ts, "dur": np.full(n["instructions"], 1800 // per - 5,
                                                      np.int64),
                         "engine": slot % 4, "kernel_id": ins_k + 1,
                         "bytes": rng.integers(0, 1 << 20, n["instructions"])},
    }


OP_NAMES = ["aten::mm", "aten::add", "aten::relu", "aten::gelu", "aten::softmax",
            "aten::layer_norm", "aten::addmm", "aten::mul"]


def write_pftrace(path: Path, ev: dict[str, dict[str, np.ndarray]],
                  extra: Callable[[Any, int, int], None] | None = None) -> None:
    """The events as our .pftrace; `extra(writer, main_thread, device)` may add more."""
    from neuron_explorer.collectors.trace_writer import open_writer

    w = open_writer(str(path), "pftrace")
    w.process(100, "python train.py")
    main = w.thread(100, 100, "MainThread")
    dev = w.process(200, "neuron:0 (trn2)")
    kernels = w.track("Kernels", dev)
    engines = np.array([w.track(name, dev) for name in ENGINES])
    w.metadata(main, 0, {"hardware": "trn2"})
    st = ev["steps"]
    w.slices(np.full(STEPS, main), st["ts"], st["dur"], ["step"], np.zeros(STEPS, int), "step",
             int_args={"step": np.arange(STEPS)})
    op = ev["ops"]
    n_ops = len(op["ts"])
    w.slices(np.full(n_ops, main), op["ts"], op["dur"], OP_NAMES, op["name"], "op",
             int_args={k: op[k] for k in ("op_id", "flops", "bytes", "step")},
             str_args={"shapes": (["[[1024, 1024], [1024, 1024]]"], np.zeros(n_ops, int)),
                       "dtypes": (["[bfloat16, bfloat16]"], np.zeros(n_ops, int))},
             flow_out=op["op_id"])
    k = ev["kernels"]
    w.slices(np.full(len(k["ts"]), kernels), k["ts"], k["dur"], ["kernel"],
             np.zeros(len(k["ts"]), int), "kernel",
             int_args={"kernel_id": k["kernel_id"], "op_id": k["op_id"]}, flow_in=k["op_id"])
    ins = ev["instructions"]
    for e in range(4):  # one batch per engine keeps each track in time order
        m = ins["engine"] == e
        w.slices(np.full(int(m.sum()), engines[e]), ins["ts"][m], ins["dur"][m], ["Inst"],
                 np.zeros(int(m.sum()), int), "instruction",
                 int_args={"kernel_id": ins["kernel_id"][m], "bytes": ins["bytes"][m]})
    if extra is not None:
        extra(w, main, dev)
    w.close()


def write_kineto(path: Path, ev: dict[str, dict[str, np.ndarray]]) -> None:
    """The same events as a PyTorch-profiler trace (µs times, Kineto categories)."""
    import orjson

    out = [{"ph": "M", "name": "process_name", "pid": 100, "tid": 0,
            "args": {"name": "python train.py"}},
           {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "GPU 0"}}]
    st = ev["steps"]
    for i, (t, d) in enumerate(zip(st["ts"].tolist(), st["dur"].tolist(), strict=True)):
        out.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i}", "pid": 100,
                    "tid": 100, "ts": t / 1000, "dur": d / 1000, "args": {"External id": i}})
    op = ev["ops"]
    for t, d, n, i, f in zip(op["ts"].tolist(), op["dur"].tolist(), op["name"].tolist(),
                             op["op_id"].tolist(), op["flops"].tolist(), strict=True):
        out.append({"ph": "X", "cat": "cpu_op", "name": OP_NAMES[n], "pid": 100, "tid": 100,
                    "ts": t / 1000, "dur": d / 1000,
                    "args": {"External id": i, "correlation": i, "flops": f,
                             "Input Dims": [[1024, 1024], [1024, 1024]]}})
    k = ev["kernels"]
    for t, d, i in zip(k["ts"].tolist(), k["dur"].tolist(), k["kernel_id"].tolist(), strict=True):
        out.append({"ph": "X", "cat": "kernel", "name": "kernel", "pid": 0, "tid": 7,
                    "ts": t / 1000, "dur": d / 1000,
                    "args": {"External id": i, "correlation": i, "device": 0, "stream": 7}})
    ins = ev["instructions"]
    for t, d, e, kid, b in zip(ins["ts"].tolist(), ins["dur"].tolist(), ins["engine"].tolist(),
                               ins["kernel_id"].tolist(), ins["bytes"].tolist(), strict=True):
        out.append({"ph": "X", "cat": "kernel", "name": "Inst", "pid": 0, "tid": 10 + e,
                    "ts": t / 1000, "dur": d / 1000,
                    "args": {"External id": kid, "correlation": kid, "device": 0, "bytes": b}})
    doc = {"schemaVersion": 1, "deviceProperties": [], "traceEvents": out}
    path.write_bytes(orjson.dumps(doc))


# imports, done before the clock starts: a fixed cost, not the load's
SETUP = {
    "ours": "import neuron_explorer as ne, neuron_explorer.trace, neuron_explorer.tables, "
            "neuron_explorer.loaders.pftrace, neuron_explorer.loaders.chrome_json, "
            "neuron_explorer.store.cache, neuron_explorer.progress, pyarrow.parquet, tqdm.auto",
    # every .pftrace decoded in windows into its cache entry (by default only large ones)
    "ours_streamed": "import neuron_explorer as ne, neuron_explorer.trace, "
                     "neuron_explorer.tables, neuron_explorer.loaders.pftrace, "
                     "neuron_explorer.loaders.chrome_json, neuron_explorer.store.cache, "
                     "neuron_explorer.progress, pyarrow.parquet, tqdm.auto\n"
                     "neuron_explorer.loaders.STREAM_MIN_BYTES = 0",
    "hta": "from hta.common.trace_parser import parse_trace_dataframe\n"
           "from hta.configs.parser_config import ParserConfig",
}
EVERY_TABLE = ("t.flows; t.steps; t.ops; t.kernels; t.instructions; t.modules; "
               "t.table('args'); n = len(t.table('slices'))")
# kind -> (setup, what is timed, trace cache: off, or a fresh / the same folder)
MEASURE = {
    # the flows are linked on first use: asked for, so the figure covers what a load did
    "ours": ("ours", "t = ne.load(PATH); n = len(t.table('slices')); t.flows", "off"),
    "ours_derived": ("ours", "t = ne.load(PATH); n = len(t.ops) + len(t.kernels)", "off"),
    "ours_json": ("ours", "t = ne.load(PATH); n = len(t.table('slices'))", "off"),
    # every table ready: parsed, derived, args decoded, the store written into the cache
    "first_all": ("ours", f"t = ne.load(PATH); {EVERY_TABLE}", "fresh"),
    "first_all_streamed": ("ours_streamed", f"t = ne.load(PATH); {EVERY_TABLE}", "fresh"),
    # the load alone (the cache written), and decoded in windows whatever the file's size
    "first_load": ("ours", "t = ne.load(PATH); n = len(t.table('slices')); t.steps", "fresh"),
    "first_load_streamed": ("ours_streamed",
                            "t = ne.load(PATH); n = len(t.table('slices')); t.steps", "fresh"),
    # the same from the cache written by first_all
    "cached_all": ("ours", f"t = ne.load(PATH); {EVERY_TABLE}", "warm"),
    "cached_load": ("ours", "t = ne.load(PATH); n = len(t.table('slices')); t.steps", "warm"),
    "hta": ("hta", ("meta, df, symbols = parse_trace_dataframe(PATH, ParserConfig())\n"
                    "n = len(df)"), "off"),
    # a real trace: its events as HTA's parser gives them, then with the ops and kernels
    "ours_real": ("ours", "t = ne.load(PATH); n = len(t.table('slices'))", "off"),
    "ours_real_derived": ("ours", ("t = ne.load(PATH); n = len(t.table('slices')); t.ops; "
                                   "t.kernels"), "off"),
}
# HTA's own test traces and the other real PyTorch-profiler traces kept for the tests
REAL_TRACES = ("tests/data/real_traces", "tests/data/hta_critical_path")


def write_identical(folder: Path, n: int) -> tuple[Path, Path]:
    """n identical slices on one thread, as .pftrace and as JSON."""
    import orjson
    from neuron_explorer.collectors.trace_writer import open_writer

    pf, js = folder / f"same_{n}.pftrace", folder / f"same_{n}.json"
    w = open_writer(str(pf), "pftrace")
    w.process(1, "python")
    main = w.thread(1, 1, "MainThread")
    w.slices(np.full(n, main), np.zeros(n, np.int64), np.full(n, 1000, np.int64), ["op"],
             np.zeros(n, int), "op")
    w.close()
    event = {"ph": "X", "cat": "op", "name": "op", "pid": 1, "tid": 1, "ts": 1.0, "dur": 1.0}
    js.write_bytes(orjson.dumps({"traceEvents": [event] * n}))
    return pf, js


def nesting_case(folder: Path, n: int, repeat: int) -> None:
    """Load time of n and 4n identical slices (nested n deep), both formats."""
    seconds = {}
    for count in (n, 4 * n):
        for path in write_identical(folder, count):
            runs = [measure("ours_json", str(path))["cpu_seconds"] for _ in range(repeat)]
            seconds[(path.suffix, count)] = runs
            path.unlink()
    for suffix in (".pftrace", ".json"):
        small, large = seconds[(suffix, n)], seconds[(suffix, 4 * n)]
        ratio = min(large) / min(small)
        print(f"nested {suffix:8s} {n:,}: {min(small):.2f}-{max(small):.2f} s cpu, "
              f"{4 * n:,}: {min(large):.2f}-{max(large):.2f} s cpu; ratio {ratio:.1f}x "
              f"(target <= 6x: {'met' if ratio <= 6 else 'MISSED'})")


CACHE = Path(tempfile.gettempdir()) / f"bench_load_cache_{os.getpid()}"


def measure(kind: str, path: str) -> dict[str, float]:
    """Run one measurement in a fresh process: seconds (after imports), peak RSS, rows."""
    setup, timed, cache = MEASURE[kind]
    if cache == "fresh":
        shutil.rmtree(CACHE, ignore_errors=True)
    code = f"""
import json, resource, sys, time
PATH = {path!r}
import pandas, numpy
{SETUP[setup]}
def hwm():  # this process's peak RSS (ru_maxrss would count the parent's, kept by exec)
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
base = hwm()
t0, c0 = time.perf_counter(), time.process_time()
s0 = resource.getrusage(resource.RUSAGE_SELF).ru_stime
{timed}
dt, cpu = time.perf_counter() - t0, time.process_time() - c0
usage = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({{"seconds": dt, "cpu_seconds": cpu, "sys_seconds": usage.ru_stime - s0,
                  "cpu_with_imports": time.process_time(),
                  "peak_bytes": hwm(), "base_bytes": base, "rows": n}}))
"""
    env = {**os.environ, "NEURON_EXPLORER_CACHE": "off" if cache == "off" else str(CACHE)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=False, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"{kind} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def record_engine_trace(path: Path, steps: int) -> Path:
    """Record examples/gpt.py at --level engine (bounded in time)."""
    root = Path(__file__).resolve().parents[1]
    cli = Path(sys.executable).with_name("neuron-explorer")
    t0 = time.perf_counter()
    subprocess.run([str(cli), "record", "--level", "engine", "-o", str(path), "--",
                    str(root / "examples" / "gpt.py"), "--steps", str(steps)],
                   check=True, timeout=600, capture_output=True)
    print(f"recorded {path.name}: examples/gpt.py, {steps} steps at --level engine, "
          f"{path.stat().st_size / 2**20:.0f} MiB, in {time.perf_counter() - t0:.0f} s")
    return path


def store_targets(label: str, path: Path, best: Callable[[str, Path], dict[str, float]]
                  ) -> None:
    """First load to every table ready (the cache written), cached reload, peak memory."""
    size = path.stat().st_size
    kinds = (("ours", None), ("first_load", None), ("first_load_streamed", None),
             ("first_all_streamed", None), ("first_all", 1e6), ("cached_all", 10e6),
             ("cached_load", 10e6))
    runs = {kind: best(kind, path) for kind, _ in kinds}
    n = runs["ours"]["rows"]
    print(f"{label}: {n:,} slices, {size / 2**20:.0f} MiB ('_streamed': decoded in windows "
          "into the cache, as files from STREAM_MIN_BYTES on are)")
    for kind, target in kinds:
        r = runs[kind]
        rate, rate_cpu = n / r["seconds"], n / r["cpu_seconds"]
        above = r["peak_bytes"] - r["base_bytes"]
        verdict = "" if target is None else \
            f" (target >= {target / 1e6:.0f} M/s: {'met' if rate_cpu >= target else 'MISSED'}, " \
            f"{rate_cpu / target:.2f}x of it)"
        print(f"  {kind:12s} {r['seconds']:6.2f} s wall {r['cpu_seconds']:6.2f} s cpu  "
              f"{rate / 1e6:5.2f} M slices/s wall, {rate_cpu / 1e6:5.2f} by cpu{verdict}  "
              f"peak {above / 2**20:5.0f} MiB above the imports ({above / size:.1f}x the file)")
    peak = max(r["peak_bytes"] - r["base_bytes"] for r in runs.values())
    print(f"  peak above the imports {peak / 2**20:.0f} MiB = {peak / size:.1f}x the file "
          f"(target <= 3x: {'met' if peak <= 3 * size else 'MISSED'})")


def real_traces(best: Callable[[str, Path], dict[str, float]]) -> None:
    """Each real trace against HTA's parser: CPU time after the imports and with them, and
    peak memory above the imports (targets: 5x faster, no more memory)."""
    root = Path(__file__).resolve().parents[1]
    paths = sorted(p for folder in REAL_TRACES for p in (root / folder).glob("*.json.gz"))
    print("real traces against HTA (CPU s after the imports / with them; peak MiB above the "
          "imports); ours: the events, then with the ops and kernels tables")
    for path in paths:
        runs = {kind: best(kind, path) for kind in ("ours_real", "ours_real_derived", "hta")}
        ours, derived, hta = runs["ours_real"], runs["ours_real_derived"], runs["hta"]
        mib = {k: (r["peak_bytes"] - r["base_bytes"]) / 2**20 for k, r in runs.items()}
        print(f"  {path.name[:44]:44s} {ours['rows']:>8,} slices  "
              f"ours {ours['cpu_seconds']:.3f}/{ours['cpu_with_imports']:.2f} "
              f"(+tables {derived['cpu_seconds']:.3f})  HTA {hta['cpu_seconds']:.3f}/"
              f"{hta['cpu_with_imports']:.2f}  HTA/ours "
              f"{hta['cpu_seconds'] / ours['cpu_seconds']:.1f}x "
              f"({hta['cpu_with_imports'] / ours['cpu_with_imports']:.1f}x with imports)  "
              f"MiB {mib['ours_real']:.0f} (+tables {mib['ours_real_derived']:.0f}) "
              f"/ HTA {mib['hta']:.0f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slices", type=int, default=1_000_000)
    parser.add_argument("--keep", help="write the traces into this folder and keep them")
    parser.add_argument("--no-hta", action="store_true", help="skip the HTA baseline")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each of ours (best kept)")
    parser.add_argument("--hta-repeat", type=int, default=2, help="runs of HTA (best kept)")
    parser.add_argument("--nested", type=int, default=50_000,
                        help="identical slices of the nesting case (0: skip it)")
    parser.add_argument("--recorded", help="an engine-level trace of ours to measure the "
                        "store on (default: record examples/gpt.py at --level engine)")
    parser.add_argument("--record-steps", type=int, default=30,
                        help="steps of examples/gpt.py to record (about 13k slices a step)")
    parser.add_argument("--store-only", action="store_true",
                        help="only the store targets (first load, cached reload)")
    parser.add_argument("--real-only", action="store_true",
                        help="only the real traces against HTA")
    args = parser.parse_args()
    # each figure is the best of `--repeat` fresh processes: the least disturbed by other work
    def best(kind: str, path: Path, times: int) -> dict[str, float]:
        runs = [measure(kind, str(path)) for _ in range(times)]
        return {k: min(r[k] for r in runs) for k in runs[0]}

    if not args.no_hta:
        real_traces(lambda kind, p: best(kind, p, args.repeat))
        if args.real_only:
            return 0
    folder = Path(args.keep or tempfile.mkdtemp(prefix="bench_load_"))
    folder.mkdir(parents=True, exist_ok=True)
    pf, js = folder / "bench.pftrace", folder / "bench_kineto.json"
    t0 = time.perf_counter()
    ev = events(args.slices)
    write_pftrace(pf, ev)
    write_kineto(js, ev)
    print(f"wrote {args.slices:,} slices in {time.perf_counter() - t0:.1f} s: "
          f"{pf.stat().st_size / 2**20:.0f} MiB .pftrace, {js.stat().st_size / 2**20:.0f} MiB JSON")
    recorded = Path(args.recorded) if args.recorded else record_engine_trace(
        folder / "recorded_engine.pftrace", args.record_steps)
    for label, path in (("synthetic", pf), ("recorded engine-level", recorded)):
        store_targets(label, path, lambda kind, p: best(kind, p, args.repeat))
    if args.store_only:
        return 0
    results = {"ours": best("ours", pf, args.repeat),
               "ours_derived": best("ours_derived", pf, args.repeat),
               "ours_json": best("ours_json", js, args.repeat)}
    if not args.no_hta:
        results["hta"] = best("hta", js, args.hta_repeat)
    for kind, r in results.items():
        print(f"{kind:13s} {r['seconds']:7.2f} s wall {r['cpu_seconds']:7.2f} s cpu "
              f"(of which {r['sys_seconds']:5.2f} s system: page faults)  "
              f"peak {r['peak_bytes'] / 2**30:5.2f} GiB  rows {r['rows']:,}")
    ours = results["ours"]
    print("(cpu time is the fairer figure on a loaded machine: wall time counts other work)")
    print(f"ours .pftrace load: {ours['seconds']:.2f} s wall (target <= 5 s: "
          f"{'met' if ours['seconds'] <= 5 else 'MISSED'}), peak "
          f"{ours['peak_bytes'] / 2**30:.2f} GiB (target < 2 GiB: "
          f"{'met' if ours['peak_bytes'] < 2 * 2**30 else 'MISSED'})")
    if "hta" in results:
        for clock in ("seconds", "cpu_seconds"):
            hta = results["hta"][clock]
            label = "wall" if clock == "seconds" else "cpu"
            print(f"ratio HTA / ours, {label}: .pftrace {hta / ours[clock]:.1f}x, "
                  f".pftrace + ops/kernels tables {hta / results['ours_derived'][clock]:.1f}x, "
                  f"same JSON {hta / results['ours_json'][clock]:.1f}x")
    if args.nested:
        nesting_case(folder, args.nested, args.repeat)
    if not args.keep:
        shutil.rmtree(folder)  # the traces, the recorded one and their stores
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    finally:
        shutil.rmtree(CACHE, ignore_errors=True)  # the trace cache the runs wrote
