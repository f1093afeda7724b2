"""`train_mode_inference`: a model served without `model.eval()` (and without no_grad) runs
dropout and batch norm's training work on every request. A trial's CNN lost 16% of each
request to them and no finding said so; its steps were called training steps."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_runner import median_step, record_variants
from neuron_explorer import load

pytestmark = pytest.mark.slow
PROGRAM = Path(__file__).parent / "programs" / "cnn_serve.py"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory):
    paths = record_variants(tmp_path_factory.mktemp("train_mode"), PROGRAM,
                            {"train_mode": [], "eval": ["--eval"]}, modelled=True)
    return {name: load(path) for name, path in paths.items()}



def test_the_finding_claims_what_eval_mode_saves(recorded) -> None:
    trace = recorded["train_mode"]
    (f,) = [f for f in trace.bottlenecks() if f.rule_id == "train_mode_inference"]
    saved = median_step(trace) - median_step(recorded["eval"])
    assert saved > 0
    assert f.time_lost_ns / f.steps == pytest.approx(saved, rel=0.15)
    assert "model.eval()" in f.recommendation and "inference_mode" in f.recommendation
    assert "not the trained model's" in f.explanation


def test_a_run_that_never_trains_serves(recorded) -> None:
    assert set(recorded["train_mode"].phases()["phase"]) == {"eval"}
    assert not [f for f in recorded["eval"].bottlenecks() if f.rule_id == "train_mode_inference"]


def test_a_served_models_launches_are_its_forward(recorded) -> None:
    """short_kernel_sequence split a served model's launches into "the model's forward and
    backward", of a run with no backward."""
    (f,) = [f for f in recorded["train_mode"].bottlenecks()
            if f.rule_id == "short_kernel_sequence"]
    assert "the model's forward (compiling fuses those)" in f.explanation
    assert "backward" not in f.explanation


def test_a_served_read_the_host_did_not_wait_at_is_not_told_to_be_hidden(recorded) -> None:
    """Each request's `.cpu()` of its answer: the device had finished, the host waited 0 ns.
    The advice for a server was to hide the read behind the next request's launch; a trial
    did so and saved nothing (the time is the read itself)."""
    (f,) = [f for f in recorded["eval"].bottlenecks() if f.rule_id == "sync_in_step"]
    assert "(a server), keep that read; the host waited 0 ns" in f.recommendation
    assert "hides nothing" in f.recommendation
    assert "launch the next step's work before reading" not in f.recommendation


def test_a_compiled_model_serving_in_training_mode_is_named(tmp_path) -> None:
    """Compiled, the training-mode work runs inside the graph (AOTAutograd's batch norm
    with batch statistics, its dropout): a trial's compiled CNN served so got no finding,
    though its outputs were not the trained model's."""
    trace = load(record_variants(tmp_path, PROGRAM, {"compiled": ["--compile"]},
                                 modelled=True)["compiled"])
    (f,) = [f for f in trace.bottlenecks() if f.rule_id == "train_mode_inference"]
    assert "dropout zeroes values at random (1 a step)" in f.explanation
    assert "running ones (2 a step)" in f.explanation
    assert "In its compiled graph" in f.explanation
    assert f.recommendation.startswith("Call model.eval() before serving")
    assert f.evidence and "graph_1_forward" in f.evidence[0]["description"]


@pytest.mark.parametrize("layout", [[], ["--seq-first"]])
def test_eval_mode_claims_the_encoder_layers_fast_path_where_it_is_taken(tmp_path,
                                                                         layout) -> None:
    """Without grad, eval mode sends each batch-first nn.TransformerEncoderLayer down
    torch's fast path, one fused op a layer: a trial's server was told dropout's 0.5 ms a
    step and saved 4.4 ms. Layers built seq-first (the default) never take it: their claim
    is dropout's alone. Both claims are what eval mode saved (`programs/served_encoder.py`,
    modelled clock)."""
    f, saved = _claimed_and_saved(tmp_path, "served_encoder.py", layout)
    assert ("fast path" in f.explanation) == (not layout), f.explanation
    assert "enable_nested_tensor=False" in f.recommendation or layout
    assert f.time_lost_ns / f.steps == pytest.approx(saved, rel=0.1), (f.time_lost_ns, saved)


def _claimed_and_saved(folder: Path, program: str, layout: list[str]):
    """A served program recorded in training mode and with --eval: train mode's finding,
    and the median step eval mode saved."""
    paths = record_variants(folder, Path(__file__).parent / "programs" / program,
                            {"train": layout, "eval": [*layout, "--eval"]}, modelled=True)
    train, in_eval = load(paths["train"]), load(paths["eval"])
    (f,) = [f for f in train.bottlenecks() if f.rule_id == "train_mode_inference"]
    return f, median_step(train) - median_step(in_eval)


@pytest.mark.parametrize("layout", [[], ["--seq-first"]])
def test_an_image_models_fast_path_is_told_by_its_attention(tmp_path, layout) -> None:
    """An image model's batch is never known from token ids: its layers' layout is told by
    batch_first attention turning (B, T, D) into (T, B, D). A trial's ViT server was
    claimed dropout's 0.5 ms a step where eval mode saved 4.1 (`programs/served_patches.py`,
    modelled clock)."""
    f, saved = _claimed_and_saved(tmp_path, "served_patches.py", layout)
    assert ("fast path" in f.explanation) == (not layout), f.explanation
    assert f.time_lost_ns / f.steps == pytest.approx(saved, rel=0.1), (f.time_lost_ns, saved)


def test_a_compiled_models_fast_path_is_no_slower_than_its_layers(tmp_path) -> None:
    """Compiled in eval mode, each encoder layer is torch's one fused op: the compile path
    takes it as the layer's ops (`backend/fast_path_layers.py`), as with the fast path off.
    Lowered as one op, it made a trial's compiled server 34% slower after model.eval(),
    which the finding had advised; the outputs are the same either way."""
    program = Path(__file__).parent / "programs" / "served_patches.py"
    paths = record_variants(tmp_path, program, {
        "fast": ["--compile", "--eval"], "layers": ["--compile", "--eval", "--no-fast-path"],
        "train": ["--compile"]}, modelled=True)
    fast, layers, train = (load(paths[name]) for name in ("fast", "layers", "train"))
    assert median_step(fast) == pytest.approx(median_step(layers), rel=0.02)
    assert median_step(fast) <= median_step(train) * 1.02
    (f,) = [f for f in train.bottlenecks() if f.rule_id == "train_mode_inference"]
    assert f.time_lost_ns == 0  # dropout inside the graph: no time to save, and none lost
