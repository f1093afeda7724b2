"""Requests served a model call each are named with what batching them saves, against a
recording of the batched server (`programs/served_classifier.py`, modelled clock: the same
times every run). A classifier served one request a call was told to compile, and to batch
in a clause; one batch of its 16 requests saved 1.5x the figure it was given."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_runner import record_variants
from neuron_explorer import load
from neuron_explorer.analyses.steady_state import in_analysed_steps

pytestmark = pytest.mark.slow  # eight recordings
PROGRAM = Path(__file__).parent / "programs" / "served_classifier.py"


def _analysed_ns(trace) -> int:
    return int(in_analysed_steps(trace, trace.steps)["dur"].sum())


def test_serving_a_request_a_call_claims_what_batching_eight_saves(tmp_path) -> None:
    paths = record_variants(tmp_path, PROGRAM, {"one": [], "eight": ["--per-call", "8"]},
                            modelled=True)
    one, eight = load(paths["one"]), load(paths["eight"])
    (f,) = [f for f in one.bottlenecks() if f.rule_id == "unbatched_calls"]
    assert f.title == "Requests served a model call each (16 calls)"
    assert f.recommendation.startswith("Serve batches of up to 8 requests")
    assert f.evidence[0]["description"] == "the model's call in step 0, one of 16"
    saved = _analysed_ns(one) - _analysed_ns(eight)
    assert f.time_lost_ns == pytest.approx(saved, rel=0.1), (f.time_lost_ns, saved)
    # two calls of eight: too few calls left to batch
    assert not [g for g in eight.bottlenecks() if g.rule_id == "unbatched_calls"]


def test_calls_that_batch_already_are_told_the_larger_batch_in_rows(tmp_path) -> None:
    """Four calls of four requests: batching them is one call of 16 rows (a server of 8 a
    call was told it served "a request a call" and to batch "up to 4")."""
    paths = record_variants(tmp_path, PROGRAM, {"four": ["--per-call", "4"],
                                                "sixteen": ["--per-call", "16"]},
                            modelled=True)
    four, sixteen = load(paths["four"]), load(paths["sixteen"])
    (f,) = [f for f in four.bottlenecks() if f.rule_id == "unbatched_calls"]
    assert f.title == "Model calls of 4 rows each (4 calls)"
    assert f.recommendation.startswith("Serve calls of up to 16 rows (4 of today's calls)")
    saved = _analysed_ns(four) - _analysed_ns(sixteen)
    assert f.time_lost_ns == pytest.approx(saved, rel=0.1), (f.time_lost_ns, saved)


def test_a_device_bound_model_uploaded_just_before_its_first_call(tmp_path) -> None:
    """Weights uploaded right before the first request are not its data: they grew with the
    batch in the first group's replay (a 512-row call's matmuls 59x longer), and the saving,
    10% of the run, read as none. The device runs behind the host here: the saving is of
    the run's span, to its last kernel."""
    size = ["--width", "2048", "--rows", "512"]
    paths = record_variants(tmp_path, PROGRAM, {"one": size, "eight": [*size, "--per-call", "8"]},
                            modelled=True)
    one, eight = load(paths["one"]), load(paths["eight"])
    (f,) = [f for f in one.bottlenecks() if f.rule_id == "unbatched_calls"]
    assert f.title == "Model calls of 512 rows each (16 calls)"
    saved = _span_ns(one) - _span_ns(eight)
    assert f.time_lost_ns == pytest.approx(saved, rel=0.15), (f.time_lost_ns, saved)


def test_a_compiled_server_claims_what_batching_its_graph_saves(tmp_path) -> None:
    """A compiled model's graph is one op with no key to lower at more rows: the replay
    gave up, and a compiled ViT server whose requests batched four at a time ran 3.4x
    faster was told only the host-bound finding's idle gaps (100 us a request, where
    batching saved 217). The backend builds each inference program over 8 calls' rows as
    it records. Each answer is read in the next call's step: the batch's read is the first
    call's, after its program."""
    common = ["--compile", "--rows", "4"]
    paths = record_variants(tmp_path, PROGRAM, {"one": common,
                                                "eight": [*common, "--per-call", "8"]},
                            modelled=True)
    one, eight = load(paths["one"]), load(paths["eight"])
    (f,) = [f for f in one.bottlenecks() if f.rule_id == "unbatched_calls"]
    assert f.title == "Model calls of 4 rows each (15 calls)"
    assert "compiled graph's program built again by the backend" in f.saving_basis
    assert "torch._dynamo.mark_dynamic" in f.recommendation
    calls = len(in_analysed_steps(one, one.steps))
    batched = calls / 8 * float(in_analysed_steps(eight, eight.steps)["dur"].median())
    saved = _analysed_ns(one) - batched
    assert f.time_lost_ns == pytest.approx(saved, rel=0.1), (f.time_lost_ns, saved)


def _span_ns(trace) -> int:
    steps, kernels = trace.steps, trace.kernels
    end = max(int((steps["ts"] + steps["dur"]).max()), int((kernels["ts"] + kernels["dur"]).max()))
    return end - int(steps["ts"].min())


def test_requests_of_one_row_among_the_others_still_batch(tmp_path) -> None:
    """A request of one row skips an op or two (its batch-first transposes are copies of
    nothing): three of them among 15 calls once refused the replay, which wanted all but
    two calls alike, and a ViT server whose requests 4x faster batched was told nothing of
    batching (`programs/served_patches.py`: 16 requests, three of one image)."""
    program = Path(__file__).parent / "programs" / "served_patches.py"
    sizes = "8,8,8,1,8,8,8,1,8,8,8,8,1,8,8,8"
    common = ["--eval", "--no-fast-path", "--sizes", sizes]
    paths = record_variants(tmp_path, program, {"one": common,
                                                "eight": [*common, "--group", "8"]},
                            modelled=True)
    one, eight = load(paths["one"]), load(paths["eight"])
    (f,) = [f for f in one.bottlenecks() if f.rule_id == "unbatched_calls"]
    assert "(8 of today's calls)" in f.recommendation, f.recommendation
    calls = len(in_analysed_steps(one, one.steps))
    # the analysed calls served eight a call, each as long as the batched server's
    batched = calls / 8 * float(in_analysed_steps(eight, eight.steps)["dur"].median())
    saved = _analysed_ns(one) - batched
    assert f.time_lost_ns == pytest.approx(saved, rel=0.1), (f.time_lost_ns, saved)
