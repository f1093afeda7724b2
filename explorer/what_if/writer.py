"""Write a what-if prediction as a trace with the recorded layout.

The host side is the recording's, re-timed: every host slice keeps its track, name,
category and args, its ends moved by the replay's `HostShift`; op slices get their new
launch time, cost and kernel; sync slices their re-derived wait. The device side is the
replay's: one process per device named for the new preset, its kernels (flows from their
ops, as recorded), and at engine level the instructions, DMA transfers and occupancy
counters of the new kernels. HBM in use keeps the recorded values at the new times.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from neuron_explorer import tables
from neuron_explorer.analyses.kernel_lines import NKI_OP_PREFIX
from neuron_explorer.common import trace_format as tf
from neuron_explorer.trace import Trace
from neuron_explorer.what_if.replay import META_WHATIF, WhatIfOptions

_INSTANTS = frozenset({tf.CAT_GRAPH_BREAK, tf.CAT_RECOMPILE, tf.CAT_UNCOUNTED})
_DEVICE_KINDS_REPLACED = frozenset({"kernel", "instruction", "dma", "memcpy", "memset"})
ENGINES = ("tensor", "vector", "scalar", "gpsimd")


def _plain(value: Any) -> Any:
    """An arg value as the writers take it (int, float, bool or str)."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value)
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return str(value)


def _args(trace: Trace, slice_id: int, **changes: Any) -> dict[str, Any]:
    args = {k: _plain(v) for k, v in (trace.slice_args.get(slice_id) or {}).items()
            if v is not None}
    args.update({k: v for k, v in changes.items() if v is not None})
    return args


def host_events(trace: Trace, ops: pd.DataFrame):
    """The ops and sync waits in host order, as the replay's HostEvents."""
    from neuron_explorer.backend.replay import HostEvent

    syncs = tables.of_kind(trace, tf.CAT_SYNC)
    sync_dev = tables.number(trace, tf.ARG_DEVICE, syncs["id"].to_numpy(), default=0)
    rows = pd.concat([
        pd.DataFrame({"id": ops["id"].to_numpy(), "ts": ops["ts"].to_numpy(),
                      "dur": ops["dur"].to_numpy(), "device": ops["device"].to_numpy(),
                      "key": ops["key"].to_numpy()}),
        pd.DataFrame({"id": syncs["id"].to_numpy(), "ts": syncs["ts"].to_numpy(),
                      "dur": syncs["dur"].to_numpy(), "device": sync_dev,
                      "key": np.full(len(syncs), None, dtype=object)}),
    ], ignore_index=True).sort_values(["ts", "id"], kind="stable", ignore_index=True)
    backward = tables.ancestor_of_kind(trace, rows["id"].to_numpy(), (tf.CAT_BACKWARD,)) >= 0
    transfers = _collective_transfers(trace, rows["id"].to_numpy())
    recorded = _custom_kernels_ns(trace, rows)
    events = [HostEvent(int(t), int(d), int(v), k, backward=bool(b),
                        transfer_ns=None if x < 0 else int(x),
                        recorded_ns=None if r < 0 else int(r))
              for t, d, v, k, b, x, r in
              zip(rows["ts"].tolist(), rows["dur"].tolist(), rows["device"].tolist(),
                  rows["key"].tolist(), backward.tolist(), transfers.tolist(),
                  recorded.tolist(), strict=True)]
    return rows, events


def _custom_kernels_ns(trace: Trace, rows: pd.DataFrame) -> np.ndarray:
    """Per row: for a custom kernel's op (an `@nki.jit` launch: no op key describes its
    schedule, and the replay took it for a sync point), its recorded kernels' summed
    length (a prediction runs it as recorded); -1 for any other."""
    out = np.full(len(rows), -1, np.int64)
    ids = rows["id"].to_numpy(np.int64)
    names = tables.slice_names(trace)[ids]
    custom = np.flatnonzero([str(n).startswith(NKI_OP_PREFIX) for n in names])
    k = trace.kernels
    if not len(custom) or not len(k):
        return out
    per_op = k.groupby("op_slice_id")["dur"].sum()
    out[custom] = per_op.reindex(ids[custom]).fillna(0).to_numpy(np.int64)
    return out


