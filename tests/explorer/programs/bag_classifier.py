"""A compiled classifier over token ids: an embedding table, the mean of each row's
embeddings, then a stack of linear layers.
`bag_classifier.py [--vocab N] [--width N] [--layers N] [--batch N] [--encoder]`
(`--encoder`: a transformer encoder layer over the embeddings instead of the linear
layers, which inference runs as one op, its matmuls inside)."""

import argparse

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--vocab", type=int, default=8000)
parser.add_argument("--width", type=int, default=96)
parser.add_argument("--layers", type=int, default=6)
parser.add_argument("--batch", type=int, default=8192)
parser.add_argument("--encoder", action="store_true")
args = parser.parse_args()


class BagClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(args.vocab, args.width)
        self.mlp = nn.Sequential(*[m for _ in range(args.layers)
                                   for m in (nn.Linear(args.width, args.width), nn.ReLU())])
        self.encoder = nn.TransformerEncoderLayer(args.width, 4, 2 * args.width,
                                                  batch_first=True)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if args.encoder:
            return self.encoder(self.emb(ids)).mean(dim=1)
        return self.mlp(self.emb(ids).mean(dim=1))


torch.manual_seed(0)
model = BagClassifier().to("neuron").eval()
compiled = torch.compile(model, backend="neuron")
ids = torch.randint(0, args.vocab, (args.batch, 2), device="neuron")
with torch.no_grad():
    for _ in range(6):
        out = compiled(ids)
print(out.sum().item())
