"""A recorded float32 op stream as it would run in a lower precision: under autocast, or
with the model and its inputs cast whole. Pure functions of op keys (common/op_key_codec.py)
and the recorded data flow; nothing runs.

Autocast runs matmuls in the lower precision and the ops that need range (losses, norms,
softmax) in float32 (common/autocast_policy.py); every other op runs in the dtype its
inputs bring, by PyTorch's type promotion: a GELU after a bf16 matmul runs in bf16 and
moves half the bytes, and `out - target` of a bf16 output and a float32 target runs in
float32. So each tensor's dtype follows the recorded data flow from the op that made it
(`plan`). Each cast autocast makes is an `aten::_to_copy` launched on its own, as an eager
recording under autocast shows it:
- in the forward, each float32 input of a matmul cast down (weights every call: autocast
  keeps no copy) and each lower-precision input of a float32 op cast up;
- in the backward, autograd runs each op in its forward's dtypes: a matmul's backward
  reads the lower-precision copies its forward saved, a float32 op's the float32 ones; a
  gradient that arrives in another dtype than its op runs in is cast once, where it is
  made; a gradient no backward op reads (a parameter's) is cast back to float32.
Without the data flow (`plan` given none), each matmul is cast alone: its inputs down and
its outputs back up (`autocast_casts`), the ops around it unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from math import prod
from typing import NamedTuple

from neuron_explorer.common.autocast_policy import LOWER_PRECISION, runs_in_float32
from neuron_explorer.common.op_families import base_name, runs_matmuls

# (op name, ((shape, dtype name), ...) inputs, outputs, attrs)
OpKey = tuple[str, tuple, tuple, tuple]

F32 = "float32"
# What `dtype=` turns a matmul's float32 tensors into: fp8 operands accumulate and
# write bf16 (as the Tensor Engine does); the ops after it see the result's dtype.
DTYPES = {"bf16": ("bfloat16", "bfloat16"), "fp8": ("float8_e4m3fn", "bfloat16")}
_FLOATS = frozenset({F32, "float16", "bfloat16"})
_LOWER = frozenset(base_name(n) for n in LOWER_PRECISION)
# ops whose output dtype is an argument, not their inputs' (`.to()`, `.float()`, `type_as`
# are recorded as this)
_EXPLICIT_DTYPE = frozenset({"_to_copy"})


class Planned(NamedTuple):
    """One op as it would run: its key and the casts launched before and after it."""

    key: OpKey
    before: tuple[OpKey, ...] = ()
    after: tuple[OpKey, ...] = ()


def cast(shape: tuple, source: str, target: str) -> OpKey:
    """The key of a cast of one tensor (an `aten::_to_copy`)."""
    return ("aten::_to_copy", ((shape, source),), ((shape, target),), ())


def lowers_precision(name: str) -> bool:
    """Whether autocast runs the recorded op `name` in the lower precision: a matmul, a
    convolution, attention, a fused layer, or one of its list's other ops (prelu)."""
    return runs_matmuls(name) or base_name(name) in _LOWER


def with_dtype(key: OpKey, dtype: str | None) -> OpKey:
    """The key of a matmul (or of a whole layer PyTorch's fast path runs as one op, its
    matmuls inside) as if its floating-point tensors had `dtype` ("bf16", "fp8"); other
    ops, and every op when `dtype` is None, unchanged."""
    if dtype is None or not runs_matmuls(key[0]):
        return key
    operand, result = DTYPES[dtype]
    name, inputs, outputs, attrs = key
    ins = tuple((s, operand if d in _FLOATS else d) for s, d in inputs)
    outs = tuple((s, result if d in _FLOATS else d) for s, d in outputs)
    return name, ins, outs, attrs


def cast_whole(key: OpKey, dtype: str) -> OpKey:
    """The key of an op of a model cast whole to `dtype`'s result dtype (`model.to(torch.
    bfloat16)` and its inputs): every float32 tensor in it, matmuls' operands in the
    operand dtype."""
    if runs_matmuls(key[0]):
        return with_dtype(key, dtype)
    low = DTYPES[dtype][1]
    name, inputs, outputs, attrs = key
    return (name, tuple((s, low if d == F32 else d) for s, d in inputs),
            tuple((s, low if d == F32 else d) for s, d in outputs), attrs)