def _collective_transfers(trace: Trace, ids: np.ndarray) -> np.ndarray:
    """Per slice of `ids`: for a collective's op (`c10d::all_reduce`), how long its
    collective moved data on the interconnect (the device slice of the same kernel id);
    -1 for any other slice."""
    out = np.full(len(ids), -1, np.int64)
    collectives = tables.of_kind(trace, tf.CAT_COLLECTIVE)
    if not len(collectives):
        return out
    cids = collectives["id"].to_numpy()
    transfer = dict(zip(tables.number(trace, tf.ARG_KERNEL_ID, cids, default=-1).tolist(),
                        tables.number(trace, tf.ARG_TRANSFER_NS, cids, default=0).tolist(),
                        strict=True))
    kernel = tables.number(trace, tf.ARG_KERNEL_ID, ids, default=-1)
    names = trace.table("slices")["name"].iloc[ids].astype(str).to_numpy()
    for i in np.flatnonzero(np.char.startswith(names.astype(str), "c10d::")):
        out[i] = transfer.get(int(kernel[i]), -1)
    return out


def _metadata(trace: Trace, options: WhatIfOptions, preset: Any, notes: Sequence[str]) -> dict:
    meta = dict(trace.metadata)
    recorded = trace.hardware
    meta[tf.META_HARDWARE] = preset.name
    meta[tf.META_HARDWARE_FIGURES] = json.loads(json.dumps(preset.figures(), default=str))
    meta[META_WHATIF] = {
        "prediction": True,
        "from": str(trace.path),
        "recorded_hardware": recorded,
        "hardware": preset.name,
        "mode": options.mode,
        "dtype": options.dtype,
        "launch_overhead_ns": preset.host_launch_overhead_ns,
        "approximations": list(notes),
    }
    return meta


class _Tracks:
    """The predicted trace's processes and tracks, made from the recorded ones."""

    def __init__(self, trace: Trace, writer: Any, preset_name: str, engine_level: bool) -> None:
        self.writer = writer
        self.engine_level = engine_level
        self.preset_name = preset_name
        self.host: dict[int, int] = {}  # recorded track id -> new track
        self._device_pid: dict[int, int] = {}
        self._devices: dict[int, int] = {}
        self._device_tracks: dict[tuple[int, str], int] = {}
        tracks = trace.tracks
        processes: dict[int, int] = {}
        command = [str(a) for a in trace.metadata.get(tf.META_COMMAND) or []]
        for row in tracks.itertuples(index=False):
            if int(row.device) >= 0:
                if row.kind == "device":
                    self._device_pid[int(row.device)] = int(row.pid)
                continue
            if row.kind == "process":
                processes[int(row.pid)] = writer.process(int(row.pid), str(row.name), command)
                self.host[int(row.track_id)] = processes[int(row.pid)]
        for row in tracks.itertuples(index=False):
            if int(row.device) >= 0 or row.kind == "process":
                continue
            pid = int(row.pid)
            if pid not in processes:
                processes[pid] = writer.process(pid, str(row.process))
            if row.kind == "thread":
                self.host[int(row.track_id)] = writer.thread(pid, int(row.tid), str(row.name))
            else:
                self.host[int(row.track_id)] = writer.track(str(row.name), processes[pid])

    def device(self, index: int) -> int:
        process = self._devices.get(index)
        if process is None:
            pid = self._device_pid.get(index, (1 << 30) + index)
            process = self._devices[index] = self.writer.process(
                pid, tf.DEVICE_PROCESS.format(index=index, preset=self.preset_name))
            self.track(index, tf.TRACK_KERNELS)
            if self.engine_level:
                for engine in ENGINES:
                    self.track(index, tf.ENGINE_TRACKS[engine])
            self.counter(index, tf.COUNTER_HBM, "bytes")
        return process

    def track(self, index: int, name: str) -> int:
        track = self._device_tracks.get((index, name))
        if track is None:
            track = self.writer.track(name, self.device(index))
            self._device_tracks[(index, name)] = track
        return track

    def counter(self, index: int, name: str, unit: str | None = None) -> int:
        key = (index, "counter:" + name)
        track = self._device_tracks.get(key)
        if track is None:
            track = self.writer.counter_track(name, self.device(index), unit)
            self._device_tracks[key] = track
        return track

    def engine(self, index: int, engine: str) -> int:
        if engine in tf.ENGINE_TRACKS:
            return self.track(index, tf.ENGINE_TRACKS[engine])
        queue = engine.partition(".")[2] or "0"
        return self.track(index, tf.DMA_TRACK.format(queue=queue))


