"""A small MLP trained eagerly or compiled:
`small_mlp.py LAYERS [--compile] [--item] [--check-finite] [--width W] [--batch B] [--input HOW]
[--optimizer O] [--loss-module] [--accumulate K] [--predictions WHERE]` (`--item`: read
the loss on the host every step, as a training log does; `--check-finite`: stop if the
output holds a NaN or inf, read every step; `--predictions every-step`: each row's argmax
read to the host every step (`every-step-view`: through a view of them), `--predictions
on-device`: kept on the device, read once after the loop, `outputs-kept`: the outputs
kept, their argmax taken when read after the loop; `--accumulate`: K
micro-batches a step, their gradients accumulated;
width 64 and batch 32 unless given; `--loss-module`: the loss is `nn.MSELoss()`, a module
called beside the model, rather than a function of its output). `--input`: `once` (the
default: one host tensor uploaded before the loop), `every-step` (the same host tensor
uploaded in every step), `rebuilt` (a new host tensor of the same values uploaded every
step), `fresh` (a new host tensor uploaded every step), `on-device` (a new one made on
the device), `pieces` (the sum of four new host tensors, each uploaded), `stacked` (the
same four uploaded in one copy and unbound on the device), `paired` (four inputs and
four row weights, each uploaded), `paired-batched` (the eight in one flat copy, sliced
and unbound on the device), `cycled` (a host dataset of
four batches, batch `step % 4` of it uploaded every step), `cycled-on-device` (that
dataset uploaded once before the loop, its batch indexed on the device), `sliced` (a host
dataset of five batches, the last smaller, sliced and uploaded every step: an epoch every
five steps) or `sliced-on-device` (that dataset uploaded once, sliced on the device).
`--compile-loss`: the model and its loss compiled as one function (with `--compile`).
`--compiled-autograd`: each micro-batch's backward (with `--accumulate`) under compiled
autograd, which takes the adds into `.grad` into its graph.
`--labels`: two random 0/1 labels uploaded every step beside the input (they repeat by
chance, a quarter of the time). `--ema`: an exponential moving average of the weights
updated after each optimizer step, a Python loop over the parameters.
`--optimizer`: `sgd` (the default), `sgd-momentum` (momentum 0.9, foreach),
`sgd-momentum-fused`, `adam` (PyTorch's default, foreach), `adam-fused`
(`fused=True`), `adam-loop` (`foreach=False`), `adamw` or `adamw-fused`; with
`--optimizer-per-step`, constructed anew at the start of every step. `--zero-grad
zeros`: `zero_grad(set_to_none=False)`, the gradients zeroed in place; `--zero-grad-last`
(with `--accumulate`): zero_grad after the optimizer's step, at the end of each step
(marked with `neuron_explorer.step()` after it). `--clip`: the
gradients clipped with `clip_grad_norm_` before each optimizer step; `--clip-loop`: the same
clipping as a Python loop over the parameters. `--ema-foreach`: the average of `--ema` with
`torch._foreach_mul_` and `torch._foreach_add_` over the list of tensors; `--ema-lerp`: the
same average with one `torch._foreach_lerp_`; `--ema-compiled`: the loop of `--ema` in a
compiled function. `--groups`: Adam's
parameters in two groups (weight decay on the matrices only). `--grad-noise loop|foreach`:
noise drawn per gradient (`randn_like`) and added in a loop, or with foreach ops.
`--bf16`: the model cast whole to bfloat16, its input cast on the host (`--input once`)."""

import sys

import neuron_explorer
import torch
from torch import nn

LAYERS = int(sys.argv[1])
COMPILE = "--compile" in sys.argv
ITEM = "--item" in sys.argv
CHECK_FINITE = "--check-finite" in sys.argv
PREDICTIONS = sys.argv[sys.argv.index("--predictions") + 1] if "--predictions" in sys.argv else ""
LOSS_MODULE = "--loss-module" in sys.argv


