"""`neuron-explorer diff A B [--fail-above PCT]`: what changed between two traces.

With `--fail-above PCT` the command is a performance guard for CI: it exits 1 when B's
step time is more than PCT percent above A's (0 otherwise, 2 on errors), after printing
the diff as usual. Recordings made with `NEURON_HOST_CLOCK=modelled` make the check
exact: the same program gives the same trace, so any change is the program's.
"""

from __future__ import annotations

import argparse
import math
import sys

from neuron_explorer.commands.report import FORMATS, load_quietly, write_output
from neuron_explorer.common.errors import NeuronExplorerError

EXIT_REGRESSION = 1


def _percent(text: str) -> float:
    try:
        value = float(text.rstrip("%"))
    except ValueError:
        value = -1.0
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a percentage: give a number >= 0, "
                                         "e.g. --fail-above 5")
    return value


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("a", help="the baseline trace (or run folder)")
    parser.add_argument("b", help="the trace (or run folder) to compare with it")
    parser.add_argument("--format", choices=FORMATS, default="text", help="output format")
    parser.add_argument("-o", "--output", help="write to this file instead of stdout")
    parser.add_argument("--fail-above", type=_percent, metavar="PCT",
                        help="exit with status 1 when B's step time is more than PCT%% above "
                             "A's (a CI performance guard)")


def step_time_growth(result) -> tuple[float, float, float]:
    """(A's step time ns, B's, growth in percent) from a TraceDiff's summary."""
    row = result.summary.loc[result.summary["metric"] == "step_time_ns"]
    a = float(row["a"].iloc[0]) if len(row) else math.nan
    b = float(row["b"].iloc[0]) if len(row) else math.nan
    if not (a > 0 and math.isfinite(b)):
        raise NeuronExplorerError(
            f"cannot check --fail-above: {result.a if not a > 0 else result.b} has no step "
            "time (record a run with steps, or compare traces that have them)")
    return a, b, (b / a - 1.0) * 100.0


def run_step_time_growth(a, b) -> tuple[float, float, float]:
    """(A's step time ns, B's, growth in percent) of two runs: the median over ranks of
    each rank's median step, as the run report and the diff's table give it (a mean over
    the analysed time once said 90.6% where the table said 97.0%)."""
    a_ns, b_ns = _run_step_ns(a), _run_step_ns(b)
    if not (a_ns > 0 and b_ns > 0):
        raise NeuronExplorerError("cannot check --fail-above: a run has no step time")
    return a_ns, b_ns, (b_ns / a_ns - 1.0) * 100.0


def _run_step_ns(run) -> float:
    steps = run.rank_summary()["step_time_ns"].dropna()
    return float(steps.median()) if len(steps) else 0.0


def run(args: argparse.Namespace) -> int:
    from neuron_explorer.render import fmt_ns
    from neuron_explorer.trace_diff import diff

    a, b = load_quietly(args.a, "diff"), load_quietly(args.b, "diff")
    runs = [hasattr(x, "digests") for x in (a, b)]
    if any(runs):  # run folders: one trace per rank
        if not all(runs):
            raise NeuronExplorerError(f"cannot compare a run with a single trace ({args.a}, "
                                      f"{args.b}): give both runs or both traces")
        from neuron_explorer.runs.report import render_run_diff

        write_output(render_run_diff(a, b, args.format), args.output)
        if args.fail_above is None:
            return 0
        a_ns, b_ns, growth = run_step_time_growth(a, b)
    else:
        result = diff(a, b)
        write_output(result.render(args.format), args.output)
        if args.fail_above is None:
            return 0
        if not result.comparable:  # a damaged file must not pass, nor fail, as a regression
            cut = [name for name, short in zip((args.a, args.b), result.cut_short, strict=True)
                   if short]
            raise NeuronExplorerError(
                f"cannot check --fail-above: {' and '.join(cut)} "
                f"{'is a recording' if len(cut) == 1 else 'are recordings'} cut short (killed, "
                "or the file damaged), whose step time measures only the part kept; record "
                "it again")
        a_ns, b_ns, growth = step_time_growth(result)
    if growth > args.fail_above:
        print(f"neuron-explorer diff: step time grew {growth:.1f}% ({fmt_ns(a_ns)} -> "
              f"{fmt_ns(b_ns)}), more than --fail-above {args.fail_above:g}%", file=sys.stderr)
        return EXIT_REGRESSION
    print(f"neuron-explorer diff: step time {growth:+.1f}% ({fmt_ns(a_ns)} -> {fmt_ns(b_ns)}), "
          f"within --fail-above {args.fail_above:g}%", file=sys.stderr)
    return 0
