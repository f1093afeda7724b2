"""Streams and events for `torch.neuron`, as FSDP2 and other stream-aware code use them.

The device runs its kernels on one compute queue and its collectives on a collective
queue (`collective_queue`). A side stream here holds no kernels: it only carries the
time its work is ready, so that waiting on a collective from a side stream (FSDP2's
all-gather and reduce-scatter streams) delays the compute queue only when the compute
stream waits for that stream or an event recorded on it, as on the real device.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from neuron_explorer.backend import devices


class Stream:
    """A `neuron` stream: the default one is the device's compute queue."""

    def __init__(self, device: int | None = None, priority: int = 0) -> None:
        self.device_index = devices.current_index if device is None else int(device)
        self.priority = priority
        self.ready_ns = 0  # side streams: when the work waited for so far is done
        self.is_default = False

    @property
    def device(self):
        return devices.get(self.device_index).torch_device

    def ready_time(self) -> int:
        if self.is_default:
            return devices.get(self.device_index).timeline.finish_ns
        return self.ready_ns

    def wait_until(self, t_ns: int) -> None:
        """Work issued on this stream from now on starts no earlier than `t_ns`."""
        if self.is_default:
            timeline = devices.get(self.device_index).timeline
            timeline.finish_ns = max(timeline.finish_ns, t_ns)
        else:
            self.ready_ns = max(self.ready_ns, t_ns)

    def wait_stream(self, other: Stream) -> None:
        self.wait_until(other.ready_time())

    def wait_event(self, event: Event) -> None:
        self.wait_until(event.time_ns)

    def record_event(self, event: Event | None = None) -> Event:
        event = event or Event()
        event.record(self)
        return event

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        from neuron_explorer.backend import runtime

        runtime.synchronize(self.device_index, "synchronize")

    def __eq__(self, other: object) -> bool:
        return self is other

    def __hash__(self) -> int:
        return id(self)

    def __repr__(self) -> str:
        kind = "default" if self.is_default else "side"
        return f"<neuron Stream {kind} device={self.device_index}>"


class Event:
    """A point on a stream: `record` takes the stream's ready time, waits use it."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False,
                 interprocess: bool = False) -> None:
        self.time_ns = 0

    def record(self, stream: Stream | None = None) -> Event:
        self.time_ns = (stream or current_stream()).ready_time()
        return self

    def wait(self, stream: Stream | None = None) -> None:
        (stream or current_stream()).wait_event(self)

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        current_stream().synchronize()

    def elapsed_time(self, end: Event) -> float:
        return (end.time_ns - self.time_ns) / 1e6


_defaults: dict[int, Stream] = {}
_local = threading.local()


def default_stream(device: int | None = None) -> Stream:
    index = devices.current_index if device is None else _index(device)
    stream = _defaults.get(index)
    if stream is None:
        stream = _defaults[index] = Stream(index)
        stream.is_default = True
    return stream


def _index(device) -> int:
    if isinstance(device, int):
        return device
    import torch

    device = torch.device(device)
    return devices.current_index if device.index is None else device.index


def current_stream(device: int | None = None) -> Stream:
    stack = getattr(_local, "stack", None)
    if stack:
        return stack[-1]
    return default_stream(device)


def set_stream(stream: Stream) -> None:
    _local.stack = [stream]


@contextmanager
def stream(s: Stream | None) -> Iterator[None]:
    """Make `s` the current stream inside the block (None: leave it as it is)."""
    if s is None:
        yield
        return
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    stack.append(s)
    try:
        yield
    finally:
        stack.pop()


def install(device_module) -> None:
    """Give `torch.neuron` the stream API, where it does not have one already."""
    for name, value in (("Stream", Stream), ("Event", Event), ("stream", stream),
                        ("current_stream", current_stream), ("default_stream", default_stream),
                        ("set_stream", set_stream)):
        if not hasattr(device_module, name):
            setattr(device_module, name, value)
