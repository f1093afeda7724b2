"""A compiled graph's program as it would be with the model cast whole to a lower
precision (`model.to(torch.bfloat16)` and its inputs): every float32 tensor of the graph
in that dtype, so its matmuls run at that rate and every load, store and elementwise op
moves and computes half the bytes.

The FP32-matmul finding states this program's saving for compiled graphs: the program is
built again from the same fusion groups, their values' dtypes swapped for the build
(`what_if_build`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from neuron_explorer.backend.compiler.fusion import FusionGroup
from neuron_explorer.backend.compiler.what_if_build import (
    changed_values,
    fake_like,
    graph_nodes,
    program_ns,
)

if TYPE_CHECKING:
    from neuron_explorer.backend.devices import NeuronDevice


def whole_model_ns(groups: Sequence[FusionGroup], device: NeuronDevice, name: str,
                   binding: dict | None, dtype: torch.dtype = torch.bfloat16) -> int | None:
    """The length of the graph's program with its float32 tensors in `dtype` (None when
    the graph does no device work, or cannot be built so)."""
    def cast(val: torch.Tensor) -> torch.Tensor | None:
        if val.dtype != torch.float32:
            return None
        return fake_like(val, val.shape, val.stride(), dtype)

    return program_ns(groups, device, name, binding,
                      changed_values(graph_nodes(groups), cast))
