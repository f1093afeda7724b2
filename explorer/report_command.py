"""`neuron-explorer report TRACE`: summarise a trace (breakdown, top ops, ranked findings)."""

from __future__ import annotations

import argparse
import sys
import warnings

from neuron_explorer.errors import NeuronExplorerError

FORMATS = ("text", "json", "md", "html")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trace", help="trace file: .pftrace, Chrome JSON or PyTorch-profiler "
                        "JSON (.gz); or a run folder of per-rank traces")
    parser.add_argument("--format", choices=FORMATS, default="text", help="output format")
    parser.add_argument("-o", "--output", help="write to this file instead of stdout")


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


def load_quietly(path: str, command: str):
    """Load a trace; its warnings (a truncated recording) become one line each on stderr."""
    from neuron_explorer.trace import load

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trace = load(path)
    print_warnings(trace, command)
    return trace


def print_warnings(trace, command: str, since: int = 0) -> None:
    """The trace's warnings from the `since`-th on, one line each on stderr."""
    for message in trace.warnings[since:]:
        print(f"neuron-explorer {command}: warning: {message}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    from neuron_explorer.report import render_report

    trace = load_quietly(args.trace, "report")
    if not hasattr(trace, "slice_args"):  # a run folder: one trace per rank
        from neuron_explorer.run_report import render_run_report

        write_output(render_run_report(trace, args.format), args.output)
        return 0
    seen = len(trace.warnings)
    with warnings.catch_warnings():  # parts found unreadable on first use (slice args)
        warnings.simplefilter("ignore")
        text = render_report(trace, args.format)
    print_warnings(trace, "report", seen)
    write_output(text, args.output)
    return 0
