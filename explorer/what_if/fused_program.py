"""A predicted graph's program fused along the recorded data flow.

An eager recording at op level says, for each tensor an op read, which recorded op made it
(`producers`, how many op ids back). With it a compiled what-if replay fuses as the compile
path does (backend/compiler/graph_kernels.py): a chain of elementwise and reduction ops
is one stream whose tiles load the chain's inputs once, run every op's steps in SBUF and
store only what another kernel reads; a GEMM keeps its result in SBUF for the elementwise
ops that consume it (its epilogue). An op joins the group of the op before it when it
reads a value that group made; other ops keep their eager kernel. What is stored is what
an op outside the group reads, or what nobody recorded reading (a result the host or a
later step may read). Without the producers a program is emitted op by op (`compiled`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from neuron_explorer.common.dtypes import dtype_bytes
from neuron_explorer.common.op_families import ADDS_INPUT, GEMM, base_name

# as the compile path bounds a group (backend/compiler/fusion.py MAX_GROUP_OPS)
MAX_GROUP_OPS = 48


@dataclass(frozen=True)
class DataFlow:
    """A program's ops' data flow: per op, per tensor input, the position in the program of
    the op that made it (-1: made outside it, or by nothing recorded); and per op whether an
    op outside the program reads a result of it, or nothing recorded reads it."""

    producers: tuple[tuple[int, ...], ...]
    read_outside: tuple[bool, ...]


def program_flow(events: Sequence[int], producer_rows: Sequence[tuple[int, ...]],
                 readers: dict[int, set[int]]) -> DataFlow:
    """The data flow of the program of host events `events` (row indices): each row's
    producer rows (-1: none) and each row's readers (rows)."""
    position = {row: i for i, row in enumerate(events)}
    producers = tuple(tuple(position.get(p, -1) for p in producer_rows[row]) for row in events)
    outside = tuple(not readers.get(row) or any(r not in position for r in readers[row])
                    for row in events)
    return DataFlow(producers, outside)


@dataclass
class _Group:
    kind: str  # "gemm" (a GEMM and its epilogue), "stream" or "single"
    members: list[int] = field(default_factory=list)


def emit_fused(b, keys: list, flow: DataFlow) -> list:
    """Emit the ops `keys` into builder `b` fused along `flow`; returns the sections (one
    per group, as the compile path labels a fused group)."""
    from neuron_explorer.backend.hardware.optable import NO_DEVICE_WORK
    from neuron_explorer.backend.replay import spec_of

    specs = [spec_of(key) for key in keys]
    work = [not (base_name(s.name) in NO_DEVICE_WORK
                 or (s.outputs and all(t.numel == 0 for t in s.outputs))) for s in specs]
    groups = _groups(specs, work, flow)
    group_of = {m: g for g, group in enumerate(groups) for m in group.members}
    done: dict[int, tuple[int, ...]] = {}
    sections: list = []
    for g, group in enumerate(groups):
        start = len(b)
        b.section = len(sections)
        sections.append(_section_name(specs, group))
        b.after = tuple(dict.fromkeys(
            i for m in group.members for p in flow.producers[m]
            if p >= 0 and group_of.get(p, g) != g for i in done.get(group_of[p], ())))
        _emit_group(b, specs, group, flow)
        if len(b) > start:
            done[g] = b.finished(start, through_stores=True)
    b.after = ()
    return sections


def _groups(specs: list, work: list[bool], flow: DataFlow) -> list[_Group]:
    from neuron_explorer.backend.compiler.stream_steps import steps_for

    groups: list[_Group] = []
    for i, spec in enumerate(specs):
        if not work[i]:
            continue
        steps = _steps(spec, steps_for)
        last = groups[-1] if groups else None
        if (last is not None and steps is not None and len(last.members) < MAX_GROUP_OPS
                and any(p in last.members for p in flow.producers[i])
                and (last.kind == "stream"
                     or last.kind == "gemm" and _numel(spec) == _numel(specs[last.members[0]]))):
            last.members.append(i)
            continue
        kind = "gemm" if _gemm(spec) is not None else "stream" if steps is not None else "single"
        groups.append(_Group(kind, [i]))
    return groups


def _steps(spec, steps_for):
    converts = bool(spec.inputs) and bool(spec.outputs) and \
        spec.outputs[0].dtype != spec.inputs[0].dtype
    return steps_for(spec.name, len(spec.inputs), converts)


def _numel(spec) -> int:
    return max([t.numel for t in spec.outputs] + [1])


def _section_name(specs: list, group: _Group) -> object:
    from neuron_explorer.what_if.compiled import Section

    names = tuple(specs[m].name for m in group.members)
    label = "fused_" + "_".join(base_name(n) for n in names[:4]) if len(names) > 1 \
        else base_name(names[0])
    return Section(label, names)


