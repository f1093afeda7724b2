"""Colours of the dashboard: one fixed colour per slice category, so every page agrees."""

from __future__ import annotations

import zlib

CATEGORY_COLOURS = {
    "step": "#5b6770",
    "module": "#4e79a7",
    "backward": "#7a5195",
    "optimizer": "#b07aa1",
    "op": "#59a14f",
    "kernel": "#f28e2b",
    "instruction": "#e8a33d",
    "dma": "#76b7b2",
    "sync": "#e15759",
    "dataloader": "#edc948",
    "compile": "#9c755f",
    "annotation": "#8cd17d",
    "graph_break": "#d62728",
    "recompile": "#d62728",
    "merged": "#9aa5b1",
    # PyTorch-profiler (Kineto) categories
    "cpu_op": "#59a14f",
    "user_annotation": "#8cd17d",
    "cuda_runtime": "#bab0ac",
    "gpu_memcpy": "#76b7b2",
    "gpu_memset": "#86bcb6",
    "python_function": "#a0cbe8",
}

# Breakdown categories (trace.breakdown()) reuse the same hues where they mean the same.
BREAKDOWN_COLOURS = {
    "idle": "#d5dae0",
    "data": "#edc948",
    "dataloader": "#edc948",
    "sync": "#e15759",
    "compile": "#9c755f",
    "dma": "#76b7b2",
    "tensor": "#f28e2b",
    "vector": "#4e79a7",
    "scalar": "#59a14f",
    "gpsimd": "#b07aa1",
}

_FALLBACK = ["#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#9c755f", "#ff9da7"]


def category_colour(category: str) -> str:
    """The colour of a slice category; unknown categories get a stable colour of their own."""
    if category in CATEGORY_COLOURS:
        return CATEGORY_COLOURS[category]
    return _FALLBACK[zlib.crc32(str(category).encode()) % len(_FALLBACK)]


def breakdown_colour(category: str) -> str:
    """The colour of a time-breakdown category (device engines, DMA, idle, host work)."""
    key = str(category).lower()
    for name, colour in BREAKDOWN_COLOURS.items():
        if name in key:
            return colour
    return category_colour(key)