def _option(name: str, default: int) -> int:
    return int(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default


WIDTH, BATCH = _option("--width", 64), _option("--batch", 32)
ACCUMULATE = _option("--accumulate", 1)
INPUT = sys.argv[sys.argv.index("--input") + 1] if "--input" in sys.argv else "once"
ZERO_GRAD = sys.argv[sys.argv.index("--zero-grad") + 1] if "--zero-grad" in sys.argv else "none"
SET_TO_NONE = ZERO_GRAD != "zeros"
ZERO_LAST = "--zero-grad-last" in sys.argv
torch.manual_seed(0)
layers: list[nn.Module] = []
for _ in range(LAYERS):
    layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
model = nn.Sequential(*layers).to("neuron")
DTYPE = torch.bfloat16 if "--bf16" in sys.argv else torch.float32
model.to(DTYPE)
OPTIMIZER = sys.argv[sys.argv.index("--optimizer") + 1] if "--optimizer" in sys.argv else "sgd"
PER_STEP = "--optimizer-per-step" in sys.argv


def new_optimizer() -> torch.optim.Optimizer:
    if OPTIMIZER == "sgd":
        return torch.optim.SGD(model.parameters(), lr=1e-3)
    if OPTIMIZER.startswith("sgd-momentum"):
        return torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9,
                               fused=OPTIMIZER.endswith("-fused") or None)
    adam = torch.optim.AdamW if OPTIMIZER.startswith("adamw") else torch.optim.Adam
    params: list = list(model.parameters())
    if "--groups" in sys.argv:  # weight decay on the matrices only: two parameter groups
        params = [{"params": [p for p in params if p.dim() > 1], "weight_decay": 0.01},
                  {"params": [p for p in params if p.dim() <= 1], "weight_decay": 0.0}]
    return adam(params, lr=1e-3, fused=OPTIMIZER.endswith("-fused") or None,
                foreach=False if OPTIMIZER == "adam-loop" else None)


opt = new_optimizer()
EMA = "--ema" in sys.argv
ema = [p.detach().clone() for p in model.parameters()]
fwd = torch.compile(model, backend="neuron") if COMPILE else model


@torch.compile(backend="neuron")
def compiled_ema() -> None:
    with torch.no_grad():
        for mean, weight in zip(ema, model.parameters(), strict=True):
            mean.mul_(0.999).add_(weight, alpha=0.001)


COMPILE_LOSS = "--compile-loss" in sys.argv
compiled_loss = torch.compile(lambda x: model(x).square().mean() / ACCUMULATE, backend="neuron")
host_x = torch.randn(BATCH, WIDTH).to(DTYPE)
x = host_x.to("neuron")
dataset = torch.randn(4, BATCH, WIDTH)
if INPUT == "cycled-on-device":
    dataset = dataset.to("neuron")
