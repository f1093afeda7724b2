"""Do findings hold on a loaded machine? Each example script is recorded on an idle
machine and again with two busy processes per core beside it (the default, measured
host clock); the two reports' findings (rule, severity, in rank order) are compared.

    python benchmarks/bench_findings_under_load.py [--busy-per-core 2] [--only NAME]

Prints, per script, the findings of both recordings and whether they agree: the same
rules in the same order with the same severities ("same"), or what moved. A finding
whose share sits on a severity threshold may flip between runs on an idle machine too;
the script says so when the idle run's share is within 20% of a threshold.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

# name -> command after `neuron-explorer record -o OUT --`
SCRIPTS: dict[str, list[str]] = {
    "mlp": [sys.executable, str(EXAMPLES / "mlp_eager.py")],
    "gpt": [sys.executable, str(EXAMPLES / "gpt.py")],
    "gpt compiled": [sys.executable, str(EXAMPLES / "gpt.py"), "--compile"],
    "conv + data loader": [sys.executable, str(EXAMPLES / "slow_dataloader.py")],
    "loss read each step": [sys.executable, str(EXAMPLES / "item_in_loop.py")],
    "fsdp, 2 ranks": [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                      str(EXAMPLES / "fsdp.py"), "--steps", "8"],
}


def _spin() -> None:
    while True:
        pass


@contextlib.contextmanager
def busy(processes: int) -> Iterator[None]:
    """`processes` busy loops for the duration."""
    spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(processes)]
    for p in spinners:
        p.start()
    try:
        yield
    finally:
        for p in spinners:
            p.terminate()
            p.join()


def findings(command: list[str], folder: str, name: str) -> list[tuple[str, str, float]]:
    """(rule, severity, share of step) of the recording's findings, in rank order."""
    import neuron_explorer

    out = os.path.join(folder, name + (".run" if "torch.distributed.run" in command
                                       else ".pftrace"))
    cli = Path(sys.executable).with_name("neuron-explorer")
    subprocess.run([str(cli), "record", "-o", out, "--", *command], check=True,
                   capture_output=True, cwd=folder,
                   env={**os.environ, "OMP_NUM_THREADS": "1", "NEURON_EXPLORER_CACHE": "off"})
    found = neuron_explorer.load(out).bottlenecks()
    return [(f.rule_id, f.severity, f.share_of_step) for f in found]


def near_threshold(share: float) -> bool:
    from neuron_explorer.rules import thresholds as th

    return any(abs(share - t) <= 0.2 * t
               for t in (th.SEVERITY_HIGH_SHARE, th.SEVERITY_MEDIUM_SHARE))


def _only_at_thresholds(a: list[tuple[str, str, float]], b: list[tuple[str, str, float]]) -> bool:
    """The two lists differ only where a share sits on a threshold: a severity flipped at
    a severity line, or a finding under 2% of the step present in one only; the rules
    that both have keep their order."""
    small = 0.02
    kept_a = [f for f in a if f[2] >= small or f[0] in {g[0] for g in b}]
    kept_b = [f for f in b if f[2] >= small or f[0] in {g[0] for g in a}]
    if [f[0] for f in kept_a] != [f[0] for f in kept_b]:
        return False
    return all(x[1] == y[1] or near_threshold(x[2]) or near_threshold(y[2])
               for x, y in zip(kept_a, kept_b, strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--busy-per-core", type=int, default=2)
    parser.add_argument("--only", help="run the scripts whose name contains this")
    args = parser.parse_args()
    load = args.busy_per_core * (os.cpu_count() or 1)
    agree = 0
    names = [n for n in SCRIPTS if not args.only or args.only in n]
    for name in names:
        with tempfile.TemporaryDirectory() as folder:
            idle = findings(SCRIPTS[name], folder, "idle")
            with busy(load):
                loaded = findings(SCRIPTS[name], folder, "loaded")
        same = [(r, s) for r, s, _ in idle] == [(r, s) for r, s, _ in loaded]
        edge = not same and _only_at_thresholds(idle, loaded)
        agree += same or edge
        print(f"{name}: {'same' if same else 'same but at a threshold' if edge else 'DIFFERENT'}")
        for label, fs in (("idle", idle), (f"{load} busy", loaded)):
            print(f"  {label:>8}: " + ", ".join(
                f"{r} [{s} {share:.0%}{'*' if near_threshold(share) else ''}]"
                for r, s, share in fs))
    print(f"\n{agree} of {len(names)} scripts give the same findings in the same order, "
          "but for shares at a threshold (* within 20% of a severity line)")


if __name__ == "__main__":
    main()
