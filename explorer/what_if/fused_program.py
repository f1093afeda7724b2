"""A predicted graph's program fused along the recorded data flow.

An eager recording at op level says, for each tensor an op read, which recorded op made it
(`producers`, how many op ids back). With it a compiled what-if replay fuses as the compile
path does: the same greedy plan (backend/compiler/fusion.py) over the recorded ops. A chain
of elementwise and reduction ops is one stream whose tiles load the chain's inputs once,
run every op's steps in SBUF and store only what another kernel reads; a GEMM keeps its
result in SBUF for the elementwise ops that consume it (its epilogue); batched matmuls and
the score math between them are an attention region, emitted by the compile path's own
code (backend/compiler/region.py); other ops keep their eager kernel. As in a compiled
program (backend/compiler/program.py), values handed between groups stay in SBUF when
they fit, and inputs from outside are loaded a few groups ahead. What is stored is what
an op outside the group reads, or what nobody recorded reading (a result the host or a
later step may read). Without the producers a program is emitted op by op (`compiled`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
from neuron_explorer.common.dtypes import dtype_bytes
from neuron_explorer.common.op_families import ADDS_INPUT, GEMM, base_name

# as the compile path bounds a group (backend/compiler/fusion.py MAX_GROUP_OPS)
MAX_GROUP_OPS = 48
# ops that lay their inputs side by side (backend/compiler/graph_kernels.py `_CONCATS`)
_CONCATS = frozenset({"cat", "stack"})


@dataclass(frozen=True)
class DataFlow:
    """A program's ops' data flow: per op, per tensor input, the position in the program of
    the op that made it (-1: made outside it, or by nothing recorded); and per op whether an
    op outside the program reads a result of it, or nothing recorded reads it."""

    producers: tuple[tuple[int, ...], ...]
    read_outside: tuple[bool, ...]
    # per op, per tensor input made outside the program, which of the ops outside made it
    # (numbered in the program's order; -1: made inside, or by nothing recorded): inputs
    # of one shape made by one op are one tensor, loaded once
    made_outside: tuple[tuple[int, ...], ...] = ()

    @cached_property
    def readers(self) -> dict[int, list[int]]:
        """Per op, the ops of the program that read a result of it."""
        out: dict[int, list[int]] = {}
        for j, made_by in enumerate(self.producers):
            for p in dict.fromkeys(made_by):
                if p >= 0:
                    out.setdefault(p, []).append(j)
        return out


def program_flow(events: Sequence[int], producer_rows: Sequence[tuple[int, ...]],
                 readers: dict[int, set[int]],
                 makers: Sequence[tuple[int, ...]] | None = None) -> DataFlow:
    """The data flow of the program of host events `events` (row indices): each row's
    producer rows (-1: none) and each row's readers (rows); `makers`, per row the op id
    that made each input (`compiled.recorded_makers`)."""
    position = {row: i for i, row in enumerate(events)}
    producers = tuple(tuple(position.get(p, -1) for p in producer_rows[row]) for row in events)
    outside = tuple(not readers.get(row) or any(r not in position for r in readers[row])
                    for row in events)
    made_outside: tuple[tuple[int, ...], ...] = ()
    if makers is not None:
        number: dict[int, int] = {}  # op id -> its number: alike in every step's program
        made_outside = tuple(
            tuple(number.setdefault(m, len(number)) if m >= 0 and p not in position else -1
                  for p, m in zip(producer_rows[row], makers[row], strict=False))
            for row in events)
    return DataFlow(producers, outside, made_outside)


@dataclass
class _Group:
    kind: str  # "gemm" (a GEMM and its epilogue), "stream", "attention" or "single"
    members: list[int] = field(default_factory=list)
    reads: set[int] = field(default_factory=set)  # the groups it reads from
    held: int = 0  # an attention group's bytes in SBUF
    chains: list[list[int]] = field(default_factory=list)  # foreach pieces side by side


def emit_fused(new_builder: Callable[[], Any], keys: list, flow: DataFlow) -> tuple[Any, list]:
    """Emit the ops `keys` fused along `flow` into a builder from `new_builder`; returns it
    and the sections (one per group, as the compile path labels a fused group).

    As the compile path builds a program (backend/compiler/program.py `build_program`):
    values handed between groups stay in SBUF, and inputs are loaded ahead, when they fit
    beside each group's own working set; a program where they would not is emitted again
    with every value going through HBM and nothing loaded ahead."""
    from neuron_explorer.backend.compiler.program import ON_CHIP_SHARE
    from neuron_explorer.backend.hardware.optable import NO_DEVICE_WORK
    from neuron_explorer.backend.replay import spec_of

    specs, flow, origin = per_tensor([spec_of(key) for key in keys], flow)
    work = [not (base_name(s.name) in NO_DEVICE_WORK
                 or (s.outputs and all(t.numel == 0 for t in s.outputs))) for s in specs]
    groups = _side_by_side(_groups(specs, work, flow), specs, origin, flow)
    group_of = {m: g for g, group in enumerate(groups) for m in group.members}
    # the memory an op with no device work made (an `empty` a `cat(out=)` fills) holds
    # nothing to load
    nothing_to_load = frozenset(i for i, w in enumerate(work) if not w)
    handed, live = _handed_on(specs, groups, group_of, flow)
    b = new_builder()
    sbuf = b.preset.sbuf_bytes
    if live <= ON_CHIP_SHARE * sbuf:
        ahead = _LoadAhead(sbuf)
        sections = _emit_groups(b, specs, groups, group_of, flow, handed | nothing_to_load,
                                ahead)
        if b.sbuf_peak + live + ahead.most_held <= sbuf:
            b.note_sbuf(b.sbuf_peak + live + ahead.most_held)
            return b, sections
        b = new_builder()
    sections = _emit_groups(b, specs, groups, group_of, flow, nothing_to_load, _LoadAhead(0))
    return b, sections


def per_tensor(specs: list, flow: DataFlow) -> tuple[list, DataFlow, list[int]]:
    """Each foreach op as its op once per tensor, as the compile path hands them to the
    compiler (backend/compiler/foreach_ops.py), with the data flow between the pieces: a
    piece reads the pieces of its inputs' foreach ops at its own place in their lists
    (an optimizer's lists are in one order), an op that reads a list (a `stack` of
    norms) each piece at its place in its inputs. Also returns, per op of the new
    program, the position of the foreach op it is a piece of (-1: none)."""
    from neuron_explorer.backend.compiler.foreach_ops import per_tensor_name
    from neuron_explorer.backend.hardware.specs import OpSpec

    pieces: list[list[int]] = []  # per op, its positions in the new program
    out_specs: list = []
    producers: list[tuple[int, ...]] = []
    outside: list[bool] = []
    made_outside: list[tuple[int, ...]] = []
    origin: list[int] = []

    def made_by(p: int, place: int) -> int:
        return -1 if p < 0 else pieces[p][min(place, len(pieces[p]) - 1)]

    for i, spec in enumerate(specs):
        n = len(spec.outputs)
        lists = len(spec.inputs) // n if n else 0
        shared = spec.inputs[lists * n:]
        name = per_tensor_name(spec.name, shared)
        made = flow.producers[i]
        makers = flow.made_outside[i] if flow.made_outside else ()
        if name is None or not lists:
            pieces.append([len(out_specs)])
            out_specs.append(spec)
            producers.append(tuple(made_by(p, k) for k, p in enumerate(made)))
            outside.append(flow.read_outside[i])
            made_outside.append(makers)
            origin.append(-1)
            continue
        pieces.append([])
        for j in range(n):
            ks = [li * n + j for li in range(lists)] + list(range(lists * n, len(spec.inputs)))
            pieces[i].append(len(out_specs))
            out_specs.append(OpSpec(name, tuple(spec.inputs[k] for k in ks),
                                    (spec.outputs[j],), spec.attrs))
            producers.append(tuple(made_by(made[k], j) if k < len(made) else -1 for k in ks))
            outside.append(flow.read_outside[i])
            made_outside.append(tuple(makers[k] if k < len(makers) else -1 for k in ks))
            origin.append(i)
    return out_specs, DataFlow(tuple(producers), tuple(outside),
                               tuple(made_outside) if flow.made_outside else ()), origin



def _emit_groups(b, specs: list, groups: list[_Group], group_of: dict[int, int],
                 flow: DataFlow, on_chip: frozenset[int], ahead: _LoadAhead) -> list:
    done: dict[int, tuple[int, ...]] = {}
    sections: list = []
    for g, group in enumerate(groups):
        start = len(b)
        b.section = len(sections)
        sections.append(_section_name(specs, group))
        waits = ahead.load(b, specs, flow, g, group, done, on_chip)
        b.after = tuple(dict.fromkeys(
            [i for m in group.members for p in flow.producers[m]
             if p >= 0 and group_of.get(p, g) != g for i in done.get(group_of[p], ())]
            + waits))
        _emit_group(b, specs, group, flow, on_chip, ahead.loaded)
        if len(b) > start:
            done[g] = b.finished(start, through_stores=True)
    b.after = ()
    return sections


class _LoadAhead:
    """The compile path's loads ahead (backend/compiler/program.py `_load_ahead`): the
    weights and other inputs from outside the program a group reads are loaded once the
    group `PREFETCH_AHEAD` before it is done, within `PREFETCH_SHARE` of SBUF, so their
    DMA runs while the groups before compute."""

    def __init__(self, sbuf_bytes: int) -> None:
        """`sbuf_bytes`: the SBUF whose share loads may take (0: nothing is loaded ahead)."""
        from neuron_explorer.backend.compiler.program import PREFETCH_SHARE

        self.budget = PREFETCH_SHARE * sbuf_bytes
        self.loaded: set[tuple[int, int]] = set()  # (member, input index) in SBUF
        self.tensors: dict[tuple, list[int]] = {}  # a tensor made outside -> its load
        self.held: list[tuple[int, int]] = []  # (group, bytes) per load
        self.most_held = 0  # the most bytes loaded ahead held at once

    def load(self, b, specs: list, flow: DataFlow, g: int, group: _Group,
             done: dict[int, tuple[int, ...]], on_chip: frozenset[int]) -> list[int]:
        """Emit `group`'s loads ahead; returns the instructions it waits for."""
        from neuron_explorer.backend.compiler.program import PREFETCH_AHEAD

        if not self.budget or not _reads_on_chip(specs, group):
            return []
        b.after = done.get(g - PREFETCH_AHEAD, ()) if g >= PREFETCH_AHEAD else ()
        # what the last groups loaded is still held; what earlier ones loaded is freed
        self.held = [(reader, size) for reader, size in self.held
                     if reader >= g - PREFETCH_AHEAD]
        held = sum(size for _, size in self.held)
        waits: list[int] = []
        for t, made_by, m, k in _external_inputs(specs, group.members, flow, group.members):
            if made_by >= 0 or (group.kind == "gemm" and m == group.members[0] and k == 0
                                and base_name(specs[m].name) in ADDS_INPUT):
                continue  # made in the program, or a GEMM's bias (added leaving PSUM)
            tensor = _tensor_made_outside(flow, m, k, t)
            if tensor in self.tensors:  # loaded for an earlier op: kept in SBUF since
                waits.extend(self.tensors[tensor])
                self.loaded.add((m, k))
                continue
            if t.nbytes > 0 and held + t.nbytes <= self.budget:
                load = b.dma_load(t.nbytes)
                waits.extend(load)
                if tensor is not None:
                    self.tensors[tensor] = list(load)
                held += t.nbytes
                self.held.append((g, t.nbytes))
                self.loaded.add((m, k))
                self.most_held = max(self.most_held, held)
        return waits


