"""Continuous batching: requests arrive over time, each with its own prompt and output length,
and the server runs them together a step at a time.

Each step of the server first admits the requests waiting for a free slot, reading each
one's prompt in a call of its own (its prefill, which gives its first token), then feeds
the last token of every request that was already running in one batched call (a decode
step: one more token each). A request that has all its tokens leaves, and its slot goes to
the next one waiting. The model is generate.py's decoder; its cache has one slot of fixed
length per running request, written at each request's own positions.

`neuron_explorer.request` marks which requests each call serves (one id per batch row),
and each arrival (a range with no call in it), so `Trace.requests()` gives every request's
time in the queue, time to first token and time per output token.

    python examples/serve.py [--requests 12] [--max-batch 4] [--arrive-every 2] [--seed 0]
"""

import argparse
import random
from collections import deque
from dataclasses import dataclass, field

import neuron_explorer
import torch
from generate import Decoder


@dataclass
class Request:
    id: int
    prompt: list[int]
    max_tokens: int
    arrives: int  # the server step it arrives in
    out: list[int] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return len(self.out) >= self.max_tokens


def make_requests(n: int, every: float, seed: int, vocab: int) -> list[Request]:
    """Prompts of 8-32 tokens asking for 4-24 tokens, arriving `every` steps apart on
    average (at random: bursts and lulls)."""
    rng = random.Random(seed)
    requests, step = [], 0.0
    for i in range(n):
        prompt = [rng.randrange(vocab) for _ in range(rng.randint(8, 32))]
        requests.append(Request(i, prompt, rng.randint(4, 24), int(step)))
        step += rng.expovariate(1 / every) if every > 0 else 0
    return requests


def serve(model: Decoder, requests: list[Request], max_batch: int, device: str) -> None:
    length = max(len(r.prompt) + r.max_tokens for r in requests)
    cache = model.static_cache(max_batch, length, device)  # slot i: running[i]'s keys, values
    tensors = [t for kv in cache for t in kv]
    pending, waiting = deque(requests), deque()
    running: list[Request] = []
    step = 0
    while pending or waiting or running:
        if not (waiting or running):
            step = max(step, pending[0].arrives)  # idle: on to the next arrival
        while pending and pending[0].arrives <= step:
            r = pending.popleft()
            with neuron_explorer.request(r.id):  # its arrival: it waits from here
                waiting.append(r)
        decoding = list(running)  # they have a token to feed: one more each this step
        while waiting and len(running) < max_batch:
            r = waiting.popleft()
            slot = len(running)
            rows = [[t[slot:slot + 1] for t in kv] for kv in cache]  # views: written in place
            positions = torch.arange(len(r.prompt), device=device)[None]
            with neuron_explorer.request(r.id):
                logits, _ = model(torch.tensor([r.prompt]).to(device), rows, positions)
            r.out.append(int(logits[0, -1].argmax()))  # streamed to the client: waits for it
            running.append(r)
        if decoding:  # running[:n], so slots 0..n-1
            n = len(decoding)
            ids = torch.tensor([[r.out[-1]] for r in decoding]).to(device)
            # the fed token's position: after the prompt and the tokens before it
            positions = torch.tensor([[len(r.prompt) + len(r.out) - 1] for r in decoding])
            rows = [[t[:n] for t in kv] for kv in cache]
            with neuron_explorer.request([r.id for r in decoding]):  # row i serves decoding[i]
                logits, _ = model(ids, rows, positions.to(device))
            for r, token in zip(decoding, logits[:, -1].argmax(-1).tolist(), strict=True):
                r.out.append(token)
        # finished requests leave; the last running one moves into the slot freed, so the
        # running requests stay in slots 0..n-1 and a decode step reads one slice of the cache
        for i in reversed(range(len(running))):
            if running[i].done:
                last = len(running) - 1
                if i != last:
                    for t in tensors:
                        t[i].copy_(t[last])
                running[i] = running[last]
                running.pop()
        step += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=12)
    parser.add_argument("--max-batch", type=int, default=4, help="slots: requests run at once")
    parser.add_argument("--arrive-every", type=float, default=2.0,
                        help="mean server steps between arrivals (0: all at once)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="neuron")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = Decoder().to(args.device).eval()
    requests = make_requests(args.requests, args.arrive_every, args.seed,
                             model.embed.num_embeddings)
    with torch.inference_mode():
        serve(model, requests, args.max_batch, args.device)
    print(f"{len(requests)} requests, {sum(len(r.out) for r in requests)} tokens; "
          f"request 0: {requests[0].out}")


if __name__ == "__main__":
    main()
