"""fp32 matmuls inside torch.compile(backend="neuron") graphs (#12 item 4): under autocast an
attention bmm kept in fp32 is flagged, through `neuron-explorer record` and `report`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import neuron_explorer
import pytest
from cli_runner import record_variants, run_cli
from neuron_explorer.analyses.compiled_sections import compiled_matmuls

pytestmark = pytest.mark.slow
PROGRAM = Path(__file__).parent / "programs" / "compiled_attention_autocast.py"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory):
    return record_variants(tmp_path_factory.mktemp("compiled_fp32"), PROGRAM,
                           {"fp32": ["fp32"], "bf16": ["bf16"]})


def _fp32_finding(path: Path) -> dict | None:
    report = json.loads(run_cli("report", "--format", "json", str(path), cwd=path.parent))
    return next((f for f in report["findings"] if f["rule_id"] == "fp32_matmul"), None)


def test_a_compiled_attention_bmm_kept_in_fp32_is_flagged(recorded) -> None:
    matmuls = compiled_matmuls(neuron_explorer.load(recorded["fp32"]))
    dtypes = dict(zip(matmuls["name"], matmuls["dtype"], strict=False))
    assert dtypes["aten::bmm"] == "float32" and dtypes["aten::addmm"] == "bfloat16", dtypes

    finding = _fp32_finding(recorded["fp32"])
    assert finding is not None, "the fp32 bmm inside the compiled graph is flagged"
    assert any("aten::bmm in float32 inside compiled graph_" in e["description"]
               for e in finding["evidence"]), finding["evidence"]
    assert "Other matmuls of this run ran in bfloat16" in finding["explanation"]
    assert re.search(r"Run aten::bmm at \S*compiled_attention_autocast\.py:24 in bfloat16: it "
                     r"ran outside autocast",
                     finding["recommendation"]), finding["recommendation"]
    # a compiled run with only a larger batch left for its host: the claim is the run
    # replayed with the bmm's graphs shortened (the host's Python sets most steps on the
    # measured clock, a step whose loss read waits on the graph saves its part), not the
    # device time "after the host-bound fix"
    assert finding["after"] == ""
    assert finding["saving_basis"].startswith(
        "replay: the run replayed with each compiled graph's run shortened"), finding
    assert 0 <= finding["time_lost_ns"] <= finding["symptom_ns"]


def test_the_same_graph_with_its_bmm_in_bf16_is_not_flagged(recorded) -> None:
    matmuls = compiled_matmuls(neuron_explorer.load(recorded["bf16"]))
    assert set(matmuls["dtype"]) == {"bfloat16"}
    assert _fp32_finding(recorded["bf16"]) is None


def test_a_compiled_graphs_roofline_dtype_is_its_matmuls_mix(recorded) -> None:
    """Graphs under autocast showed as float32 in the roofline (the dtype of their first
    input) and were advised bf16: their dtype is now the mix of their matmuls'."""
    mixed = neuron_explorer.load(recorded["fp32"]).roofline()
    graphs = mixed[mixed["name"].str.startswith("graph:")]
    assert set(graphs["dtype"]) >= {"bfloat16+float32"} or \
        set(graphs["dtype"]) >= {"float32+bfloat16"}, graphs[["name", "dtype"]]
    bf16 = neuron_explorer.load(recorded["bf16"]).roofline()
    graphs = bf16[bf16["name"].str.startswith("graph:")]
    assert "bfloat16" in set(graphs["dtype"]) and "float32" not in set(graphs["dtype"])


def test_a_token_model_is_not_told_to_cast_its_inputs(repo_root) -> None:
    """Every upload of the compiled GPT's steps is of token ids, which a model cast to
    bfloat16 takes as they are: a compiled LSTM's advice said to cast them too. The CNN's
    images (float) are told to be cast on the host (`test_fp32_matmul_autocast.py`)."""
    gpt = neuron_explorer.load(repo_root / "sample_traces" / "gpt_compiled.pftrace")
    (f,) = [f for f in gpt.bottlenecks() if f.rule_id == "fp32_matmul"]
    assert f.recommendation.startswith("Cast the model to bfloat16 whole")
    assert "integer ids" in f.recommendation and "with its inputs" not in f.recommendation
    assert "Cast the inputs on the host" not in f.recommendation
