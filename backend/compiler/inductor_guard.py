"""What `torch.compile(model)` (the default backend, Inductor) does on neuron tensors.

Inductor generates Triton or C++ code; neither runs on a NeuronCore. Two guards stop
such a compile with a message that names the backend to use instead:

1. A pre-grad check, installed as Inductor's `pre_grad_custom_pass`. Inductor runs its
   pre-grad passes on Dynamo's graph at the start of AOTAutograd (after its cache
   lookup, before the joint forward/backward trace, which is most of the time a
   compile spends before Inductor proper), so the compile fails right after Dynamo
   has traced the model. Nothing earlier sees the graph's devices without wrapping
   `torch.compile` or Dynamo's backend lookup: Dynamo has no per-device backend
   selection, and Inductor's device registration
   (`register_backend_for_device`, `get_scheduling_for_device`) and its per-device
   custom passes are consulted only after AOTAutograd. Importing Inductor costs
   seconds, so the check is set when `torch._inductor.config` is first imported (an
   import hook), not at `import torch`. A program that sets its own
   `pre_grad_custom_pass` replaces ours, and guard 2 still applies.
2. Inductor looks up a PrivateUse1 device's code generators as attributes of the
   device module (`torch.neuron.Scheduling`, `PythonWrapperCodegen`, ...); ours are
   classes that raise at Inductor's first device lookup, before it lowers or
   generates any code.

Importing this module is cheap: it runs at `import torch`.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING

from neuron_explorer.common.errors import NeuronExplorerError

if TYPE_CHECKING:  # torch is not imported here at run time: this module loads with it
    from torch import fx

MESSAGE = (
    "torch.compile's default backend (inductor) cannot generate code for the neuron "
    "device; compile with torch.compile(model, backend=\"neuron\") instead"
)
INDUCTOR_CONFIG = "torch._inductor.config"


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


def refuse_neuron_graph(graph: fx.Graph) -> None:
    """Inductor's pre-grad pass: raise if any value of Dynamo's graph is a neuron tensor."""
    for node in graph.nodes:
        value = node.meta.get("example_value", node.meta.get("val"))
        values = value if isinstance(value, (list, tuple)) else (value,)
        for v in values:
            device = getattr(v, "device", None)
            if getattr(device, "type", None) == "neuron":
                raise InductorUnsupportedError()


def _pre_grad_check() -> object:
    """`refuse_neuron_graph` as a CustomGraphPass (a stable uuid keeps Inductor's caches)."""
    from torch._inductor.custom_graph_pass import CustomGraphPass

    class NeuronPreGradCheck(CustomGraphPass):
        def __call__(self, graph: fx.Graph) -> None:
            refuse_neuron_graph(graph)

        def uuid(self) -> str:
            return "neuron_explorer.refuse_neuron_graph.v1"

    return NeuronPreGradCheck()


def install_pre_grad_check(config: ModuleType) -> None:
    """Set the check as Inductor's pre-grad pass unless the program set its own."""
    if getattr(config, "pre_grad_custom_pass", None) is None:
        setattr(config, "pre_grad_custom_pass", _pre_grad_check())  # noqa: B010 (a module)


class _InductorConfigHook(importlib.abc.MetaPathFinder):
    """Installs the pre-grad check once `torch._inductor.config` has been executed."""

    def find_spec(self, name: str, path: Sequence[str] | None, target: object = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if name != INDUCTOR_CONFIG:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_install(module: ModuleType) -> None:
            exec_module(module)
            install_pre_grad_check(sys.modules.get(name, module))

        spec.loader.exec_module = exec_then_install  # type: ignore[method-assign]  # this loader only
        return spec


def install(device_module: ModuleType) -> None:
    """Give the `torch.neuron` module the code generators Inductor looks up, and arrange
    the pre-grad check (now, or when Inductor's config is first imported)."""
    for guard in GUARDS:
        if not hasattr(device_module, guard.__name__):
            setattr(device_module, guard.__name__, guard)
    config = sys.modules.get(INDUCTOR_CONFIG)
    if config is not None:
        install_pre_grad_check(config)
    elif not any(isinstance(f, _InductorConfigHook) for f in sys.meta_path):
        sys.meta_path.insert(0, _InductorConfigHook())
