"""What `torch.compile(model)` (the default backend, Inductor) does on neuron tensors.

Inductor generates Triton or C++ code; neither runs on a NeuronCore. Inductor looks
up a PrivateUse1 device's code generators as attributes of the device module
(`torch.neuron.Scheduling`, `PythonWrapperCodegen`, ...); ours are these guard
classes, which stop the compile at Inductor's first device lookup, before it lowers
or generates any code, with a message that names the backend to use instead.
Importing this module is cheap: it runs at `import torch`.
"""

from __future__ import annotations

from types import ModuleType

from neuron_explorer.errors import NeuronExplorerError

MESSAGE = (
    "torch.compile's default backend (inductor) cannot generate code for the neuron "
    "device; compile with torch.compile(model, backend=\"neuron\") instead"
)


class InductorUnsupportedError(NeuronExplorerError):
    """torch.compile(model) with Inductor on neuron tensors."""

    def __init__(self) -> None:
        super().__init__(MESSAGE)


class _RefuseInductor(type):
    """Any use of the class by Inductor (its first is `supports_caching`) raises."""

    @property
    def supports_caching(cls) -> bool:
        raise InductorUnsupportedError()

    def __call__(cls, *args: object, **kwargs: object) -> object:
        raise InductorUnsupportedError()


class Scheduling(metaclass=_RefuseInductor):
    """Inductor's kernel scheduling for neuron: refused."""


class PythonWrapperCodegen(metaclass=_RefuseInductor):
    """Inductor's Python wrapper codegen for neuron: refused."""


class CppWrapperCodegen(metaclass=_RefuseInductor):
    """Inductor's C++ wrapper codegen for neuron: refused."""


class WrapperFxCodegen(metaclass=_RefuseInductor):
    """Inductor's FX wrapper codegen for neuron: refused."""


GUARDS = (Scheduling, PythonWrapperCodegen, CppWrapperCodegen, WrapperFxCodegen)


def install(device_module: ModuleType) -> None:
    """Give the `torch.neuron` module the code generators Inductor looks up."""
    for guard in GUARDS:
        if not hasattr(device_module, guard.__name__):
            setattr(device_module, guard.__name__, guard)
