"""Peak figures of the traced hardware, read from the trace's `hardware_figures` metadata.

The backend's presets write these keys (common/presets.py `figures()`);
a trace without them (a PyTorch-profiler trace) gets None from every accessor, and
the analyses that need a peak return empty or unknown results.
"""

from __future__ import annotations

from typing import Any


def peak_flops(figures: dict[str, Any] | None, dtype: str = "bfloat16") -> float | None:
    """Tensor Engine dense peak in FLOP/s for `dtype` (BF16 when the dtype is unknown)."""
    if not figures:
        return None
    table = figures.get("tensor_peak_flops")
    if isinstance(table, dict) and table:
        value = table.get(dtype) or table.get("bfloat16") or max(table.values())
        return float(value)
    value = figures.get("peak_flops")
    return float(value) if value else None


def hbm_bandwidth(figures: dict[str, Any] | None) -> float | None:
    """HBM bandwidth of one device in bytes/s."""
    if not figures:
        return None
    value = figures.get("hbm_bytes_per_s") or figures.get("memory_bytes_per_s")
    return float(value) if value else None


def dma_bandwidth(figures: dict[str, Any] | None) -> float | None:
    """DMA bandwidth of one device in bytes/s."""
    if not figures:
        return None
    value = figures.get("dma_bytes_per_s")
    return float(value) if value else None


def ridge_point(figures: dict[str, Any] | None, dtype: str = "bfloat16") -> float | None:
    """Arithmetic intensity (FLOP/byte) where the roofline turns from memory- to compute-bound."""
    flops, bw = peak_flops(figures, dtype), hbm_bandwidth(figures)
    return flops / bw if flops and bw else None


def hbm_capacity(figures: dict[str, Any] | None) -> int | None:
    """HBM bytes of one device."""
    if not figures:
        return None
    value = figures.get("hbm_bytes")
    return int(value) if value else None


def partitions(figures: dict[str, Any] | None) -> int:
    """SBUF partitions (engine lanes); 128 on every Trainium generation."""
    return int((figures or {}).get("partitions") or 128)


def dma_fixed_ns(figures: dict[str, Any] | None) -> float | None:
    """The fixed cost of one DMA transfer in ns (its descriptors, then trigger to first
    byte), or None for a trace whose hardware figures do not say."""
    value = (figures or {}).get("dma_fixed_ns")
    return float(value) if value else None


def dma_fixed_text(figures: dict[str, Any] | None) -> str:
    """The fixed cost of one DMA transfer as the rules' texts give it ('~1.7 us'), or ''
    for a trace whose hardware figures do not say (recorded before they did)."""
    value = dma_fixed_ns(figures)
    return f" (~{value / 1e3:.1f} us on this hardware)" if value else ""
