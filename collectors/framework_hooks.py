"""Framework-level events from PyTorch's own hooks: modules, backward, optimizer, data, ranges.

- forward: global module forward pre/post hooks give one `module` slice per call,
  named by its path (`model.layers.3.attn`);
- backward: module backward hooks would wrap every module's outputs in a custom
  autograd Function, which breaks in-place ops after a module, so instead each
  module's forward remembers the autograd sequence numbers of the nodes it created,
  and during backward the node running each op (`torch._C._current_autograd_node`)
  says which module's backward is running; a forward run inside backward (a
  checkpoint's recompute) nests in that backward slice, and adding into an existing
  `.grad` (AccumulateGrad) stays in the module slice open;
- optimizer: global step pre/post hooks (a step ends a training step), zero_grad;
- a model's outermost call also records grad mode when it is off and the shape of token
  ids passed to it, from which the explorer tells training, eval, prefill and decode apart;
- inference: with no optimizer step and no `neuron_explorer.step()`, the return of the
  outermost module's forward in no-grad or eval mode ends a step (one step per request);
- data: time in the DataLoader iterator's `__next__`;
- `torch.profiler.record_function` ranges become annotations.

Hooks do nothing while Dynamo traces (they would otherwise be compiled into graphs),
and the time they spend is removed from the host clock. Dynamo never compiles them as
frames of their own either: `torch.compile(module)` calls the model's module hooks from
inside its compiled wrapper, where Dynamo compiled each hook as an empty function with
guards on the grad mode, so switching to `no_grad` for evaluation "recompiled" the
recorder twice beside the model. The wrapper's call is the model's slice; the model's
own call inside it is not recorded again.
"""

from __future__ import annotations

import sys
import threading
import warnings
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from neuron_explorer.backend.clock import clock
from neuron_explorer.backend.host_costs import host_costs
from neuron_explorer.collectors import dataloader_workers, signal_guard
from neuron_explorer.collectors.trace_writer import RecordingError
from neuron_explorer.common.trace_format import (
    ARG_BATCH,
    ARG_COMPILE_SKIPS,
    ARG_GRAD,
    ARG_LIBRARY_MODULE,
    ARG_MODULE,
    ARG_PHASE,
    ARG_STEP,
    ARG_TOKENS,
    ARG_TRAINING,
    ARG_WORKER,
    ARG_WORKER_PID,
    CAT_DATALOADER,
    CAT_MODULE,
    CAT_OPTIMIZER,
)
from torch._C._autograd import _get_sequence_nr
from torch.nn.modules import module as nn_module
from torch.optim import optimizer as optimizer_hooks

_COMPILED_MODULE_WARNING = r"Using `torch\.compile\(module\)` when there are global hooks"

if TYPE_CHECKING:
    from neuron_explorer.backend.events import OpLaunch
    from neuron_explorer.collectors.recorder import Recorder, ThreadState

_perf_ns = clock.real_ns  # the clock's own measure: exclusions must be in it
_stamp = clock.stamp
_dynamo_compiling = torch.compiler.is_compiling
_get_mode = torch._C._get_dispatch_mode
_FAKE = torch._C._TorchDispatchModeKey.FAKE
_PROXY = torch._C._TorchDispatchModeKey.PROXY


def _is_compiling() -> bool:
    """True while torch.compile traces (Dynamo, or AOT tracing with fake/proxy tensors):
    module calls then are not the program running."""
    return _dynamo_compiling() or _get_mode(_FAKE) is not None or _get_mode(_PROXY) is not None
