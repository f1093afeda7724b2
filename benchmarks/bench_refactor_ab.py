"""A refactor at no cost: the writers, `emit_gemm` and `KernelBuilder._schedule` of this tree
against the same modules at an earlier revision, alternated in one process.

Checks first that both emit identical kernels (GEMMs of several shapes, dtypes, batches),
then times, round by round: a GEMM mix emitted (`emit_gemm`), its kernels scheduled
(`KernelBuilder.build`), and the bench_writer event mix written to a .pftrace. Prints each
median with its range and the new/old ratio per round (median and range).

    python benchmarks/bench_refactor_ab.py [--rev 41fd09f] [--rounds 9]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

import bench_writer
from neuron_explorer.backend.hardware import gemm
from neuron_explorer.backend.hardware.builder import KernelBuilder
from neuron_explorer.collectors.perfetto_writer import PerfettoWriter
from neuron_explorer.common.presets import get_preset

ROOT = Path(__file__).resolve().parent.parent
SHAPES = [(m, k, n, batch) for m, k, n in [(64, 512, 512), (1000, 3000, 200), (2048, 2048, 2048),
                                           (1, 8192, 8192)] for batch in (1, 12)]


def old_module(rev: str, path: str, name: str, folder: str) -> ModuleType:
    """The module at `path` as of `rev`, imported under `name` (its imports: this tree's)."""
    source = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout
    file = os.path.join(folder, f"{name}.py")
    Path(file).write_text(source)
    spec = importlib.util.spec_from_file_location(name, file)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def builders(gemm_module: ModuleType, builder_class: type) -> list:
    preset = get_preset("trn2")
    out = []
    for m, k, n, batch in SHAPES:
        b = builder_class(preset, "mm")
        gemm_module.emit_gemm(b, gemm_module.Gemm(m=m, k=k, n=n, dtype="bfloat16",
                                                  out_dtype="bfloat16", batch=batch))
        out.append(b)
    return out


def same_kernels(old_gemm: ModuleType, old_builder: ModuleType) -> None:
    for bo, bn in zip(builders(old_gemm, old_builder.KernelBuilder), builders(gemm, KernelBuilder),
                      strict=True):
        ko, kn = bo.build(), bn.build()
        ao, an = ko.arrays(), kn.arrays()
        assert ko.duration_ns == kn.duration_ns and all((ao[c] == an[c]).all() for c in ao)


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rev", default="41fd09f", help="the revision to compare against")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--events", type=int, default=200_000, help="events per writer run")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        old_gemm = old_module(args.rev, "backend/hardware/gemm.py", "old_gemm", folder)
        old_builder = old_module(args.rev, "backend/hardware/builder.py", "old_builder", folder)
        old_writer = old_module(args.rev, "collectors/perfetto_writer.py", "old_writer", folder)
        same_kernels(old_gemm, old_builder)
        print(f"identical kernels for {len(SHAPES)} GEMMs")
        trace = os.path.join(folder, "t.pftrace")
        make = {"old": lambda: builders(old_gemm, old_builder.KernelBuilder),
                "new": lambda: builders(gemm, KernelBuilder)}
        writer = {"old": old_writer.PerfettoWriter, "new": PerfettoWriter}
        times: dict[str, dict[str, list[float]]] = {
            case: {"old": [], "new": []} for case in ("emit_gemm", "schedule", "writer")}
        for _ in range(args.rounds):
            for side in ("old", "new"):
                times["emit_gemm"][side].append(timed(make[side]))
                made = make[side]()
                times["schedule"][side].append(timed(lambda made=made: [b.build() for b in made]))
                bench_writer.PerfettoWriter = writer[side]
                times["writer"][side].append(bench_writer.run_mix(trace, args.events)[0])
    for case, sides in times.items():
        ratios = [n / o for n, o in zip(sides["new"], sides["old"], strict=True)]
        old, new = sides["old"], sides["new"]
        print(f"{case:10s} old {statistics.median(old) * 1e3:8.1f} ms [{min(old) * 1e3:.1f}-"
              f"{max(old) * 1e3:.1f}]  new {statistics.median(new) * 1e3:8.1f} ms "
              f"[{min(new) * 1e3:.1f}-{max(new) * 1e3:.1f}]  "
              f"new/old {statistics.median(ratios):.3f}"
              f" [{min(ratios):.3f}-{max(ratios):.3f}]  ({args.rounds} rounds)")


if __name__ == "__main__":
    main()
