"""What a distributed run's step runs besides the model, for the compiled what-if
(`compiled.py`): DDP's reducer copying gradients into its buckets, FSDP2's hooks copying
shards around their collectives, and the graphs Dynamo's DDP optimizer splits a model
into. Each is told from the recorded op stream: op keys (`rows["key"]`), slice names
(a collective's op is `c10d::...`, with no key) and the recorded data flow."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from neuron_explorer.memo import memoised

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

# Dynamo's DDP optimizer (torch/_dynamo/backends/distributed.py) splits a graph of a model
# DDP wraps where its parameters fill a bucket, walking the graph from its end: the first
# bucket at torch.distributed._DEFAULT_FIRST_BUCKET_BYTES, the others at DDP's
# bucket_cap_mb (25 MiB unless set: the trace does not say)
DDP_FIRST_BUCKET_BYTES = 1 << 20
DDP_BUCKET_BYTES = 25 << 20
_ITEMSIZE = {"float64": 8, "int64": 8, "float32": 4, "int32": 4, "float16": 2,
             "bfloat16": 2, "int16": 2, "int8": 1, "uint8": 1, "bool": 1}


def split_at_ddp_buckets(trace: Trace, rows: pd.DataFrame, labels: np.ndarray,
                          data_flow: tuple | None, optimizer: np.ndarray) -> None:
    """Relabel each forward graph into one graph per DDP bucket, as Dynamo's DDP optimizer
    compiles `DDP(torch.compile(model))`, and each backward op into the backward graph of
    its module's bucket: a graph call each (a two-rank MLP's 1.6 MB of parameters made
    two forward graphs and two backward ones, where one of each was predicted). A
    parameter is an input the optimizer last wrote."""
    if data_flow is None:
        return
    producers, keys = data_flow[0], rows["key"].tolist()
    module = trace.ops.set_index("id")["module"].reindex(rows["id"].to_numpy())
    module = module.fillna("").astype(str).to_numpy()
    for label in dict.fromkeys(x for x in labels.tolist() if x.endswith(":forward")):
        forward = np.flatnonzero(labels == label)
        bucket = np.zeros(len(forward), np.int64)
        size, n = 0, 0
        for j in range(len(forward) - 1, -1, -1):
            if size >= DDP_BUCKET_BYTES or (n == 0 and size >= DDP_FIRST_BUCKET_BYTES):
                n, size = n + 1, 0
            bucket[j] = n
            row = forward[j]
            for (shape, dtype), p in zip(keys[row][1], producers[row], strict=False):
                if p >= 0 and optimizer[p]:
                    size += math.prod(shape) * _ITEMSIZE.get(dtype, 4)
        if not n:
            continue
        # a module's ops go where its last one went (a weight's view before its matmul)
        of_module = dict(zip(module[forward].tolist(), (n - bucket).tolist(), strict=True))
        of_module.pop("", None)
        step_call = label.removesuffix(":forward")
        for row, b in zip(forward.tolist(), (n - bucket).tolist(), strict=True):
            labels[row] = f"{step_call}.{of_module.get(module[row], b)}:forward"
        for row in np.flatnonzero(labels == f"{step_call}:backward").tolist():
            labels[row] = f"{step_call}.{of_module.get(module[row], n)}:backward"


# What DDP's reducer runs per gradient as it lands: the copy into its bucket, divided by the
# world size (`mul_out`), or a plain copy; the views it takes cost no device work
_BUCKET_COPIES = frozenset({"aten::mul", "aten::div", "aten::mul_", "aten::div_",
                            "aten::copy_", "aten::_copy_from"})
_VIEWS = frozenset({"aten::as_strided", "aten::view", "aten::_reshape_alias"})


# What a sharded model's hooks run around each collective (FSDP2's copy into the
# all-gather's buffer and out of it, the reduce-scatter's `cat`): allocations, copies, views
_COLLECTIVE_COPIES = frozenset({"aten::empty", "aten::_foreach_copy_", "aten::cat",
                                "aten::_copy_from", "aten::copy_", "aten::chunk_cat",
                                "aten::split_with_sizes_copy", "aten::as_strided",
                                "aten::view", "aten::_reshape_alias"})


def collective_copies(names: list[str], keys: list, data_flow: tuple | None) -> set[int]:
    """The ops right before and after each collective that only allocate, copy or view,
    and the copies that read what those made (a prefetched all-gather's output, copied
    out later): FSDP2's hooks filling the all-gather's buffer and copying the parameters
    out of it (the reduce-scatter's alike), which run eagerly between the graphs of the
    modules compiled under them (a compiled step of four sharded blocks: each block's
    graph between its hooks' ops, as recorded)."""
    found: set[int] = set()
    for row, name in enumerate(names):
        if keys[row] is not None or not name.startswith("c10d::"):
            continue
        for step in (-1, 1):
            near = row + step
            while 0 <= near < len(keys) and keys[near] is not None \
                    and keys[near][0] in _COLLECTIVE_COPIES:
                found.add(near)
                near += step
    if data_flow is not None:  # in op order: a copy reads what an earlier op made
        for row, key in enumerate(keys):
            if key is not None and key[0] in _COLLECTIVE_COPIES and row not in found \
                    and any(p in found for p in data_flow[0][row]):
                found.add(row)
    return found


def ddp_reducer_ops(names: list[str], keys: list, backward: np.ndarray,
                     data_flow: tuple | None) -> set[int]:
    """The backward ops DDP's reducer runs from its autograd hooks: the copies of each
    gradient into the bucket that a collective then reduces, launched right after the
    last of them. Each reads the bucket the copy before it wrote, so they are the chain of
    alike ops behind the op before the collective. In `DDP(torch.compile(model))` they
    stay eager, after the compiled backward (a two-rank MLP's six were fused into the
    predicted graph: the prediction 32% short)."""
    if data_flow is None:
        return set()
    producers = data_flow[0]
    found: set[int] = set()
    for row, name in enumerate(names):
        if keys[row] is not None or not name.startswith("c10d::") or not backward[row]:
            continue
        last = row - 1
        while last >= 0 and keys[last] is not None and keys[last][0] in _VIEWS:
            last -= 1
        chain = [last] if last >= 0 and keys[last] is not None else []
        while chain:
            p = chain.pop()
            if p in found or not backward[p] or keys[p][0] not in _BUCKET_COPIES:
                continue
            found.add(p)
            chain += [q for q in producers[p]
                      if q >= 0 and keys[q] is not None and keys[q][0] == keys[p][0]]
    return found


def hook_copy_op_ids(trace: Trace) -> np.ndarray:
    """The op slices of a sharded model's hooks around its collectives (`collective_copies`
    over the recorded op stream): they run eagerly whatever the user compiles. Computed
    once per trace (reading the data flow parses every op's producers)."""
    return memoised(trace, "hook_copy_op_ids", lambda: _hook_copy_op_ids(trace))


def _hook_copy_op_ids(trace: Trace) -> np.ndarray:
    from neuron_explorer.what_if.compiled import recorded_data_flow

    ops = trace.ops
    # the names used (a categorical's categories are): no collective, nothing to look for
    used = ops["name"].cat.categories if isinstance(ops["name"].dtype, pd.CategoricalDtype) \
        else ops["name"].unique()
    if not any(str(n).startswith("c10d::") for n in used):
        return np.zeros(0, np.int64)
    ops = ops.sort_values("ts", kind="stable", ignore_index=True)
    names = ops["name"].astype(str).tolist()
    keys = [None if n.startswith("c10d::") else (n,) for n in names]
    rows = collective_copies(names, keys, recorded_data_flow(trace, ops))
    return ops["id"].to_numpy(np.int64)[sorted(rows)]