def autocast_casts(key: OpKey, dtype: str | None, backward: bool = False) -> list[OpKey]:
    """The casts around a float32 matmul run in `dtype` when nothing says where its tensors
    come from: in the forward each float32 input cast to the operand dtype and each output
    back to float32; in the backward the incoming gradient (the first input) cast down and
    each gradient it makes cast back up."""
    if dtype is None or not runs_matmuls(key[0]):
        return []
    operand = DTYPES[dtype][0]
    _, inputs, outputs, _ = key
    down = [s for s, d in inputs if d == F32][: 1 if backward else None]
    up = [s for s, d in outputs if d == F32]
    return [cast(s, F32, operand) for s in down] + [cast(s, operand, F32) for s in up]


def plan(keys: Sequence[OpKey | None], backward: Sequence[bool], dtype: str,
         producers: Sequence[tuple[int, ...]] | None = None,
         readers: Mapping[int, set[int]] | None = None) -> list[Planned | None]:
    """Each op of a recorded stream (`keys` in host order; None: not an op) as autocast in
    `dtype` runs it. `backward`: per op, whether autograd's backward ran it; `producers`:
    per op, per tensor input, the index of the op that made it (-1: none recorded);
    `readers`: per op, the ops that read a result of it. Without `producers`, each matmul
    is cast alone (`autocast_casts`)."""
    if producers is None:
        return [None if k is None else Planned(with_dtype(k, dtype),
                                               tuple(autocast_casts(k, dtype, b)))
                for k, b in zip(keys, backward, strict=True)]
    return _Propagation(keys, backward, dtype, producers, readers or {}).run()


