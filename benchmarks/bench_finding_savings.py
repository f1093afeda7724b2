"""Do findings save what they say? Each example script is recorded as it is and again
with the finding's fix applied; the finding's predicted saving per analysed step (its
`time_lost_ns`, from the first recording) is set against the step time the fix really
saved (the two recordings' mean analysed step, host and device done, on the measured
host clock).

    python benchmarks/bench_finding_savings.py [--rounds 3] [--only NAME]

A high finding's prediction should fall within 25% of the measured change. A finding
whose saving comes only after another fix (`after`) predicts what it saves then, so its
row shows the prediction against a fix applied on its own for reference only. Prints
each round's prediction, measurement and ratio, and the median ratio per case.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

# name -> (script, arguments as is, arguments with the fix, the rule the fix answers)
CASES: dict[str, tuple[str, list[str], list[str], str]] = {
    "data loader, 2 workers": ("slow_dataloader.py", [], ["--workers", "2"],
                               "dataloader_stall"),
    "host-bound GPT, compiled": ("gpt.py", [], ["--compile"], "host_bound"),
    "fp32 matmuls, bf16 autocast": ("fp32_matmul.py", ["--steps", "10"],
                                    ["--steps", "10", "--bf16"], "fp32_matmul"),
    "straggler rank, 2 ranks, no extra work": ("straggler.py", ["--extra-ms", "20"],
                                               ["--extra-ms", "0"], "straggler_rank"),
    "loss read every step, every 5th": ("item_in_loop.py", [], ["--sync-every", "5"],
                                        "sync_in_step"),
}
TOLERANCE = 0.25


# scripts run on two ranks under torchrun (recorded as a run folder)
DISTRIBUTED = {"straggler.py"}


def record(folder: str, name: str, script: str, args: list[str]) -> str:
    distributed = script in DISTRIBUTED
    out = os.path.join(folder, f"{name}.run" if distributed else f"{name}.pftrace")
    cli = Path(sys.executable).with_name("neuron-explorer")
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2"]
                if distributed else [sys.executable])
    subprocess.run([str(cli), "record", "-o", out, "--", *launcher,
                    str(EXAMPLES / script), *args], check=True, capture_output=True,
                   env={**os.environ, "OMP_NUM_THREADS": "1", "NEURON_EXPLORER_CACHE": "off"})
    return out


def per_step(path: str) -> tuple[float, int, object]:
    """(mean analysed step in ns, analysed steps, the loaded trace or run). A step lasts
    until its device work is done too: a device that lags behind its host (no sync in
    the step) finishes the analysed steps' kernels after their host windows end. A run's
    step is the mean over its ranks."""
    import neuron_explorer

    loaded = neuron_explorer.load(path)
    if isinstance(loaded, neuron_explorer.Run):
        ranks = [_trace_step(loaded[r]) for r in loaded.ranks]
        return statistics.mean(r[0] for r in ranks), ranks[0][1], loaded
    return (*_trace_step(loaded), loaded)


def _trace_step(trace) -> tuple[float, int]:
    from neuron_explorer.analyses.steady_state import analysed_steps, in_analysed_steps

    steps = in_analysed_steps(trace, trace.steps)  # type: ignore[arg-type]
    kernels = in_analysed_steps(trace, trace.kernels)  # type: ignore[arg-type]
    start = float(steps["ts"].min())
    end = max(float((steps["ts"] + steps["dur"]).max()),
              float((kernels["ts"] + kernels["dur"]).max()) if len(kernels) else 0.0)
    n = len(analysed_steps(trace).steps)  # type: ignore[arg-type]
    return (end - start) / n, n


def one_round(case: str, folder: str) -> tuple[float, float, str, str]:
    """(predicted saving per step, measured saving per step, severity, after)."""
    script, as_is, fixed, rule = CASES[case]
    before, steps, trace = per_step(record(folder, "before", script, as_is))
    after_fix, _, _ = per_step(record(folder, "after", script, fixed))
    found = {f.rule_id: f for f in trace.bottlenecks()}  # type: ignore[attr-defined]
    finding = found.get(rule)
    predicted = finding.time_lost_ns / steps if finding else 0.0
    return (predicted, before - after_fix, finding.severity if finding else "none",
            finding.after if finding else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", help="run the cases whose name contains this")
    args = parser.parse_args()
    cases = [c for c in CASES if not args.only or args.only in c]
    print(f"{'case':34} {'round':>5} {'severity':>8} {'predicted':>11} {'measured':>11} "
          f"{'ratio':>6}")
    summary = []
    for case in cases:
        ratios = []
        for i in range(args.rounds):
            with tempfile.TemporaryDirectory() as folder:
                predicted, measured, severity, after = one_round(case, folder)
            ratio = predicted / measured if measured > 0 else float("inf")
            ratios.append(ratio)
            label = severity + (f" after {after}" if after else "")
            print(f"{case:34} {i + 1:>5} {label:>8} {predicted / 1e6:>9.2f}ms "
                  f"{measured / 1e6:>9.2f}ms {ratio:>6.2f}", flush=True)
        summary.append((case, statistics.median(ratios), min(ratios), max(ratios), severity))
    print("\nmedian ratio of predicted to measured saving (min-max):")
    for case, median, low, high, severity in summary:
        inside = abs(median - 1) <= TOLERANCE
        print(f"  {case:34} {median:.2f} ({low:.2f}-{high:.2f}) [{severity}]"
              + ("" if inside else f"  outside {TOLERANCE:.0%}"))


if __name__ == "__main__":
    main()