def _tensor_made_outside(flow: DataFlow, member: int, k: int, t) -> tuple | None:
    """What names input `k` of `member` among the program's inputs from outside: the op
    that made it, its shape and dtype (as the compile path keeps one graph input loaded
    ahead for every op that reads it); None where the recording does not say."""
    makers = flow.made_outside[member] if flow.made_outside else ()
    if k >= len(makers) or makers[k] < 0:
        return None
    return makers[k], tuple(t.shape), t.dtype


def _reads_on_chip(specs: list, group: _Group) -> bool:
    """Whether the group's kernel takes its operands from SBUF (an op emitted as its
    eager kernel loads its own)."""
    from neuron_explorer.backend.compiler.stream_steps import steps_for

    if group.kind == "attention" or len(group.members) > 1:
        return True
    spec = specs[group.members[0]]
    return (_gemm(spec) is not None or base_name(spec.name) in _CONCATS
            or _steps(spec, steps_for) is not None)


def _groups(specs: list, work: list[bool], flow: DataFlow) -> list[_Group]:
    """The compile path's greedy fusion (backend/compiler/fusion.py `_Planner`) over the
    recorded ops: an elementwise op, a reduction or a batched matmul joins the first group
    that made one of its inputs and can take it; the groups come out in an order where
    each follows the groups it reads."""
    from neuron_explorer.backend.compiler.stream_steps import steps_for

    groups: list[_Group] = []
    group_of: dict[int, int] = {}
    for i, spec in enumerate(specs):
        if not work[i]:
            continue
        kind = _kind(spec, _steps(spec, steps_for))
        producers = list(dict.fromkeys(group_of[p] for p in flow.producers[i] if p in group_of))
        target = None
        if kind in ("elementwise", "reduction", "attention"):
            target = next((g for g in producers
                           if _can_join(spec, kind, specs, groups, g, producers,
                                        flow.producers[i])), None)
        if target is None:
            target = len(groups)
            groups.append(_Group("stream" if kind in ("elementwise", "reduction") else kind))
        group = groups[target]
        group.members.append(i)
        if group.kind == "attention":
            group.held += _out_bytes(spec)
        group.reads |= set(producers) - {target}
        group_of[i] = target
    return _in_dependency_order(groups)


