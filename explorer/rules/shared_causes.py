"""Findings whose causes lie on one line of the program: one change there fixes each of
them, so their savings overlap rather than add. A NaN guard in a compiled forward was a
graph break and a sync on one line: 2.78 and 2.75 ms claimed beside each other, 2.89 ms
saved by removing it, and the report said nothing of the two being one.

Only rules whose evidence is the cause itself (a sync's call, a graph break, a copy's
line) are compared; rules whose evidence is where a cost shows (a kernel's DMA) would
share lines with any cause in the same graph.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import numpy as np
from neuron_explorer.common import trace_format as tf

if TYPE_CHECKING:
    from neuron_explorer.rules.finding import Finding
    from neuron_explorer.trace import Trace

# rules whose evidence slices are the code to change
CAUSE_RULES = frozenset({"sync_in_step", "recompilation", "host_device_copies",
                         "layout_copies", "cast_round_trip", "converted_uploads",
                         "python_loop", "parameter_loop"})


def with_shared_causes(trace: Trace, findings: list[Finding]) -> list[Finding]:
    """`findings`, each whose cause lies on a line another's does too saying so."""
    lines = {i: _lines(trace, f) for i, f in enumerate(findings) if f.rule_id in CAUSE_RULES}
    out = list(findings)
    for i, mine in lines.items():
        for j, theirs in lines.items():
            shared = sorted(mine & theirs)
            if i == j or not shared:
                continue
            other = findings[j]
            out[i] = dataclasses.replace(out[i], explanation=(
                f"{out[i].explanation} Its cause at {shared[0]} is also the "
                f"{other.rule_id} finding's ({other.title}): one change there fixes both, so "
                "the two savings overlap rather than add."))
    return out


def _lines(trace: Trace, finding: Finding) -> set[str]:
    """The program lines ("train.py:42") of the finding's evidence slices."""
    ids = np.array([i for item in finding.evidence for i in item["slice_ids"]], np.int64)
    sources = trace.slice_args.column(tf.ARG_SOURCE, ids)  # an empty array for no ids
    return {str(s).split(" ")[0] for s in sources.tolist() if s}
