"""Serving-style training step next to a preallocated KV cache that fills most of HBM.

The cache takes about 90% of the device's memory, so the activations of a larger
batch, or a second cache, no longer fit: `torch.neuron.memory_allocated()` sits
near `get_device_properties().total_memory`. Sizing the cache from the memory
actually left (`torch.neuron.mem_get_info()`) keeps headroom for activations.
"""

import argparse

import torch
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--fraction", type=float, default=0.9,
                        help="share of HBM given to the KV cache")
    args = parser.parse_args()

    device = torch.device("neuron")
    total = torch.neuron.get_device_properties(device).total_memory
    layers, heads, head_dim = 16, 16, 128
    per_token = 2 * layers * heads * head_dim * 2  # K and V, bf16
    tokens = int(total * args.fraction) // per_token
    # The cache is written as requests arrive; allocating it reserves the memory.
    kv_cache = torch.empty(2, layers, tokens, heads, head_dim, dtype=torch.bfloat16, device=device)
    print(f"KV cache: {kv_cache.numel() * 2 / 2**30:.1f} GiB of {total / 2**30:.1f} GiB")

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2048, 2048), nn.GELU(), nn.Linear(2048, 2048)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(512, 2048).to(device)
    for _ in range(args.steps):
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    used = torch.neuron.max_memory_allocated(device)
    print(f"peak memory {used / 2**30:.2f} GiB of {total / 2**30:.1f} GiB; "
          f"final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