def _side_by_side(groups: list[_Group], specs: list, origin: list[int],
                  flow: DataFlow) -> list[_Group]:
    """The streams of the same foreach ops' pieces, one a tensor, merged into one stream
    over all their tensors, as the compile path merges them
    (backend/compiler/fusion.py `_Planner._side_by_side`); groups where one reads another
    stay apart."""
    from neuron_explorer.backend.compiler.fusion import independent

    group_of = {m: g for g, group in enumerate(groups) for m in group.members}
    for g, group in enumerate(groups):  # in this order's numbers
        group.reads = {group_of[p] for m in group.members for p in flow.producers[m]
                       if p in group_of and group_of[p] != g}
    by_chain: dict[tuple, list[int]] = {}
    for g, group in enumerate(groups):
        if group.kind == "stream" and all(origin[m] >= 0 for m in group.members):
            signature = tuple((specs[m].name, origin[m]) for m in group.members)
            by_chain.setdefault(signature, []).append(g)
    gone: dict[int, int] = {}  # a merged group -> the group it joined
    for siblings in by_chain.values():
        if len(siblings) < 2 or not independent(siblings, lambda i: groups[i].reads):
            continue
        first = groups[siblings[0]]
        first.chains = [list(groups[g].members) for g in siblings]
        for g in siblings[1:]:
            first.members.extend(groups[g].members)
            first.reads |= groups[g].reads
            gone[g] = siblings[0]
        first.reads -= set(siblings)
    if not gone:
        return groups
    for group in groups:
        group.reads = {gone.get(r, r) for r in group.reads}
    kept = [g for g in range(len(groups)) if g not in gone]
    number = {g: i for i, g in enumerate(kept)}
    for g in kept:
        groups[g].reads = {number[r] for r in groups[g].reads if r != g}
    return _in_dependency_order([groups[g] for g in kept])


