"""`neuron-explorer demo`: record the reference MLP in eager mode, then open it in the dashboard."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from neuron_explorer.common.errors import NeuronExplorerError

WORKLOAD = "neuron_explorer.webapp.demo_workload"
TRACE_NAME = "mlp_eager.pftrace"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output-dir", default="neuron-explorer-demo",
                        help="folder for the demo trace (default: ./neuron-explorer-demo)")
    parser.add_argument("--train-steps", type=int, default=6,
                        help="training steps to record (default 6)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8050,
                        help="port to listen on (default 8050; 0: any free)")
    parser.add_argument("--no-browser", action="store_true",
                        help="print the URL but do not open a browser")


def record_demo(folder: Path, train_steps: int = 6) -> Path:
    """Records the demo workload with `neuron-explorer record` into `folder`; returns the trace."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise NeuronExplorerError(
            f"cannot create {folder} ({exc.strerror}); pass another --output-dir") from None
    trace = folder / TRACE_NAME
    command = [sys.executable, "-m", "neuron_explorer", "record", "-o", str(trace),
               "--", "python", "-m", WORKLOAD, "--train-steps", str(train_steps)]
    print(f"Recording the reference MLP (eager, {train_steps} steps) into {trace} ...", flush=True)
    result = subprocess.run(command, check=False)
    if result.returncode != 0 or not trace.is_file():
        raise NeuronExplorerError(
            f"recording the demo workload failed (exit status {result.returncode}); "
            "see the messages above")
    return trace


def run(args: argparse.Namespace) -> int:
    from neuron_explorer.webapp.view_command import serve

    trace = record_demo(Path(args.output_dir), args.train_steps)
    return serve(trace, host=args.host, port=args.port, open_browser=not args.no_browser)
