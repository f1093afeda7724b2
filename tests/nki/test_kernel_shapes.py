"""A kernel's profile is per set of input shapes, the most-run first: a first call on a
small correctness case (300 x 512) no longer describes the kernel's typical call."""

from __future__ import annotations

import sys
from pathlib import Path

import neuron_explorer
import pytest
import torch
from neuron_explorer.analyses.kernel_lines import kernel_shapes
from neuron_explorer.kernel_report import kernel_dict, kernel_summary
from neuron_explorer.report import render_report

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "nki"))
import norms


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("shapes") / "shapes.pftrace"
    gen = torch.Generator().manual_seed(0)
    with neuron_explorer.record(path, level="engine", quiet=True):
        small = torch.randn(300, 512, generator=gen).to("neuron")
        norms.rms_norm(small, torch.ones(1, 512).to("neuron"))  # the correctness call
        big = torch.randn(384, 1024, generator=gen).to("neuron")
        g = torch.ones(1, 1024).to("neuron")
        for _ in range(3):
            norms.rms_norm(big, g)
        torch.neuron.synchronize()
        neuron_explorer.step()
    return neuron_explorer.load(path)


def test_runs_are_grouped_by_shape_most_run_first(trace):
    groups = kernel_shapes(trace, "rms_norm")
    assert groups["shapes"].tolist() == ["[[384, 1024], [1, 1024]]", "[[300, 512], [1, 512]]"]
    assert groups["runs"].tolist() == [3, 1]


def test_the_profile_describes_the_typical_call_and_each_shape_has_its_own(trace):
    typical = kernel_summary(trace, "rms_norm")
    small = kernel_summary(trace, "rms_norm", "[[300, 512], [1, 512]]")
    assert typical["shapes"] == "[[384, 1024], [1, 1024]]" and typical["runs"] == 3
    assert small["runs"] == 1 and small["duration_ns"] < typical["duration_ns"]
    assert typical["dma_median_bytes"] == 2 * small["dma_median_bytes"]  # its own run's rows
    text = render_report(trace, "text")
    first = text.index("Kernel rms_norm: profile at [[384, 1024], [1, 1024]]")
    assert first < text.index("Kernel rms_norm: profile at [[300, 512], [1, 512]]")
    (entry,) = kernel_dict(trace)
    assert [s["shapes"] for s in entry["by_shape"]] == [typical["shapes"], small["shapes"]]
