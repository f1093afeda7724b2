"""Re-time a recorded op stream on a hardware preset without running the program again.

The device timeline is a pure function of the op sequence (names, shapes, dtypes,
attrs) and the preset, so a recording's op keys are enough: each op is lowered for the
chosen preset by the same lowering a live run uses (`hardware.lower_op`, the host
fallback, the host-link transfers) and placed by the same `DeviceTimeline`, launched the
way the default eager policy launches it (the preset's host launch overhead, then the
kernel). No values are computed: the lowering reads shapes and dtypes only.

The host keeps its own time between launches from the recording. What the old device
made it wait for is re-derived: a launch costs the new launch overhead instead of the
old, and a sync point waits until the new device has finished (or not at all). Every
host time after such a change moves by the difference, so host slices that are not ops
or syncs (steps, modules, data loading) keep their recorded lengths, stretched only by
the launches and syncs inside them (`HostShift`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
from neuron_explorer.backend.hardware import (
    DeviceTimeline,
    HardwarePreset,
    Kernel,
    NoLowering,
    OpSpec,
    TensorSpec,
    get_preset,
    lower_host_fallback,
    lower_host_transfer,
    lower_op,
)
from neuron_explorer.backend.hardware.kernel import FIRST_DMA

# (shape, dtype name) pairs; attrs as (name, value) pairs (common/op_key_codec.py)
OpKey = tuple[str, tuple, tuple, tuple]

@dataclass
class ReplayedKernel:
    """One kernel the replay placed on a device."""

    kernel: Kernel
    device: int
    launch_ns: int
    start_ns: int
    end_ns: int
    fallback: bool


@dataclass
class ReplayedOp:
    """An op's new host slice and the kernels it launched."""

    ts: int
    dur: int
    kernels: list[ReplayedKernel] = field(default_factory=list)
    flops: int = 0
    hbm_bytes: int = 0
    fallback: bool = False
    name: str | None = None  # a new name (a predicted graph launch); None: as recorded


@dataclass(frozen=True)
class ReplayOptions:
    """What to predict: the preset and the launch overhead (another dtype is in the
    events' keys and casts: `backend.mixed_precision`)."""

    hardware: str = "trn2"
    launch_overhead_ns: int | None = None  # None: the preset's own

    def preset(self) -> HardwarePreset:
        preset = get_preset(self.hardware)
        if self.launch_overhead_ns is not None:
            preset = dataclasses.replace(preset,
                                         host_launch_overhead_ns=int(self.launch_overhead_ns))
        return preset


@dataclass
class HostEvent:
    """A host slice the replay re-times: an op (with its key) or a sync point."""

    ts: int
    dur: int
    device: int
    key: OpKey | None = None  # None: a sync point, or a collective
    backward: bool = False  # run by autograd's backward (what autocast casts differs)
    transfer_ns: int | None = None  # a collective: its time on the interconnect
    # a custom kernel's op (an NKI kernel, `nki::<name>`): its recorded kernels' length,
    # which no lowering of its key gives
    recorded_ns: int | None = None
    # casts launched before and after the op (in another dtype: backend/mixed_precision.py)
    casts_before: tuple = ()
    casts_after: tuple = ()


class HostShift:
    """Maps recorded host times to predicted ones: each re-timed launch or sync moves every
    later time by how much longer (or shorter) it got. Times inside a `collapsed` span
    (recorded ops that became one launch) map to the span's start."""

    def __init__(self, ends: np.ndarray, deltas: np.ndarray,
                 collapsed: Sequence[tuple[int, int]] = ()) -> None:
        order = np.argsort(ends, kind="stable")
        self._ends = ends[order]
        self._shift = np.concatenate([[0], np.cumsum(deltas[order])]).astype(np.int64)
        self._collapsed = list(collapsed)

    def __call__(self, ts: np.ndarray) -> np.ndarray:
        """Predicted times of recorded host times."""
        ts = np.array(ts, np.int64)
        for start, end in self._collapsed:
            ts[(ts > start) & (ts < end)] = start
        return ts + self._shift[np.searchsorted(self._ends, ts, side="right")]


def _transfer(attrs: tuple) -> str | None:
    for name, value in attrs:
        if name == "direction" and value in ("host_to_device", "device_to_host"):
            return value
    return None


def spec_of(key: OpKey) -> OpSpec:
    """The hardware's OpSpec of an op key (backend/runtime.py `spec_for`)."""
    name, inputs, outputs, attrs = key
    return OpSpec(name=name, inputs=tuple(TensorSpec(tuple(s), d) for s, d in inputs),
                  outputs=tuple(TensorSpec(tuple(s), d) for s, d in outputs), attrs=dict(attrs))


def lower_key(key: OpKey, preset: HardwarePreset) -> tuple[Kernel | None, bool]:
    """(kernel, runs on the host) of one op key on `preset`, lowered as the runtime does
    (backend/runtime.py `lower`)."""
    _, inputs, outputs, attrs = key
    direction = _transfer(attrs)
    if direction is not None:
        to_device = direction == "host_to_device"
        tensors = outputs if to_device else inputs
        nbytes = sum(TensorSpec(tuple(s), d).nbytes for s, d in tensors)
        return lower_host_transfer(nbytes, preset, to_device=to_device), False
    spec = spec_of(key)
    try:
        return lower_op(spec, preset), False
    except NoLowering:
        return lower_host_fallback(spec, preset), True


