"""Training loops with other work in each iteration, as users write them:

    beside_training.py sample [--compile]  # train, then sample in eval mode (no_grad)
    beside_training.py distill [--teacher-eval] [--compile-step]  # a frozen teacher
    beside_training.py gan [--compile | --compile-step]  # two models, two optimizers
    beside_training.py policy [--no-validation]  # a policy's Categorical each step

`sample` trains a denoiser for STEPS steps and then runs SAMPLES sampling steps; compiled,
`model.eval()` under no_grad recompiles in the first of them. `distill`'s teacher is
larger than its student. `gan` marks its iterations with `neuron_explorer.step()` after
both optimizer steps. `policy` builds a torch.distributions.Categorical each step, whose
argument checks read device values on the host (off with --no-validation)."""

import sys

import neuron_explorer
import torch
from torch import nn

MODE = sys.argv[1]
STEPS, SAMPLES = 8, 4
torch.manual_seed(0)


def mlp(width: int, depth: int = 2, dropout: float = 0.0) -> nn.Module:
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.GELU(), nn.Dropout(dropout)]
    return nn.Sequential(*layers, nn.Linear(width, width)).to("neuron")


def sample() -> None:
    model = mlp(128)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step = torch.compile(model, backend="neuron") if "--compile" in sys.argv else model
    x = torch.randn(64, 128).to("neuron")
    for _ in range(STEPS):
        loss = (step(x) - x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        z = torch.randn(64, 128).to("neuron")
        for _ in range(SAMPLES):
            z = z - 0.1 * step(z)
            neuron_explorer.step()
    print(float(z.abs().mean()))


def distill() -> None:
    teacher, student = mlp(256, depth=4, dropout=0.1), mlp(256, depth=1)
    if "--teacher-eval" in sys.argv:
        teacher.eval()
    opt = torch.optim.AdamW(student.parameters(), lr=1e-3)
    x = torch.randn(64, 256).to("neuron")

    def distill_loss(x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            target = teacher(x)
        return (student(x) - target).pow(2).mean()

    if "--compile-step" in sys.argv:  # both forwards and the loss
        distill_loss = torch.compile(distill_loss, backend="neuron")
    for _ in range(STEPS):
        loss = distill_loss(x)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(float(loss))


def gan() -> None:
    gen, disc = mlp(64), nn.Sequential(mlp(64), nn.Linear(64, 1)).to("neuron")
    if "--compile" in sys.argv:
        gen, disc = torch.compile(gen, backend="neuron"), torch.compile(disc, backend="neuron")
    opt_g = torch.optim.Adam(gen.parameters(), lr=2e-4)
    opt_d = torch.optim.Adam(disc.parameters(), lr=2e-4)
    real = torch.randn(32, 64).to("neuron")
    bce = nn.functional.binary_cross_entropy_with_logits
    ones, zeros = torch.ones(32, 1).to("neuron"), torch.zeros(32, 1).to("neuron")

    def d_loss(fake: torch.Tensor) -> torch.Tensor:
        return bce(disc(real), ones) + bce(disc(fake.detach()), zeros)

    def g_loss(fake: torch.Tensor) -> torch.Tensor:
        return bce(disc(fake), ones)

    if "--compile-step" in sys.argv:  # the models and their losses: the step's forwards
        gen = torch.compile(gen, backend="neuron")
        d_loss, g_loss = (torch.compile(f, backend="neuron") for f in (d_loss, g_loss))
    for _ in range(STEPS):
        fake = gen(torch.randn(32, 64).to("neuron"))
        loss_d = d_loss(fake)
        opt_d.zero_grad()
        loss_d.backward()
        opt_d.step()
        loss_g = g_loss(fake)
        opt_g.zero_grad()
        loss_g.backward()
        opt_g.step()
        print(float(loss_d), float(loss_g))  # after both steps: a piece of its own
        neuron_explorer.step()


def policy() -> None:
    torch.distributions.Distribution.set_default_validate_args("--no-validation" not in sys.argv)
    net = mlp(64)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    obs = torch.randn(16, 64).to("neuron")
    for _ in range(STEPS):
        dist = torch.distributions.Categorical(logits=net(obs))
        action = dist.sample()
        loss = -(dist.log_prob(action) * action.float()).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(float(loss))


{"sample": sample, "distill": distill, "gan": gan, "policy": policy}[MODE]()
