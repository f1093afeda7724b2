"""What the copies finding says its fix saves, against recordings of the fix.

An upload in every step is two different problems. The same host tensor uploaded again
(a constant) can move to the device once, before the loop: its whole op goes. Data new
every step still has to reach the device: created there (or prefetched), its op stays
and only the transfer goes. The finding once replayed both without their ops: a script
drawing a fresh random batch on the host every step was promised 550 us, where making
it on the device ran 132 us slower (the device's random-number kernel costs as much as
the upload it saves). The recorder marks an upload of a tensor it uploaded before,
unchanged (`same_host_tensor`). On the modelled host clock both runs are the same
every time, so the figures are compared as they are.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from cli_runner import record_variants
from neuron_explorer import load
from neuron_explorer.common import trace_format as tf
from neuron_explorer.rules.finding import step_time

pytestmark = pytest.mark.slow
PROGRAM = Path(__file__).parent / "programs" / "small_mlp.py"
SHAPE = ["2", "--width", "256", "--batch", "1024"]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict:
    folder = tmp_path_factory.mktemp("copies")
    paths = record_variants(folder, PROGRAM, {v: [*SHAPE, "--input", v] for v in
                                              ("once", "every-step", "fresh", "on-device",
                                               "rebuilt")},
                            modelled=True)
    return {name: load(path) for name, path in paths.items()}


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The default 32 x 64 input (8 KiB: small enough for its values to be compared)."""
    folder = tmp_path_factory.mktemp("small_copies")
    variants = {v: ["2", "--input", v] for v in ("once", "rebuilt", "pieces", "stacked")}
    paths = record_variants(folder, PROGRAM, variants | {
        "labels": ["2", "--input", "fresh", "--labels"]}, modelled=True)
    return {name: load(path) for name, path in paths.items()}


def _finding(trace):
    return [f for f in trace.bottlenecks() if f.rule_id == "host_device_copies"]


def test_a_constant_uploaded_every_step_saves_its_whole_copy(recorded) -> None:
    trace = recorded["every-step"]
    ops = trace.ops[trace.ops["name"] == "aten::_to_copy"]
    marked = trace.slice_args.column(tf.ARG_SAME_HOST_TENSOR, ops["id"].to_numpy())
    # the model's and the input's first uploads are not marked; the input's upload in
    # each of the 12 steps is
    assert marked.tolist() == [None] * (len(ops) - 12) + [True] * 12
    (f,) = _finding(trace)
    assert "uploaded once before the loop" in f.saving_basis
    assert f.recommendation.startswith("Move the host tensors uploaded again unchanged")
    saved = step_time(trace) - step_time(recorded["once"])
    # each op's own front end (the Python that calls it) is in no slice: 12 of the 62 us
    # a step the fix saves on the modelled clock, charged after the op, go with it
    assert f.time_lost_ns == pytest.approx(saved, rel=0.02), (f.time_lost_ns, saved)


def test_data_new_every_step_saves_only_its_transfer(recorded) -> None:
    from neuron_explorer.rules import host_device_copies
    from neuron_explorer.rules.host_device_copies import copies, issuers

    trace = recorded["fresh"]
    assert not any(trace.slice_args.column(tf.ARG_SAME_HOST_TENSOR, trace.ops["id"].to_numpy()))
    c = copies(trace)
    c = c[c["step"] >= 0]
    issued = issuers(trace, c)
    none = np.zeros(len(c), bool)
    saving, basis = host_device_copies._saving(trace, c, issued, none, none, batched=False)
    assert "the ops that issue it stay" in basis
    saved = step_time(trace) - step_time(recorded["on-device"])
    # nothing to save, so no finding (it fired on its symptom, at 0 ns lost, before)
    assert saved < 0 and saving == 0 and not _finding(trace)