_current_node = torch._C._current_autograd_node
_GraphModule = torch.fx.GraphModule  # torch.compile's own graphs, not the user's modules
# modules Dynamo does not trace by default (torch/_dynamo/variables/builder.py): torch.compile
# breaks its graph around each call and runs them eager
_DYNAMO_SKIPS = (torch.nn.RNN, torch.nn.GRU, torch.nn.LSTM)
_DYNAMO_FRAMES = "torch._dynamo.eval_frame"
_hook_frames_skipped = False
_ACCUMULATE_GRAD = "torch::autograd::AccumulateGrad"  # runs right after its grad's node
_SEQ_MAP_LIMIT = 2_000_000  # autograd sequence numbers remembered for backward attribution
# record_function ranges that other events already show
_SKIPPED_RANGES = ("Optimizer.", "enumerate(DataLoader)", "Optimizer.zero_grad")
# PyTorch's modules that only hold others: their ops are their children's
_CONTAINERS = (torch.nn.Sequential, torch.nn.ModuleList, torch.nn.ModuleDict)


def _is_library_module(module: torch.nn.Module) -> bool:
    """A module PyTorch defines that is built of others and computes between them
    (nn.MultiheadAttention, nn.TransformerEncoderLayer), not a container: the views and
    copies inside its call are the library's. (A leaf, nn.Linear, runs one op on what it
    is given: a copy there is of the caller's view.)"""
    return (type(module).__module__.startswith("torch.") and not isinstance(module, _CONTAINERS)
            and next(module.children(), None) is not None)


def _skip_hook_frames() -> None:
    """Tell Dynamo to run the module hooks' frames as they are, never to compile them (it
    still inlines them while it traces a module, where they return at once). Done once
    Dynamo is loaded: loading it for a program that never compiles would cost a second."""
    global _hook_frames_skipped
    if _DYNAMO_FRAMES not in sys.modules:
        return
    _hook_frames_skipped = True
    from torch._dynamo.eval_frame import set_code_exec_strategy
    from torch._dynamo.types import FrameAction, FrameExecStrategy

    # skipped with everything they call: the recorder's own functions are no frames to
    # compile either
    skip = FrameExecStrategy(FrameAction.SKIP, FrameAction.SKIP)
    for hook in (FrameworkHooks._forward_pre, FrameworkHooks._forward_post):
        set_code_exec_strategy(hook.__code__, skip)


def _call_args(module: torch.nn.Module, args: Any) -> dict[str, Any]:
    """What the explorer needs to split a run into phases, on a model's outermost call:
    grad off (grad on, the usual case, writes nothing) with the model's training flag (an
    eval pass sets `model.eval()`; a step's own no-grad work, targets or a teacher's pass
    on a model in train mode, does not) and, when the first argument holds token ids,
    their shape (a decode step feeds one new token a sequence)."""
    model = getattr(module, "_orig_mod", module)  # torch.compile's wrapper: its model
    out: dict[str, Any] = {} if torch.is_grad_enabled() else {
        ARG_GRAD: 0, ARG_TRAINING: int(model.training)}
    first = args[0] if isinstance(args, tuple) and args else None
    if (isinstance(first, torch.Tensor) and 1 <= first.dim() <= 2
            and not first.dtype.is_floating_point and not first.dtype.is_complex
            and first.dtype != torch.bool):
        out[ARG_TOKENS] = str(list(first.shape))
    return out


