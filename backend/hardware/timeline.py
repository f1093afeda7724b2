"""The device clock of one `neuron` device: kernels run one after another.

A kernel starts at max(launch time + launch latency, when the previous kernel ends)
and lasts its (precomputed) duration, so the device timeline is a pure function of
the launches. On trn2/trn3 the Tensor Engine's throttle re-engages after it has been
idle for `te_throttle_idle_ns`: a kernel that uses it after such a gap (or first) lasts
`kernel.te_cold_ns` longer; back-to-back kernels keep it warm. Times are ns on the host
clock's timeline.
"""

from __future__ import annotations

from neuron_explorer.backend.hardware.kernel import Kernel
from neuron_explorer.common.presets import HardwarePreset


class DeviceTimeline:
    """Places kernels on one device's clock and keeps what is queued."""

    __slots__ = ("busy_ns", "collectives_end_ns", "finish_ns", "kernels", "preset",
                 "te_idle_since")

    def __init__(self, preset: HardwarePreset) -> None:
        self.preset = preset
        self.finish_ns = 0  # when all work queued so far completes
        # when the collectives a replay launched end (a live run keeps its collective
        # queue in backend/distributed/collective_queue.py)
        self.collectives_end_ns = 0
        self.busy_ns = 0  # total kernel time scheduled
        self.kernels = 0
        self.te_idle_since: int | None = None  # end of the last kernel using the Tensor Engine

    def restart(self) -> None:
        """Idle from time 0 of a restarted clock, the Tensor Engine cold; the totals stay."""
        self.finish_ns = 0
        self.collectives_end_ns = 0
        self.te_idle_since = None

    def schedule(self, kernel: Kernel, launch_ns: int) -> tuple[int, int]:
        """Queue `kernel` launched at host time `launch_ns`; return its (start, end)."""
        start = launch_ns + self.preset.launch_latency_ns
        start = max(start, self.finish_ns)
        duration = kernel.duration_ns
        if kernel.engine_busy_ns["tensor"]:
            idle = self.te_idle_since
            if idle is None or start - idle >= self.preset.te_throttle_idle_ns:
                duration += kernel.te_cold_ns
        end = start + duration
        if kernel.engine_busy_ns["tensor"]:
            self.te_idle_since = end
        self.finish_ns = end
        self.busy_ns += duration
        self.kernels += 1
        return start, end