def test_a_constant_made_again_with_the_same_values_saves_its_whole_copy(small) -> None:
    """`torch.tensor([...])` or a clone in the loop is a new host tensor every step: the
    mark (the same tensor, unchanged) missed it, and the finding advised moving the data
    new every step, saving only its transfer (a user's class weights and feature scale,
    124 us a step measured, were not named)."""
    trace = small["rebuilt"]
    ops = trace.ops[trace.ops["name"] == "aten::_to_copy"]
    marked = trace.slice_args.column(tf.ARG_SAME_HOST_TENSOR, ops["id"].to_numpy())
    # the first upload of those values, before the loop, is not marked
    assert marked.tolist() == [None] * (len(ops) - 12) + [True] * 12
    (f,) = _finding(trace)
    assert f.recommendation.startswith("Move the host tensors uploaded again unchanged")
    saved = step_time(trace) - step_time(small["once"])
    assert f.time_lost_ns == pytest.approx(saved, rel=0.02), (f.time_lost_ns, saved)


def test_a_mib_made_again_with_the_same_values_is_a_constant_too(recorded) -> None:
    """A 1 MiB input made anew with the same values every step: values were compared up to
    16 KiB, and a trial's 32 KiB positional encoding rebuilt every step read as data new
    every step (its saving claimed at half of what building it once saved)."""
    trace = recorded["rebuilt"]
    ops = trace.ops[trace.ops["name"] == "aten::_to_copy"]
    marked = trace.slice_args.column(tf.ARG_SAME_HOST_TENSOR, ops["id"].to_numpy())
    assert marked.tolist()[-12:] == [True] * 12
    (f,) = _finding(trace)
    assert f.recommendation.startswith("Move the host tensors uploaded again unchanged")
    saved = step_time(trace) - step_time(recorded["once"])
    assert f.time_lost_ns == pytest.approx(saved, rel=0.05), (f.time_lost_ns, saved)


def test_labels_that_repeat_by_chance_are_data_not_a_constant(small) -> None:
    """Two random 0/1 labels a step repeat by chance: their uploads are marked as values
    uploaded before, some of them, and the finding told to move them to the device before
    the loop (a DataLoader's label batches, 11 of 32 copies). A line's uploads are a
    constant only where every one is, once one is."""
    trace = small["labels"]
    ops = trace.ops[trace.ops["name"] == "aten::_to_copy"]
    line = PROGRAM.read_text().splitlines().index(
        '        labels = torch.randint(0, 2, (2,)).to("neuron")') + 1  # `--labels`' line
    labels = ops[ops["source"].astype(str).str.endswith(f":{line}")]
    marked = [bool(m) for m in trace.slice_args.column(
        tf.ARG_SAME_HOST_TENSOR, labels["id"].to_numpy())]
    assert len(marked) == 12 and any(marked) and not all(marked[1:]), marked
    assert not [f for f in _finding(trace) if "uploaded again unchanged" in f.recommendation]


def test_batching_copies_saves_what_one_copy_and_a_split_save(small) -> None:
    """Four uploads a step of one dtype against one copy of them all, unbound on the
    device: the finding once replayed the three later copies gone, without the unbind the
    fix adds or the bytes their transfers still move (a user's six copies a step, of two
    dtypes, were promised 2.2x what batching saved)."""
    trace = small["pieces"]
    (f,) = _finding(trace)
    assert "of one dtype in one copy (4 copies of one dtype a step" in f.recommendation
    assert "one kept as the split" in f.saving_basis
    saved = step_time(trace) - step_time(small["stacked"])
    # the split a view op apiece, not a copy's op (the trial's two dtypes: 0.63x)
    assert f.time_lost_ns == pytest.approx(saved, rel=0.05), (f.time_lost_ns, saved)
    assert not _finding(small["stacked"])


