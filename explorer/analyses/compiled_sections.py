"""What each compiled graph runs, section by section, named as the user wrote it.

A `torch.compile(backend="neuron")` graph runs as one program whose instructions
say which section (fused group) they belong to, its aten op(s), and what the user's
code called to make them (`LayerNorm`, `F.layer_norm`, `torch.softmax`): the module
type or torch function Dynamo recorded, so `aten::native_layer_norm` reads as the
`nn.LayerNorm` it came from.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from neuron_explorer.common.op_families import is_matmul_like
from neuron_explorer.common.trace_format import (
    ARG_ENGINE,
    ARG_KERNEL_ID,
    ARG_MODULE,
    ARG_OPS,
    ARG_SECTION,
    ARG_SECTIONS,
    ARG_SOURCE,
    CAT_DMA,
    CAT_INSTRUCTION,
)

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

COLUMNS = ["graph", "section", "written", "ops", "module", "source", "runs", "instructions",
           "engine_ns"]
MATMUL_COLUMNS = ["id", "ts", "dur", "step", "graph", "name", "written", "module", "source",
                  "dtype", "device_dur"]


def compiled_sections(trace: Trace) -> pd.DataFrame:
    """One row per (graph, section): what it runs (`written`: the user's call, `ops`: the aten
    ops), where (`module`, `source`), how often the graph ran (`runs`), its instructions per
    run and its engine time per run (ns, summed over engines and DMA queues), in program order."""
    frame = _program_instructions(trace)
    if frame is None:
        return pd.DataFrame(columns=COLUMNS)
    keys = ["graph", "section", "written", "ops", "module", "source"]
    out = frame.groupby(keys, sort=False).agg(
        runs=("kernel_id", "nunique"), instructions=("dur", "size"), engine_ns=("dur", "sum"),
        first=("ts", "min")).reset_index()
    out["instructions"] = out["instructions"] // out["runs"]
    out["engine_ns"] = out["engine_ns"] // out["runs"]
    return out.sort_values(["graph", "first"], kind="stable")[COLUMNS].reset_index(drop=True)


def _first_matmul(ops: str) -> str:
    """The first matmul, convolution or attention op of a section's '+'-joined aten ops
    (all of them when it has none)."""
    return next((op for op in ops.split("+") if is_matmul_like(op)), ops)


def compiled_matmuls(trace: Trace) -> pd.DataFrame:
    """One row per run of a compiled graph's section holding a matmul: its aten matmul
    (`name`), the dtype it ran in, its Tensor Engine time in that run (`device_dur`), where
    it comes from, and the graph's kernel (`id`, `ts`, `dur`, `step`), for the fp32 rule."""
    frame = _program_instructions(trace)
    if frame is None:
        return pd.DataFrame(columns=MATMUL_COLUMNS)
    frame = frame[(frame["matmul_dtype"] != "") & (frame["engine"] == "tensor")]
    if frame.empty:
        return pd.DataFrame(columns=MATMUL_COLUMNS)
    runs = frame.groupby(["kernel_id", "section", "written", "ops", "module", "source",
                          "matmul_dtype"], sort=False)["dur"].sum().reset_index()
    k = trace.kernels.set_index("kernel_id")
    runs = runs[runs["kernel_id"].isin(k.index)]
    kernel = k.loc[runs["kernel_id"]]
    first_matmul = runs["ops"].map(_first_matmul)
    return pd.DataFrame({
        "id": kernel["id"].to_numpy(np.int64), "ts": kernel["ts"].to_numpy(np.int64),
        "dur": kernel["dur"].to_numpy(np.int64), "step": kernel["step"].to_numpy(),
        "graph": kernel["name"].to_numpy(), "name": first_matmul.to_numpy(),
        "written": runs["written"].to_numpy(), "module": runs["module"].to_numpy(),
        "source": runs["source"].to_numpy(), "dtype": runs["matmul_dtype"].to_numpy(),
        "device_dur": runs["dur"].to_numpy(np.int64),
    }, columns=MATMUL_COLUMNS)


