"""Every category has a colour of its own (#12 item 6: python and vector shared a blue,
op_dispatch and compile a brown)."""

from __future__ import annotations

import itertools

from neuron_explorer.plot.theme import (
    BREAKDOWN_COLOURS,
    CATEGORY_COLOURS,
    breakdown_colour,
    category_colour,
)

BREAKDOWN = ["python", "op_dispatch", "compile", "dataloader", "sync",
             "tensor", "vector", "scalar", "gpsimd", "dma_only", "idle"]
TIMELINE = ["step", "module", "backward", "optimizer", "op", "kernel", "instruction", "dma", "sync",
            "dataloader", "compile", "annotation", "graph_break", "recompile", "merged"]


def _rgb(colour: str) -> tuple[int, int, int]:
    return tuple(int(colour[i:i + 2], 16) for i in (1, 3, 5))


def _apart(a: str, b: str) -> float:
    return sum((x - y) ** 2 for x, y in zip(_rgb(a), _rgb(b), strict=True)) ** 0.5


def test_breakdown_categories_have_distinct_colours():
    colours = {c: breakdown_colour(c) for c in BREAKDOWN}
    for (a, ca), (b, cb) in itertools.combinations(colours.items(), 2):
        assert _apart(ca, cb) > 40, (a, ca, b, cb)


def test_timeline_categories_have_distinct_colours():
    colours = {c: category_colour(c) for c in TIMELINE}
    for (a, ca), (b, cb) in itertools.combinations(colours.items(), 2):
        assert _apart(ca, cb) > 40, (a, ca, b, cb)


def test_the_same_meaning_keeps_the_same_colour_and_unknowns_stay_apart():
    assert breakdown_colour("sync") == category_colour("sync")
    assert breakdown_colour("dataloader") == category_colour("dataloader")
    assert breakdown_colour("dma_only") == category_colour("dma")
    known = set(BREAKDOWN_COLOURS.values()) | set(CATEGORY_COLOURS.values())
    assert category_colour("something_new") not in known
    assert category_colour("something_new") == category_colour("something_new")
