"""The device clock of one `neuron` device: kernels run one after another.

A kernel starts at max(launch time + launch latency, when the previous kernel ends)
and lasts its (precomputed) duration, so the device timeline is a pure function of
the launches. Times are ns on the host clock's timeline.
"""

from __future__ import annotations

from neuron_explorer.backend.hardware.kernel import Kernel
from neuron_explorer.backend.hardware.presets import HardwarePreset


class DeviceTimeline:
    """Places kernels on one device's clock and keeps what is queued."""

    __slots__ = ("busy_ns", "finish_ns", "kernels", "preset")

    def __init__(self, preset: HardwarePreset) -> None:
        self.preset = preset
        self.finish_ns = 0  # when all work queued so far completes
        self.busy_ns = 0  # total kernel time scheduled
        self.kernels = 0

    def schedule(self, kernel: Kernel, launch_ns: int) -> tuple[int, int]:
        """Queue `kernel` launched at host time `launch_ns`; return its (start, end)."""
        start = launch_ns + self.preset.launch_latency_ns
        start = max(start, self.finish_ns)
        end = start + kernel.duration_ns
        self.finish_ns = end
        self.busy_ns += kernel.duration_ns
        self.kernels += 1
        return start, end

    def idle_at(self, t_ns: int) -> bool:
        """True when everything queued before `t_ns` has finished by then."""
        return self.finish_ns <= t_ns
