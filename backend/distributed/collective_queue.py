"""Each device's collective queue, and where a collective lands on it.

A collective reaches the device when it is launched and the compute work queued before
it (which produced its inputs) has finished; it starts when every rank of its group has
reached it and lasts its cost on the interconnect. Collectives run one after another on
their queue and overlap the compute queue until something waits for them.
"""

from __future__ import annotations

from neuron_explorer.backend import devices

_finish: dict[int, int] = {}  # device index -> when its last collective ends


def ready_ns(device: devices.NeuronDevice) -> int:
    """When `device` could start a collective launched now: the work queued before it
    (compute and earlier collectives) is done."""
    return max(device.timeline.finish_ns, _finish.get(device.index, 0))


def arrival(device: devices.NeuronDevice, launch_ns: int) -> int:
    """When a collective launched at host time `launch_ns` is ready to run on `device`."""
    return max(launch_ns + device.preset.launch_latency_ns, ready_ns(device))


def place(device: devices.NeuronDevice, arrivals: list[int], transfer_ns: int) -> tuple[int, int]:
    """(start, end) of a collective every rank reached at `arrivals` (device clock)."""
    start = max(arrivals)
    end = start + transfer_ns
    _finish[device.index] = max(_finish.get(device.index, 0), end)
    return start, end


def finish_ns(device_index: int) -> int:
    return _finish.get(device_index, 0)


def restart() -> None:
    """No collective queued, for a restarted host clock (`devices.restart_clocks`)."""
    _finish.clear()
