"""`.float()` before a matmul inside an autocast region: autocast casts the input straight
back to bf16, so the matmul never runs in float32 and both copies (and autograd's two for
the gradient) are work for nothing. A trial's attention "kept in float32" made 24 such
copies a step; dropping the `.float()` calls saved 10% of its step and no finding named
them. Against the same program without them (modelled host clock: exact)."""

from __future__ import annotations

from pathlib import Path

import neuron_explorer
import pytest
from cli_runner import run_cli

PROGRAM = '''
import sys, torch
from torch import nn
UPCAST = "--upcast" in sys.argv
torch.manual_seed(0)
qkv, out = nn.Linear(64, 192).to("neuron"), nn.Linear(64, 64).to("neuron")
opt = torch.optim.SGD([*qkv.parameters(), *out.parameters()], lr=0.01)
x = torch.randn(8, 32, 64, device="neuron")
for _ in range(4):
    with torch.autocast("neuron", dtype=torch.bfloat16):
        q, k, v = qkv(x).chunk(3, dim=-1)
        if UPCAST:  # "for stability": autocast casts them back for the matmul
            q, k = q.float(), k.float()
        att = (q @ k.transpose(-2, -1)).softmax(-1)
        loss = out(att @ v).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
'''


def _record(folder: Path, name: str, *args: str) -> neuron_explorer.Trace:
    run_cli("record", "-o", f"{name}.pftrace", "--", "python", "attn.py", *args, cwd=folder,
            modelled=True)
    return neuron_explorer.load(folder / f"{name}.pftrace")


def test_casts_to_float32_that_autocast_undoes_are_found_and_priced(tmp_path: Path) -> None:
    (tmp_path / "attn.py").write_text(PROGRAM)
    upcast, plain = _record(tmp_path, "upcast", "--upcast"), _record(tmp_path, "plain")
    (f,) = [f for f in upcast.bottlenecks() if f.rule_id == "cast_round_trip"]
    assert "attn.py:13 (2x a step)" in f.explanation  # the forward's line, not backward()'s
    assert f.recommendation.startswith("Drop the .float()")
    saved = upcast.summary()["total_ns"] - plain.summary()["total_ns"]
    assert f.time_lost_ns == pytest.approx(saved, rel=0.02), (f.time_lost_ns, saved)
    assert not [g for g in plain.bottlenecks() if g.rule_id == "cast_round_trip"]
