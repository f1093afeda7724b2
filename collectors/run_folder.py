"""`neuron-explorer record -- torchrun ... train.py`: one run folder, one trace per rank.

The launcher itself records nothing: its Python children (the ranks) each record
their own trace into the folder (`rank0.pftrace`, `rank1.pftrace`, ...), with the
record command's level, steps and format. The folder also holds `manifest.json`
(world size, command, preset, topology, the ranks' traces), written before the
launcher starts and completed when it ends, so a run that dies still says what it was.
"""

from __future__ import annotations

import json
import os
import re
import sys
from typing import Any

from neuron_explorer.collectors.trace_writer import RecordingError

MANIFEST = "manifest.json"
RUN_SUFFIX = ".run"
_LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch")
_RANK_TRACE = re.compile(r"^rank(\d+)\.(pftrace|json)$")


def is_launcher(program) -> bool:
    """Whether the program is torchrun (or `python -m torch.distributed.run`)."""
    from neuron_explorer.collectors.program import COMMAND, MODULE

    if program.kind == COMMAND:
        return os.path.basename(program.target) == "torchrun"
    return program.kind == MODULE and program.target in _LAUNCHER_MODULES


def script_stem(program) -> str:
    """The name of the script the launcher runs (for the default folder name)."""
    for word in program.args:
        if word.endswith(".py"):
            return os.path.basename(word)[:-3]
    return "run"


def default_folder(stem: str) -> str:
    """A new folder name in the current folder: never an existing one."""
    candidate, n = f"{stem}{RUN_SUFFIX}", 1
    while os.path.exists(candidate):
        candidate = f"{stem}.{n}{RUN_SUFFIX}"
        n += 1
    return candidate


def prepare_folder(path: str) -> str:
    """Create the run folder (or reuse an existing one, replacing its rank traces)."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise RecordingError(f"cannot write the run to {path}: it is a file; give a folder "
                             "name with -o/--output when recording torchrun")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise RecordingError(f"cannot write the run to {path}: folder {parent} does not "
                             "exist; create it or choose another -o/--output")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise RecordingError(f"cannot create the run folder {path}: {exc.strerror}; choose "
                             "a writable path with -o/--output") from None
    old = [name for name in os.listdir(path) if _RANK_TRACE.match(name) or name == MANIFEST]
    if old:
        print(f"neuron-explorer: replacing the run in {path}", file=sys.stderr)
        for name in old:
            os.unlink(os.path.join(path, name))
    return path


def _option_value(args: list[str], *names: str) -> str | None:
    for i, word in enumerate(args):
        for name in names:
            if word == name and i + 1 < len(args):
                return args[i + 1]
            if word.startswith(name + "="):
                return word.split("=", 1)[1]
    return None


def launched_world_size(program) -> int | None:
    """nproc_per_node x nnodes from the launcher's options, when they are plain numbers."""
    per_node = _option_value(program.args, "--nproc_per_node", "--nproc-per-node")
    nodes = _option_value(program.args, "--nnodes") or "1"
    if per_node is None or not per_node.isdigit() or not nodes.isdigit():
        return None
    return int(per_node) * int(nodes)


def rank_traces(folder: str) -> list[tuple[int, str]]:
    """(rank, file name) of the traces in the folder, by rank."""
    found = []
    for name in os.listdir(folder):
        match = _RANK_TRACE.match(name)
        if match:
            found.append((int(match.group(1)), name))
    return sorted(found)


def manifest(program, folder: str, level: str, steps, fmt: str,
             outcome_code: int | None = None) -> dict[str, Any]:
    """The run's manifest: what ran, on what, and which traces it left."""
    from neuron_explorer.backend.distributed.topology import topology_for
    from neuron_explorer.common.presets import get_preset, interconnect_for

    preset = get_preset(os.environ.get("NEURON_HARDWARE", "trn2").strip() or "trn2")
    ranks = rank_traces(folder)
    data: dict[str, Any] = {
        "world_size": launched_world_size(program) or (len(ranks) or None),
        "command": program.argv,
        "preset": preset.name,
        "topology": {**topology_for(preset).as_dict(),
                     "chip_links": interconnect_for(preset).topology},
        "level": level,
        "steps": list(steps) if steps else None,
        "format": fmt,
        "ranks": [{"rank": r, "trace": name} for r, name in ranks],
    }
    if outcome_code is not None:
        data["exit_code"] = outcome_code
    return data


def write_manifest(folder: str, data: dict[str, Any]) -> None:
    path = os.path.join(folder, MANIFEST)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def summary(folder: str, data: dict[str, Any]) -> str:
    """The lines printed when the run ends: the folder and each rank's trace."""
    from neuron_explorer.collectors.summary import human_size

    ranks = data["ranks"]
    expected = data.get("world_size")
    lines = [f"neuron-explorer: run written to {folder} ({len(ranks)} rank trace"
             f"{'s' if len(ranks) != 1 else ''}"
             + (f" of {expected}" if expected and expected != len(ranks) else "") + ")"]
    if data.get("exit_code"):
        lines.append(f"  the program exited with code {data['exit_code']}: the traces hold what "
                     f"ran until then (neuron-explorer report {folder} says which rank failed)")
    for entry in ranks:
        path = os.path.join(folder, entry["trace"])
        size = os.path.getsize(path) if os.path.exists(path) else 0
        lines.append(f"  rank {entry['rank']}: {path} ({human_size(size)})")
    lines.append(f"  manifest: {os.path.join(folder, MANIFEST)}")
    if ranks:  # the folder: the dashboard's Ranks page and the report compare the ranks
        lines.append(f"  open it: neuron-explorer view {folder}  |  neuron-explorer report "
                     f"{folder}")
    return "\n".join(lines)


def record_run(program, folder: str, level: str, steps, fmt: str) -> int:
    """Run the launcher with every rank recording into `folder`; return its exit code."""
    from neuron_explorer.collectors import child_processes, output_claim
    from neuron_explorer.collectors.program import end_like_python, run_program
    from neuron_explorer.collectors.recorder import RecordOptions

    prepare_folder(folder)
    ext = ".json" if fmt == "json" else ".pftrace"
    options = RecordOptions(os.path.join(folder, f"rank{ext}"), level, steps, fmt,
                            program.argv)
    write_manifest(folder, manifest(program, folder, level, steps, fmt))
    child_processes.export_to_children(options, run_folder=folder)
    try:
        outcome = run_program(program)
    finally:
        child_processes.stop_exporting()
    data = manifest(program, folder, level, steps, fmt, outcome.code)
    write_manifest(folder, data)
    output_claim.release()  # the folder is written: another record may take it now
    print(summary(folder, data), file=sys.stderr)
    return end_like_python(outcome)