def write_prediction(trace: Trace, ops: pd.DataFrame, options: WhatIfOptions,
                     path: str) -> None:
    """Re-time `trace`'s op stream (`ops`, from `whatif.recorded_ops`) as `options` ask
    and write the predicted trace to `path`."""
    from neuron_explorer.backend.replay import ReplayOptions, replay
    from neuron_explorer.collectors.trace_writer import open_writer
    from neuron_explorer.what_if.lower_precision import in_dtype

    hardware = options.hardware or trace.hardware or "trn2"
    overhead = (None if options.launch_overhead_us is None
                else round(options.launch_overhead_us * 1000))
    replay_options = ReplayOptions(hardware, overhead)
    preset = replay_options.preset()
    rows, events = host_events(trace, ops)
    events = in_dtype(trace, rows, events, options.dtype)
    notes: list[str] = []
    if options.mode == "compiled":
        from neuron_explorer.what_if.compiled import replay_compiled

        replayed, shift, notes = replay_compiled(trace, rows, events, replay_options,
                                                 allow_rnn=options.allow_rnn)
    else:
        replayed, shift = replay(events, replay_options)
    missing = int(sum(k is None for k in ops["key"].tolist()))
    if missing:
        notes.append(f"{missing} ops without an op key kept their recorded host time and "
                     "launched nothing")
    engine_level = trace.metadata.get(tf.META_LEVEL) == "engine"
    writer = open_writer(path, "pftrace")
    try:
        tracks = _Tracks(trace, writer, preset.name, engine_level)
        _write(trace, writer, tracks, rows, events, replayed, shift, engine_level,
               _metadata(trace, options, preset, notes))
        writer.close()
    except BaseException:
        writer.discard()
        raise


def _write(trace: Trace, writer: Any, tracks: _Tracks, rows: pd.DataFrame, events: list,
           replayed: list, shift: Any, engine_level: bool, meta: dict) -> None:
    s = trace.table("slices")
    host = s[s["track_id"].isin(list(tracks.host))]
    meta_rows = host[host["kind"] == tf.CAT_METADATA]
    main_track = (tracks.host[int(meta_rows["track_id"].iloc[0])] if len(meta_rows)
                  else next(iter(tracks.host.values())))
    meta_ts = int(shift(meta_rows["ts"].to_numpy()[:1])[0]) if len(meta_rows) else 0
    writer.metadata(main_track, meta_ts, meta)
    # host slices other than ops and syncs: their ends moved by the shift
    host_slices: list[tuple] = []
    others = host[~host["kind"].isin([tf.CAT_OP, tf.CAT_SYNC, tf.CAT_METADATA])]
    start = shift(others["ts"].to_numpy())
    end = shift((others["ts"] + others["dur"]).to_numpy())
    for sid, track, name, cat, ts, te in zip(
            others["id"].tolist(), others["track_id"].tolist(), others["name"].tolist(),
            others["category"].tolist(), start.tolist(), end.tolist(), strict=True):
        if cat in _INSTANTS:
            writer.instant(tracks.host[track], ts, name, cat, _args(trace, sid))
        else:
            host_slices.append((tracks.host[track], ts, max(0, te - ts), name, cat,
                                _args(trace, sid), (), sid))
    # ops and syncs, each as the replay placed it; then the kernels they launched
    by_id = s.set_index("id")
    kernel_id = 0
    kernels = []
    for sid, key, ev, new in zip(rows["id"].tolist(), rows["key"].tolist(), events, replayed,
                                 strict=True):
        if new is None:  # an op a predicted graph launch runs
            continue
        row = by_id.loc[sid]
        track = tracks.host[int(row["track_id"])]
        if row["kind"] == tf.CAT_SYNC:
            host_slices.append((track, new.ts, new.dur, row["name"], tf.CAT_SYNC,
                                _args(trace, sid), (), sid))
            continue
        args = _args(trace, sid)
        if key is not None and ev.key != key:
            # the dtypes the prediction ran the op in: its report read the recorded
            # float32 and advised bf16 on a bf16 prediction
            args[tf.ARG_DTYPES] = "[" + ", ".join(d for _, d in ev.key[1]) + "]"
        op_id = int(args.get(tf.ARG_OP_ID, sid))
        args.pop(tf.ARG_KERNEL_ID, None)
        flow = []
        if new.kernels:
            kernel_id += 1
            args[tf.ARG_KERNEL_ID] = kernel_id
            args[tf.ARG_FLOPS], args[tf.ARG_BYTES] = int(new.flops), int(new.hbm_bytes)
            args[tf.ARG_FALLBACK] = bool(new.fallback)
            for index, k in enumerate(new.kernels):
                kernels.append((kernel_id + index, op_id, index, args.get(tf.ARG_STEP, -1), k))
            kernel_id += len(new.kernels) - 1
            flow = [op_id | (i << 40) for i in range(len(new.kernels))]
        name = row["name"]
        if new.name is not None:  # a predicted graph launch
            name = new.name
            args = {tf.ARG_OP_ID: op_id, tf.ARG_STEP: args.get(tf.ARG_STEP, -1),
                    tf.ARG_DEVICE: args.get(tf.ARG_DEVICE, 0), tf.ARG_FLOPS: int(new.flops),
                    tf.ARG_BYTES: int(new.hbm_bytes), tf.ARG_FALLBACK: False,
                    tf.ARG_GRAPH_ID: int(name.partition(":")[2]),
                    **({tf.ARG_KERNEL_ID: args[tf.ARG_KERNEL_ID]} if new.kernels else {})}
        host_slices.append((track, new.ts, new.dur, name, tf.CAT_OP, args, flow, sid))
    _write_nested(writer, host_slices, s)
    _write_kernels(writer, tracks, kernels, engine_level)
    _write_device_rest(trace, writer, tracks, shift)