class FrameworkHooks:
    """Installs the hooks for one recorder and removes them again."""

    def __init__(self, recorder: Recorder) -> None:
        self.rec = recorder
        self._names: weakref.WeakKeyDictionary[torch.nn.Module, str] = weakref.WeakKeyDictionary()
        self._roots: set[str] = set()
        self._seq_module: dict[int, str] = {}
        self._handles: list[Any] = []
        # inference steps: the outermost module call running on the main thread, and the
        # module whose calls end steps (the first one to run in inference)
        self._outer_call: int | None = None
        self._step_module: int | None = None
        # torch.compile's wrappers: id of the model each wraps -> id of the wrapper
        self._wrapper_of: dict[int, int] = {}
        self._patches: list[tuple[object, str, object]] = []

    # -- install / uninstall -----------------------------------------------------

    def install(self) -> None:
        # torch.compile(module) warns on every call while global module hooks exist that
        # they fire for its wrapper too: the recorder's do, and it reads the wrapper as
        # its model (`_orig_mod`), so the warning would only tell the user of our hooks.
        warnings.filterwarnings("ignore", _COMPILED_MODULE_WARNING, UserWarning)
        _skip_hook_frames()
        self._handles = [
            nn_module.register_module_forward_pre_hook(self._forward_pre),
            nn_module.register_module_forward_hook(self._forward_post, always_call=True),
            optimizer_hooks.register_optimizer_step_pre_hook(self._optimizer_pre),
            optimizer_hooks.register_optimizer_step_post_hook(self._optimizer_post),
        ]
        self._patch(torch.optim.Optimizer, "zero_grad", self._wrap_zero_grad)
        self._patch(torch.nn.Module, "zero_grad", self._wrap_zero_grad)
        self._patch(torch.autograd, "backward", self._wrap_backward)
        from torch.utils.data import dataloader

        self._patch(dataloader._BaseDataLoaderIter, "__next__", self._wrap_next)
        self._patch(dataloader._MultiProcessingDataLoaderIter, "__init__",
                    self._wrap_workers_start)
        self._patch(dataloader._MultiProcessingDataLoaderIter, "_try_put_index",
                    self._wrap_put_index)
        from torch.utils.data._utils import worker

        self._patch(worker, "_worker_loop", dataloader_workers.wrap_worker_loop)
        from torch.utils.data._utils import signal_handling

        self._patch(signal_handling, "_set_SIGCHLD_handler",
                    dataloader_workers.wrap_sigchld_setter)
        rf = torch.autograd.profiler.record_function
        self._patch(rf, "__enter__", self._wrap_range_enter)
        self._patch(rf, "__exit__", self._wrap_range_exit)

    def uninstall(self) -> None:
        # typeshed types `warnings.filters` as a Sequence; it is the module's own list
        warnings.filters[:] = [  # type: ignore[index]
            f for f in warnings.filters
            if not (f[1] is not None and f[1].pattern == _COMPILED_MODULE_WARNING)]
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for owner, name, original in reversed(self._patches):
            setattr(owner, name, original)
        self._patches.clear()

    def _patch(self, owner: object, name: str, make: Callable[[Any], Any]) -> None:
        original = owner.__dict__[name] if name in vars(owner) else getattr(owner, name)
        self._patches.append((owner, name, original))
        setattr(owner, name, make(original))

    # -- module paths ------------------------------------------------------------------

    def path_of(self, module: torch.nn.Module, parent: str | None) -> str:
        path = self._names.get(module)
        if path is not None:
            return path
        if parent is None:
            has_children = next(iter(module.children()), None) is not None
            base = "model" if has_children and "model" not in self._roots else type(module).__name__
            path = base
            n = 2
            while path in self._roots:
                path = f"{base}{n}"
                n += 1
            self._roots.add(path)
        else:
            path = f"{parent}.{type(module).__name__}"
        for name, sub in module.named_modules():
            if sub not in self._names:
                self._names[sub] = f"{path}.{name}" if name else path
        return self._names.get(module, path)

    def current_module(self, state: ThreadState) -> str:
        if state.forward:
            return state.forward[-1][0]
        if state.backward:
            return state.backward[-1]
        return ""

    # -- forward -----------------------------------------------------------------------

    def _forward_pre(self, module: torch.nn.Module, _args: Any) -> None:
        if _is_compiling() or isinstance(module, _GraphModule):
            return
        if not _hook_frames_skipped:
            _skip_hook_frames()  # before the first compiled call: torch.compile loaded Dynamo
        wrapped = getattr(module, "_orig_mod", None)
        if isinstance(wrapped, torch.nn.Module):
            self._wrapper_of[id(wrapped)] = id(module)
        if self._outer_call is None and threading.get_ident() == self.rec.main_ident:
            self._outer_call = id(module)  # also outside the step window: it counts steps
        if not self.rec.recording:
            return
        t0, ts = _stamp()  # the hook's own time from here is taken off the clock below
        try:
            rec = self.rec
            state = rec.thread()
            # the compiled wrapper's own model is not recorded again: the wrapper's slice
            # is this call
            if not state.forward or state.forward[-1][2] != self._wrapper_of.get(id(module)):
                self._begin_forward(module, state, ts, _args)
        except RecordingError as exc:
            self.rec.fail(exc)
        clock.exclude(_perf_ns() - t0)
        if host_costs.module_hook_ns:  # the slow module-call path these hooks cause
            clock.defer(host_costs.module_hook_ns, ts)

    def _begin_forward(self, module: torch.nn.Module, state: ThreadState, ts: int,
                       args: Any) -> None:
        rec = self.rec
        parent = state.forward[-1][0] if state.forward else None
        path = self.path_of(module, parent)
        slice_args: dict[str, Any] = {ARG_MODULE: path, ARG_PHASE: "forward", ARG_STEP: rec.step}
        if isinstance(module, _DYNAMO_SKIPS):  # a what-if of the run compiled keeps it eager
            slice_args[ARG_COMPILE_SKIPS] = "rnn"
        if _is_library_module(module):  # what its ops do is not the user's code to change
            slice_args[ARG_LIBRARY_MODULE] = True
        if not state.forward:
            node = _current_node()
            if node is not None:  # a forward run by a backward node (checkpoint recompute)
                rec.backward_to(self._seq_module.get(node._sequence_nr(), ""), ts, state)
            slice_args.update(_call_args(module, args))
        state.forward.append((path, _get_sequence_nr(), id(module)))
        rec.begin(path, CAT_MODULE, slice_args, ts=ts, state=state)

    def _forward_post(self, module: torch.nn.Module, _args: Any, _out: Any) -> None:
        if _is_compiling():
            return
        try:
            self._record_forward_end(module)
        finally:
            if self._outer_call == id(module):
                self._outer_call = None
                self._end_inference_step(module)

    def _end_inference_step(self, module: torch.nn.Module) -> None:
        """The outermost module returned: in an inference loop (no grad, or eval mode) and
        with no optimizer or explicit steps, each call of the model is a step."""
        rec = self.rec
        if rec.stopped or rec.explicit_steps or rec.step_boundary == "optimizer":
            return
        model = getattr(module, "_orig_mod", module)  # torch.compile's wrapper: its model
        inference = not torch.is_grad_enabled() or not model.training
        if not inference:
            return
        if self._step_module is None:
            self._step_module = id(module)
        elif self._step_module != id(module):
            return  # another top-level module (a tokenizer, a loss): not the model
        self._timed(self._forward_step_end)

    def _forward_step_end(self, ts: int) -> None:
        self.rec.end_step(explicit=False, ts=ts, by="forward")

    def _record_forward_end(self, module: torch.nn.Module) -> None:
        rec = self.rec
        state = rec._threads.get(threading.get_ident())
        if state is None or not state.forward:
            return
        key = id(module)
        stack = state.forward
        if stack[-1][2] != key:  # a call whose pre-hook we skipped (or never saw)
            if not any(entry[2] == key for entry in stack):
                return
            while stack[-1][2] != key:  # calls that never returned through their hook
                stack.pop()
                rec.end(CAT_MODULE, state=state)
        t0, ts = _stamp()
        try:
            path, seq_start, _ = stack.pop()
            seq_end = _get_sequence_nr()
            if seq_end > seq_start and torch.is_grad_enabled():
                seq_map = self._seq_module
                if len(seq_map) > _SEQ_MAP_LIMIT:
                    seq_map.clear()
                for seq in range(seq_start, seq_end):
                    seq_map.setdefault(seq, path)  # inner modules claimed theirs first
            rec.end(CAT_MODULE, ts=ts, state=state)
        except RecordingError as exc:
            rec.fail(exc)
        clock.exclude(_perf_ns() - t0)
        if host_costs.module_hook_ns:
            clock.defer(host_costs.module_hook_ns, ts)

    # -- backward ----------------------------------------------------------------------

    def before_op(self, ev: OpLaunch, state: ThreadState) -> None:
        """Called for every device op: follow the autograd node into module backward slices."""
        node = _current_node()
        if node is not None and state.forward:
            return  # a forward inside backward (recompute): its module slices hold its ops
        if node is None:
            if state.backward:
                try:
                    self.rec.close_backward(ev.host_start_ns, state)
                except RecordingError as exc:
                    self.rec.fail(exc)
            return
        path = self._seq_module.get(node._sequence_nr())
        if path is None:
            if state.backward and node.name() == _ACCUMULATE_GRAD:
                return  # adding to a parameter's .grad: part of the module whose grad it is
            path = ""
        try:
            self.rec.backward_to(path, ev.host_start_ns, state)
        except RecordingError as exc:
            self.rec.fail(exc)

    def _wrap_backward(self, original: Callable) -> Callable:
        def backward(*args: Any, **kwargs: Any) -> Any:
            if _current_node() is not None:  # a backward inside backward (reentrant checkpoint)
                return original(*args, **kwargs)  # the outer one's slices and map stay
            try:
                # A Ctrl-C or `kill` raised in a Python callback of the C++ autograd engine
                # aborted the process ("terminate called without an active exception",
                # the trace left without its end): it waits for the backward to finish.
                with signal_guard.guarded():
                    return original(*args, **kwargs)
            finally:
                if self.rec.recording:
                    self._timed(self._close_backward)

        return backward

    def _close_backward(self, ts: int) -> None:
        self.rec.close_backward(ts)
        # sequence numbers of this step's forward are no longer needed
        self._seq_module.clear()

    # -- optimizer ----------------------------------------------------------------------

    def _optimizer_pre(self, optimizer: torch.optim.Optimizer, _args: Any, _kw: Any) -> None:
        if _is_compiling():  # a compiled optimizer step: its calls run no hook, end no step
            self.rec.optimizer_step_compiled = True
            return
        if not self.rec.recording:
            return
        self._timed(self._optimizer_begin, f"{type(optimizer).__name__}.step")

    def _optimizer_begin(self, name: str, ts: int) -> None:
        self.rec.close_backward(ts)
        self.rec.begin(name, CAT_OPTIMIZER, {ARG_STEP: self.rec.step}, ts=ts)

    def _optimizer_post(self, _optimizer: torch.optim.Optimizer, _args: Any, _kw: Any) -> None:
        if _is_compiling() or self.rec.stopped:
            return
        self._timed(self._optimizer_end)

    def _optimizer_end(self, ts: int) -> None:
        self.rec.end(CAT_OPTIMIZER, ts=ts)
        self.rec.end_step(explicit=False, ts=ts, by="optimizer")

    def _wrap_zero_grad(self, original: Callable) -> Callable:
        hooks = self

        def zero_grad(self_: Any, *args: Any, **kwargs: Any) -> Any:
            rec = hooks.rec
            if _is_compiling() or not rec.recording:
                return original(self_, *args, **kwargs)
            name = f"{type(self_).__name__}.zero_grad"
            hooks._timed(rec.begin, name, CAT_OPTIMIZER, {ARG_STEP: rec.step})
            try:
                return original(self_, *args, **kwargs)
            finally:
                hooks._timed(rec.end, CAT_OPTIMIZER)

        return zero_grad

    # -- data loading ----------------------------------------------------------------------

    def _wrap_next(self, original: Callable) -> Callable:
        hooks = self

        def __next__(self_: Any) -> Any:
            rec = hooks.rec
            if not rec.recording:
                return original(self_)
            if rec.workers.follows(self_):
                return hooks._next_from_workers(original, self_)
            hooks._timed(rec.begin, "DataLoader.__next__", CAT_DATALOADER, {ARG_STEP: rec.step})
            try:
                return original(self_)
            finally:
                hooks._timed(rec.end, CAT_DATALOADER)

        return __next__

    def _next_from_workers(self, original: Callable, iterator: Any) -> Any:
        """`__next__` of a multi-worker iterator: the wait names the batch and the worker that
        fetched it, with a flow from that worker's track (`dataloader_workers`)."""
        rec = self.rec
        t0, ts = _stamp()
        mono_start = dataloader_workers.mono_ns()
        rec.workers.anchor(mono_start, ts)
        rec.workers.wait_started()
        batch, worker = dataloader_workers.batch_and_worker(iterator)
        clock.exclude(_perf_ns() - t0)
        got = False
        try:
            result = original(iterator)
            got = True
            return result
        finally:
            t1, end = _stamp()
            mono_end = dataloader_workers.mono_ns()
            waited = end  # where the wait ends on the host clock
            try:
                if batch is not None and getattr(iterator, "_rcvd_idx", None) != batch + 1:
                    batch = worker = None  # it skipped to another batch (a worker ended)
                receipt = rec.workers.received(iterator, batch if got else None, worker)
                if receipt.ready is not None and receipt.sent is not None:
                    # until the batch is ready as its worker would have it beside the
                    # program, then what receiving it took (unpickling, the queue: what
                    # the wait lasted on the host clock once the batch was sent)
                    receiving = min(max(end - ts - max(receipt.sent - mono_start, 0), 0),
                                    end - ts)
                    waited = max(ts, receipt.ready) + receiving
                rec.workers.anchor(mono_end, waited)
                rec.workers.wait_ended(waited)
                args = {ARG_STEP: rec.step}
                if receipt.batch is not None:
                    args[ARG_BATCH] = receipt.batch
                if receipt.worker_id is not None:
                    args[ARG_WORKER] = receipt.worker_id
                if receipt.worker_pid is not None:
                    args[ARG_WORKER_PID] = receipt.worker_pid
                rec.ensure_step(ts=ts)
                rec.writer.slice(rec.thread().track, ts, waited - ts, "DataLoader.__next__",
                                 CAT_DATALOADER, args,
                                 flow_in=(receipt.flow,) if receipt.flow is not None else ())
            except RecordingError as exc:
                rec.fail(exc)
            clock.exclude(_perf_ns() - t1)
            clock.charge(waited - end)  # the program waits that much longer (or less)

    def _wrap_put_index(self, original: Callable) -> Callable:
        hooks = self

        def _try_put_index(self_: Any) -> None:
            rec = hooks.rec
            batch = getattr(self_, "_send_idx", None)
            original(self_)
            if (rec.recording and rec.workers.follows(self_) and batch is not None
                    and getattr(self_, "_send_idx", None) != batch):
                rec.workers.task_sent(self_, batch, clock.now())

        return _try_put_index

    def _wrap_workers_start(self, original: Callable) -> Callable:
        hooks = self

        def __init__(self_: Any, *args: Any, **kwargs: Any) -> None:
            rec = hooks.rec
            if rec.recording:
                rec.workers.before_workers_start()
            original(self_, *args, **kwargs)
            if rec.recording:
                rec.workers.anchor(dataloader_workers.mono_ns(), clock.now())

        return __init__

    # -- record_function ranges -----------------------------------------------------------

    def _wrap_range_enter(self, original: Callable) -> Callable:
        hooks = self

        def __enter__(self_: Any) -> Any:
            result = original(self_)
            rec = hooks.rec
            if not _is_compiling() and rec.recording and not self_.name.startswith(_SKIPPED_RANGES):
                self_._neuron_explorer_open = True
                hooks._timed(rec.annotation_begin, self_.name)
            return result

        return __enter__

    def _wrap_range_exit(self, original: Callable) -> Callable:
        hooks = self

        def __exit__(self_: Any, *exc: Any) -> Any:
            if getattr(self_, "_neuron_explorer_open", False):
                self_._neuron_explorer_open = False
                hooks._timed(hooks.rec.annotation_end)
            return original(self_, *exc)

        return __exit__

    def _timed(self, fn: Callable, *args: Any) -> None:
        """Run a recording call at the current host time (passed as `ts`), keeping its own
        time off the host clock and its errors contained."""
        t0, ts = _stamp()
        try:
            fn(*args, ts=ts)
        except RecordingError as exc:
            self.rec.fail(exc)
        clock.exclude(_perf_ns() - t0)
