"""Writing a trace's or a run's store into a chosen folder (`neuron-explorer convert`)."""

from __future__ import annotations

import json
import os
from functools import partial
from typing import Any

from neuron_explorer.common.errors import NeuronExplorerError
from neuron_explorer.store.parquet import FORMAT, RUN_MANIFEST, VERSION, write_store


def convert_trace(path: str, out: str, progress: bool | None = None) -> tuple[int, int | None]:
    """Write a trace's tables (derived ones included) into `out`; returns its number of
    slices and the rank it states (None if it states none)."""
    from neuron_explorer.loaders import read_trace
    from neuron_explorer.progress import steps
    from neuron_explorer.runs.files import distributed_info
    from neuron_explorer.store.cache import source_key
    from neuron_explorer.trace import DERIVED, Trace

    with steps(2 + len(DERIVED), f"converting {os.path.basename(path)}", progress) as bar:
        raw = read_trace(path)
        bar.update()
        trace = Trace(raw)
        derived = {}
        for name in DERIVED:
            derived[name] = trace.table(name)
            bar.update()
        try:
            write_store(out, raw, source_key(path), derived=derived)
        except OSError as exc:
            raise NeuronExplorerError(f"cannot write {out}: {exc.strerror or exc}; check the "
                                      "path and that its folder is writable") from None
        bar.update()
    return len(raw.slices), distributed_info(raw.metadata).get("rank")


def _convert_file(path: str, out: str) -> tuple[int, int | None]:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return convert_trace(path, os.path.join(out, os.path.basename(path)), progress=False)


def convert_run(source: str, out: str, progress: bool | None = None,
                processes: int | None = None, scheduler: str | None = None) -> dict[int, str]:
    """Write every rank's store into `out/<trace file name>/` (in worker processes) and
    `run.json`, which maps ranks to those folders; returns that map."""
    from neuron_explorer.runs.files import assign_ranks, read_manifest, run_paths
    from neuron_explorer.runs.run import map_ranks

    paths = run_paths(source)
    os.makedirs(out, exist_ok=True)
    done = map_ranks(partial(_convert_file, out=out), paths, processes, progress,
                     "converting ranks", scheduler)
    ranks = assign_ranks(paths, [own for _, own in done])
    folders = {rank: os.path.basename(p) for rank, p in zip(ranks, paths, strict=True)}
    manifest: dict[str, Any] = {
        "format": FORMAT, "version": VERSION, "source": os.path.abspath(source),
        "ranks": {str(r): f for r, f in sorted(folders.items())},
        "manifest": read_manifest(source)}
    with open(os.path.join(out, RUN_MANIFEST), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1)
    return folders