def _write_nested(writer: Any, host_slices: list[tuple], slices: pd.DataFrame) -> None:
    """Host slices as begin and end events in time order, nested as recorded (`slices`, the
    recorded table, gives each one's depth and parent by its id, the tuples' last field).
    At one time, ends come first, inner before outer, then begins, outer before inner; a
    slice of no length goes before the end of a recorded parent ending then (a sync as its
    step ends) and otherwise after the begins of those outside it (a sync as the module
    after it begins was written inside the module's first op, and its finding lost)."""
    depth = slices["depth"].to_numpy(np.int64)
    parent = slices["parent_id"].to_numpy(np.int64)
    ends_at = {sid: ts + dur for _, ts, dur, *_, sid in host_slices}
    events = []
    for i, (_, ts, dur, *_, sid) in enumerate(host_slices):
        d = int(depth[sid])
        if dur == 0:
            before_parent_end = ends_at.get(int(parent[sid])) == ts
            events.append((ts, 0, -d + 0.5, sid, i) if before_parent_end
                          else (ts, 1, d - 0.5, sid, i))
        else:
            events.append((ts + dur, 0, -d, -sid, i))
            events.append((ts, 1, d, sid, i))
    for ts, _, _, _, i in sorted(events):
        track, start, dur, name, cat, args, flow, _ = host_slices[i]
        if dur == 0:
            writer.slice(track, ts, 0, name, cat, args, flow_out=flow)
        elif ts == start:
            writer.begin(track, ts, name, cat, args, flow_out=flow)
        else:
            writer.end(track, ts)


def _write_kernels(writer: Any, tracks: _Tracks, kernels: list, engine_level: bool) -> None:
    from neuron_explorer.backend.hardware import ENGINE_NAMES

    parts: list[tuple] = []
    for kernel_id, op_id, index, step, k in kernels:
        kernel = k.kernel
        args = {tf.ARG_KERNEL_ID: kernel_id, tf.ARG_OP_ID: op_id, tf.ARG_STEP: int(step),
                tf.ARG_FLOPS: int(kernel.model_flops), tf.ARG_HW_FLOPS: int(kernel.flops),
                tf.ARG_BYTES: int(kernel.hbm_bytes),
                tf.ARG_ENGINE_BUSY: json.dumps(kernel.engine_busy_ns, sort_keys=True),
                tf.ARG_SBUF: int(kernel.sbuf_bytes), tf.ARG_PSUM: int(kernel.psum_bytes),
                tf.ARG_FALLBACK: bool(k.fallback)}
        writer.slice(tracks.track(k.device, tf.TRACK_KERNELS), k.start_ns, k.end_ns - k.start_ns,
                     kernel.name, tf.CAT_KERNEL, args, flow_in=[op_id | (index << 40)])
        if engine_level:
            _kernel_counters(writer, tracks, k)
            arrays = kernel.arrays()
            parts.append((kernel_id, k.device, k.start_ns, arrays, kernel))
    if parts:
        _write_instructions(writer, tracks, parts, ENGINE_NAMES)


