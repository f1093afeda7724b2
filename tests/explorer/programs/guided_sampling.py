"""A conditional denoiser sampled with classifier-free guidance, as diffusion samplers do:

    guided_sampling.py [--batched] [--heun]

Each sampling step runs the model on the conditioned and on the unconditioned input, two
calls of one model on independent inputs (--batched: one call over both, stacked). --heun
adds a second, corrector call that takes the first call's result: calls that depend on
each other, which no batching joins."""

import sys

import neuron_explorer
import torch
from torch import nn

torch.manual_seed(0)
WIDTH, CLASSES, BATCH, STEPS = 256, 10, 16, 6


class Denoiser(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(CLASSES + 1, WIDTH)  # the last class: no condition
        self.body = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.GELU(),
                                  nn.Linear(WIDTH, WIDTH), nn.GELU(), nn.Linear(WIDTH, WIDTH))

    def forward(self, x: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
        return self.body(x + self.embed(label))


model = Denoiser().to("neuron").eval()
labels = torch.randint(0, CLASSES, (BATCH,)).to("neuron")
empty = torch.full((BATCH,), CLASSES).to("neuron")


def guided(x: torch.Tensor, scale: float = 3.0) -> torch.Tensor:
    if "--batched" in sys.argv:
        both = model(torch.cat([x, x]), torch.cat([labels, empty]))
        cond, uncond = both.chunk(2)
    else:
        cond, uncond = model(x, labels), model(x, empty)
    return uncond + scale * (cond - uncond)


with torch.no_grad():
    x = torch.randn(BATCH, WIDTH).to("neuron")
    for _ in range(STEPS):
        eps = guided(x)
        if "--heun" in sys.argv:
            eps = 0.5 * (eps + model(x - 0.1 * eps, labels))
        x = x - 0.1 * eps
        neuron_explorer.step()
print(float(x.abs().mean()))
