"""Element sizes by the names traces give dtypes: torch's, and PyTorch-profiler traces' C++
types (which the communication analysis reads to size a collective's message)."""

from __future__ import annotations

import pytest
from neuron_explorer.common.dtypes import dtype_bytes


@pytest.mark.parametrize("name, size", [
    ("float32", 4), ("torch.bfloat16", 2), ("float", 4), ("double", 8), ("half", 2),
    ("c10::half", 2), ("c10::bfloat16", 2), ("long int", 8), ("long", 8), ("int", 4),
    ("short", 2), ("signed char", 1), ("unsigned char", 1), ("bool", 1),
])
def test_every_name_a_trace_gives_has_its_size(name: str, size: int) -> None:
    assert dtype_bytes(name) == size


def test_an_unknown_name_takes_the_callers_default() -> None:
    assert dtype_bytes("c10::complex<float>") == 4
    assert dtype_bytes("c10::complex<float>", default=0) == 0
