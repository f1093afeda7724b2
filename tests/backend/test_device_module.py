"""`torch.neuron`: device selection, random state, memory statistics, properties."""

from __future__ import annotations

import gc

import pytest
import torch


def test_device_selection():
    assert torch.neuron.is_available()
    assert torch.neuron.device_count() == 8
    assert torch.neuron.current_device() == 0
    torch.neuron.set_device(2)
    try:
        assert torch.neuron.current_device() == 2
        with torch.neuron.device(3):
            assert torch.neuron.current_device() == 3
        assert torch.neuron.current_device() == 2
    finally:
        torch.neuron.set_device(0)
    with pytest.raises(RuntimeError, match="neuron:9 does not exist"):
        torch.neuron.set_device(9)


def test_properties_like_cuda():
    props = torch.neuron.get_device_properties(0)
    assert props.name == "Trainium2 NeuronCore-v3 (simulated)"
    assert props.total_memory == 12 * 2**30  # 96 GiB over 8 cores
    assert props.preset == "trn2"
    assert props.tensor_peak_flops["bfloat16"] == pytest.approx(2 * 128 * 128 * 2.4e9)
    assert torch.neuron.get_device_name("neuron:1") == props.name
    free, total = torch.neuron.mem_get_info()
    assert total == props.total_memory and 0 < free <= total


def test_rng_state_round_trip_and_seeding():
    torch.neuron.manual_seed(123)
    state = torch.neuron.get_rng_state()
    a = torch.rand(5, device="neuron").cpu()
    torch.neuron.set_rng_state(state)
    b = torch.rand(5, device="neuron").cpu()
    assert torch.equal(a, b)
    torch.manual_seed(7)  # seeds every device too, as for CUDA
    c = torch.rand(5, device="neuron").cpu()
    torch.manual_seed(7)
    assert torch.equal(c, torch.rand(5, device="neuron").cpu())
    torch.manual_seed(8)
    assert not torch.equal(c, torch.rand(5, device="neuron").cpu())


def test_memory_counts_live_tensors_and_frees_them():
    gc.collect()
    base = torch.neuron.memory_allocated()
    torch.neuron.reset_peak_memory_stats()
    x = torch.empty(1024, 1024, device="neuron")  # 4 MiB
    assert torch.neuron.memory_allocated() == base + 4 * 2**20
    y = x * 2
    assert torch.neuron.memory_allocated() == base + 8 * 2**20
    view = x[0]  # views share storage: no new memory
    assert torch.neuron.memory_allocated() == base + 8 * 2**20
    del x, y, view
    gc.collect()
    assert torch.neuron.memory_allocated() == base
    assert torch.neuron.max_memory_allocated() == base + 8 * 2**20
    stats = torch.neuron.memory_stats()
    assert stats["allocated_bytes.all.current"] == base
    assert stats["allocated_bytes.all.peak"] == base + 8 * 2**20


def test_out_of_memory_is_worded_like_cuda():
    too_big = 13 * 2**30 // 4  # float32 elements: more than the 12 GiB per core
    with pytest.raises(torch.OutOfMemoryError) as err:
        torch.empty(too_big, device="neuron")
    message = str(err.value)
    assert "Tried to allocate 13.00 GiB" in message
    assert "total capacity of 12.00 GiB" in message
    assert "allocated by PyTorch" in message and "smaller batch size" in message
    assert torch.neuron.memory_stats()["num_ooms"] >= 1
    assert torch.ones(2, device="neuron").sum().item() == 2.0  # the device still works


def test_synchronize_runs():
    x = torch.randn(64, 64, device="neuron")
    y = x @ x
    torch.neuron.synchronize()
    torch.neuron.synchronize("neuron:0")
    assert torch.allclose(y.cpu(), x.cpu() @ x.cpu(), atol=1e-4)


def test_a_bare_device_name_and_the_current_device():
    x = torch.randn(3)
    torch.neuron.set_device(1)
    try:
        # Our kernels see the missing index and use the current device.
        assert torch.empty(3, device="neuron").device == torch.device("neuron", 1)
        assert torch.zeros(3, device="neuron").device == torch.device("neuron", 1)
        assert x.neuron().device == torch.device("neuron", 1)
        # PyTorch fills the index of `.to` from the Python device guard, which always
        # answers 0 (see the device module's docstring); an explicit index works.
        assert x.to("neuron").device == torch.device("neuron", 0)
        assert x.to("neuron:1").device == torch.device("neuron", 1)
    finally:
        torch.neuron.set_device(0)