rows = torch.randn(5 * BATCH - BATCH // 2, WIDTH)
if INPUT == "sliced-on-device":
    rows = rows.to("neuron")
losses = []
predictions = []
for step in range(12):
    if PER_STEP:  # a user's loop that builds its optimizer in each step
        opt = new_optimizer()
    if INPUT.startswith("cycled"):
        x = dataset[step % 4].to("neuron")
    elif INPUT.startswith("sliced"):
        x = rows[(step % 5) * BATCH:(step % 5 + 1) * BATCH].to("neuron")
    elif INPUT == "every-step":
        x = host_x.to("neuron")
    elif INPUT == "rebuilt":
        x = host_x.clone().to("neuron")
    elif INPUT == "fresh":
        x = torch.randn(BATCH, WIDTH).to("neuron")
    elif INPUT == "pieces":
        x = sum(piece.to("neuron") for piece in torch.randn(4, BATCH, WIDTH).unbind(0))
    elif INPUT == "stacked":
        x = sum(torch.randn(4, BATCH, WIDTH).to("neuron").unbind(0))
    elif INPUT == "paired":  # four micro-batches' inputs and their row weights
        xs, ws = torch.randn(4, BATCH, WIDTH), torch.randn(4, BATCH)
        x = sum(a.to("neuron") * w.to("neuron")[:, None]
                for a, w in zip(xs.unbind(0), ws.unbind(0), strict=True))
    elif INPUT == "paired-batched":  # the same, in one flat buffer split on the device
        xs, ws = torch.randn(4, BATCH, WIDTH), torch.randn(4, BATCH)
        flat = torch.cat([xs.flatten(), ws.flatten()]).to("neuron")
        a_all = flat[:xs.numel()].view(4, BATCH, WIDTH).unbind(0)
        w_all = flat[xs.numel():].view(4, BATCH).unbind(0)
        x = sum(a * w[:, None] for a, w in zip(a_all, w_all, strict=True))
    elif INPUT == "on-device":
        x = torch.randn(BATCH, WIDTH, device="neuron")
    if "--labels" in sys.argv:
        labels = torch.randint(0, 2, (2,)).to("neuron")
    if ACCUMULATE > 1:  # zero_grad, then a forward and backward per micro-batch, one step
        if not ZERO_LAST:
            opt.zero_grad(set_to_none=SET_TO_NONE)
        for _ in range(ACCUMULATE):
            loss = compiled_loss(x) if COMPILE_LOSS else fwd(x).square().mean() / ACCUMULATE
            if "--compiled-autograd" in sys.argv:
                with torch._dynamo.compiled_autograd._enable(torch.compile(backend="neuron")):
                    loss.backward()
            else:
                loss.backward()
        opt.step()
        if ZERO_LAST:
            opt.zero_grad(set_to_none=SET_TO_NONE)
            neuron_explorer.step()  # the step ends here, after the zeroing
        continue
    if COMPILE_LOSS:  # the loss inside the compiled function
        loss = compiled_loss(x)
        opt.zero_grad(set_to_none=SET_TO_NONE)
        loss.backward()
        opt.step()
        continue
    out = fwd(x)
    if CHECK_FINITE and not bool(torch.isfinite(out).all()):
        raise SystemExit("the output is not finite")
    loss = nn.MSELoss()(out, torch.zeros_like(out)) if LOSS_MODULE else out.square().mean()
    opt.zero_grad(set_to_none=SET_TO_NONE)
    loss.backward()
    if "--clip" in sys.argv:
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    if "--grad-noise" in sys.argv:  # noise added to each gradient, a parameter at a time
        grads = [p.grad for p in model.parameters()]
        noise = [torch.randn_like(g) for g in grads]
        if sys.argv[sys.argv.index("--grad-noise") + 1] == "foreach":
            torch._foreach_add_(grads, torch._foreach_mul(noise, 1e-3))
        else:
            for g, n in zip(grads, noise, strict=True):
                g.add_(n * 1e-3)
    if "--clip-loop" in sys.argv:  # the same clipping written by hand, a parameter at a time
        total = torch.zeros((), device="neuron")
        for p in model.parameters():
            total += p.grad.norm() ** 2
        coef = torch.clamp(1.0 / (total.sqrt() + 1e-6), max=1.0)
        for p in model.parameters():
            p.grad.mul_(coef)
    opt.step()
    if EMA:
        with torch.no_grad():
            for average, weight in zip(ema, model.parameters(), strict=True):
                average.mul_(0.999).add_(weight, alpha=0.001)
    if "--ema-foreach" in sys.argv:  # the same average over the list of tensors
        with torch.no_grad():
            torch._foreach_mul_(ema, 0.999)
            torch._foreach_add_(ema, list(model.parameters()), alpha=0.001)
    if "--ema-lerp" in sys.argv:  # the same average, one pass over each tensor
        with torch.no_grad():
            torch._foreach_lerp_(ema, list(model.parameters()), 0.001)
    if "--ema-compiled" in sys.argv:  # the loop of --ema, compiled
        compiled_ema()
    if ITEM:
        losses.append(loss.item())
    if PREDICTIONS == "every-step":
        predictions.append(out.argmax(dim=1).cpu())
    elif PREDICTIONS == "every-step-view":
        predictions.append(out.argmax(dim=1).view(-1, 1).cpu())
    elif PREDICTIONS == "on-device":
        predictions.append(out.argmax(dim=1))
    elif PREDICTIONS == "outputs-kept":
        predictions.append(out.detach())
if PREDICTIONS == "on-device":
    predictions = [torch.cat(predictions).cpu()]
elif PREDICTIONS == "outputs-kept":
    predictions = [torch.cat([o.argmax(dim=1) for o in predictions]).cpu()]
print(loss.item())
