"""`neuron-explorer diff A B`: what changed between two traces."""

from __future__ import annotations

import argparse

from neuron_explorer.report_command import FORMATS, load_quietly, write_output


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("a", help="the baseline trace")
    parser.add_argument("b", help="the trace to compare with it")
    parser.add_argument("--format", choices=FORMATS, default="text", help="output format")
    parser.add_argument("-o", "--output", help="write to this file instead of stdout")


def run(args: argparse.Namespace) -> int:
    from neuron_explorer.diff import diff

    a, b = load_quietly(args.a, "diff"), load_quietly(args.b, "diff")
    write_output(diff(a, b).render(args.format), args.output)
    return 0
