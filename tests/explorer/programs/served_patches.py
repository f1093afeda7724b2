"""An image classifier of patches and encoder layers serving requests without grad, left
in training mode: no token ids, so the model's batch is not known from its inputs.

    served_patches.py [--eval] [--seq-first] [--compile] [--no-fast-path]
                      [--sizes N,N,...] [--group K]

--eval calls model.eval(); --seq-first builds its layers with batch_first=False (inputs
(T, B, D), which never take torch's fast path); --compile compiles the model;
--no-fast-path turns torch's fast path for the encoder layers off; --sizes serves one
request of each size (six of 8 images otherwise); --group serves K requests a call."""

import sys

import neuron_explorer
import torch
from torch import nn

BATCH_FIRST = "--seq-first" not in sys.argv
WIDTH, PATCH, BATCH = 64, 8, 8


class PatchClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.patches = nn.Conv2d(3, WIDTH, PATCH, stride=PATCH)
        layer = nn.TransformerEncoderLayer(WIDTH, 4, 2 * WIDTH, dropout=0.1,
                                           batch_first=BATCH_FIRST, norm_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(WIDTH, 10)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        h = self.patches(images).flatten(2).transpose(1, 2)  # (B, patches, D)
        h = self.enc(h if BATCH_FIRST else h.transpose(0, 1))
        return self.head(h.mean(1 if BATCH_FIRST else 0))


if "--no-fast-path" in sys.argv:
    torch.backends.mha.set_fastpath_enabled(False)
torch.manual_seed(0)
model = PatchClassifier().to("neuron")
if "--eval" in sys.argv:
    model.eval()
served = torch.compile(model, backend="neuron") if "--compile" in sys.argv else model
def option(name: str, default: str) -> str:
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


sizes = [int(n) for n in option("--sizes", ",".join([str(BATCH)] * 6)).split(",")]
group = int(option("--group", "1"))
pixels = torch.Generator().manual_seed(0)
requests = [torch.randn(n, 3, 32, 32, generator=pixels) for n in sizes]
for first in range(0, len(requests), group):
    images = torch.cat(requests[first:first + group])
    with torch.no_grad():
        logits = served(images.to("neuron"))
    print(logits.argmax(-1).tolist())
    neuron_explorer.step()