def _program_instructions(trace: Trace) -> pd.DataFrame | None:
    """The instructions and DMA transfers of compiled programs with their section's labels
    (None: the trace has none)."""
    slices = trace.table("slices")
    if not len(slices):
        return None
    # the columns it needs at the rows it needs: a frame of every engine-level slice was
    # 400 MB at 8 M instructions, to keep none of them in a trace of eager kernels
    rows = np.flatnonzero(slices["category"].isin([CAT_INSTRUCTION, CAT_DMA]).to_numpy())
    args = trace.slice_args
    section = args.texts(ARG_SECTION, slices["id"].to_numpy(np.int64)[rows])
    keep = section != ""
    if not keep.any():
        return None
    rows = rows[keep]
    ids = slices["id"].to_numpy(np.int64)[rows]
    kernel_id = args.numbers(ARG_KERNEL_ID, ids, default=-1).astype(np.int64)
    names = dict(zip(trace.kernels["kernel_id"], trace.kernels["name"], strict=False))
    # each distinct kernel's name once (a name looked up per instruction was 0.37 s of a
    # compiled CNN's findings)
    distinct, inverse = np.unique(kernel_id, return_inverse=True)
    graph = np.array([names.get(k, f"kernel {k}") for k in distinct.tolist()], object)
    frame = pd.DataFrame({
        "graph": graph[inverse],
        "kernel_id": kernel_id,
        "section": section[keep],
        "ops": args.texts(ARG_OPS, ids),
        "module": args.texts(ARG_MODULE, ids),
        "source": args.texts(ARG_SOURCE, ids),
        "engine": args.texts(ARG_ENGINE, ids),
        "ts": slices["ts"].to_numpy(np.int64)[rows],
        "dur": slices["dur"].to_numpy(np.int64)[rows],
    })
    labels = section_labels(trace)
    if labels.empty:
        return frame.assign(written="", matmul_dtype="")
    frame = frame.merge(labels.drop(columns="matmul_shapes"),
                        on=["kernel_id", "section", "module", "source"], how="left")
    return frame.fillna({"written": "", "matmul_dtype": ""})


def section_labels(trace: Trace) -> pd.DataFrame:
    """(kernel_id, section, module, source) -> written, matmul_dtype, matmul_shapes, from the
    `sections` JSON each compiled program's kernel slice carries (None for the matmul shapes
    of a recording made before they were recorded)."""
    k = trace.kernels
    columns = ["kernel_id", "section", "module", "source", "written", "matmul_dtype",
               "matmul_shapes"]
    if not len(k):
        return pd.DataFrame(columns=columns)
    texts = trace.slice_args.texts(ARG_SECTIONS, k["id"].to_numpy(np.int64))
    parsed: dict[str, list] = {}
    rows: list[list] = []
    for kernel_id, text in zip(k["kernel_id"].tolist(), texts, strict=True):
        if not text:
            continue
        if text not in parsed:
            try:
                parsed[text] = [[*r, None][:6] for r in json.loads(text)
                                if isinstance(r, list) and len(r) in (5, 6)]
            except ValueError:
                parsed[text] = []
        rows.extend([kernel_id, *r] for r in parsed[text])
    frame = pd.DataFrame(rows, columns=columns)
    return frame.drop_duplicates(["kernel_id", "section", "module", "source"])


def matmul_dtype_mix(trace: Trace) -> dict[int, str]:
    """Per compiled program's kernel id, the dtypes of its matmul sections, the most used
    first ("bfloat16", or "bfloat16+float32" under autocast with some fp32 matmuls); a
    program without matmuls is absent. A graph's first input's dtype says nothing of its
    matmuls (under bf16 autocast the inputs are float32)."""
    labels = section_labels(trace)
    labels = labels[labels["matmul_dtype"].astype(str) != ""] if len(labels) else labels
    mix: dict[int, str] = {}
    for kernel_id, part in labels.groupby("kernel_id", sort=False):
        counts = part["matmul_dtype"].astype(str).value_counts(sort=True)
        mix[int(kernel_id)] = "+".join(counts.index.tolist())
    return mix


def graph_matmul_shapes(trace: Trace) -> dict[int, str]:
    """Per compiled program's kernel id, its matmuls' operand shapes ("[[64, 96], [96, 160]]
    [[64, 160], [160, 10]]": a section's after another's; "" for a program whose matmuls
    record none, an opaque op's own); a program recorded before they were is absent."""
    labels = section_labels(trace)
    if not len(labels):
        return {}
    labels = labels[labels["matmul_shapes"].notna()]
    return {int(kernel_id): " ".join(s for s in part["matmul_shapes"].astype(str) if s)
            for kernel_id, part in labels.groupby("kernel_id", sort=False)}
