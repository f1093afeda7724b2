"""Holistic Trace Analysis's own figures on the real traces the parity tests use.

The parity tests (tests/explorer/test_hta_parity.py, test_kernel_sequences.py,
test_annotations.py) hold HTA 0.5.0's numbers for the traces in tests/data/real_traces;
HTA is not a dependency of this project. This script computes those numbers again where
HTA is installed (`pip install HolisticTraceAnalysis==0.5.0` in another environment, or
`--hta-path` to an unpacked copy), so they can be checked or refreshed:

    python benchmarks/hta_parity_values.py [--hta-path DIR] [--traces tests/data/real_traces]

Each trace is copied into a folder of its own (HTA reads a folder per run). Prints, per
trace: the temporal breakdown and the communication/computation overlap, the kernel-type
breakdown (us), the queue-length summary per stream, the launch statistics (rows, sums,
HTA's outlier groups), the idle-time breakdown per stream, the user-annotation breakdown
(host time), the frequent kernel sequences of the ops the tests name, the memory-bandwidth
summary, the time blocked on a full launch queue and the aten ops' kernels and delays.
The MTIA trace (slow to load) gets the temporal breakdown only, docs/explorer.md gives
it; the CUPTI-profiler trace its counter data with operators (per innermost op: kernels
and each counter's sum); the two sampled ranks, as one run, HTA's potential stragglers.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

TRACES = ("critical_path__alexnet__benchmark_result_2869224_1695835535_trace.json.gz",
          "trace_filter__sampled_rank-0.json.gz", "trace_filter__sampled_rank-1.json.gz",
          "amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz")
BREAKDOWN_ONLY = ("mtia_trace_single_rank__mtia_rank_0.json.gz",)
CUPTI = ("cupti_profiler__benchmark_result_924719_1679055439_trace.json.gz",)
SAMPLED_RUN = ("trace_filter__sampled_rank-0.json.gz", "trace_filter__sampled_rank-1.json.gz")
SEQUENCE_OPS = ("AddmmBackward0", "forward")
BLOCKED_AT = (1024, 50, 30, 10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hta-path", help="a folder holding the `hta` package")
    parser.add_argument("--traces", default=str(Path(__file__).resolve().parent.parent
                                                / "tests" / "data" / "real_traces"))
    args = parser.parse_args()
    if args.hta_path:
        sys.path.insert(0, args.hta_path)
    try:
        from hta.trace_analysis import TraceAnalysis
    except ImportError:
        sys.exit("HTA is not installed here: pip install HolisticTraceAnalysis==0.5.0 in "
                 "another environment, or pass --hta-path")
    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")
    with tempfile.TemporaryDirectory() as work:
        for name in TRACES + BREAKDOWN_ONLY + CUPTI:
            folder = Path(work) / name.split(".")[0]
            folder.mkdir()
            shutil.copy(Path(args.traces) / name, folder / name)
            analysis = TraceAnalysis(trace_dir=str(folder))
            rank = next(iter(analysis.t.traces))
            print(f"=== {name} (rank {rank})")
            if name in CUPTI:
                _cupti(analysis, rank)
                continue
            _breakdowns(analysis)
            if name not in BREAKDOWN_ONLY:
                _report(analysis, rank, work)
        # the two sampled ranks as one run (2 of a world of 128): HTA's stragglers
        run = Path(work) / "sampled_run"
        run.mkdir()
        for name in SAMPLED_RUN:
            shutil.copy(Path(args.traces) / name, run / name)
        analysis = TraceAnalysis(trace_dir=str(run))
        print("=== the sampled ranks as a run: potential stragglers",
              {n: analysis.get_potential_stragglers(num_candidates=n) for n in (1, 2)})


def _cupti(a, rank: int) -> None:
    kernels = a.get_cupti_counter_data_with_operators(ranks=[rank])[0]
    counters = sorted(c for c in kernels.columns if c.startswith("smsp__"))
    print("CUPTI kernels:", len(kernels))
    print("counter sums:", {c: int(kernels[c].sum()) for c in counters})
    per_op = kernels.groupby("bottom_level_op")
    print("per innermost op (kernels, all counters' sum):", {
        op: (len(part), int(part[counters].to_numpy().sum())) for op, part in per_op})
    print("per outermost op (kernels):", kernels["top_level_op"].value_counts().to_dict())


def _breakdowns(a) -> None:
    temporal = a.get_temporal_breakdown(visualize=False)
    print("temporal breakdown (us): idle, compute, non-compute, kernel time:", [
        (int(row["idle_time(us)"]), int(row["compute_time(us)"]),
         int(row["non_compute_time(us)"]), int(row["kernel_time(us)"]))
        for _, row in temporal.iterrows()])
    overlap = a.get_comm_comp_overlap(visualize=False)
    print("comm/comp overlap (%):", overlap["comp_comm_overlap_pctg"].tolist())


def _report(a, rank: int, work: str) -> None:
    kernels = a.get_gpu_kernel_breakdown(visualize=False, include_memory_kernels=True)[0]
    print("kernel types (us):", dict(zip(kernels["kernel_type"], kernels["sum"], strict=True)))
    print("queue length summary:\n", a.get_queue_length_summary(ranks=[rank]).to_string())
    stats = a.get_cuda_kernel_launch_stats(ranks=[rank], runtime_cutoff=50,
                                           launch_delay_cutoff=100, visualize=False)[rank]
    cpu, gpu = stats["cpu_duration"], stats["gpu_duration"]
    print("launch stats: rows", len(stats), "sums (cpu, gpu, delay)",
          (int(cpu.sum()), int(gpu.sum()), int(stats["launch_delay"].sum())),
          "short", int(((cpu <= 50) & (gpu < cpu)).sum()), "slow", int((cpu > 50).sum()),
          "delayed", int((stats["launch_delay"] > 100).sum()))
    idle, _ = a.get_idle_time_breakdown(ranks=[rank], visualize=False)
    print("idle time (us):\n", idle.to_string())
    notes = a.get_gpu_user_annotation_breakdown(use_gpu_annotation=False, visualize=False)
    if notes is not None:
        print("annotations, host time (us):",
              dict(zip(notes["name"], notes["sum (us)"], strict=True)))
    bandwidth = a.get_memory_bw_summary(ranks=[rank])
    if bandwidth is not None and len(bandwidth):
        print("memory bandwidth summary (GB/s):\n", bandwidth.to_string())
    series = a.get_queue_length_time_series([rank])
    for full in BLOCKED_AT:  # CUDA's 1024, then lower bars that the sampled traces pass
        blocked = a.get_time_spent_blocked_on_full_queue(series, max_queue_length=full)
        print(f"blocked on a queue of {full} (us):", "none" if blocked is None or not len(blocked)
              else dict(zip(blocked["stream"], blocked["duration_at_max_queue_length"],
                            strict=True)))
    try:
        ops = a.get_aten_op_kernels_and_delay(ranks=[rank]).get(rank)
    except KeyError as error:  # HTA 0.5.0 fails on a trace with no CUDA launch (AMD's)
        print("aten ops' kernels: HTA fails,", repr(error))
        ops = None
    if ops is not None and len(ops):
        calls = ops["occurrence_count"]

        def total(part, column):
            return round(float((part["occurrence_count"] * part[column]).sum()), 1)

        print("aten ops' kernels: rows", len(ops), "per op (calls, summed first-launch delay"
              " us, summed runtime delay us):", {
                  op: (int(part["occurrence_count"].sum()),
                       total(part, "avg_aten_op_launch_delay"), total(part, "avg_runtime_delay"))
                  for op, part in ops.groupby("aten_op_name")},
              "total calls", int(calls.sum()))
    for op in SEQUENCE_OPS:
        for n in (1, 2, 3):
            found = a.get_frequent_cuda_kernel_sequences(
                operator_name=op, output_dir=work, min_pattern_len=n, rank=rank, top_k=5,
                visualize=False)
            if len(found):
                print(f"sequences of {op!r}, n={n}:", [
                    (row["pattern"][:60], int(row["count"]),
                     float(row["GPU kernel duration (us)"])) for _, row in found.iterrows()])


if __name__ == "__main__":
    main()
