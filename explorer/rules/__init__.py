"""Bottleneck rules: one module per rule, each `check(trace) -> list[Finding]`.

Thresholds live in `thresholds.py`. A rule that needs data the trace lacks (no
engines in a PyTorch-profiler trace, no hardware figures) returns no findings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from neuron_explorer.rules import (
    accumulation_all_reduce,
    cast_round_trip,
    checkpoint_recompute,
    compile_dominates,
    converted_uploads,
    dataloader_stall,
    dependency_idle,
    eager_beside_graphs,
    engine_imbalance,
    exposed_communication,
    fp32_matmul,
    frozen_train_mode,
    host_bound,
    host_device_copies,
    host_fallback,
    joined_calls,
    kernel_dma_not_pipelined,
    kernel_matmul_tile_shape,
    kernel_memory_pressure,
    kernel_small_dma,
    launch_delay,
    layout_copies,
    memory_bound_ops,
    memory_near_capacity,
    optimizer_recreated,
    parameter_loop,
    python_loop,
    queued_idle,
    recompilation,
    shape_recompiles,
    short_kernel_sequence,
    small_dma,
    sync_in_step,
    tensor_engine_padding,
    train_mode_inference,
    unbatched_calls,
    unfused_optimizer,
    zeroed_gradients,
)
from neuron_explorer.rules.finding import Finding, Findings, ranked, step_time
from neuron_explorer.rules.shared_causes import with_shared_causes

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace

RULES = (host_bound, sync_in_step, host_fallback, host_device_copies, dataloader_stall,
         memory_bound_ops, tensor_engine_padding, fp32_matmul, engine_imbalance, small_dma,
         recompilation, shape_recompiles, compile_dominates, memory_near_capacity,
         exposed_communication, dependency_idle, queued_idle, launch_delay, short_kernel_sequence,
         kernel_dma_not_pipelined, kernel_memory_pressure, kernel_matmul_tile_shape,
         kernel_small_dma, checkpoint_recompute, zeroed_gradients, accumulation_all_reduce,
         optimizer_recreated, python_loop, parameter_loop, unfused_optimizer, train_mode_inference,
         frozen_train_mode, converted_uploads, layout_copies, cast_round_trip, unbatched_calls,
         joined_calls, eager_beside_graphs)
RULE_IDS = tuple(rule.RULE_ID for rule in RULES)
# rules whose share of time is not of the steps (compile time), as each declares it
SHARE_BASES = {rule.RULE_ID: rule.SHARE_BASE for rule in RULES if hasattr(rule, "SHARE_BASE")}


def run_rules(trace: Trace) -> Findings:
    """Every rule's findings, ranked by time lost (a finding that needs another fix first
    right after that fix's), then severity."""
    findings: list[Finding] = []
    if ran_nothing(trace):
        return ranked(findings)
    for rule in RULES:
        findings.extend(rule.check(trace))
    return ranked(with_shared_causes(trace, findings))


def ran_nothing(trace: Trace) -> bool:
    """Whether the analysed steps last no time: nothing to weigh a cause against. A program
    that raised in its first step on the modelled clock, which counts no compiling (a
    failed torch.compile), left a 0 ns step, and its report ranked the model's upload as a
    bottleneck of it."""
    return bool(len(trace.steps)) and step_time(trace) <= 0


__all__ = ["RULES", "RULE_IDS", "SHARE_BASES", "Finding", "Findings", "ran_nothing", "run_rules"]
