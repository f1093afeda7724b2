"""The kernel part of the report: per NKI kernel and set of input shapes (the most-run
first) its profile (engine busy %, DMA/compute overlap, SBUF/PSUM high-water, SBUF
spills, critical engine, DMA sizes) and why it is as fast as it is, and the kernel's
line profile (each source line with its time, engine and stall)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from neuron_explorer.analyses.kernel_lines import (
    kernel_instructions,
    kernel_profile,
    kernel_shapes,
    line_profile,
    nki_kernels,
)
from neuron_explorer.common.engine_profile import ENGINE_COLUMNS
from neuron_explorer.render import Section, fmt_ns

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

TOP_KERNELS = 5
TOP_SHAPES = 3  # profiles per kernel, one per set of input shapes, the most-run first
ENGINE_NAMES = {"tensor": "Tensor Engine", "vector": "Vector Engine", "scalar": "Scalar Engine",
                "gpsimd": "GpSimd Engine", "dma": "DMA"}


def kernel_summary(trace: Trace, kernel: str, shapes: str | None = None) -> dict[str, Any]:
    """One NKI kernel's figures, averaged over its runs with one set of input shapes (the
    most-run, by default: a kernel run once on a small correctness case and many times on
    its real shapes is described by the latter), and the reasons for its time."""
    groups = kernel_shapes(trace, kernel)
    if len(groups):
        pick = groups.iloc[0] if shapes is None else \
            groups[groups["shapes"] == shapes].iloc[0]
        shapes, ids = str(pick["shapes"]), list(pick["kernel_ids"])
    else:
        ids = None
    prof = kernel_profile(trace, kernel, ids)
    first = kernel_instructions(trace, kernel, kernel_ids=ids)
    dma = first[first["engine"] == "dma"]
    dma_ns = float(prof["busy_dma_pct"].iloc[0]) / 100 * int(prof["dur_ns"].iloc[0])
    peak = float((trace.hardware_figures or {}).get("dma_bytes_per_s") or 0)
    out = {
        "kernel": kernel, "shapes": shapes or "", "shape_count": len(groups),
        "runs": len(prof), "duration_ns": float(prof["dur_ns"].mean()),
        "busy_pct": {e: float(prof[f"busy_{e}_pct"].mean()) for e in ENGINE_COLUMNS},
        "dma_compute_overlap_pct": float(prof["dma_compute_overlap_pct"].mean()),
        "sbuf_bytes": int(prof["sbuf_bytes"].max()), "psum_bytes": int(prof["psum_bytes"].max()),
        "critical_engine": str(prof["critical_engine"].mode().iloc[0]),
        "spill_bytes": float(prof["spill_bytes"].mean()),
        "reload_bytes": float(prof["reload_bytes"].mean()),
        "spill_ns": float(prof["spill_ns"].mean()),
        "dma_transfers": len(dma),
        "dma_median_bytes": int(dma["bytes"].median()) if len(dma) else 0,
        "dma_bytes_per_s": float(dma["bytes"].sum()) / dma_ns * 1e9 if dma_ns else 0.0,
        "dma_peak_bytes_per_s": peak,
    }
    out["why"] = explain(out)
    return out


def explain(s: dict[str, Any]) -> list[str]:
    """Why the kernel takes its time, in the profile's terms: the critical engine, how much
    of the DMA hides under compute, and how efficiently the transfers move data."""
    busy = s["busy_pct"]
    critical = s["critical_engine"]
    compute = max((e for e in ENGINE_COLUMNS if e != "dma"), key=lambda e: busy[e])
    lines = []
    if critical == "dma":
        lines.append(f"DMA bound: the DMA queues are busy {busy['dma']:.0f}% of the kernel, the "
                     f"busiest compute engine ({ENGINE_NAMES[compute]}) {busy[compute]:.0f}%.")
    else:
        lines.append(f"{ENGINE_NAMES[critical]} bound: busy {busy[critical]:.0f}% of the kernel "
                     f"(DMA {busy['dma']:.0f}%).")
    overlap = s["dma_compute_overlap_pct"]
    if overlap < 50:
        lines.append(f"Only {overlap:.0f}% of the DMA time overlaps compute: loads and compute "
                     "are not pipelined (allocate tiles inside the loop so buffers rotate, load "
                     "ahead of use).")
    else:
        lines.append(f"{overlap:.0f}% of the DMA time is hidden under compute.")
    if s.get("spill_bytes"):
        stored = (s["spill_bytes"] - s["reload_bytes"]) / 2**20
        lines.append(f"Its live SBUF tiles do not fit: it spills {stored:.1f} MiB to HBM and "
                     f"reloads {s['reload_bytes'] / 2**20:.1f} MiB per run, "
                     f"{fmt_ns(s['spill_ns'])} of it with no compute engine busy (smaller "
                     "tiles, or tiles live for a shorter time, keep it on chip).")
    if s["dma_transfers"]:
        rate = s["dma_bytes_per_s"] / 1e9
        peak = s["dma_peak_bytes_per_s"] / 1e9
        share = f" ({100 * rate / peak:.0f}% of the {peak:.0f} GB/s peak)" if peak else ""
        advice = (": larger transfers with longer contiguous rows move more per fixed cost"
                  if peak and rate < peak / 2 else "")
        lines.append(f"{s['dma_transfers']} DMA transfers of {s['dma_median_bytes']} B (median, "
                     f"per queue) move data at {rate:.0f} GB/s while DMA is busy{share}{advice}.")
    return lines


def _profile_content(s: dict[str, Any]) -> dict[str, Any]:
    busy = ", ".join(f"{e} {v:.1f}%" for e, v in s["busy_pct"].items() if v > 0) or "-"
    return {"input shapes": s["shapes"] or "-", "runs": s["runs"],
            "duration (mean)": fmt_ns(s["duration_ns"]), "engine busy": busy,
            "DMA/compute overlap": f"{s['dma_compute_overlap_pct']:.1f}% of DMA time",
            "SBUF high-water": f"{s['sbuf_bytes'] / 2**10:.0f} KiB",
            "PSUM high-water": f"{s['psum_bytes'] / 2**10:.0f} KiB",
            "SBUF spills": (f"{(s['spill_bytes'] - s['reload_bytes']) / 2**20:.1f} MiB stored, "
                            f"{s['reload_bytes'] / 2**20:.1f} MiB reloaded, "
                            f"{fmt_ns(s['spill_ns'])} not under compute")
            if s.get("spill_bytes") else "none",
            "critical engine": s["critical_engine"],
            "DMA transfers (first run)": f"{s['dma_transfers']}, median {s['dma_median_bytes']} B",
            "why": " ".join(s["why"])}


def line_table(lines: pd.DataFrame) -> pd.DataFrame:
    """The line profile as the report prints it: line, engine, time, stall, share, code."""
    return pd.DataFrame({
        "line": [f"{str(f).rsplit('/', 1)[-1]}:{n}" for f, n in zip(lines["file"], lines["line"],
                                                                    strict=True)],
        "engine": lines["engine"], "time": [fmt_ns(v) for v in lines["total_ns"]],
        "stall": [fmt_ns(v) for v in lines["stall_ns"]],
        "share": [f"{100 * v:.1f}%" for v in lines["share"]],
        "instructions": lines["instructions"],
        "code": [c.strip() or "(source not found)" for c in lines["code"]]})


def kernel_sections(trace: Trace) -> list[Section]:
    """Per NKI kernel (the longest first, at most TOP_KERNELS): its profile and line profile."""
    sections = []
    for name in nki_kernels(trace)[:TOP_KERNELS]:
        lines = line_profile(trace, name)
        if not len(lines):
            continue
        groups = kernel_shapes(trace, name)
        for shapes in groups["shapes"].tolist()[:TOP_SHAPES] or [None]:
            which = f" at {shapes}" if len(groups) > 1 else ""
            sections.append(Section(f"Kernel {name}: profile{which}", _profile_content(
                kernel_summary(trace, name, shapes))))
        sections.append(Section(f"Kernel {name}: line profile (time per source line, summed "
                                "over its runs)", line_table(lines)))
    return sections


def kernel_dict(trace: Trace) -> list[dict[str, Any]]:
    """Per NKI kernel, JSON-able: the summary and its line profile."""
    out = []
    for name in nki_kernels(trace):
        lines = line_profile(trace, name)
        if not len(lines):
            continue
        records = lines.replace({np.nan: None}).to_dict(orient="records")
        shapes = kernel_shapes(trace, name)["shapes"].tolist()
        out.append({**kernel_summary(trace, name), "lines": records,
                    "by_shape": [kernel_summary(trace, name, s) for s in shapes]})
    return out