def recorded_kernel(name: str, length_ns: int) -> Kernel:
    """A kernel of a recorded length standing for a custom kernel's run (an NKI kernel: its
    own schedule, which no op key describes). Predictions dropped them: a replay of a run
    whose NKI kernel took 800 us a step predicted the same step for a kernel twice as
    fast, and claimed compiling saved that kernel's time."""
    one = np.ones(1, np.int64)
    return Kernel(name, flops=0, model_flops=0, hbm_read_bytes=0, hbm_write_bytes=0,
                  spill_bytes=0, sbuf_bytes=0, psum_bytes=0, opcodes=(name,),
                  engine=np.array([FIRST_DMA], np.int16), opcode=np.zeros(1, np.int16),
                  start=np.zeros(1, np.int64), dur=one * int(length_ns),
                  nbytes=np.zeros(1, np.int64), iflops=np.zeros(1, np.int64))


def replay_one(ev: HostEvent, ts: int, timeline: DeviceTimeline,
               preset: HardwarePreset) -> ReplayedOp:
    """One op, collective or sync point issued at host time `ts` on `timeline`, as a live
    run would."""
    if not ev.backward:  # past a backward: the device waits for the collectives it launched
        timeline.finish_ns = max(timeline.finish_ns, timeline.collectives_end_ns)
    if ev.transfer_ns is not None:
        return _collective(ev, ts, timeline, preset)
    if ev.recorded_ns is not None:  # a custom kernel (no op key) runs as it was recorded
        return _recorded(ev, ts, timeline, preset)
    if ev.key is None:  # a sync point: wait for what this device still has queued
        return ReplayedOp(ts, max(0, timeline.finish_ns - ts))
    kernel, fallback = lower_key(ev.key, preset)
    if kernel is None:
        return ReplayedOp(ts, 0, fallback=fallback)
    overhead = preset.host_launch_overhead_ns
    # in another dtype, autocast's casts around the op, each launched on its own
    before = [lower_key(c, preset)[0] for c in ev.casts_before]
    after = [lower_key(c, preset)[0] for c in ev.casts_after]
    out = ReplayedOp(ts, 0, fallback=fallback)
    for k in [c for c in before if c is not None] + [kernel] + [c for c in after
                                                                 if c is not None]:
        launch = ts + out.dur + overhead
        start, end = timeline.schedule(k, launch)
        out.kernels.append(ReplayedKernel(k, ev.device, launch, start, end,
                                          fallback and k is kernel))
        out.dur += overhead
        out.flops += k.model_flops
        out.hbm_bytes += k.hbm_bytes
    return out


def _recorded(ev: HostEvent, ts: int, timeline: DeviceTimeline,
              preset: HardwarePreset) -> ReplayedOp:
    """A custom kernel's launch at host time `ts`: its recorded length on the device."""
    kernel = recorded_kernel("custom kernel", int(ev.recorded_ns or 0))
    launch = ts + preset.host_launch_overhead_ns
    start, end = timeline.schedule(kernel, launch)
    return ReplayedOp(ts, preset.host_launch_overhead_ns,
                      [ReplayedKernel(kernel, ev.device, launch, start, end, False)])


def _collective(ev: HostEvent, ts: int, timeline: DeviceTimeline,
                preset: HardwarePreset) -> ReplayedOp:
    """A collective launched at host time `ts`: the host pays what it recorded (the launch,
    and any wait for its peers to call it); it runs on the collective queue once the work
    queued before it is done, for its recorded transfer (this rank's peers taken to arrive
    with it). Launched by the backward (DDP's buckets), it overlaps the rest of the
    backward and the device waits for it as the backward ends, as DDP makes it; launched
    elsewhere, the device waits for it at once. It was replayed as a sync point: the
    host's launch gone, a DDP step 2% short on an unchanged replay."""
    arrival = ts + preset.host_launch_overhead_ns + preset.launch_latency_ns
    start = max(arrival, timeline.finish_ns, timeline.collectives_end_ns)
    timeline.collectives_end_ns = start + int(ev.transfer_ns or 0)
    if not ev.backward:
        timeline.finish_ns = timeline.collectives_end_ns
    return ReplayedOp(ts, ev.dur)


def replay(events: Iterable[HostEvent], options: ReplayOptions
           ) -> tuple[list[ReplayedOp], HostShift]:
    """Re-time `events` (in host order) on the options' preset: per event its new slice
    (for a sync point, its new wait as a `ReplayedOp` without kernels), and the shift that
    maps every other recorded host time."""
    preset = options.preset()
    timelines: dict[int, DeviceTimeline] = {}
    shift = 0
    out: list[ReplayedOp] = []
    ends: list[int] = []
    deltas: list[int] = []
    for ev in events:
        timeline = timelines.get(ev.device)
        if timeline is None:
            timeline = timelines[ev.device] = DeviceTimeline(preset)
        new = replay_one(ev, ev.ts + shift, timeline, preset)
        out.append(new)
        if new.dur != ev.dur:
            ends.append(ev.ts + ev.dur)
            deltas.append(new.dur - ev.dur)
            shift += new.dur - ev.dur
    return out, HostShift(np.array(ends, np.int64), np.array(deltas, np.int64))
