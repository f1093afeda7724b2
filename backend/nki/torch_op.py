"""An NKI kernel as a PyTorch custom op (`torch.library`), so `torch.compile` graphs
can call it: `op = nki.as_torch_op(kernel)`; `op(a, b)`.

The fake implementation traces the kernel without numerics on the inputs' shapes and
dtypes to learn its outputs' shapes and dtypes; the real one is the eager launch.
"""

from __future__ import annotations

import torch
from neuron_explorer.nki.errors import NkiError

_TORCH = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "int32": torch.int32, "int8": torch.int8, "uint8": torch.uint8, "int16": torch.int16}


class _Shape:
    def __init__(self, t) -> None:
        self.shape, self.dtype = tuple(t.shape), str(t.dtype).removeprefix("torch.")


# op name ("nki::matmul") -> its kernel, for the graph compiler's lowering
KERNELS: dict[str, object] = {}


def as_torch_op(kernel, name: str | None = None):
    """Register `kernel` (tensor arguments only, one output) as `nki::<name>`."""
    from neuron_explorer.nki.launch import launch
    from neuron_explorer.nki.runner import Run, run

    op_name = f"nki::{name or kernel.func.__name__}"
    KERNELS[op_name] = kernel

    def output_spec(args) -> Run:
        return run(kernel, tuple(_Shape(a) for a in args), {}, numerics=False)

    @torch.library.custom_op(op_name, mutates_args=())
    def op(args: list[torch.Tensor]) -> torch.Tensor:
        if all(a.device.type == "cpu" for a in args):
            # a compiled graph's host run (its device work is charged by the graph):
            # the numbers only
            return _host_numbers(kernel, args)
        out = launch(kernel, tuple(args), {})
        if not isinstance(out, torch.Tensor):
            raise NkiError(f"{op_name}: as a torch op a kernel must return one tensor")
        return out

    @op.register_fake
    def _(args):
        traced = output_spec(args)
        dtype = traced.output_dtypes
        if not isinstance(dtype, str):
            raise NkiError(f"{op_name}: as a torch op a kernel must return one tensor")
        return args[0].new_empty(traced.output_shapes, dtype=_TORCH[dtype])

    def call(*args: torch.Tensor) -> torch.Tensor:
        return op(list(args))

    call.op = op  # type: ignore[attr-defined]  # mypy does not model function attributes
    return call


def _host_numbers(kernel, args: list[torch.Tensor]) -> torch.Tensor:
    from neuron_explorer.nki.launch import HostArg, outputs_to_device, to_numpy
    from neuron_explorer.nki.runner import run

    host = tuple(HostArg(to_numpy(a), str(a.dtype).removeprefix("torch.")) for a in args)
    result = run(kernel, host, {}, numerics=True)
    return outputs_to_device(result.outputs, result.output_dtypes, torch.device("cpu"))


def lower_into(b, spec) -> bool:
    """Emit the kernel of the `nki::` custom op `spec` into `b`, the builder of a compiled
    graph's program: the kernel is traced on the op's input shapes (no numerics) and its
    instructions, with their dependencies, join the program after `b.after` (the ops it
    reads). False when `spec` is no registered kernel."""
    from neuron_explorer.nki.runner import run

    kernel = KERNELS.get(spec.name.split(".", 1)[0])
    if kernel is None:
        return False
    traced = run(kernel, tuple(_Shape(t) for t in spec.inputs), {}, b.preset,
                 numerics=False).builder
    assert traced is not None  # run() keeps the builder of every kernel it traces
    opcodes = {code: name for name, code in traced._opcodes.items()}
    offset = len(b)
    for j in range(len(traced)):
        deps = tuple(offset + d for d in traced._deps[j])
        # the spills' stores and reloads come last in issue order: wait for them once added
        i = b.add(traced._engine[j], opcodes[traced._opcode[j]], traced._cost[j],
                  tuple(d for d in deps if d < offset + j), nbytes=traced._bytes[j],
                  flops=traced._flops[j], kind=traced._kind[j], latency=traced._latency[j])
        later = tuple(d for d in deps if d >= offset + j)
        if later:
            b._deps[i] = b._deps[i] + later
        if j in traced._gap:
            b._gap[i] = traced._gap[j]
        if j in traced._transfer:  # a DMA piece: its transfer and descriptor generation
            b._transfer[i] = offset + traced._transfer[j]
            if j in traced._dge:
                b._dge[i] = traced._dge[j]
    b.add_model_flops(traced.model_flops)
    b.hbm_read_bytes += traced.hbm_read_bytes
    b.hbm_write_bytes += traced.hbm_write_bytes
    b.spill_bytes += traced.spill_bytes
    b.note_sbuf(traced.sbuf_peak)
    b.note_psum(traced.psum_peak)
    return True
