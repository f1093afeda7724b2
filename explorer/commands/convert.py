"""`neuron-explorer convert TRACE|RUN_DIR -o DIR`: a trace's tables as Parquet files.

For a trace, DIR holds `trace.json` and one Parquet file per table (slices, args,
tracks, counters, flows, steps, ops, kernels, instructions, modules); for a run, one
such folder per rank (named as its trace file) and `run.json`. `neuron_explorer.load(DIR)`
reads either back; DuckDB, pandas or any Parquet reader read the files directly.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings

from neuron_explorer.common.errors import NeuronExplorerError


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trace", help="trace file (.pftrace, Chrome JSON, PyTorch-profiler "
                        "JSON(.gz)) or a run folder of per-rank traces")
    parser.add_argument("-o", "--output", required=True,
                        help="folder to write (created; must be empty if it exists)")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from neuron_explorer.store.convert import convert_run, convert_trace

    out = args.output
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise NeuronExplorerError(f"{out} exists and is not an empty folder; give a new "
                                  "folder for the converted trace")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if os.path.isdir(args.trace):
            ranks = convert_run(args.trace, out, progress=False if args.quiet else None)
            what = f"{len(ranks)} ranks"
        else:
            rows, _ = convert_trace(args.trace, out, progress=False if args.quiet else None)
            what = f"{rows:,} slices"
    for w in caught:
        if issubclass(w.category, UserWarning):
            print(f"neuron-explorer convert: warning: {w.message}", file=sys.stderr)
    if not args.quiet:
        print(f"wrote {what} as Parquet into {out}", file=sys.stderr)
    return 0