class _Propagation:
    """`plan` with the data flow: each op's float32 outputs take the dtype it runs in."""

    def __init__(self, keys: Sequence[OpKey | None], backward: Sequence[bool], dtype: str,
                 producers: Sequence[tuple[int, ...]], readers: Mapping[int, set[int]]
                 ) -> None:
        self.keys, self.backward, self.readers = keys, backward, readers
        self.producers = producers
        self.operand, self.result = DTYPES[dtype]
        # per op, per output: its dtype in the new run (None: not a float32 output)
        self.made: list[list[str | None]] = [[] for _ in keys]
        # per backward op: whether it only reshapes what the forward saved (a weight's
        # transpose for its gradient's matmul), not a gradient
        self.of_saved = [False] * len(keys)
        # per size (elements) of what this forward's matmuls read: whether each of that
        # size was float32, cast down. The gradient of such a tensor goes back to float32
        # where a backward matmul makes it; a size some matmul read in the lower precision
        # too is left to the gradient's reader (attention's scores, q, k and v may share
        # one shape).
        self.cast_down: dict[int, bool] = {}
        self.in_backward = False

    def run(self) -> list[Planned | None]:
        return [None if key is None else self._op(i, key) for i, key in enumerate(self.keys)]

    def _source(self, i: int, j: int) -> int:
        made_by = self.producers[i]
        # (an out= op's data flow goes on past its inputs, with what last wrote its out=
        # tensors)
        if len(made_by) < len(self.keys[i][1]):  # type: ignore[index]
            return -1  # a data flow that does not line up with the key: nothing known
        return made_by[j]

    def _output(self, p: int, shape: tuple) -> int:
        """Which output of op `p` a tensor of `shape` it made is: the data flow names the op,
        not the output (a convolution's backward makes its input's and its weight's
        gradients)."""
        key = self.keys[p]
        if key is None:  # an op without a key (a collective): nothing planned for it
            return -1
        outputs = key[2]
        for k, (s, _) in enumerate(outputs):
            if tuple(s) == tuple(shape) and self.made[p][k] is not None:
                return k
        return next((k for k, d in enumerate(self.made[p]) if d is not None), -1)

    def _dtype_of(self, p: int, shape: tuple) -> str:
        """The dtype a recorded float32 tensor of `shape` made by op `p` has in the new run."""
        k = self._output(p, shape) if p >= 0 else -1  # -1: made outside the plan
        return (self.made[p][k] or F32) if k >= 0 else F32

    def _gradient(self, p: int) -> bool:
        """Whether a tensor made by op `p` is a gradient: made by the backward from
        something other than what the forward saved, or made outside it for the backward
        alone (the loss's gradient `backward()` starts from)."""
        if p < 0:
            return False
        if self.backward[p]:
            return not self.of_saved[p]
        return not any(not self.backward[r] for r in self.readers.get(p, ()))

    def _cast_gradient(self, p: int, shape: tuple, now: str, target: str,
                       before: list[OpKey]) -> None:
        """Autograd casts a gradient to its op's dtype once, as it is made: every op that
        reads it reads the cast."""
        before.append(cast(shape, now, target))
        k = self._output(p, shape)
        if k >= 0:
            self.made[p][k] = target

    def _op(self, i: int, key: OpKey) -> Planned:
        name, inputs, outputs, attrs = key
        backward = self.backward[i]
        if backward != self.in_backward:
            self.in_backward = backward
            if not backward:  # the next forward casts its own
                self.cast_down.clear()
        self.made[i] = [None] * len(outputs)
        if not any(d == F32 for _, d in (*inputs, *outputs)):
            return Planned(key)
        sources = [self._source(i, j) for j in range(len(inputs))]
        current = [self._dtype_of(p, s) if d == F32 else d
                   for p, (s, d) in zip(sources, inputs, strict=True)]
        gradients = [d == F32 and self._gradient(p)
                     for p, (_, d) in zip(sources, inputs, strict=True)]
        if backward:
            self.of_saved[i] = (any(d == F32 for _, d in inputs)
                                and not any(gradients))
        before: list[OpKey] = []
        lower = lowers_precision(name)
        if lower or runs_in_float32(name, backward):
            target = self.operand if lower else F32
            ins = []
            for (shape, d), p, now, gradient in zip(inputs, sources, current, gradients,
                                                    strict=True):
                if d != F32:
                    ins.append((shape, d))
                    continue
                # the forward casts what it reads; the backward reads the copies its
                # forward saved, and casts only a gradient arriving in another dtype
                if lower and not backward:
                    was_f32 = self.cast_down.get(prod(shape), True)
                    self.cast_down[prod(shape)] = was_f32 and now == F32
                if now != target and not backward:
                    before.append(cast(shape, now, target))
                elif now != target and gradient:
                    self._cast_gradient(p, shape, now, target, before)
                ins.append((shape, target))
            out_dtype = self.result if lower else F32
            outs = [(s, out_dtype if d == F32 else d) for s, d in outputs]
        else:
            ins, outs = self._promoted(i, key, sources, current, gradients, before)
        self.made[i] = [d if old == F32 else None
                        for (_, d), (_, old) in zip(outs, outputs, strict=True)]
        after = self._back_to_float32(i, outputs, lower)
        return Planned((name, tuple(ins), tuple(outs), attrs), tuple(before), after)

    def _promoted(self, i: int, key: OpKey, sources: list[int], current: list[str],
                  gradients: list[bool], before: list[OpKey]) -> tuple[list, list]:
        """An op autocast lets through: it runs in the dtype of what it reads (the larger
        float dtype of its dimensioned float inputs, or of its scalars where it has none);
        in place, each output keeps its tensor's dtype. In the backward, what the forward
        saved sets the dtype and a gradient in another one is cast to it first."""
        name, inputs, outputs, _ = key
        floats = [(len(s) > 0, now, gradient) for (s, d), now, gradient in
                  zip(inputs, current, gradients, strict=True) if d == F32]
        saved = [f for f in floats if not f[2]] if self.backward[i] else []
        pool = saved or floats
        dims = [now for has_dims, now, _ in pool if has_dims] or [now for _, now, _ in pool]
        runs_in = (F32 if F32 in dims else dims[0]) if dims else None
        ins = list(zip([s for s, _ in inputs], current, strict=True))
        if saved and runs_in is not None:
            for j, ((shape, _), p, now, gradient) in enumerate(
                    zip(inputs, sources, current, gradients, strict=True)):
                if gradient and now != runs_in:
                    self._cast_gradient(p, shape, now, runs_in, before)
                    ins[j] = (shape, runs_in)
        raw = name.split("::")[-1].split(".")[0]
        in_place = raw.endswith("_") and not raw.endswith("__")
        outs = []
        for j, (shape, d) in enumerate(outputs):
            if d != F32 or base_name(name) in _EXPLICIT_DTYPE:
                outs.append((shape, d))
            elif in_place and j < len(ins):
                outs.append((shape, ins[j][1]))
            else:
                outs.append((shape, runs_in or d))
        return ins, outs

    def _back_to_float32(self, i: int, outputs: tuple, lower: bool) -> tuple[OpKey, ...]:
        """The gradients a backward op makes that go back to float32 as it makes them (the
        backward of autocast's cast): a backward matmul's gradient of what its forward cast
        down (a weight, an input made in float32), and a gradient no backward op reads (a
        parameter's, which the optimizer reads)."""
        if not self.backward[i] or self.of_saved[i]:
            return ()
        read = any(self.backward[r] for r in self.readers.get(i, ()))
        casts = []
        for k, (shape, _) in enumerate(outputs):
            made = self.made[i][k]
            if made in (None, F32):
                continue
            if not read or lower and self.cast_down.get(prod(shape), False):
                casts.append(cast(shape, made, F32))
                self.made[i][k] = F32
        return tuple(casts)

