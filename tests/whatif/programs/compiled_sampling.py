"""A compiled decoder generating greedily without a cache, checking each new token for the
end of text: the argmax and the check run eagerly on the graph's logits, or, with
`--sample-inside`, in the compiled function with the model.

    python compiled_sampling.py [--sample-inside]
"""

import sys

import neuron_explorer
import torch
from torch import nn

VOCAB, WIDTH, EOS = 256, 64, 255  # EOS never wins: every run makes all its tokens


class Decoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.mix = nn.Sequential(nn.Linear(WIDTH, 2 * WIDTH), nn.GELU(),
                                 nn.Linear(2 * WIDTH, WIDTH))
        self.head = nn.Linear(WIDTH, VOCAB)
        with torch.no_grad():
            self.head.bias[EOS] = -1e4

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        return self.head(h + self.mix(h).cumsum(1))


def sample(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    token = logits[:, -1].argmax(-1, keepdim=True)
    return token, (token == EOS).all()


torch.manual_seed(0)
model = Decoder().to("neuron").eval()
if "--sample-inside" in sys.argv:
    step = torch.compile(lambda ids: sample(model(ids)), backend="neuron")
else:
    compiled = torch.compile(model, backend="neuron")

    def step(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return sample(compiled(ids))


ids = torch.randint(0, EOS, (2, 16)).to("neuron")
with torch.no_grad():
    for _ in range(14):
        token, done = step(ids)
        if done.item():
            break
        ids = torch.cat([ids, token], 1)
        neuron_explorer.step()
print(ids.shape)
