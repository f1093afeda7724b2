"""Does a recording stopped by a signal keep every step it wrote, and say when steps are
missing? `neuron-explorer record` runs a training loop that prints each step it
completes; at a random moment the loop gets SIGINT, SIGTERM or SIGKILL. The trace is
then loaded as a user would.

    python benchmarks/bench_signals.py [--rounds 10] [--seed 0]

Per signal, `--rounds` recordings (30 with the default). SIGINT and SIGTERM must close
the trace: every step the program completed is in it, with no cut-short warning. A
SIGKILL loses what was still buffered (at most the last half second): the trace must
load, warn that it was cut short, and hold every step completed before its last flush.
Prints one line per recording and a summary per signal; exits 1 if any recording breaks
those rules.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

from neuron_explorer.collectors.recorder import _FLUSH_EVERY_S  # how old a flush may be

PROGRAMS = Path(__file__).resolve().parent.parent / "tests" / "collectors" / "programs"
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGKILL)


def one_recording(folder: str, signum: int, delay_s: float) -> dict:
    """Record the looping program, signal it `delay_s` after its first step, load the
    trace: what it completed, what the trace holds and what loading said."""
    out = os.path.join(folder, "signalled.pftrace")
    # the script runs in the record process, as `neuron-explorer record train.py` runs it
    proc = subprocess.Popen(
        [sys.executable, "-m", "neuron_explorer.cli", "record", "-o", out, "--level", "op",
         "train_small.py", "3", "loop"], cwd=PROGRAMS, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", "NEURON_EXPLORER_CACHE": "off"})
    assert proc.stdout is not None
    completed: list[tuple[int, float]] = []  # (step, when it was printed)
    sent: list[float] = []

    def send() -> None:
        sent.append(time.monotonic())
        proc.send_signal(signum)

    timer = threading.Timer(delay_s, send)  # lands anywhere in a step, not after a print
    errors: list[str] = []
    reader = threading.Thread(target=lambda: errors.extend(proc.stderr), daemon=True)
    reader.start()
    for line in proc.stdout:
        if line.startswith("step "):
            completed.append((int(line.split()[1]), time.monotonic()))
            if len(completed) == 1:
                timer.start()
    proc.wait(timeout=120)
    timer.join()
    reader.join(timeout=10)
    return {"returncode": proc.returncode, "completed": completed, "sent": sent[0],
            "stderr": "".join(x for x in errors if not x.startswith("Extension modules"))[-6000:],
            **_load(out)}


def _load(path: str) -> dict:
    import neuron_explorer
    from neuron_explorer.common.errors import TruncatedTraceWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            trace = neuron_explorer.load(path, cache=False)
        except Exception as exc:  # noqa: BLE001 - the benchmark reports any failure
            return {"error": f"{type(exc).__name__}: {exc}", "steps": [], "warned": False}
    # (error: what a failed load raised, or the cut-short warnings' text)
    cut = [str(w.message) for w in caught if issubclass(w.category, TruncatedTraceWarning)]
    return {"error": "; ".join(cut), "steps": sorted(trace.steps["step"].tolist()),
            "warned": bool(cut)}


def verdict(signum: int, r: dict) -> tuple[bool, int]:
    """(whether the recording kept the rules, completed steps missing from the trace)."""
    done = [s for s, _ in r["completed"]]
    missing = sorted(set(done) - set(r["steps"]))
    if r["error"] and not r["warned"]:  # the load failed
        return False, len(missing)
    if signum == signal.SIGKILL:
        # steps completed before the last flush that could have happened are written
        flushed = [s for s, when in r["completed"] if when <= r["sent"] - _FLUSH_EVERY_S]
        kept = not (set(flushed) - set(r["steps"]))
        return kept and r["warned"], len(missing)
    return not missing and not r["warned"] and r["returncode"] == -signum, len(missing)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=10, help="recordings per signal")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--signals", default="INT,TERM,KILL", help="which signals to send")
    parser.add_argument("--max-delay", type=float, default=2.0,
                        help="signal at most this many seconds after the first step")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    summary: dict[int, list[tuple[bool, int, int]]] = {}
    chosen = [getattr(signal, f"SIG{name.strip()}") for name in args.signals.split(",")]
    plan = [s for s in chosen for _ in range(args.rounds)]
    rng.shuffle(plan)
    print(f"{'signal':8} {'delay':>6} {'completed':>9} {'in trace':>8} {'missing':>7} "
          f"{'warned':>6} {'ok':>3}")
    for signum in plan:
        delay = rng.uniform(0.0, args.max_delay)
        with tempfile.TemporaryDirectory() as folder:
            r = one_recording(folder, signum, delay)
        ok, missing = verdict(signum, r)
        summary.setdefault(signum, []).append((ok, missing, len(r["completed"])))
        name = signal.Signals(signum).name
        print(f"{name:8} {delay:>5.2f}s {len(r['completed']):>9} {len(r['steps']):>8} "
              f"{missing:>7} {r['warned']!s:>6} {'yes' if ok else 'NO':>3}"
              + (f"  {r['error'][:200]}" if r["error"] and not ok else ""), flush=True)
        if not ok:
            print(f"    exit {r['returncode']}; stderr ends:\n{r['stderr']}", flush=True)
    print("\nper signal: recordings kept the rules / all; steps missing (max, total)")
    failed = False
    for signum, rows in summary.items():
        kept = sum(ok for ok, _, _ in rows)
        failed |= kept < len(rows)
        print(f"  {signal.Signals(signum).name:8} {kept}/{len(rows)}; missing max "
              f"{max(m for _, m, _ in rows)}, total {sum(m for _, m, _ in rows)} of "
              f"{sum(c for _, _, c in rows)} completed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