def _kernel_counters(writer: Any, tracks: _Tracks, k: Any) -> None:
    kernel = k.kernel
    scale = 100.0 / max(k.end_ns - k.start_ns, 1)
    for engine in ENGINES:
        busy = kernel.engine_busy_ns.get(engine)
        if busy:
            track = tracks.counter(k.device, tf.COUNTER_UTIL.format(
                engine=tf.ENGINE_TRACKS[engine]), "%")
            writer.counter(track, k.start_ns, min(100.0, busy * scale))
            writer.counter(track, k.end_ns, 0.0)
    for name, value in ((tf.COUNTER_SBUF, kernel.sbuf_bytes), (tf.COUNTER_PSUM, kernel.psum_bytes)):
        if value:
            track = tracks.counter(k.device, name, "bytes")
            writer.counter(track, k.start_ns, int(value))
            writer.counter(track, k.end_ns, 0)


def _write_instructions(writer: Any, tracks: _Tracks, parts: list, engine_names: Sequence[str]
                        ) -> None:
    """Every new kernel's instructions and DMA transfers, one batch per category."""
    engine_idx = np.concatenate([a["engine"] for _, _, _, a, _ in parts]).astype(np.int64)
    devices = np.concatenate([np.full(len(a["engine"]), d, np.int64) for _, d, _, a, _ in parts])
    ts = np.concatenate([a["start"] + start for _, _, start, a, _ in parts]).astype(np.int64)
    dur = np.concatenate([a["dur"] for *_, a, _ in parts]).astype(np.int64)
    nbytes = np.concatenate([a["bytes"] for *_, a, _ in parts]).astype(np.int64)
    flops = np.concatenate([a["flops"] for *_, a, _ in parts]).astype(np.int64)
    kernel_ids = np.concatenate([np.full(len(a["engine"]), kid, np.int64)
                                 for kid, _, _, a, _ in parts])
    opcode_names: dict[str, int] = {}
    opcode_parts = []
    for *_, a, kernel in parts:
        lookup = np.array([opcode_names.setdefault(o, len(opcode_names))
                           for o in kernel.opcodes] or [0], np.int64)
        opcode_parts.append(lookup[a["opcode"]])
    opcodes = np.concatenate(opcode_parts)
    pairs, pair_index = np.unique(devices * 1024 + engine_idx, return_inverse=True)
    pair_tracks = np.array([tracks.engine(int(p) // 1024, engine_names[int(p) % 1024])
                            for p in pairs], np.int64)
    engine_list = list(engine_names)
    is_dma = np.array([e not in tf.ENGINE_TRACKS for e in engine_list], bool)[engine_idx]
    for category, keep in ((tf.CAT_INSTRUCTION, ~is_dma), (tf.CAT_DMA, is_dma)):
        if not keep.any():
            continue
        writer.slices(
            pair_tracks[pair_index[keep]], ts[keep], dur[keep], list(opcode_names),
            opcodes[keep], category,
            {tf.ARG_KERNEL_ID: kernel_ids[keep], tf.ARG_BYTES: nbytes[keep],
             tf.ARG_FLOPS: flops[keep]},
            {tf.ARG_ENGINE: (engine_list, engine_idx[keep]),
             tf.ARG_OPCODE: (list(opcode_names), opcodes[keep])},
        )


def _write_device_rest(trace: Trace, writer: Any, tracks: _Tracks, shift: Any) -> None:
    """The device side the replay does not redo: HBM in use (the recorded values at the new
    times) and slices such as collectives (moved with the host)."""
    device_of = trace.tracks.set_index("track_id")["device"]
    counters = trace.counters
    hbm = counters[counters["name"] == tf.COUNTER_HBM]
    if len(hbm):
        dev = device_of.reindex(hbm["track_id"].to_numpy()).fillna(0).astype(int).to_numpy()
        for d in np.unique(dev).tolist():
            part = hbm[dev == d]
            track = tracks.counter(d, tf.COUNTER_HBM, "bytes")
            for ts, value in zip(shift(part["ts"].to_numpy()).tolist(),
                                 part["value"].tolist(), strict=True):
                writer.counter(track, ts, int(value))
    s = trace.table("slices")
    dev_of_slice = device_of.reindex(s["track_id"].to_numpy()).fillna(-1).to_numpy()
    rest = s[(dev_of_slice >= 0) & ~s["kind"].isin(list(_DEVICE_KINDS_REPLACED))]
    names = trace.tracks.set_index("track_id")["name"]
    for sid, track_id, name, cat, ts, dur in zip(
            rest["id"].tolist(), rest["track_id"].tolist(), rest["name"].tolist(),
            rest["category"].tolist(), rest["ts"].tolist(), rest["dur"].tolist(), strict=True):
        device = int(device_of[track_id])
        new = int(shift(np.array([ts]))[0])
        writer.slice(tracks.track(device, str(names[track_id])), new, int(dur), name, cat,
                     _args(trace, sid))
