"""An eager op right before a compiled graph whose ops take long to compute on the host."""

import torch


@torch.compile(backend="neuron")
def chain(x: torch.Tensor) -> torch.Tensor:
    for _ in range(12):
        x = (x @ x) * 0.01
    return x


x = torch.randn(384, 384, device="neuron")
chain(x)  # compiles
for _ in range(3):
    y = x + 1
    z = chain(y)
print(float(z.sum()))
