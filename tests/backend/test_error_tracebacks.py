"""An op's own error (a shape mismatch, out of memory) reads as on a built-in device: the
CPU's message, and a traceback that ends at the user's call, not inside the emulation."""

from __future__ import annotations

import traceback
from pathlib import Path

import neuron_explorer.backend
import pytest
import torch

BACKEND = str(Path(neuron_explorer.backend.__file__).parent)


def _backend_frames(error: BaseException) -> list[str]:
    return [f"{f.filename}:{f.lineno} in {f.name}"
            for f in traceback.extract_tb(error.__traceback__)
            if f.filename.startswith(BACKEND)]


def test_a_shape_mismatch_ends_at_the_users_call() -> None:
    a, b = torch.randn(4, 5), torch.randn(6, 3)
    with pytest.raises(RuntimeError) as on_cpu:
        torch.nn.functional.linear(a, b)
    with pytest.raises(RuntimeError) as on_device:
        torch.nn.functional.linear(a.to("neuron"), b.to("neuron"))
    assert str(on_device.value) == str(on_cpu.value)
    assert len(_backend_frames(on_device.value)) <= 1, _backend_frames(on_device.value)


def test_an_index_error_from_the_fallback_ends_at_the_users_call() -> None:
    x = torch.arange(4.0, device="neuron")
    with pytest.raises(IndexError) as caught:
        x.index_select(0, torch.tensor([7], device="neuron"))
    assert "out of range" in str(caught.value)
    assert len(_backend_frames(caught.value)) <= 1, _backend_frames(caught.value)


def test_out_of_memory_ends_at_the_users_call() -> None:
    capacity = torch.neuron.get_device_properties().total_memory
    with pytest.raises(torch.OutOfMemoryError) as caught:
        # one byte over: exactly the capacity fits when nothing else is held
        torch.empty(capacity + 1, dtype=torch.uint8, device="neuron")
    assert "neuron out of memory" in str(caught.value)
    assert len(_backend_frames(caught.value)) <= 2, _backend_frames(caught.value)
    with pytest.raises(torch.OutOfMemoryError) as caught:  # the size rule, before the host op
        torch.ones(1, device="neuron").expand(capacity) + 1  # a view: no memory
    assert len(_backend_frames(caught.value)) <= 1, _backend_frames(caught.value)


def test_a_nested_tensor_says_what_makes_it_and_the_fix() -> None:
    """In eval mode under no_grad, nn.TransformerEncoder given a padding mask packs the
    batch into a nested tensor (its fast path): a trial's server crashed with "Internal
    error: NestedTensorImpl doesn't support sizes" once told to call model.eval()."""
    torch.manual_seed(0)
    ids = torch.randn(2, 5, 16).to("neuron")
    pad = torch.tensor([[False] * 5, [False] * 3 + [True] * 2]).to("neuron")

    def encoder(nested: bool) -> torch.nn.Module:
        layer = torch.nn.TransformerEncoderLayer(16, 2, 32, batch_first=True)
        return torch.nn.TransformerEncoder(layer, 1, enable_nested_tensor=nested).to(
            "neuron").eval()

    with torch.no_grad():
        with pytest.raises(NotImplementedError, match="enable_nested_tensor=False") as raised:
            encoder(True)(ids, src_key_padding_mask=pad)
        assert len(_backend_frames(raised.value)) <= 1, _backend_frames(raised.value)
        out = encoder(False)(ids, src_key_padding_mask=pad)  # the fix runs
    assert out.shape == (2, 5, 16)
