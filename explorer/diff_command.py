"""`neuron-explorer diff A B`: what changed between two traces."""

from __future__ import annotations

import argparse

from neuron_explorer.errors import NeuronExplorerError
from neuron_explorer.report_command import FORMATS, load_quietly, write_output


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("a", help="the baseline trace")
    parser.add_argument("b", help="the trace to compare with it")
    parser.add_argument("--format", choices=FORMATS, default="text", help="output format")
    parser.add_argument("-o", "--output", help="write to this file instead of stdout")


def run(args: argparse.Namespace) -> int:
    from neuron_explorer.diff import diff

    a, b = load_quietly(args.a, "diff"), load_quietly(args.b, "diff")
    runs = [hasattr(x, "digests") for x in (a, b)]
    if any(runs):
        if not all(runs):
            raise NeuronExplorerError(f"cannot compare a run with a single trace ({args.a}, "
                                      f"{args.b}): give both runs or both traces")
        from neuron_explorer.run_report import render_run_diff

        write_output(render_run_diff(a, b, args.format), args.output)
        return 0
    write_output(diff(a, b).render(args.format), args.output)
    return 0