def _kind(spec, steps) -> str:
    """How an op takes part in fusion, as `fusion.classify` says of a graph's node: an op the
    compile path keeps apart (a pooling, a loss: neither pointwise nor a reduction) keeps its
    own kernel, as does one whose kernel is not a plain stream."""
    from neuron_explorer.backend.compiler.fusion import (
        ATTENTION_SBUF_SHARE,
        SBUF_BYTES,
        OpKind,
        kind_of_op,
    )

    base = base_name(spec.name)
    if base == "bmm" and len(spec.outputs) == 1 and sum(
            t.nbytes for t in (*spec.inputs, *spec.outputs)) <= ATTENTION_SBUF_SHARE * SBUF_BYTES:
        return "attention"
    if _gemm(spec) is not None:
        return "gemm"
    kind = kind_of_op(base)
    if steps is None or kind not in (OpKind.ELEMENTWISE, OpKind.REDUCTION):
        return "single"
    return "reduction" if kind is OpKind.REDUCTION else "elementwise"


def _can_join(spec, kind: str, specs: list, groups: list[_Group], g: int,
              producers: list[int], made_by: tuple[int, ...]) -> bool:
    """Whether op `spec` (its inputs made by the ops `made_by`) may join group `g`."""
    from neuron_explorer.backend.compiler.fusion import (
        ATTENTION_SBUF_SHARE,
        SBUF_BYTES,
        one_iteration_space,
        reaches,
    )

    group = groups[g]
    if len(group.members) >= MAX_GROUP_OPS or group.kind == "single":
        return False
    if group.kind == "attention":
        # batched work no larger than what the region holds, all of it fitting in SBUF
        size = _out_bytes(spec)
        if not spec.outputs or len(spec.outputs[0].shape) < 3:
            return False
        if kind != "attention" and size > max(_out_bytes(specs[m]) for m in group.members):
            return False
        if group.held + size > ATTENTION_SBUF_SHARE * SBUF_BYTES:
            return False
    elif kind == "attention":
        return False
    elif group.kind == "gemm" and (kind != "elementwise"
                                   or _numel(spec) > _numel(specs[group.members[0]])):
        return False  # an epilogue is elementwise work on the GEMM's result, no larger
    elif group.kind == "stream" and not one_iteration_space(
            _touched(spec), [_numel(specs[p]) for p in made_by if p in group.members],
            [_touched(specs[m]) for m in group.members],
            [_numel(specs[m]) for m in group.members]):
        return False  # one stream passes over one set of elements
    # joining must not make the group read from a group that reads from it
    return not any(reaches(other, g, lambda i: groups[i].reads)
                   for other in producers if other != g)


