"""On a host-bound run, findings whose time lost is device time say that it is not step time.

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


@pytest.mark.parametrize(("trace", "rule"), [("mlp_eager.pftrace", "small_dma"),
                                             ("odd_dims.pftrace", "memory_bound_ops"),
                                             ("odd_dims.pftrace", "tensor_engine_padding")])
def test_device_time_finding_on_a_host_bound_run_says_so(repo_root: Path, trace: str,
                                                         rule: str) -> None:
    findings = {f.rule_id: f for f in neuron_explorer.load(
        repo_root / "sample_traces" / trace).bottlenecks()}
    assert "host_bound" in findings, "the sample is host-bound"
    assert rule in findings
    assert NOTE in findings[rule].explanation
