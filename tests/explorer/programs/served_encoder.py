"""An encoder classifier serving padded batches of requests, left in training mode:

    served_encoder.py [--eval] [--seq-first]

--eval calls model.eval() (its encoder built with enable_nested_tensor=False: given a
padding mask, torch's fast path would pack the batch into a nested tensor); --seq-first
builds its layers with batch_first=False, nn.TransformerEncoderLayer's default, whose
inputs are (T, B, D) and which never take that fast path."""

import sys

import neuron_explorer
import torch
from torch import nn

BATCH_FIRST = "--seq-first" not in sys.argv
VOCAB, WIDTH, BATCH = 500, 128, 16


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, WIDTH)
        layer = nn.TransformerEncoderLayer(WIDTH, 4, 256, dropout=0.1, batch_first=BATCH_FIRST)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(WIDTH, 4)

    def forward(self, ids: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        h = self.emb(ids if BATCH_FIRST else ids.t())
        h = self.enc(h, src_key_padding_mask=pad)
        h = h if BATCH_FIRST else h.transpose(0, 1)
        keep = (~pad).unsqueeze(-1).float()
        return self.head((h * keep).sum(1) / keep.sum(1))


torch.manual_seed(0)
model = Classifier().to("neuron")
if "--eval" in sys.argv:
    model.eval()
lengths = torch.Generator().manual_seed(0)
for _ in range(6):
    sizes = torch.randint(5, 30, (BATCH,), generator=lengths)
    ids = torch.zeros(BATCH, int(sizes.max()), dtype=torch.long)
    for i, n in enumerate(sizes.tolist()):
        ids[i, :n] = torch.randint(1, VOCAB, (n,), generator=lengths)
    with torch.no_grad():
        logits = model(ids.to("neuron"), (ids == 0).to("neuron"))
    print(logits.argmax(-1).tolist())
    neuron_explorer.step()
