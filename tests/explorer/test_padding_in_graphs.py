"""`tensor_engine_padding` on compiled graphs reads the graph's matmuls' own dims.

A compiled graph runs as one kernel whose op lists the graph's inputs: an embedding table
(a vocabulary of 8000, just past a multiple of 128) among them, though no matmul tiles it.
The rule took those inputs for matmul dims and claimed 15 us a step for padding that only
a smaller vocabulary would save, which saves nothing. Each section of a compiled program
now records its matmuls' operand shapes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_runner import record_variants
from neuron_explorer import load
from neuron_explorer.common import trace_format as tf

pytestmark = pytest.mark.slow
PROGRAM = Path(__file__).parent / "programs" / "bag_classifier.py"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory):
    paths = record_variants(tmp_path_factory.mktemp("padding_graphs"), PROGRAM,
                            {"under_a_tile": ["--width", "96"],
                             "past_a_multiple": ["--width", "160"]}, modelled=True)
    return {name: load(path) for name, path in paths.items()}


def _padding(trace):
    return [f for f in trace.bottlenecks() if f.rule_id == "tensor_engine_padding"]


def test_an_embedding_tables_vocabulary_is_no_matmul_dim(recorded) -> None:
    trace = recorded["under_a_tile"]
    graphs = trace.kernels[trace.kernels["name"].astype(str).str.startswith("graph_")]
    assert (graphs["hw_flops"] > 1.2 * graphs["flops"]).all()  # padded: width 96
    assert _padding(trace) == []  # 96 is one tile at any size; 8000 is no matmul's


def test_a_graphs_sections_name_their_matmuls_shapes(recorded) -> None:
    trace = recorded["past_a_multiple"]
    graph = trace.kernels[trace.kernels["name"].astype(str).str.startswith("graph_")].iloc[0]
    (text,) = trace.slice_args.texts(tf.ARG_SECTIONS, [int(graph["id"])])
    shapes = [row[5] for row in json.loads(text) if row[4]]
    assert "[[160], [8192, 160], [160, 160]]" in shapes  # addmm: bias, input, weight^T
    (finding,) = _padding(trace)
    assert "dims [160]" in finding.explanation
    assert "8000" not in finding.explanation


def test_a_layer_run_as_one_op_gives_its_weights_dims_not_the_tables(tmp_path) -> None:
    """At inference nn.TransformerEncoderLayer runs as one op with its matmuls inside: its
    section records its operands' shapes (the QKV projection's 288 = 3 x 96 among them),
    and the embedding table's 8000 rows are still no matmul dim."""
    trace = load(record_variants(tmp_path, PROGRAM, {"encoder": [
        "--encoder", "--width", "96", "--batch", "64"]}, modelled=True)["encoder"])
    (finding,) = _padding(trace)
    assert "288" in finding.explanation and "8000" not in finding.explanation
