"""Advice names the APIs of the device the trace ran on: a GPU or MTIA trace from
PyTorch's profiler is not told to compile with backend="neuron" or to make tensors with
device='neuron' (it was, on every real trace), and our own traces still are."""

from __future__ import annotations

import pytest
from neuron_explorer.device_terms import device_terms

A100 = "critical_path__alexnet__benchmark_result_2869224_1695835535_trace.json.gz"
MI250 = "amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz"
MTIA = "mtia_trace_single_rank__mtia_rank_0.json.gz"
CPU = "cpu_only__rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"
NCCL = "trace_filter__sampled_rank-0.json.gz"


def recommendations(trace, rule_id: str) -> list[str]:
    return [f.recommendation for f in trace.bottlenecks() if f.rule_id == rule_id]


@pytest.mark.parametrize("name, device", [(A100, "cuda"), (MI250, "cuda"), (MTIA, "mtia"),
                                          (CPU, "cpu"), (NCCL, "cuda")])
def test_the_device_of_each_real_trace(load_real, name: str, device: str) -> None:
    terms = device_terms(load_real(name).metadata)
    assert terms.device == device and not terms.recorded_here


# (AlexNet's A100 trace is mostly start-up: it has no host-bound finding to advise on)
@pytest.mark.parametrize("name", [MI250, NCCL])
def test_a_gpu_trace_is_told_to_compile_for_its_gpu(load_real, name: str) -> None:
    (text,) = recommendations(load_real(name), "host_bound")
    assert "backend=\"neuron\"" not in text and "neuron-explorer" not in text
    assert "torch.compile(...)" in text and 'mode="reduce-overhead"' in text


def test_an_mtia_trace_makes_its_tensors_on_mtia(load_real) -> None:
    (text,) = recommendations(load_real(MTIA), "host_device_copies")
    assert "device='mtia'" in text and "neuron" not in text


def test_our_traces_keep_the_neuron_advice(repo_root) -> None:
    import neuron_explorer

    trace = neuron_explorer.load(repo_root / "sample_traces" / "mlp_eager.pftrace")
    assert device_terms(trace.metadata).device == "neuron"
    (text,) = recommendations(trace, "host_bound")
    assert 'torch.compile(..., backend="neuron")' in text and "reduce-overhead" not in text
    # the MLP's matmuls are too small for autocast's casts to pay: a larger one's advice
    fp32_trace = neuron_explorer.load(repo_root / "sample_traces" / "fp32_matmul.pftrace")
    (fp32,) = recommendations(fp32_trace, "fp32_matmul")
    assert "torch.autocast('neuron'" in fp32


def test_pinned_memory_is_advised_only_where_it_exists() -> None:
    assert device_terms({"deviceProperties": [{"name": "NVIDIA H100"}]}).pinned_memory
    assert not device_terms({"neuron_explorer_version": "0.1"}).pinned_memory
    assert device_terms({}).device == "" and device_terms({}).name == "<your device>"
