"""An embedding, a GRU and a linear head trained eagerly or compiled:
`small_gru.py [--compile] [--allow-rnn]` (`--allow-rnn`: torch._dynamo.config.allow_rnn =
True before compiling; without it Dynamo runs the GRU eager between graphs)."""

import sys

import torch
from torch import nn

if "--allow-rnn" in sys.argv:
    torch._dynamo.config.allow_rnn = True


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(100, 32)
        self.rnn = nn.GRU(32, 32, batch_first=True)
        self.out = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.rnn(self.emb(x))
        return self.out(h[:, -1])


torch.manual_seed(0)
model = Model().to("neuron")
opt = torch.optim.SGD(model.parameters(), lr=1e-2)
fwd = torch.compile(model, backend="neuron") if "--compile" in sys.argv else model
x = torch.randint(0, 100, (8, 6)).to("neuron")
y = torch.randint(0, 10, (8,)).to("neuron")
for _ in range(6):
    loss = torch.nn.functional.cross_entropy(fwd(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
print(loss.item())
