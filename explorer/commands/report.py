"""`neuron-explorer report TRACE`: summarise a trace (breakdown, top ops, ranked findings)."""

from __future__ import annotations

import argparse
import sys
import warnings
from typing import Any

from neuron_explorer.common.errors import NeuronExplorerError

FORMATS = ("text", "json", "md", "html")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trace", help="trace file: .pftrace, Chrome JSON or PyTorch-profiler "
                        "JSON (.gz); or a run folder of per-rank traces")
    parser.add_argument("--format", choices=FORMATS, default="text", help="output format")
    parser.add_argument("-o", "--output", help="write to this file instead of stdout")
    add_load_options(parser)


def add_load_options(parser: argparse.ArgumentParser) -> None:
    """--no-cache, --scheduler and --quiet: how traces and runs are loaded."""
    parser.add_argument("--no-cache", action="store_true",
                        help="parse the trace again: neither read nor write the trace cache "
                        "(also NEURON_EXPLORER_CACHE=off)")
    parser.add_argument("--scheduler", metavar="ADDRESS",
                        help="for a run folder: run the per-rank work on a Dask cluster, "
                        "'local' (a LocalCluster on this machine) or a scheduler's address "
                        "(tcp://HOST:8786)")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bars")


def write_output(text: str, output: str | None) -> None:
    """Print, or write to a file with a clear error when that fails."""
    if not output:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        return
    try:
        with open(output, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as exc:
        raise NeuronExplorerError(f"cannot write {output}: {exc.strerror}; check the path "
                                  "and that its folder exists") from None


def load_quietly(path: str, command: str, args: argparse.Namespace | None = None):
    """Load a trace; its warnings (a truncated recording) become one line each on stderr.
    `args`: the command's load options (add_load_options)."""
    from neuron_explorer.trace import load

    options: dict[str, Any] = {}
    if args is not None:
        options = {"cache": False if getattr(args, "no_cache", False) else None,
                   "scheduler": getattr(args, "scheduler", None),
                   "progress": False if getattr(args, "quiet", False) else None}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trace = load(path, **options)
    print_warnings(trace, command)
    return trace


def print_warnings(trace, command: str, since: int = 0) -> None:
    """The trace's warnings from the `since`-th on, one line each on stderr."""
    for message in trace.warnings[since:]:
        print(f"neuron-explorer {command}: warning: {message}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    from neuron_explorer.report import render_report

    trace = load_quietly(args.trace, "report", args)
    if not hasattr(trace, "slice_args"):  # a run folder: one trace per rank
        from neuron_explorer.runs.report import render_run_report

        write_output(render_run_report(trace, args.format), args.output)
        return 0
    seen = len(trace.warnings)
    with warnings.catch_warnings():  # parts found unreadable on first use (slice args)
        warnings.simplefilter("ignore")
        text = render_report(trace, args.format)
    print_warnings(trace, "report", seen)
    write_output(text, args.output)
    return 0