def _in_dependency_order(groups: list[_Group]) -> list[_Group]:
    """Each group after those it reads, in creation order where free."""
    from neuron_explorer.backend.compiler.fusion import dependency_order

    return [groups[g] for g in dependency_order({g: grp.reads for g, grp in enumerate(groups)})]


def _handed_on(specs: list, groups: list[_Group], group_of: dict[int, int],
               flow: DataFlow) -> tuple[frozenset[int], int]:
    """The ops whose results later groups read, and the most bytes of those results alive
    at once (backend/compiler/program.py `live_bytes`)."""
    last_read: dict[int, int] = {}
    for g, group in enumerate(groups):
        for m in group.members:
            for p in flow.producers[m]:
                if p in group_of and group_of[p] != g:
                    last_read[p] = max(last_read.get(p, g), g)
    change = np.zeros(len(groups) + 1, np.int64)  # bytes alive from group g on
    for p, last in last_read.items():
        change[group_of[p] + 1] += _out_bytes(specs[p])
        change[last + 1] -= _out_bytes(specs[p])
    peak = int(np.cumsum(change).max()) if len(change) else 0
    return frozenset(last_read), peak


def _out_bytes(spec) -> int:
    return sum(t.nbytes for t in spec.outputs)


def _steps(spec, steps_for):
    converts = bool(spec.inputs) and bool(spec.outputs) and \
        spec.outputs[0].dtype != spec.inputs[0].dtype
    return steps_for(spec.name, len(spec.inputs), converts)


