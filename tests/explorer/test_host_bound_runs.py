"""Findings on host-bound runs: the advice fits what the run already does, and findings
whose time lost is device time say that it is not step time.

The device of such a run idles most of the step waiting for launches, so making its kernels
faster does not shorten the step until the host launches faster: a finding that counts
device time as "% of step time" lost, with no word of it, adds up past the step with the
host-bound finding itself.
"""

from __future__ import annotations

from pathlib import Path

import neuron_explorer
import pytest

NOTE = "The run is host-bound now, so this is device time rather than step time"


@pytest.mark.parametrize(("trace", "rule"), [("near_memory.pftrace", "fp32_matmul"),
                                             ("odd_dims.pftrace", "tensor_engine_padding")])
def test_device_time_finding_on_a_host_bound_run_says_so(repo_root: Path, trace: str,
                                                         rule: str) -> None:
    findings = {f.rule_id: f for f in neuron_explorer.load(
        repo_root / "sample_traces" / trace).bottlenecks()}
    assert "host_bound" in findings, "the sample is host-bound"
    assert rule in findings
    assert NOTE in findings[rule].explanation


def test_the_fused_optimizers_saving_is_stated_once(repo_root: Path) -> None:
    """near_memory's AdamW runs foreach passes on a host-bound eager run: unfused_optimizer
    states what fused=True saves, and memory_bound_ops, whose fix was that fused=True,
    does not state it again as device time (the host-bound finding's headline, the
    compiled replay's, leaves the optimizer out)."""
    findings = {f.rule_id: f for f in neuron_explorer.load(
        repo_root / "sample_traces" / "near_memory.pftrace").bottlenecks()}
    assert "host_bound" in findings and "unfused_optimizer" in findings
    assert "fused=True" not in getattr(findings.get("memory_bound_ops"), "recommendation", "")


def test_host_bound_advice_on_a_compiled_window_knows_the_model_is_compiled(
        repo_root: Path) -> None:
    """gpt_compiled was recorded with --steps 2:4: its compile spans are outside the window,
    but its ops are graph launches, so "wrap the model in torch.compile" does not fit."""
    trace = neuron_explorer.load(repo_root / "sample_traces" / "gpt_compiled.pftrace")
    assert len(trace.compile_summary()["graphs"]) == 0
    host_bound = next(f for f in trace.bottlenecks() if f.rule_id == "host_bound")
    assert "The model is already compiled" in host_bound.recommendation
    # its foreach AdamW is about half of what the host launches (47%): that comes first
    assert host_bound.recommendation.startswith("The largest part of the host's launches is "
                                                "the optimizer's step (8 ops a step, 47%")


def test_an_eager_ddp_rank_is_told_to_compile_the_module_ddp_wraps(repo_root: Path) -> None:
    """Told to "wrap the model", a user compiled DDP's wrapper, which Dynamo runs eagerly:
    nothing saved, where DDP(torch.compile(model)) saved 3.58 ms a step."""
    samples = repo_root / "sample_traces"
    ddp = neuron_explorer.load(samples / "ddp.run" / "rank0.pftrace")
    (f,) = [f for f in ddp.bottlenecks() if f.rule_id == "host_bound"]
    assert "wrap the module DDP wraps, before wrapping it (DDP(torch.compile(model))" in \
        f.recommendation
    (f,) = [f for f in neuron_explorer.load(samples / "mlp_eager.pftrace").bottlenecks()
            if f.rule_id == "host_bound"]
    assert "wrap the model or the training step in torch.compile" in f.recommendation


def test_memory_near_capacity_names_a_resident_tensor_first(repo_root: Path) -> None:
    """near_memory.pftrace reserves one 11 GiB tensor before its loop, 99% of the peak: the
    advice was all about activations (a user's checkpointing of every block, as advised,
    took a 92% peak to 88% for 17% slower steps), and did not say checkpointing costs."""
    (f,) = [f for f in neuron_explorer.load(repo_root / "sample_traces" / "near_memory.pftrace")
            .bottlenecks() if f.rule_id == "memory_near_capacity"]
    assert f.recommendation.startswith("99% of the peak is one tensor made outside the model "
                                       "(aten::empty, 11059 MiB)"), f.recommendation
    assert "runs their forwards again in the backward (slower steps)" in f.recommendation


@pytest.mark.slow
def test_a_read_in_torchs_transformer_is_named_before_compiling(tmp_path: Path) -> None:
    """The compiled prediction compiles the forward whole; nn.Transformer reads its mask on
    the host to check that it is causal, and Dynamo breaks the graph there: a trial's
    seq2seq model was claimed 128 ms a step by compiling and saved 2.6 until it passed
    tgt_is_causal=True (then 130). The finding names the read, torch's function and the argument."""
    from cli_runner import record_variants

    program = Path(__file__).parent / "programs" / "masked_transformer.py"
    paths = record_variants(tmp_path, program, {"mask": [], "causal": ["--causal"]},
                            modelled=True)
    said = {name: [f.recommendation for f in neuron_explorer.load(p).bottlenecks()
                   if f.rule_id == "host_bound"] for name, p in paths.items()}
    (advice,) = said["mask"]
    assert "inside torch's `Transformer.forward`" in advice, advice
    assert "tgt_is_causal=True" in advice
    assert all("reads a device value" not in a for a in said["causal"]), said["causal"]
