"""Step boundaries: windows never cut a step, inference loops get a step per model call."""

from __future__ import annotations

import threading

import neuron_explorer
import torch
from neuron_explorer.backend.events import OpLaunch, hub
from torch import nn


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2)).to("neuron")


def _train_step(model: nn.Module, opt: torch.optim.Optimizer) -> None:
    model(torch.randn(4, 8, device="neuron")).sum().backward()
    opt.step()
    opt.zero_grad()


def test_a_steps_window_holds_the_ops_its_first_step_saw_before_it_began(tmp_path) -> None:
    """An op of step 2 dated before the step's slice began (an event reaching the recorder
    late) still lies inside step 2: the window's first step reaches back to it."""
    path = tmp_path / "window.pftrace"
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with neuron_explorer.record(path, level="op", steps="2:4", quiet=True) as rec:
        for _ in range(2):
            _train_step(model, opt)
        early = rec.recorder.step_start - 50_000  # before step 2 began
        hub.op_launched(OpLaunch(9_000_001, "aten::mm", 0, early, early + 10, ((2, 2),),
                                 ("float32",), 1, 1, False, (), threading.get_ident()))
        for _ in range(2):
            _train_step(model, opt)
    t = neuron_explorer.load(path)
    assert t.steps["step"].tolist() == [2, 3]
    assert t.steps["ts"].iloc[0] <= early
    assert (t.ops["step"] >= 0).all(), t.ops[t.ops["step"] < 0][["name", "ts"]]


def test_an_inference_loop_gets_a_step_per_model_call(tmp_path) -> None:
    path = tmp_path / "infer.pftrace"
    model = _model().eval()
    post = nn.Softmax(dim=-1)  # another top-level module: it ends no step
    with neuron_explorer.record(path, level="op", quiet=True) as rec, torch.no_grad():
        for n in range(3):
            x = torch.randn(2 + n, 8).to("neuron")
            post(model(x)).argmax(-1).tolist()
    assert rec.recorder.steps_completed == [0, 1, 2]
    assert rec.recorder.step_boundary == "forward"
    t = neuron_explorer.load(path)
    assert t.metadata["steps_completed"] == [0, 1, 2]
    forwards = t.modules[t.modules["module"] == "model"]
    assert forwards["step"].tolist() == [0, 1, 2]  # each call inside its own step
    assert t.summary()["mfu"] > 0


def test_training_keeps_optimizer_steps(tmp_path) -> None:
    """Grad-enabled training-mode calls end no step; the optimizer does."""
    path = tmp_path / "train.pftrace"
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with neuron_explorer.record(path, level="op", quiet=True) as rec:
        for _ in range(3):
            _train_step(model, opt)
        with torch.no_grad():
            model.eval()
            model(torch.randn(4, 8, device="neuron"))  # validation after training
    assert rec.recorder.steps_completed == [0, 1, 2]
    assert rec.recorder.step_boundary == "optimizer"


def test_an_inference_window_counts_the_calls_it_did_not_record(tmp_path) -> None:
    path = tmp_path / "infer_window.pftrace"
    model = _model().eval()
    with neuron_explorer.record(path, level="op", steps="1:3", quiet=True), \
            torch.inference_mode():
        for _ in range(4):
            model(torch.randn(2, 8, device="neuron"))
    assert neuron_explorer.load(path).steps["step"].tolist() == [1, 2]
