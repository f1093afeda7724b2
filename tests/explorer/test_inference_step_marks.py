"""An inference loop that marks its own steps (`neuron_explorer.step()`) around two
top-level modules: until the first mark, the first module's return ended a step (as it
does in an unmarked inference loop), so the first iteration was recorded as two steps,
74 us and 325 us beside 354 us. The second piece, holding no call of the model, read as a
training step: the per-step figures came from it alone, the eval passes were left out of
them, and a run that also called an NKI kernel failed `report` (no training step to
analyse after its compile). Both pieces are now left out, said so, and every step is an
inference pass."""

from __future__ import annotations

from pathlib import Path

import neuron_explorer
from cli_runner import run_cli
from neuron_explorer.analyses.steady_state import analysed_steps
from neuron_explorer.report import render_report

PROGRAM = '''
import torch, neuron_explorer
torch.set_grad_enabled(False)
l1 = torch.nn.Linear(256, 256).to("neuron")
l2 = torch.nn.Linear(256, 256).to("neuron")
x = torch.randn(256, 256, device="neuron")
for _ in range(6):
    h = torch.relu(l1(x))
    s = l2(h).sum().item()
    neuron_explorer.step()
'''


def test_the_pieces_before_the_first_step_mark_are_no_steps(tmp_path: Path) -> None:
    (tmp_path / "infer.py").write_text(PROGRAM)
    run_cli("record", "-o", "infer.pftrace", "--", "python", "infer.py", cwd=tmp_path,
            modelled=True)
    trace = neuron_explorer.load(tmp_path / "infer.pftrace")
    assert len(trace.steps) == 7  # the first iteration in two pieces, then five
    selection = analysed_steps(trace)
    assert selection.steps == (2, 3, 4, 5, 6)
    assert "steps 0–1 end before the first step mark" in selection.describe()
    assert set(trace.phases()["phase"]) == {"eval"}
    durations = trace.steps.set_index("step")["dur"]
    assert trace.summary()["step_time_ns"] == durations.loc[2:].median()
    assert "steps 2–6 of 0–6 (steps 0–1 end before the first step mark)" in \
        render_report(trace, "text")


GENERATE = '''
import torch, neuron_explorer
from torch import nn
torch.set_grad_enabled(False)
class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.head = nn.Embedding(512, 64), nn.Linear(64, 512)
    def forward(self, idx):
        return self.head(self.emb(idx))
model = LM().to("neuron").eval()
prompt = torch.randint(0, 512, (1, 16)).to("neuron")
logits = model(prompt)              # the prefill, before the loop
tok = logits[:, -1].argmax(-1, keepdim=True)
neuron_explorer.step()
for _ in range(6):
    t = tok.item()
    logits = model(tok)
    tok = logits[:, -1].argmax(-1, keepdim=True)
    neuron_explorer.step()
'''


def test_a_prefill_before_the_decode_loop_is_the_prefill(tmp_path: Path) -> None:
    """A prompt's call before a greedy loop, then `neuron_explorer.step()`: the recorder
    ended step 0 at the call's return and the mark ended a piece without a call (the first
    token's argmax). That piece broke the generation: the prompt's call was an eval pass,
    the first decode step was taken for the prefill ("prompt tokens 1"), and the time to
    first token left the prompt's call out."""
    (tmp_path / "generate.py").write_text(GENERATE)
    run_cli("record", "-o", "generate.pftrace", "--", "python", "generate.py",
            cwd=tmp_path, modelled=True)
    trace = neuron_explorer.load(tmp_path / "generate.pftrace")
    phases = trace.phases()
    assert phases["phase"].tolist() == ["prefill"] + ["decode"] * 6
    steps = trace.steps.set_index("step")
    # the prefill runs from the prompt's call to the mark after it: both pieces
    prefill = phases.iloc[0]
    assert prefill["ts"] + prefill["dur"] == steps.at[1, "ts"] + steps.at[1, "dur"]
    text = render_report(trace, "text")
    assert "prefill: 1 step" in text and "eval" not in text.split("Phases")[0]