def _numel(spec) -> int:
    return max([t.numel for t in spec.outputs] + [1])


def _touched(spec) -> int:
    """The most elements an op passes over: its result's, or its largest input's."""
    return max([t.numel for t in (*spec.inputs, *spec.outputs)] + [1])


def _section_name(specs: list, group: _Group) -> object:
    from neuron_explorer.what_if.compiled import Section

    names = tuple(specs[m].name for m in group.members)
    label = "fused_" + "_".join(base_name(n) for n in names[:4]) if len(names) > 1 \
        else base_name(names[0])
    return Section(label, names)


def _emit_group(b, specs: list, group: _Group, flow: DataFlow, on_chip: frozenset[int],
                loaded: set[tuple[int, int]]) -> None:
    """Emit one group; inputs made by ops in `on_chip`, and the inputs (member, index) in
    `loaded`, are in SBUF already."""
    from neuron_explorer.backend.hardware import emit_gemm

    members = group.members
    if group.chains:
        _side_by_side_stream(b, specs, group, flow, on_chip, frozenset(loaded))
        return
    resident = [[p in on_chip or (m, k) in loaded for k, p in enumerate(flow.producers[m])]
                for m in members]
    spec = specs[members[0]]
    if len(members) == 1 and base_name(spec.name) in _CONCATS:
        if spec.outputs and resident[0] and all(resident[0]):
            # the pieces are in SBUF already: laid out side by side, they are the result
            out = spec.outputs[0]
            b.dma_store(out.nbytes, min(b.partitions, max(out.shape[0] if out.shape else 1, 1)))
        else:
            _eager(b, spec)
        return
    if len(members) == 1 and not (any(resident[0]) and _reads_on_chip(specs, group)):
        _eager(b, spec)
        return
    if group.kind == "attention":
        from neuron_explorer.backend.compiler.region import emit_region

        in_sbuf = {("made", p) for p in on_chip} | {("input", m, k) for m, k in loaded
                                                     if m in members}
        emit_region(b, _RecordedRegion(specs, members, flow), on_chip=in_sbuf)
        return
    if group.kind == "gemm":
        anchor = members[0]
        gemm = _gemm(specs[anchor], store=_read_elsewhere(anchor, members, flow),
                     on_chip=resident[0])
        tails = emit_gemm(b, gemm)
        if len(members) == 1:
            return
        elements = max(_elements(specs, members[1:], flow, members),
                       gemm.batch * gemm.m * gemm.n)
        _stream(b, specs, members[1:], flow, members, elements, tails, 1, on_chip,
                frozenset(loaded))
        return
    _stream(b, specs, members, flow, members, _elements(specs, members, flow, members), (), 0,
            on_chip, frozenset(loaded))


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
    return any(j not in group for j in flow.readers.get(member, ()))


def _external_inputs(specs: list, members: Sequence[int], flow: DataFlow,
                     group: Sequence[int]) -> list[tuple]:
    """The tensors `members` read from outside the group (one per producer in the
    program; every input made outside the program), each as (tensor, the op that made it
    (-1: none in the program), the member reading it, its input index)."""
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
            out.append((t, p, m, k))
    return out