def _emit_group(b, specs: list, group: _Group, flow: DataFlow) -> None:
    from neuron_explorer.backend.hardware import emit_gemm

    members = group.members
    if len(members) == 1:
        _eager(b, specs[members[0]])
        return
    if group.kind == "gemm":
        anchor = members[0]
        gemm = _gemm(specs[anchor], store=_read_elsewhere(anchor, members, flow))
        tails = emit_gemm(b, gemm)
        elements = max(_elements(specs, members[1:], flow, members),
                       gemm.batch * gemm.m * gemm.n)
        _stream(b, specs, members[1:], flow, members, elements, tails, resident=1)
        return
    _stream(b, specs, members, flow, members, _elements(specs, members, flow, members), (), 0)


def _eager(b, spec) -> None:
    from neuron_explorer.backend.hardware.lowering import emit_host_fallback
    from neuron_explorer.backend.hardware.optable import lowering_for

    fn = lowering_for(base_name(spec.name))
    if fn is None:
        emit_host_fallback(b, spec)
    else:
        fn(b, spec)


def _read_elsewhere(member: int, group: Sequence[int], flow: DataFlow) -> bool:
    """Whether a result of `member` must reach HBM: read outside the program (or by no
    recorded op), or by an op of the program outside `group`."""
    if flow.read_outside[member]:
        return True
    return any(member in ps and j not in group for j, ps in enumerate(flow.producers))


def _external_inputs(specs: list, members: Sequence[int], flow: DataFlow,
                     group: Sequence[int]) -> list:
    """The tensors `members` read from HBM: made outside the group (one load per producer
    in the program; every input made outside the program)."""
    seen: set[int] = set()
    out = []
    for m in members:
        for k, t in enumerate(specs[m].inputs):
            p = flow.producers[m][k] if k < len(flow.producers[m]) else -1
            if p in group:
                continue
            if p >= 0:
                if p in seen:
                    continue
                seen.add(p)
            out.append(t)
    return out


def _elements(specs: list, members: Sequence[int], flow: DataFlow,
              group: Sequence[int]) -> int:
    sizes = [_numel(specs[m]) for m in members]
    sizes += [t.numel for t in _external_inputs(specs, members, flow, group)]
    return max(sizes + [1])


def _stream(b, specs: list, members: Sequence[int], flow: DataFlow, group: Sequence[int],
            elements: int, deps: Sequence[int], resident: int) -> None:
    from neuron_explorer.backend.compiler.stream_steps import scaled, steps_for
    from neuron_explorer.backend.hardware.streaming import stream

    steps = []
    for m in members:
        spec = specs[m]
        touched = max([_numel(spec)] + [t.numel for t in spec.inputs])
        steps.extend(scaled(_steps(spec, steps_for) or [], touched / max(elements, 1)))
    full_in: list[int] = []
    small_in: list[int] = []
    full_out: list[int] = []
    small_out: list[int] = []
    for t in _external_inputs(specs, members, flow, group):
        (full_in if t.numel == elements else small_in).append(t.nbytes)
    for m in members:
        if _read_elsewhere(m, group, flow):
            for t in specs[m].outputs:
                (full_out if t.numel == elements else small_out).append(t.nbytes)
    biggest = max(members, key=lambda m: _numel(specs[m]))
    dtype = specs[biggest].outputs[0].dtype if specs[biggest].outputs else "float32"
    stream(b, elements, dtype, steps, inputs=full_in, outputs=full_out, small_inputs=small_in,
           small_outputs=small_out, deps=tuple(deps), resident_inputs=resident)


def _gemm(spec, store: bool = True):
    """The GEMM of an mm/addmm/bmm/baddbmm op (its bias added on the PSUM copy), or None."""
    from neuron_explorer.backend.hardware import Gemm

    base = base_name(spec.name)
    if base not in GEMM:
        return None
    inputs = spec.inputs
    if base in ADDS_INPUT:
        if len(inputs) < 3:
            return None
        bias, a, w = inputs[0], inputs[1], inputs[2]
    else:
        if len(inputs) < 2:
            return None
        bias, a, w = None, inputs[0], inputs[1]
    if len(a.shape) < 2 or len(w.shape) < 2:
        return None
    m, k, n = a.shape[-2], a.shape[-1], w.shape[-1]
    batch = max(int(np.prod(a.shape)) // max(m * k, 1), 1)
    es = dtype_bytes(a.dtype)
    out_dtype = spec.outputs[0].dtype if spec.outputs else a.dtype
    return Gemm(m=m, k=k, n=n, dtype=a.dtype, out_dtype=out_dtype, batch=batch,
                a_bytes=m * k * es, b_bytes=k * n * es,
                bias_bytes=(bias.nbytes // batch) if bias is not None else 0,
                store=store, load_a=True, load_b=True)
