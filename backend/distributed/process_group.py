"""`ProcessGroupNeuron`: the torch.distributed backend of the `neuron` device.

The bytes move through gloo, on the zero-copy host views of the device tensors, so the
numbers are exactly gloo's. Around each collective the ranks also exchange the host time
of the call and when their devices could start it: their host clocks meet there when
they differ by noise only (`host_alignment`), and the collective runs on every rank's
collective queue from max(arrivals) for its cost on the simulated interconnect
(`interconnect.preset_collective_cost`), and its wait and transfer are recorded. The real time
spent here (gloo, other ranks' emulation) is removed from the host clock, which pays one
kernel launch per collective instead.

Every call completes before it returns; the `Work` it returns carries when the
collective ends on the device. Waiting on it (or a synchronous call) makes the current
stream wait until then; collectives launched inside a backward pass are also waited
for by the compute queue when that backward ends (DDP waits for its buckets there).
"""

from __future__ import annotations

import datetime
import os
import socket
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from neuron_explorer.backend import devices, runtime
from neuron_explorer.backend.clock import clock
from neuron_explorer.backend.distributed import busy_wait, collective_queue, host_alignment, streams
from neuron_explorer.backend.distributed.interconnect import (
    ALL_GATHER,
    ALL_REDUCE,
    ALL_TO_ALL,
    BARRIER,
    BROADCAST,
    RECV,
    REDUCE_SCATTER,
    SEND,
    Cost,
    Link,
    link_for,
    preset_collective_cost,
)
from neuron_explorer.backend.distributed.topology import topology_for
from neuron_explorer.backend.events import CollectiveRun, OpLaunch, hub
from neuron_explorer.common.errors import NeuronExplorerError

BACKEND_NAME = "neuron"

_SUPPORTED_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64,
                               torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64,
                               torch.bool})
_REDUCE_NAMES = {
    dist.ReduceOp.SUM: "sum", dist.ReduceOp.AVG: "avg", dist.ReduceOp.PRODUCT: "product",
    dist.ReduceOp.MIN: "min", dist.ReduceOp.MAX: "max", dist.ReduceOp.BAND: "band",
    dist.ReduceOp.BOR: "bor", dist.ReduceOp.BXOR: "bxor",
}


class CollectiveError(NeuronExplorerError, RuntimeError):
    """A collective the `neuron` backend cannot run, or one a peer rank never finished."""


def _reduce_op(opts) -> dist.ReduceOp:
    op = opts.reduceOp
    return op.op if hasattr(op, "op") else op


class NeuronWork(dist.Work):
    """A finished collective: waiting on it makes the current stream wait for its end."""

    def __init__(self, result: list[torch.Tensor], device_index: int, end_ns: int) -> None:
        super().__init__()
        self._result = result
        self._device_index = device_index
        self._end_ns = end_ns

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        if self._device_index >= 0:
            streams.current_stream(self._device_index).wait_until(self._end_ns)
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def result(self) -> list[torch.Tensor]:
        return self._result

    def get_future(self) -> torch.futures.Future:
        future: torch.futures.Future[list[torch.Tensor]] = torch.futures.Future()
        future.set_result(self._result)
        return future


class _Host:
    """The host (CPU) tensors gloo works on for some device tensors, copied back after if
    a tensor is not contiguous (gloo needs dense buffers)."""

    def __init__(self, op: str, tensors: Sequence[torch.Tensor]) -> None:
        self.pairs = []
        for t in tensors:
            if t.dtype not in _SUPPORTED_DTYPES:
                raise CollectiveError(
                    f"{op}: dtype {str(t.dtype).removeprefix('torch.')} is not supported by "
                    "the neuron collective backend (use float32, bfloat16, float16, float64, "
                    "bool or an integer dtype)")
            host = _host_view(t)
            self.pairs.append((host, host if host.is_contiguous() else host.contiguous()))

    @property
    def tensors(self) -> list[torch.Tensor]:
        return [dense for _, dense in self.pairs]

    def copy_back(self) -> None:
        for host, dense in self.pairs:
            if dense is not host:
                host.copy_(dense)


def _host_view(t: torch.Tensor) -> torch.Tensor:
    if t.device.type != "neuron":
        return t
    from neuron_explorer.backend.dispatch import host_view

    return host_view(t)