def _elements(specs: list, members: Sequence[int], flow: DataFlow,
              group: Sequence[int]) -> int:
    sizes = [_numel(specs[m]) for m in members]
    sizes += [t.numel for t, *_ in _external_inputs(specs, members, flow, group)]
    return max(sizes + [1])


def _stream(b, specs: list, members: Sequence[int], flow: DataFlow, group: Sequence[int],
            elements: int, deps: Sequence[int], resident: int,
            on_chip: frozenset[int] = frozenset(), loaded: frozenset = frozenset()) -> None:
    """Emit `members` as one stream; inputs made by ops in `on_chip`, and the inputs
    (member, index) in `loaded`, are read in SBUF."""
    from neuron_explorer.backend.hardware.streaming import stream

    full_in, small_in, full_out, small_out, in_sbuf = _stream_operands(
        specs, members, flow, group, elements, on_chip, loaded)
    biggest = max(members, key=lambda m: _numel(specs[m]))
    dtype = specs[biggest].outputs[0].dtype if specs[biggest].outputs else "float32"
    stream(b, elements, dtype, _stream_steps(specs, members, elements), inputs=full_in,
           outputs=full_out, small_inputs=small_in, small_outputs=small_out,
           deps=tuple(deps), resident_inputs=resident + in_sbuf)


def _stream_steps(specs: list, members: Sequence[int], elements: int) -> list:
    """The members' steps on a tile of a stream over `elements` elements."""
    from neuron_explorer.backend.compiler.stream_steps import scaled, steps_for

    steps = []
    for m in members:
        spec = specs[m]
        touched = max([_numel(spec)] + [t.numel for t in spec.inputs])
        steps.extend(scaled(_steps(spec, steps_for) or [], touched / max(elements, 1)))
    return steps


def _stream_operands(specs: list, members: Sequence[int], flow: DataFlow,
                     group: Sequence[int], elements: int, on_chip: frozenset[int],
                     loaded: frozenset) -> tuple[list[int], list[int], list[int], list[int], int]:
    """A stream's HBM operands in bytes (full-size inputs, small inputs, full-size
    outputs, small outputs) and how many of its inputs are in SBUF already."""
    full_in: list[int] = []
    small_in: list[int] = []
    full_out: list[int] = []
    small_out: list[int] = []
    in_sbuf = 0
    for t, made_by, m, k in _external_inputs(specs, members, flow, group):
        if made_by in on_chip or (m, k) in loaded:
            in_sbuf += 1
        else:
            (full_in if t.numel == elements else small_in).append(t.nbytes)
    for m in members:
        if _read_elsewhere(m, group, flow):
            for t in specs[m].outputs:
                (full_out if t.numel == elements else small_out).append(t.nbytes)
    return full_in, small_in, full_out, small_out, in_sbuf


def _side_by_side_stream(b, specs: list, group: _Group, flow: DataFlow,
                         on_chip: frozenset[int], loaded: frozenset) -> None:
    """Foreach pieces side by side (backend/compiler/graph_kernels.py `_side_by_side`):
    one stream over every chain's elements, each of its inputs and results one tensor of
    all the chains' bytes, the steps the first chain's."""
    from neuron_explorer.backend.compiler.graph_kernels import laid_end_to_end
    from neuron_explorer.backend.hardware.streaming import stream

    sizes = [_elements(specs, chain, flow, group.members) for chain in group.chains]
    operands = [_stream_operands(specs, chain, flow, group.members, elements, on_chip, loaded)
                for chain, elements in zip(group.chains, sizes, strict=True)]
    full_in, small_in, full_out, small_out = laid_end_to_end([o[:4] for o in operands])
    first = group.chains[0]
    dtype = specs[first[-1]].outputs[0].dtype if specs[first[-1]].outputs else "float32"
    stream(b, sum(sizes), dtype, _stream_steps(specs, first, sizes[0]), inputs=full_in,
           outputs=full_out, small_inputs=small_in, small_outputs=small_out,
           resident_inputs=operands[0][4])


