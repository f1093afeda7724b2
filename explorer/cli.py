"""The `neuron-explorer` command: record, report, diff, whatif, convert, view, demo.

Each subcommand lives in its own module exposing `configure(parser)` and
`run(args) -> int`; this file only routes, and turns the errors a user can cause
into one clear line instead of a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from types import ModuleType

from neuron_explorer import __version__
from neuron_explorer.common.errors import NeuronExplorerError

SUBCOMMANDS = {
    "record": ("neuron_explorer.collectors.record_command", "record a program into a trace"),
    "report": ("neuron_explorer.commands.report",
               "summarise a trace: breakdown, top ops, findings"),
    "diff": ("neuron_explorer.commands.diff", "compare two traces"),
    "whatif": ("neuron_explorer.commands.what_if",
               "predict a recorded run on other hardware, mode or dtype"),
    "convert": ("neuron_explorer.commands.convert", "write a trace's or a run's tables as Parquet"),
    "view": ("neuron_explorer.webapp.view_command", "open traces in the dashboard"),
    "demo": ("neuron_explorer.webapp.demo_command", "record a sample workload and open it"),
}


def build_parser(command: str | None = None,
                 ) -> tuple[argparse.ArgumentParser, dict[str, ModuleType]]:
    """The parser of every subcommand, with the options of `command`'s only (of all when
    None): only that module is imported, so `record` does not load what `whatif` or
    `view` need (pandas, the dashboard's store)."""
    parser = argparse.ArgumentParser(
        prog="neuron-explorer",
        description="Profile PyTorch on a simulated Trainium NeuronCore and explore the traces.",
    )
    parser.add_argument("--version", action="version", version=f"neuron-explorer {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules = {}
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        sp = sub.add_parser(name, help=help_text, description=help_text)
        if command is None or name == command:
            module = importlib.import_module(module_name)
            module.configure(sp)
            modules[name] = module
    return parser, modules


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # the first word that is no option names the subcommand (no top-level option takes a
    # value); none, or one that is no subcommand, configures none: argparse says what is wrong
    command = next((a for a in argv if not a.startswith("-")), "")
    parser, modules = build_parser(command)
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    try:
        return int(modules[args.command].run(args) or 0)
    except NeuronExplorerError as exc:
        print(f"neuron-explorer {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"neuron-explorer {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
