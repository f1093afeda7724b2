"""`neuron-explorer whatif TRACE [--hardware ...] [--mode ...] [--allow-rnn] [--dtype ...]`:
predict a recorded run on other hardware, in another mode or dtype, without running it
again.

Writes the predicted trace (`-o`, default next to TRACE) and prints what changed: the
diff of the recording against the prediction."""

from __future__ import annotations

import argparse
import os
import sys

from neuron_explorer.commands.report import FORMATS, load_quietly, write_output
from neuron_explorer.what_if.options import DTYPES, HARDWARE, MODES


def _microseconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a time in µs: give a number >= 0, "
                                         "e.g. --launch-overhead 20")
    return value


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trace", help="an eager recording at --level op or engine (.pftrace)")
    parser.add_argument("--hardware", choices=HARDWARE, help="preset to predict on "
                        "(default: the recording's)")
    parser.add_argument("--mode", choices=MODES, default="eager",
                        help="eager, or compiled: each step's forward and backward as one "
                             "graph launch each (docs/whatif.md says what is approximated)")
    parser.add_argument("--allow-rnn", action="store_true",
                        help="with --mode compiled: compile RNN, GRU and LSTM modules too, as "
                             "torch._dynamo.config.allow_rnn = True does (by default "
                             "torch.compile runs them eager)")
    parser.add_argument("--dtype", choices=DTYPES, help="run the matmuls in this dtype")
    parser.add_argument("--launch-overhead", type=_microseconds, metavar="US",
                        help="host time per kernel launch in µs (default: the preset's)")
    parser.add_argument("-o", "--output", help="where to write the predicted trace "
                        "(default: TRACE.whatif-HARDWARE[-MODE][-DTYPE].pftrace)")
    parser.add_argument("--format", choices=FORMATS, default="text",
                        help="format of the printed diff")


def default_output(args: argparse.Namespace, hardware: str) -> str:
    stem = os.path.splitext(args.trace)[0]
    parts = [hardware] + ([args.mode] if args.mode != "eager" else []) + \
        (["allow-rnn"] if args.allow_rnn else []) + \
        ([args.dtype] if args.dtype else [])
    return f"{stem}.whatif-{'-'.join(parts)}.pftrace"


def run(args: argparse.Namespace) -> int:
    from neuron_explorer.trace_diff import diff
    from neuron_explorer.what_if.replay import WhatIfError, whatif

    trace = load_quietly(args.trace, "whatif")
    if not hasattr(trace, "base_slices"):
        raise WhatIfError(f"{args.trace} is a run of several ranks: predict one rank's trace")
    output = args.output or default_output(args, args.hardware or trace.hardware or "trn2")
    predicted = whatif(trace, args.hardware, mode=args.mode, dtype=args.dtype,
                       launch_overhead_us=args.launch_overhead, allow_rnn=args.allow_rnn,
                       output=output)
    write_output(diff(trace, predicted).render(args.format), None)
    print(f"neuron-explorer whatif: predicted trace written to {output} "
          f"(report, view and diff read it)", file=sys.stderr)
    return 0
