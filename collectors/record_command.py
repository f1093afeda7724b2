"""`neuron-explorer record [options] -- python train.py args...`: run a program, write its trace.

Also `record train.py args...` and `record -m package.module args...`. Heavy
imports (torch) happen inside `run`, after the options are checked.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import NoReturn

from neuron_explorer.collectors.output_claim import claim, claim_or_refuse, release
from neuron_explorer.collectors.trace_writer import FORMATS, RecordingError
from neuron_explorer.common.trace_format import LEVELS


def configure(parser: argparse.ArgumentParser) -> None:
    parser.usage = "%(prog)s [options] [--] [python] SCRIPT [ARGS...] | -m MODULE [ARGS...]"
    parser.add_argument("-o", "--output", metavar="PATH",
                        help="trace file (default: a new SCRIPT.pftrace in the current folder); "
                             "for torchrun, the run folder (default: a new SCRIPT.run)")
    parser.add_argument("--hardware", metavar="PRESET",
                        help="simulated device preset, such as trn1, trn2 (the default) or trn3 "
                             "(sets NEURON_HARDWARE)")
    parser.add_argument("--level", choices=LEVELS, default="engine",
                        help="framework: steps, modules, optimizer, data, syncs, compile; "
                             "op: + every device op and kernel; engine (default): + instructions, "
                             "DMA and counters")
    parser.add_argument("--steps", metavar="START:STOP",
                        help="record only steps START..STOP-1 (a step ends at optimizer.step() "
                             "or neuron_explorer.step())")
    parser.add_argument("--format", choices=FORMATS,
                        help="pftrace (Perfetto protobuf, default) or json (Chrome trace)")
    parser.add_argument("-m", dest="module", metavar="MODULE",
                        help="run a library module as a script, like python -m")
    parser.add_argument("program", nargs=argparse.REMAINDER,
                        help="the program and its arguments")
    _one_line_errors(parser)


def _one_line_errors(parser: argparse.ArgumentParser) -> None:
    """Bad options give one clear line (no usage dump), before anything runs."""

    def error(message: str) -> NoReturn:
        parser.exit(2, f"neuron-explorer record: error: {message} "
                       "(see `neuron-explorer record --help`)\n")

    parse_known_args = parser.parse_known_args

    def parse_known_args_strict(args=None, namespace=None):
        namespace, extras = parse_known_args(args, namespace)
        if extras:
            error(f"unknown option {extras[0]}")
        return namespace, extras

    parser.error = error  # type: ignore[method-assign]
    parser.parse_known_args = parse_known_args_strict  # type: ignore[method-assign]


def default_output(stem: str, fmt: str, after: str | None = None) -> str:
    """A new file name in the current folder: never an existing file (nor `after` or a
    name before it, when given)."""
    ext = ".json" if fmt == "json" else ".pftrace"
    candidate = f"{stem}{ext}"
    n = 1
    passed = after is None
    while os.path.exists(candidate) or not passed:
        passed = passed or candidate == after
        candidate = f"{stem}.{n}{ext}"
        n += 1
    return candidate


def _check_writable(path: str) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise RecordingError(f"cannot write the trace to {path}: it is a folder; "
                             "give a file name with -o/--output")
    if not os.path.isdir(folder):
        raise RecordingError(f"cannot write the trace to {path}: folder {folder} does not "
                             "exist; create it or choose another -o/--output")
    if not os.access(folder, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise RecordingError(f"cannot write the trace to {path}: permission denied; "
                             "choose a writable path with -o/--output")


def run(args: argparse.Namespace) -> int:
    from neuron_explorer.collectors import thread_pool_wait

    thread_pool_wait.wait_asleep()  # before torch loads: see the module
    from neuron_explorer.collectors.program import parse_program
    from neuron_explorer.collectors.recorder import RecordOptions, parse_steps
    from neuron_explorer.collectors.session import format_for

    if args.hardware:  # an unknown name: one error listing the presets
        from neuron_explorer.common.presets import get_preset

        get_preset(args.hardware)
    words = list(args.program)
    if words and words[0].startswith("-") and words[0] not in ("--", "-m"):
        raise RecordingError(f"unknown option {words[0]}: see `neuron-explorer record --help`")
    program = parse_program(words, args.module)
    steps = parse_steps(args.steps)
    from neuron_explorer.collectors import run_folder

    if run_folder.is_launcher(program):  # torchrun: one trace per rank in a run folder
        if args.hardware:
            os.environ["NEURON_HARDWARE"] = args.hardware
        folder = args.output or run_folder.default_folder(run_folder.script_stem(program))
        claim_or_refuse(folder)
        return run_folder.record_run(program, folder, args.level, steps,
                                     args.format or "pftrace")
    fmt = format_for(args.output or "", args.format)
    if args.output:
        output = args.output
        _check_writable(output)
        claim_or_refuse(output)
        if os.path.exists(output):
            print(f"neuron-explorer: replacing existing {output}", file=sys.stderr)
    else:
        output = default_output(program.stem, fmt)
        _check_writable(output)
        while not claim(output):  # another record, just started, chose that name too
            output = default_output(program.stem, fmt, after=output)
    if args.hardware:
        os.environ["NEURON_HARDWARE"] = args.hardware
    options = RecordOptions(output, args.level, steps, fmt, program.argv)
    return _record(program, options)


def _record(program, options) -> int:
    from neuron_explorer.collectors import session
    from neuron_explorer.collectors.program import COMMAND, end_like_python, run_program

    recorder = session.start(options)
    if program.kind == COMMAND:
        # the launcher only starts other processes: its children hold the events
        recorder.options.drop_if_empty = False
    try:
        outcome = run_program(program)
        recorder.program_ended(outcome.code, outcome.error)
    finally:
        recorder.stop()
        release()  # the trace is written: another record may take its path now
    return end_like_python(outcome)


def main(argv: list[str] | None = None) -> int:
    """`python -m neuron_explorer.collectors.record_command ...`: the record command alone."""
    from neuron_explorer.common.errors import NeuronExplorerError

    parser = argparse.ArgumentParser(prog="neuron-explorer record")
    configure(parser)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        return run(args)
    except NeuronExplorerError as exc:
        print(f"neuron-explorer record: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