def _gemm(spec, store: bool = True, on_chip: Sequence[bool] = ()):
    """The GEMM of an mm/addmm/bmm/baddbmm op (its bias added on the PSUM copy), or None;
    `on_chip`: per input, whether it is already in SBUF (not loaded)."""
    from neuron_explorer.backend.hardware import Gemm

    base = base_name(spec.name)
    if base not in GEMM:
        return None
    inputs = spec.inputs
    resident = list(on_chip) + [False] * (3 - len(on_chip))
    if base in ADDS_INPUT:
        if len(inputs) < 3:
            return None
        bias, a, w = inputs[0], inputs[1], inputs[2]
        a_on_chip, w_on_chip = resident[1], resident[2]
    else:
        if len(inputs) < 2:
            return None
        bias, a, w = None, inputs[0], inputs[1]
        a_on_chip, w_on_chip = resident[0], resident[1]
    if len(a.shape) < 2 or len(w.shape) < 2:
        return None
    m, k, n = a.shape[-2], a.shape[-1], w.shape[-1]
    batch = max(int(np.prod(a.shape)) // max(m * k, 1), 1)
    es = dtype_bytes(a.dtype)
    out_dtype = spec.outputs[0].dtype if spec.outputs else a.dtype
    return Gemm(m=m, k=k, n=n, dtype=a.dtype, out_dtype=out_dtype, batch=batch,
                a_bytes=0 if a_on_chip else m * k * es, b_bytes=0 if w_on_chip else k * n * es,
                bias_bytes=(bias.nbytes // batch) if bias is not None else 0,
                store=store, load_a=not a_on_chip, load_b=not w_on_chip)


class _RecordedRegion:
    """An attention group of recorded ops, for the compile path's region emission
    (backend/compiler/region.py): members are op positions; a value read from outside is
    the op that made it, or the input itself where no op of the program did."""

    def __init__(self, specs: list, members: list[int], flow: DataFlow) -> None:
        self.specs = specs
        self.members = members
        self.flow = flow
        self._members = set(members)
        self._outside: dict[object, int] = {}  # value -> its bytes
        self._reads: dict[int, list] = {}
        for m in members:
            values = []
            for k, t in enumerate(specs[m].inputs):
                p = flow.producers[m][k] if k < len(flow.producers[m]) else -1
                value = p if p in self._members else ("made", p) if p >= 0 else ("input", m, k)
                if value not in self._members:
                    self._outside[value] = t.nbytes
                values.append(value)
            self._reads[m] = list(dict.fromkeys(values))

    def reads(self, op: int) -> list:
        return self._reads[op]

    def stored(self, op: int) -> bool:
        return _read_elsewhere(op, self.members, self.flow)

    def nbytes(self, value) -> int:
        return self._outside[value] if value in self._outside else _out_bytes(self.specs[value])

    def numel(self, op: int) -> int:
        return _numel(self.specs[op])

    def dtype(self, op: int) -> str:
        spec = self.specs[op]
        return spec.outputs[0].dtype if spec.outputs else "float32"

    def is_matmul(self, op: int) -> bool:
        return base_name(self.specs[op].name) == "bmm"

    def matmul_dims(self, op: int) -> tuple[int, int, int, int, str]:
        a, w = self.specs[op].inputs[:2]
        return a.shape[0], a.shape[1], a.shape[2], w.shape[-1], a.dtype

    def score_math_only(self, op: int) -> bool:
        if self.flow.read_outside[op]:
            return False
        return all(j in self._members and not self.is_matmul(j)
                   for j in self.flow.readers.get(op, ()))

    def steps(self, op: int) -> list:
        from neuron_explorer.backend.compiler.stream_steps import steps_for

        return _steps(self.specs[op], steps_for) or []
