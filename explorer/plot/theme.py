"""Colours of the figures, in the dashboard and in notebooks: one fixed colour per slice
category and per severity, so every page and every notebook agree."""

from __future__ import annotations

import zlib

FONT_FAMILY = "system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif"
GRID_COLOUR = "#eceff3"
SELECTION_COLOUR = "#d62728"
MUTED_COLOUR = "#5b6770"
CRITICAL_PATH_COLOUR = "#ff00cc"  # the critical path's line: apart from every bar colour

# Finding severities: (text, background); webapp/assets/style.css uses the same (test_theme checks).
SEVERITY_COLOURS = {
    "high": ("#c0392b", "#fdecea"),
    "critical": ("#c0392b", "#fdecea"),
    "medium": ("#b7791f", "#fff4dc"),
    "warning": ("#b7791f", "#fff4dc"),
    "low": ("#2f6db5", "#e8f0fa"),
    "info": ("#2f6db5", "#e8f0fa"),
}

# Slice categories on the timeline: no two share a colour (test_theme checks they stay apart).
CATEGORY_COLOURS = {
    "step": "#5b6770",
    "module": "#4e79a7",
    "backward": "#7a5195",
    "optimizer": "#d37295",
    "op": "#59a14f",
    "kernel": "#f28e2b",
    "instruction": "#b6992d",
    "dma": "#76b7b2",
    "sync": "#e15759",
    "dataloader": "#edc948",
    "dataloader_worker": "#8f6d00",
    "compile": "#3d2b1f",
    "annotation": "#8cd17d",
    "graph_break": "#a10e2b",
    "recompile": "#ff00aa",
    "merged": "#9aa5b1",
    # PyTorch-profiler (Kineto) categories
    "cpu_op": "#59a14f",
    "user_annotation": "#8cd17d",
    "cuda_runtime": "#bab0ac",
    "gpu_memcpy": "#76b7b2",
    "gpu_memset": "#86bcb6",
    "python_function": "#a0cbe8",
}

# Time-breakdown categories (trace.breakdown()): host work and device engines, all distinct,
# reusing a timeline hue only where the meaning is the same (sync, dataloader, dma).
BREAKDOWN_COLOURS = {
    "idle": "#d5dae0",
    "tensor": "#f28e2b",
    "vector": "#4e79a7",
    "scalar": "#59a14f",
    "gpsimd": "#b07aa1",
    "dma": "#76b7b2",
    "python": "#ff9da7",
    "op_dispatch": "#9c755f",
    "framework": "#9c755f",
    "compile": "#3d2b1f",
    "dataloader": "#edc948",
    "data": "#edc948",
    "sync": "#e15759",
    "gap": "#bab0ac",
}

# Unknown categories take a stable colour from those no known category uses.
_FALLBACK = ["#17becf", "#bcbd22", "#8c564b", "#e377c2", "#1f77b4", "#2ca02c", "#9467bd", "#c49c94"]


def category_colour(category: str) -> str:
    """The colour of a slice category; unknown categories get a stable colour of their own."""
    if category in CATEGORY_COLOURS:
        return CATEGORY_COLOURS[category]
    return _FALLBACK[zlib.crc32(str(category).encode()) % len(_FALLBACK)]


def breakdown_colour(category: str) -> str:
    """The colour of a time-breakdown category (device engines, DMA, idle, host work)."""
    key = str(category).lower()
    if key in BREAKDOWN_COLOURS:
        return BREAKDOWN_COLOURS[key]
    for name, colour in BREAKDOWN_COLOURS.items():  # 'dma_only', 'tensor engine', ...
        if key.startswith(name) or name in key.split("_"):
            return colour
    return category_colour(key)


def severity_colours(severity: str) -> tuple[str, str]:
    """(text, background) colour of a finding's severity; unknown severities read as info."""
    return SEVERITY_COLOURS.get(str(severity).lower(), SEVERITY_COLOURS["info"])