def test_batching_pieces_of_two_shapes_counts_their_slices_and_unbinds(tmp_path) -> None:
    """Four inputs and four row weights a step, one dtype, two shapes: one flat copy, then
    per shape a slice and a view besides a select per piece (12 view ops). The
    split counted a view a piece, 8 ops, and host time a cut can only take away: two
    trials' inputs and labels batched were claimed 372 us a step where batching saved
    290."""
    paths = record_variants(tmp_path, PROGRAM, {v: ["2", "--input", v] for v in
                                                ("paired", "paired-batched")}, modelled=True)
    trace, fixed = load(paths["paired"]), load(paths["paired-batched"])
    (f,) = _finding(trace)
    assert "(8 copies of one dtype a step" in f.recommendation, f.recommendation
    saved = step_time(trace) - step_time(fixed)
    assert f.time_lost_ns == pytest.approx(saved, rel=0.05), (f.time_lost_ns, saved)


def test_a_read_to_the_host_is_no_copy_to_batch(tmp_path) -> None:
    """The same four uploads a step, and the loss read by `.item()` each step: the read
    went into the batch of one dtype (five copies a step), promised 35% more than batching
    saved. It is the sync finding's, whose fix removes it."""
    paths = record_variants(tmp_path, PROGRAM, {v: ["2", "--input", v, "--item"]
                                                for v in ("pieces", "stacked")}, modelled=True)
    trace, fixed = load(paths["pieces"]), load(paths["stacked"])
    (f,) = _finding(trace)
    assert "(4 copies of one dtype a step" in f.recommendation
    saved = step_time(trace) - step_time(fixed)
    assert f.time_lost_ns == pytest.approx(saved, rel=0.15), (f.time_lost_ns, saved)
    assert [f.rule_id for f in fixed.bottlenecks() if f.rule_id == "sync_in_step"]


def test_a_host_dataset_cycled_through_saves_what_keeping_it_on_the_device_saves(
        tmp_path) -> None:
    """Batch `step % 4` of a host dataset uploaded every step: each view of it uploaded
    again is the same data (the recorder once marked only the same tensor object, and a
    new view is a new object), and once the cycle comes round every upload at that line
    is: the whole pool is a constant. Counted as a re-upload only where marked, 4 of 22
    such copies were promised 205 us where keeping the dataset on the device saved 443."""
    paths = record_variants(tmp_path, PROGRAM, {v: [*SHAPE, "--input", v] for v in
                                                ("cycled", "cycled-on-device")},
                            modelled=True)
    cycled, kept = load(paths["cycled"]), load(paths["cycled-on-device"])
    ops = cycled.ops[cycled.ops["name"] == "aten::_to_copy"]
    marked = cycled.slice_args.column(tf.ARG_SAME_HOST_TENSOR, ops["id"].to_numpy())
    assert marked.tolist()[-8:] == [True] * 8  # steps 4-11: the cycle come round
    (f,) = _finding(cycled)
    assert "cycles through" in f.recommendation
    saved = step_time(cycled) - step_time(kept)
    assert saved > 0
    assert f.time_lost_ns == pytest.approx(saved, rel=0.2), (f.time_lost_ns, saved)


def test_a_dataset_whose_first_epoch_is_not_analysed_is_still_a_pool(tmp_path) -> None:
    """Five batches sliced from a host dataset, the last smaller, compiled: the recompile
    for the last batch leaves the first epoch out of the analysed steps, so every analysed
    upload was one seen before and read as a constant. Its fix indexes the dataset on the
    device, an op a step the replay had left out (a user's claim 1.24x the saving)."""
    args = ["3", "--compile", "--input"]
    paths = record_variants(tmp_path, PROGRAM, {"sliced": [*args, "sliced"],
                                                "kept": [*args, "sliced-on-device"]},
                            modelled=True)
    sliced, kept = load(paths["sliced"]), load(paths["kept"])
    (f,) = _finding(sliced)
    assert "cycles through" in f.recommendation
    saved = step_time(sliced) - step_time(kept)
    assert saved > 0
    assert f.time_lost_ns == pytest.approx(saved, rel=0.1), (f.time_lost_ns, saved)
