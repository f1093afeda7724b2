"""The device a trace ran on, in the words its advice must use.

A recommendation names APIs the user can call. A trace recorded by this tool ran on the
`neuron` device: `torch.compile(backend="neuron")`, no pinned host memory, the what-if
and `record --steps` commands apply. A PyTorch-profiler trace from elsewhere ran on a
GPU (ROCm included: PyTorch calls it `cuda` too), an MTIA chip or the CPU alone, where
PyTorch's own defaults apply and this tool's commands do not.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class DeviceTerms:
    device: str  # the torch device string: "neuron", "cuda", "mtia", "cpu", or "" unknown
    recorded_here: bool  # by this tool's recorder: its what-if and record commands apply

    @property
    def name(self) -> str:
        """The device string for code (`device='cuda'`), or a placeholder."""
        return self.device or "<your device>"

    @property
    def compile_call(self) -> str:
        if self.device == "neuron":
            return 'torch.compile(..., backend="neuron")'
        return "torch.compile(...)"

    @property
    def launch_remedy(self) -> str:
        """The device's own way to launch a whole step at once, if it has one."""
        if self.device == "cuda":
            return (' torch.compile(mode="reduce-overhead") also captures the step as a '
                    "CUDA graph: one launch for all its kernels.")
        return ""

    @property
    def pinned_memory(self) -> bool:
        """Whether DataLoader(pin_memory=True) helps (the neuron device has no pinned
        host memory, README)."""
        return self.device == "cuda"


_GPU_NAMES = re.compile(r"nvidia|amd|radeon|instinct|geforce|tesla|quadro", re.IGNORECASE)


def device_terms(metadata: dict[str, Any]) -> DeviceTerms:
    """The device of a trace, from its metadata: ours says so (the simulated device's
    `hardware_figures`, the recorder's `neuron_explorer_version`);
    a PyTorch-profiler trace names its GPUs (`deviceProperties`) or its process group's
    backends (`distributedInfo`: `nccl` is a GPU's, `mtia:...` an MTIA chip's)."""
    if "hardware_figures" in metadata or "neuron_explorer_version" in metadata:
        return DeviceTerms("neuron", recorded_here=True)
    props = metadata.get("deviceProperties") or []
    names = " ".join(str(p.get("name", "")) for p in props if isinstance(p, dict))
    info = metadata.get("distributedInfo")
    backend = str(info.get("backend", "")).lower() if isinstance(info, dict) else ""
    if "mtia" in backend:
        return DeviceTerms("mtia", recorded_here=False)
    if _GPU_NAMES.search(names) or "nccl" in backend or "rccl" in backend:
        return DeviceTerms("cuda", recorded_here=False)
    if backend and set(re.split(r"[,:]", backend)) <= {"gloo", "cpu"}:
        return DeviceTerms("cpu", recorded_here=False)
    return DeviceTerms("", recorded_here=False)