def _nbytes(tensors: Sequence[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _device_index(tensors: Sequence[torch.Tensor]) -> int:
    """The neuron device of a collective's tensors (-1: host tensors only)."""
    for t in tensors:
        if t.device.type == "neuron":
            return t.device.index if t.device.index is not None else devices.current_index
    return -1


class ProcessGroupNeuron(dist.ProcessGroup):
    """The `neuron` backend of one process group (see the module doc)."""

    def __init__(self, store: dist.Store, rank: int, size: int,
                 timeout: datetime.timedelta) -> None:
        super().__init__(rank, size)  # type: ignore[call-arg]  # the stub lists (store, rank, size) only
        self._rank = rank
        self._size = size
        self._timeout = timeout
        # Any: torch's stubs declare none of a Backend's collectives (allreduce, send...);
        # its works wait for late peers with the CPU kept busy (busy_wait) while this
        # machine has a CPU for each of its ranks (torchrun's count, else the group's)
        local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", size))
        self._gloo: Any = busy_wait.BusyWaits(dist.ProcessGroupGloo(
            dist.PrefixStore("neuron/gloo", store), rank, size, timeout),
            spin=busy_wait.spins(local_ranks))
        self._store = store
        self._seq = 0
        self._group_name = ""
        self._group_desc = ""
        self._lock = threading.Lock()
        self._pending_in_backward: list[tuple[int, int]] = []
        self._callback_queued = False
        self._links: dict[tuple, Link] = {}
        self._connected: set[tuple[int, ...] | None] = set()  # communicators set up so far
        # the call-time exchange's buffers, reused: one collective at a time per group
        self._call = torch.zeros(3, dtype=torch.int64)
        self._calls = torch.zeros(size * 3, dtype=torch.int64)
        self._last_met: dict[tuple[int, ...] | None, int] = {}  # when the hosts last met
        if not dist.is_initialized():  # the default group: this rank's core is LOCAL_RANK's
            _select_local_device()
        # Who is in the group, and a common epoch: every rank leaves here at the same time.
        global_rank = dist.get_rank() if dist.is_initialized() else rank
        me = torch.tensor([global_rank, os.getpid(), _host_id(), clock.now()], dtype=torch.int64)
        everyone = torch.empty(size * 4, dtype=torch.int64)
        real_start = clock.real_ns()
        self._gloo._allgather_base(everyone, me).wait()
        table = everyone.view(size, 4).tolist()
        self.global_ranks = tuple(int(row[0]) for row in table)
        self.global_rank = global_rank
        self._peers = [(int(row[1]), int(row[2])) for row in table]
        clock.exclude(clock.real_ns() - real_start)
        clock.advance_to(max(int(row[3]) for row in table))

    # -- identity ------------------------------------------------------------------------

    def getBackendName(self) -> str:
        return BACKEND_NAME

    def name(self) -> str:
        return BACKEND_NAME

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    # c10d uses a Python process group as the whole group (torch 2.13): it names it here
    def setGroupName(self, name: str) -> None:
        self._group_name = name

    def getGroupName(self) -> str:
        return self._group_name

    def setGroupDesc(self, desc: str) -> None:
        self._group_desc = desc

    def getGroupDesc(self) -> str:
        return self._group_desc

    def __repr__(self) -> str:
        return f"ProcessGroupNeuron(rank={self._rank}, size={self._size})"

    # -- the one path every collective takes --------------------------------------------

    def _run(self, collective: str, label: str, tensors: Sequence[torch.Tensor],
             nbytes: int, move: Callable[[], None], result: list[torch.Tensor],
             peers: tuple[int, ...] | None = None, host_waits: bool = False) -> NeuronWork:
        """Exchange arrivals, move the bytes, place the collective; see the module doc."""
        host_start = clock.now()
        pair = None if peers is None else tuple(sorted(peers))  # one communicator a pair
        if pair not in self._connected:
            self._connect(pair)
        real_start, called = clock.stamp()
        index = _device_index(tensors)
        device = devices.get(index) if index >= 0 else None
        preset = device.preset if device is not None else devices.preset()
        overhead = preset.host_launch_overhead_ns
        # a launch at host time h reaches the device at max(h + delay, ready)
        delay = overhead + (preset.launch_latency_ns if device is not None else 0)
        ready = collective_queue.ready_ns(device) if device is not None else 0
        group = self.global_ranks if peers is None else tuple(self.global_ranks[p] for p in peers)
        with self._lock:
            self._seq += 1
            seq = self._seq
        try:
            # the exchange of call times runs on gloo's other thread while the payload moves
            calls_done = self._exchange_calls((called, ready, delay), peers)
            move()
            calls = calls_done()
        except RuntimeError as exc:
            if isinstance(exc, NeuronExplorerError):
                raise
            raise self._peer_failure(label, seq, exc) from None
        hosts = [c[0] for c in calls]
        met = host_alignment.meeting_times(hosts, self._last_met[pair])
        if met is not None:
            hosts = met
            self._last_met[pair] = met[0]
        me = self._rank if peers is None else peers.index(self._rank)
        arrivals = [max(h + c[2], c[1]) for h, c in zip(hosts, calls, strict=True)]
        arrival, launch = arrivals[me], hosts[me] + overhead
        host_wait = hosts[me] - called
        itemsize = tensors[0].element_size() if tensors else 1
        cost: Cost = preset_collective_cost(preset, collective, nbytes, len(group),
                                            self._link(preset, group), itemsize)
        if device is not None:
            start, end = collective_queue.place(device, arrivals, cost.transfer_ns)
        else:
            start, end = max(arrivals), max(arrivals) + cost.transfer_ns
        if hub.active and device is not None:
            self._emit(label, device.index, host_start, launch, tensors, nbytes, group, seq,
                       cost.algorithm, arrival, start, end, host_wait)
        clock.exclude(clock.real_ns() - real_start - overhead)
        clock.advance_to(launch)
        if host_waits:
            clock.advance_to(end)
        work = NeuronWork(result, index, end)
        if device is not None and torch._C._current_graph_task_id() != -1:
            self._wait_at_backward_end(index, end)
        return work

    def _connect(self, peers: tuple[int, ...] | None) -> None:
        """Set up the communicator of the group (or of the pair `peers`) at its first
        collective, as NCCL and the Neuron runtime do: a rendezvous that returns on every
        rank at once, so the ranks' host clocks leave it aligned (at the latest rank's
        time). Without it, each rank's start-up (imports, model set-up, first-call costs,
        measured on its own clock) would leave an offset that no later call removes, and
        the early rank would wait for it at every collective of the run."""
        real_start = clock.real_ns()
        mine = torch.tensor([clock.now()], dtype=torch.int64)
        try:
            if peers is None:
                everyone = torch.empty(self._size, dtype=torch.int64)
                self._gloo._allgather_base(everyone, mine).wait()
                latest = int(everyone.max())
            else:
                other = peers[1] if peers[0] == self._rank else peers[0]
                theirs = torch.empty(1, dtype=torch.int64)
                tag = (1 << 20) + 1
                sent = self._gloo.send([mine], other, tag)
                self._gloo.recv([theirs], other, tag).wait()
                sent.wait()
                latest = max(int(mine[0]), int(theirs[0]))
        except RuntimeError as exc:
            raise self._peer_failure("communicator set-up", self._seq + 1, exc) from None
        clock.exclude(clock.real_ns() - real_start)
        clock.advance_to(latest)
        self._connected.add(peers)
        self._last_met[peers] = latest

    def _link(self, preset, group: tuple[int, ...]) -> Link:
        """The slowest link of `group` (the topology is read once per process group)."""
        key = (preset.name, group)
        link = self._links.get(key)
        if link is None:
            link = self._links[key] = link_for(preset, topology_for(preset), group)
        return link

    def _exchange_calls(self, mine: tuple[int, int, int], peers: tuple[int, ...] | None
                        ) -> Callable[[], list[tuple[int, int, int]]]:
        """Start exchanging every rank's (host time of the call, device ready time, launch
        delay) (just the pair's for send/recv, this rank first); the returned function
        waits for the exchange and gives them, in group rank order."""
        buffer = self._call
        buffer[:] = torch.tensor(mine, dtype=torch.int64)
        if peers is None:
            everyone = self._calls
            work = self._gloo._allgather_base(everyone, buffer)

            def gathered() -> list[tuple[int, int, int]]:
                work.wait()
                return [tuple(row) for row in everyone.view(-1, 3).tolist()]

            return gathered
        other = peers[1] if peers[0] == self._rank else peers[0]
        theirs = torch.empty(3, dtype=torch.int64)
        tag = 1 << 20
        sent = self._gloo.send([buffer], other, tag)
        received = self._gloo.recv([theirs], other, tag)

        def exchanged() -> list[tuple[int, int, int]]:
            received.wait()
            sent.wait()
            pair = [mine, tuple(theirs.tolist())]
            return pair if peers[0] == self._rank else pair[::-1]

        return exchanged

    def _wait_at_backward_end(self, index: int, end_ns: int) -> None:
        """The backward that launched this collective ends with the compute queue waiting
        for it (DDP reads its buckets right after)."""
        self._pending_in_backward.append((index, end_ns))
        if not self._callback_queued:
            self._callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._backward_ended)

    def _backward_ended(self) -> None:
        pending, self._pending_in_backward = self._pending_in_backward, []
        self._callback_queued = False
        for index, end_ns in pending:
            streams.default_stream(index).wait_until(end_ns)

    def _emit(self, label: str, index: int, host_start: int, launch: int,
              tensors: Sequence[torch.Tensor], nbytes: int, group: tuple[int, ...], seq: int,
              algorithm: str, arrival: int, start: int, end: int, host_wait: int) -> None:
        record_start = clock.real_ns()
        op_id = runtime.new_op_id()
        kernel_id = runtime.new_kernel_id()
        hub.op_launched(OpLaunch(
            op_id, f"c10d::{label}", index, host_start, launch,
            tuple(tuple(t.shape) for t in tensors),
            tuple(str(t.dtype).removeprefix("torch.") for t in tensors), 0, nbytes, False,
            (kernel_id,), threading.get_ident()))
        hub.collective_ran(CollectiveRun(kernel_id, op_id, index, label, nbytes, group, seq,
                                         algorithm, arrival, start, end, self.global_rank,
                                         host_wait))
        clock.exclude(clock.real_ns() - record_start)

    def _gone_peers(self) -> list[int]:
        """Peer ranks on this host whose process has ended (waiting a little: a killed
        process closes its sockets just before it is gone). The first rank to find them
        posts them in the store, so that ranks that fail later, when the ones that
        noticed first have exited too, still name the rank that died."""
        deadline = time.monotonic() + 2.0
        while True:
            gone = [self.global_ranks[i] for i, (pid, host) in enumerate(self._peers)
                    if i != self._rank and host == _host_id() and not _alive(pid)]
            if gone or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        try:
            first = self._store.compare_set("neuron/gone", "", ",".join(map(str, gone)))
            return [int(r) for r in first.decode().split(",") if r]
        except Exception:  # noqa: BLE001 - the store may have died with the rank
            return gone

    def _peer_failure(self, label: str, seq: int, exc: RuntimeError) -> CollectiveError:
        gone = self._gone_peers()
        who = (f"rank {', '.join(map(str, gone))} exited" if gone
               else "a peer rank stopped answering")
        return CollectiveError(
            f"{label} (call {seq} of group {list(self.global_ranks)}) failed on rank "
            f"{self.global_rank}: {who} before finishing it ({str(exc).splitlines()[0]}); "
            "see that rank's output for its error")

    # -- collectives ----------------------------------------------------------------------

    def allreduce(self, tensors: list[torch.Tensor], opts=None) -> NeuronWork:  # type: ignore[override]  # c10d calls it as (tensors, opts)
        op = _reduce_op(opts) if opts is not None else dist.ReduceOp.SUM
        return self._all_reduce(tensors, op, "all_reduce")

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts=None) -> NeuronWork:
        op = _reduce_op(opts) if opts is not None else dist.ReduceOp.SUM
        return self._all_reduce(tensors, op, "all_reduce_coalesced")

    def _all_reduce(self, tensors: list[torch.Tensor], op, label: str) -> NeuronWork:
        name = _REDUCE_NAMES.get(op)
        if name is None:
            raise CollectiveError(f"{label}: reduce op {op} is not supported by the neuron "
                                  "collective backend (use sum, avg, product, min or max)")
        host = _Host(label, tensors)
        if op == dist.ReduceOp.AVG and any(not t.is_floating_point() for t in tensors):
            raise CollectiveError(f"{label}: ReduceOp.AVG needs a floating-point tensor; "
                                  "use SUM and divide")

        def move() -> None:
            gloo_op = dist.ReduceOp.SUM if op == dist.ReduceOp.AVG else op
            opts = dist.AllreduceOptions()
            opts.reduceOp = gloo_op  # type: ignore[assignment]  # pybind converts a RedOpType
            self._gloo.allreduce(host.tensors, opts).wait()
            if op == dist.ReduceOp.AVG:
                for t in host.tensors:
                    t.div_(self._size)
            host.copy_back()

        return self._run(ALL_REDUCE, label, tensors, max(_nbytes([t]) for t in tensors),
                         move, tensors)

    def broadcast(self, tensors: list[torch.Tensor], opts=None) -> NeuronWork:  # type: ignore[override]  # c10d calls it as (tensors, opts)
        host = _Host("broadcast", tensors)

        def move() -> None:
            o = dist.BroadcastOptions()
            o.rootRank, o.rootTensor = opts.rootRank, opts.rootTensor
            self._gloo.broadcast(host.tensors, o).wait()
            host.copy_back()

        return self._run(BROADCAST, "broadcast", tensors, _nbytes(tensors), move, tensors)

    def allgather(self, output_lists: list[list[torch.Tensor]],  # type: ignore[override]
                  inputs: list[torch.Tensor], opts=None) -> NeuronWork:  # c10d's one form
        outs = [t for lst in output_lists for t in lst]
        host_in = _Host("all_gather", inputs)
        host_out = [_Host("all_gather", lst) for lst in output_lists]

        def move() -> None:
            self._gloo.allgather([h.tensors for h in host_out], host_in.tensors).wait()
            for h in host_out:
                h.copy_back()

        return self._run(ALL_GATHER, "all_gather", [*inputs, *outs], _nbytes(outs), move,
                         outs)

    def all_gather_into_tensor(self, output: torch.Tensor, input: torch.Tensor,
                               label: str = "all_gather_into_tensor") -> NeuronWork:
        host_out, host_in = _Host(label, [output]), _Host(label, [input])
        if output.numel() != input.numel() * self._size:
            raise CollectiveError(f"{label}: the output must hold world size ({self._size}) x "
                                  f"the input's {input.numel()} elements, not {output.numel()}")

        def move() -> None:
            self._gloo._allgather_base(host_out.tensors[0], host_in.tensors[0]).wait()
            host_out.copy_back()

        return self._run(ALL_GATHER, label, [input, output], _nbytes([output]), move, [output])

    def allgather_into_tensor_coalesced(self, outputs: list[torch.Tensor],
                                        inputs: list[torch.Tensor], opts=None) -> NeuronWork:
        works = [self.all_gather_into_tensor(o, i) for o, i in zip(outputs, inputs, strict=True)]
        return works[-1] if works else NeuronWork([], -1, 0)

    def reduce_scatter(self, outputs: list[torch.Tensor],  # type: ignore[override]
                       input_lists: list[list[torch.Tensor]],
                       opts=None) -> NeuronWork:  # c10d calls it as (outputs, inputs, opts)
        op = _reduce_op(opts) if opts is not None else dist.ReduceOp.SUM
        # the list, joined on the host (its chunks are the ranks' parts, in rank order)
        works = [self.reduce_scatter_tensor(
                    o, torch.cat([_host_view(t).reshape(-1) for t in lst]), op, "reduce_scatter")
                 for o, lst in zip(outputs, input_lists, strict=True)]
        return works[-1]

    def reduce_scatter_tensor(self, output: torch.Tensor, input: torch.Tensor, op,
                              label: str = "reduce_scatter_tensor") -> NeuronWork:
        name = _REDUCE_NAMES.get(op)
        if name is None or op in (dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR):
            raise CollectiveError(f"{label}: reduce op {op} is not supported by the neuron "
                                  "collective backend (use sum, avg, product, min or max)")
        if input.numel() != output.numel() * self._size:
            raise CollectiveError(f"{label}: the input must hold world size ({self._size}) x "
                                  f"the output's {output.numel()} elements, not {input.numel()}")
        host_out, host_in = _Host(label, [output]), _Host(label, [input])

        def move() -> None:
            # gloo's reduce-scatter: an all-reduce of the whole input, then this rank's chunk
            full = host_in.tensors[0].clone()
            o = dist.AllreduceOptions()
            o.reduceOp = dist.ReduceOp.SUM if op == dist.ReduceOp.AVG else op  # type: ignore[assignment]  # pybind converts a RedOpType
            self._gloo.allreduce([full], o).wait()
            mine = full.reshape(-1).chunk(self._size)[self._rank]
            if op == dist.ReduceOp.AVG:
                mine = mine / self._size
            host_out.tensors[0].reshape(-1).copy_(mine)
            host_out.copy_back()

        return self._run(REDUCE_SCATTER, label, [input, output], _nbytes([input]), move,
                         [output])

    def reduce_scatter_tensor_coalesced(self, outputs: list[torch.Tensor],
                                        inputs: list[torch.Tensor], opts=None) -> NeuronWork:
        op = _reduce_op(opts) if opts is not None else dist.ReduceOp.SUM
        works = [self.reduce_scatter_tensor(o, i, op)
                 for o, i in zip(outputs, inputs, strict=True)]
        return works[-1] if works else NeuronWork([], -1, 0)

    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor,
                      output_split_sizes: list[int], input_split_sizes: list[int],
                      opts=None) -> NeuronWork:
        host_out, host_in = _Host("all_to_all_single", [output]), _Host("all_to_all_single",
                                                                        [input])

        def move() -> None:
            self._gloo.alltoall_base(host_out.tensors[0], host_in.tensors[0],
                                     list(output_split_sizes), list(input_split_sizes)).wait()
            host_out.copy_back()

        return self._run(ALL_TO_ALL, "all_to_all_single", [input, output], _nbytes([input]),
                         move, [output])

    def barrier(self, opts=None) -> NeuronWork:
        index = devices.current_index if devices.initialized() else -1
        tensors = [torch.empty(0, device=f"neuron:{index}")] if index >= 0 else []
        return self._run(BARRIER, "barrier", tensors, 0, lambda: None, [], host_waits=True)

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> NeuronWork:
        host = _Host("send", tensors)

        def move() -> None:
            self._gloo.send(host.tensors, dst, tag).wait()

        return self._run(SEND, "send", tensors, _nbytes(tensors), move, tensors,
                         peers=(self._rank, dst))

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> NeuronWork:
        if src < 0:
            raise CollectiveError("recv from any source is not supported by the neuron "
                                  "collective backend: name the source rank")
        host = _Host("recv", tensors)

        def move() -> None:
            self._gloo.recv(host.tensors, src, tag).wait()
            host.copy_back()

        return self._run(RECV, "recv", tensors, _nbytes(tensors), move, tensors,
                         peers=(src, self._rank))

    # reached through the c10d ops of `c10d_ops` (not overridable on a Python group)
    def scatter_tensors(self, outputs: list[torch.Tensor],
                        input_lists: list[list[torch.Tensor]], root: int) -> NeuronWork:
        host_out = _Host("scatter", outputs)
        host_in = [_Host("scatter", lst) for lst in input_lists]
        sent = [t for lst in input_lists for t in lst]

        def move() -> None:
            o = dist.ScatterOptions()
            o.rootRank = root
            self._gloo.scatter(host_out.tensors, [h.tensors for h in host_in], o).wait()
            host_out.copy_back()

        nbytes = _nbytes(outputs) * self._size
        return self._run(ALL_GATHER, "scatter", [*outputs, *sent], nbytes, move, outputs)

    def gather_tensors(self, output_lists: list[list[torch.Tensor]],
                       inputs: list[torch.Tensor], root: int) -> NeuronWork:
        host_in = _Host("gather", inputs)
        host_out = [_Host("gather", lst) for lst in output_lists]
        received = [t for lst in output_lists for t in lst]

        def move() -> None:
            o = dist.GatherOptions()
            o.rootRank = root
            self._gloo.gather([h.tensors for h in host_out], host_in.tensors, o).wait()
            for h in host_out:
                h.copy_back()

        nbytes = _nbytes(inputs) * self._size
        return self._run(ALL_GATHER, "gather", [*inputs, *received], nbytes, move, received)

    def reduce_tensors(self, tensors: list[torch.Tensor], op, root: int) -> NeuronWork:
        if _REDUCE_NAMES.get(op) is None or op == dist.ReduceOp.AVG:
            raise CollectiveError(f"reduce: reduce op {op} is not supported by the neuron "
                                  "collective backend (use sum, product, min or max)")
        host = _Host("reduce", tensors)

        def move() -> None:
            o = dist.ReduceOptions()
            o.reduceOp, o.rootRank = op, root
            self._gloo.reduce(host.tensors, o).wait()
            host.copy_back()

        return self._run(BROADCAST, "reduce", tensors, _nbytes(tensors), move, tensors)


def _select_local_device() -> None:
    """Make neuron:LOCAL_RANK current (neuron:0 when the chip has fewer cores than that)."""
    local = os.environ.get("LOCAL_RANK", "")
    if local.isdigit():
        index = int(local)
        devices.set_current(index if index < devices.device_count() else 0)


def _host_id() -> int:
    return zlib.crc32(socket.gethostname().encode()) & 0x7FFFFFFF


def _alive(pid: int) -> bool:
    """Whether process `pid` still runs (a killed child not yet reaped is a zombie: dead)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return state not in ("Z", "X")
