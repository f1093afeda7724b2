"""DataLoader worker tracks: what each worker process did, on the recording's host clock.

A `DataLoader(num_workers=N)` starts N worker processes. While a recording runs,
torch's worker loop is wrapped (a fork inherits the wrapper):

- in a worker, each batch is timed (task received, samples fetched, collated,
  sent) and appended as one line to a small log file of its own (one write per
  batch; a worker that dies leaves its complete lines behind);
- in the main process, each `DataLoader.__next__` notes (monotonic time, host
  time) at its start and end, the anchors that map the workers' monotonic times
  onto the host clock (piecewise linear, so a batch a worker sent during a wait
  lands inside that wait), reads the new lines of the batch's worker, writes that
  worker's batches on a track of its own ("DataLoader worker 0") and the wait as
  a slice naming the worker and batch, linked to the worker's batch by a flow.

Workers started with `spawn` or `forkserver` find the log folder in the environment
(their own recording wraps the loop again); modelled recordings
(`NEURON_HOST_CLOCK=modelled`) leave worker tracks out, their times being measured.
docs/recording.md says more.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from neuron_explorer.backend.clock import ThreadRunDelay
from neuron_explorer.common.trace_format import (
    ARG_BATCH,
    ARG_RAISED,
    ARG_SAMPLES,
    ARG_STEP,
    ARG_WAITED_FOR_CORE,
    ARG_WORKER,
    ARG_WORKER_PID,
    CAT_DATALOADER_WORKER,
)

if TYPE_CHECKING:
    from neuron_explorer.collectors.recorder import Recorder

mono_ns = _mono_ns = time.perf_counter_ns  # CLOCK_MONOTONIC: one clock for every process
_WORKER_LOOP_ARGS = 14  # torch's _worker_loop(dataset_kind, ..., shared_seed)
_FLOW_WORKER_BATCH = 1 << 61  # flow ids from a worker's batch to the wait that got it
_ANCHORS_LIMIT = 1_000_000

# Set in the main process while a recording follows workers; forked workers inherit it,
# spawned ones read the environment variable (their own recording wraps the loop again).
_log_dir: str | None = None
_owner_pid = 0
LOG_DIR_ENV = "NEURON_EXPLORER_WORKER_LOGS"


# -- in the worker ------------------------------------------------------------------


class _BatchLog:
    """One worker's batches, a line each: idx worker got collate_start collate_end sent
    samples run_delay (the time the worker was ready to run but waited for a core)
    delay_before (its run delay from its start to got), and the type of the exception
    the batch raised, where it did."""

    def __init__(self, path: str, worker_id: int) -> None:
        self.worker_id = worker_id
        self.fd: int | None = None
        with contextlib.suppress(OSError):
            self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self.idx: int | None = None
        self.got = self.collate_start = self.collate_end = -1
        self.samples = -1
        self.run_delay = ThreadRunDelay()
        self.delay_at_got = 0

    def task(self, r: Any) -> None:
        if isinstance(r, tuple) and len(r) == 2 and isinstance(r[0], int):
            self.idx, self.got = r[0], _mono_ns()
            self.delay_at_got = self.run_delay.read()
            self.collate_start = self.collate_end = -1
            self.samples = len(r[1]) if hasattr(r[1], "__len__") else 1

    def sent(self, item: Any) -> None:
        if (self.fd is None or self.idx is None or not isinstance(item, tuple)
                or item[0] != self.idx):
            return
        if len(item) > 1 and type(item[1]).__name__ == "_IterableDatasetStopIteration":
            self.idx = None  # an iterable dataset's end, not a batch
            return
        sent = _mono_ns()
        delay = self.run_delay.read() - self.delay_at_got
        # torch sends what a batch raised as an ExceptionWrapper, naming its type
        raised = getattr(item[1], "exc_type", None) if len(item) > 1 else None
        line = (f"{self.idx} {self.worker_id} {self.got} {self.collate_start} "
                f"{self.collate_end} {sent} {self.samples} {delay} {self.delay_at_got}"
                + (f" {raised.__name__}" if isinstance(raised, type) else "") + "\n")
        self.idx = None
        try:
            os.write(self.fd, line.encode())
        except OSError:  # the recording ended (its folder is gone): stop logging
            self.fd = None

    def timed_collate(self, collate: Callable) -> Callable:
        def collate_fn(data: Any) -> Any:
            self.collate_start = _mono_ns()
            try:
                return collate(data)
            finally:
                self.collate_end = _mono_ns()

        return collate_fn


class _IndexQueue:
    """The worker's task queue, noting each batch index it hands out."""

    def __init__(self, queue: Any, log: _BatchLog) -> None:
        self._queue, self._log = queue, log

    def get(self, *args: Any, **kwargs: Any) -> Any:
        r = self._queue.get(*args, **kwargs)
        self._log.task(r)
        return r

    def __getattr__(self, name: str) -> Any:
        return getattr(self._queue, name)


class _DataQueue:
    """The worker's result queue, logging a batch as it is sent."""

    def __init__(self, queue: Any, log: _BatchLog) -> None:
        self._queue, self._log = queue, log

    def put(self, item: Any, *args: Any, **kwargs: Any) -> Any:
        self._log.sent(item)
        return self._queue.put(item, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._queue, name)


def wrap_sigchld_setter(original: Callable) -> Callable:
    """torch's SIGCHLD handler raises in the main thread, wherever it is, once a worker
    dies: also inside the recorder or the device emulation's deallocation callbacks. It
    is installed when a DataLoader starts its workers, after the recorder wrapped SIGINT
    and SIGTERM; wrap it the same way, so it waits for the end of a guarded section and,
    landing in a finaliser, is sent again a moment later."""

    @functools.wraps(original)
    def _set_SIGCHLD_handler() -> None:
        import signal

        from neuron_explorer.collectors import signal_guard

        original()
        with contextlib.suppress(ValueError, TypeError):  # not the main thread
            current = signal.getsignal(signal.SIGCHLD)
            wrapped = signal_guard.deferring(current)
            if wrapped is not current:
                signal.signal(signal.SIGCHLD, wrapped)

    return _set_SIGCHLD_handler


def wrap_worker_loop(original: Callable) -> Callable:
    """torch's worker loop, logging each batch when started by a recorded process's fork."""

    # the same module and name as torch's: a `spawn` DataLoader pickles its workers'
    # target by name, and finds torch's own function in the new process
    @functools.wraps(original)
    def _worker_loop(*args: Any, **kwargs: Any) -> Any:
        log_dir = _log_dir or os.environ.get(LOG_DIR_ENV)
        if not log_dir or os.getpid() == _owner_pid or kwargs or len(args) != _WORKER_LOOP_ARGS:
            return original(*args, **kwargs)
        worker_id = args[10]
        log = _BatchLog(os.path.join(log_dir, f"{os.getpid()}.log"), worker_id)
        wrapped = list(args)
        wrapped[2] = _IndexQueue(args[2], log)
        wrapped[3] = _DataQueue(args[3], log)
        if args[6] is not None:
            wrapped[6] = log.timed_collate(args[6])
        return original(*wrapped)

    return _worker_loop


# -- in the main process --------------------------------------------------------------


@dataclass
class WorkerBatch:
    """One batch as a worker logged it (monotonic ns; -1 where not measured)."""

    idx: int
    worker_id: int
    got: int
    collate_start: int
    collate_end: int
    sent: int
    samples: int
    run_delay: int = 0  # of the time between got and sent: the worker waited for a core
    delay_before: int = 0  # of the time from the worker's start to got: waited for a core
    raised: str = ""  # the type of the exception the batch raised, where it did

    @property
    def took(self) -> int:
        """What the batch took the worker, load-free as the host clock (ns, at least 1)."""
        return max(self.sent - self.got - max(self.run_delay, 0), 1)

    @classmethod
    def parse(cls, line: bytes) -> WorkerBatch | None:
        fields = line.split()
        try:
            numbers = [int(f) for f in fields[:9]]
        except ValueError:
            return None
        if len(numbers) != 9:
            return None
        idx, worker_id, got, collate_start, collate_end, sent, samples, delay, before = numbers
        raised = fields[9].decode(errors="replace") if len(fields) > 9 else ""
        return cls(idx, worker_id, got, collate_start, collate_end, sent, samples, delay,
                   before, raised)


@dataclass
class Receipt:
    """What a `DataLoader.__next__` got: the batch index, its worker, the flow to it, and
    when the batch is ready on the host clock (`ready`) and was sent (`sent`, monotonic)
    where its worker's log had it."""

    batch: int | None
    worker_id: int | None
    worker_pid: int | None
    flow: int | None
    ready: int | None = None
    sent: int | None = None


class _WorkerLog:
    """The main process's view of one worker's log: read position, pending batches, track."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.offset = 0
        self.tail = b""
        self.pending: list[WorkerBatch] = []
        self.track: int | None = None
        self.last_end = 0  # host time the last batch written ended
        self.written = 0  # batches written

    def read_new(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return
        self.offset += len(data)
        lines = (self.tail + data).split(b"\n")
        self.tail = lines.pop()  # an unfinished line (a worker killed mid-write) waits
        self.pending.extend(b for b in map(WorkerBatch.parse, lines) if b is not None)


class WorkerTracks:
    """Follows the workers of one recording's DataLoaders into its trace."""

    def __init__(self, recorder: Recorder) -> None:
        self.rec = recorder
        self.enabled = not recorder.modelled
        self.dir: str | None = None
        self._walls: list[int] = []
        self._hosts: list[int] = []
        self._logs: dict[int, _WorkerLog] = {}  # worker pid -> its log
        self._next_flow = 0
        self._tasks_sent: dict[tuple[int, int], int] = {}  # (worker pid, batch) -> host time
        self._sent_in_wait: list[tuple[int, int]] | None = None  # during a __next__

    # -- set-up --------------------------------------------------------------------

    def before_workers_start(self) -> None:
        """A multi-worker iterator is about to fork its workers: give them a log folder."""
        global _log_dir, _owner_pid
        if not self.enabled:
            return
        if self.dir is None:
            try:
                # named by the recording process: whose a folder left behind is
                self.dir = tempfile.mkdtemp(prefix=f"neuron-explorer-workers-{os.getpid()}-")
            except OSError:
                self.enabled = False  # no temporary folder: no worker tracks, nothing else lost
                return
        _log_dir, _owner_pid = self.dir, os.getpid()
        os.environ[LOG_DIR_ENV] = self.dir

    def follows(self, iterator: Any) -> bool:
        return self.enabled and self.dir is not None and hasattr(iterator, "_workers")

    # -- the clock ----------------------------------------------------------------------

    def anchor(self, mono: int, host: int) -> None:
        """A moment read on both clocks (monotonic ns, host ns)."""
        if self._walls and (mono <= self._walls[-1] or host < self._hosts[-1]):
            return
        if len(self._walls) >= _ANCHORS_LIMIT:
            del self._walls[: _ANCHORS_LIMIT // 2], self._hosts[: _ANCHORS_LIMIT // 2]
        self._walls.append(mono)
        self._hosts.append(host)

    def to_host(self, mono: int) -> int:
        """A worker's monotonic time on the host clock: linear between the anchors around
        it, at the monotonic rate before the first and after the last."""
        walls, hosts = self._walls, self._hosts
        i = bisect.bisect_right(walls, mono) - 1
        if i < 0:
            return hosts[0] - (walls[0] - mono)
        if i >= len(walls) - 1:
            return hosts[-1] + (mono - walls[-1])
        w0, w1, h0, h1 = walls[i], walls[i + 1], hosts[i], hosts[i + 1]
        return h0 + (h1 - h0) * (mono - w0) // (w1 - w0)

    # -- batches -----------------------------------------------------------------------
    #
    # A worker's batches are laid on the host clock as a worker would run them beside the
    # program on the real host: each starts when its task was sent or the worker's batch
    # before ended, whichever is later, and lasts what it took the worker (load-free).
    # Their own monotonic times would not do: the host clock leaves out the device's
    # emulation and the recording, during which the workers kept running, so batches
    # would look ready far sooner than they could be (a step of 3 ms fed by 2 workers of
    # 50 ms batches showed steps of 6 ms instead of 25). A wait then lasts until its batch
    # is ready on the host clock, plus what receiving it took the main process.

    def task_sent(self, iterator: Any, batch: int, host: int) -> None:
        """The iterator sent `batch`'s task to its worker at `host` (inside a wait: when
        the wait ends, since that is when the program would send it)."""
        with contextlib.suppress(AttributeError, IndexError, KeyError, TypeError):
            worker_id = iterator._task_info[batch][0]
            key = (int(iterator._workers[worker_id].pid), batch)
            self._tasks_sent[key] = host
            if self._sent_in_wait is not None:
                self._sent_in_wait.append(key)

    def wait_started(self) -> None:
        self._sent_in_wait = []

    def wait_ended(self, host: int) -> None:
        """The wait ends at `host`: the tasks it sent leave then. (Not later: the host clock
        ran on while the program was blocked in the wait, which ends earlier where its
        batch was ready sooner; under load, tasks stamped so started their batches up to
        100 ms late.)"""
        for key in self._sent_in_wait or ():
            if key in self._tasks_sent:
                self._tasks_sent[key] = host
        self._sent_in_wait = None

    def received(self, iterator: Any, batch: int | None, worker_id: int | None) -> Receipt:
        """The main thread got `batch` from `worker_id`: write that worker's batches so far,
        the received one with a flow to the wait."""
        pid = None
        with contextlib.suppress(AttributeError, IndexError, TypeError):
            pid = int(iterator._workers[worker_id].pid) if worker_id is not None else None
        if pid is None or batch is None or self.dir is None:
            return Receipt(batch, worker_id, pid, None)
        log = self._logs.get(pid)
        if log is None:
            log = self._logs[pid] = _WorkerLog(os.path.join(self.dir, f"{pid}.log"))
        log.read_new()
        for i, b in enumerate(log.pending):
            if b.idx == batch:
                flow = _FLOW_WORKER_BATCH | self._next_flow
                self._next_flow += 1
                self._write(pid, log, log.pending[:i], None)
                ready = self._write(pid, log, [b], flow)
                del log.pending[: i + 1]
                return Receipt(batch, worker_id, pid, flow, ready, b.sent)
        return Receipt(batch, worker_id, pid, None)

    def _write(self, pid: int, log: _WorkerLog, batches: list[WorkerBatch],
               flow: int | None) -> int | None:
        """Write `batches` on the worker's track; the host time the last one ends."""
        if not batches or not self._walls:
            return None
        writer = self.rec.writer
        if log.track is None:
            label = f"DataLoader worker {batches[0].worker_id}"
            writer.process(pid, f"{label} (pid {pid})")
            log.track = writer.thread(pid, pid, label)
        track, step = log.track, self.rec.step
        for b in batches:
            args: dict[str, int | str] = {ARG_BATCH: b.idx, ARG_WORKER: b.worker_id,
                                          ARG_WORKER_PID: pid, ARG_SAMPLES: b.samples,
                                          ARG_STEP: step}
            if b.run_delay > 0:  # left out of its length, as the host clock leaves it out
                args[ARG_WAITED_FOR_CORE] = b.run_delay
            if b.raised:
                args[ARG_RAISED] = b.raised
            sent = self._tasks_sent.pop((pid, b.idx), None)
            start = max(sent if sent is not None else self.to_host(b.got), log.last_end, 0)
            if not log.written:
                # not before the worker had started (its first task), its start-up timed
                # load-free: under load, waiting for a core at start-up moved every batch
                start = max(start, self.to_host(b.got) - max(b.delay_before, 0))
            end = start + b.took
            scale = b.took / max(b.sent - b.got, 1)

            def at(mono: int, b: WorkerBatch = b, start: int = start, scale: float = scale) -> int:
                return start + int((mono - b.got) * scale)

            name = f"batch {b.idx}" + (f" (raised {b.raised})" if b.raised else "")
            writer.begin(track, start, name, CAT_DATALOADER_WORKER, args,
                         flow_out=(flow,) if flow is not None else ())
            if b.got <= b.collate_start <= b.collate_end <= b.sent:
                writer.begin(track, start, "fetch samples", CAT_DATALOADER_WORKER)
                writer.end(track, at(b.collate_start))
                writer.begin(track, at(b.collate_start), "collate", CAT_DATALOADER_WORKER)
                writer.end(track, at(b.collate_end))
            writer.end(track, end)
            log.last_end = end
            log.written += 1
        return log.last_end

    def close(self, mono: int, host: int, write: bool = True) -> None:
        """The recording ends: write the batches no wait received, remove the log folder."""
        global _log_dir
        if self.dir is None:
            return
        if os.getpid() == _owner_pid and write:
            self.anchor(mono, host)
            with contextlib.suppress(OSError):
                for name in os.listdir(self.dir):  # workers no wait received from
                    pid = int(name.partition(".")[0]) if name[0].isdigit() else 0
                    if pid and pid not in self._logs:
                        self._logs[pid] = _WorkerLog(os.path.join(self.dir, name))
            for pid, log in self._logs.items():
                log.read_new()
                self._write(pid, log, log.pending, None)
                log.pending.clear()
        if os.getpid() == _owner_pid:
            _log_dir = None
            if os.environ.get(LOG_DIR_ENV) == self.dir:
                del os.environ[LOG_DIR_ENV]
            shutil.rmtree(self.dir, ignore_errors=True)
        self.dir = None


def batch_and_worker(iterator: Any) -> tuple[int | None, int | None]:
    """Before `__next__`: the batch index it will return and the worker fetching it."""
    idx = getattr(iterator, "_rcvd_idx", None)
    info = getattr(iterator, "_task_info", {}).get(idx)
    worker = info[0] if isinstance(info, tuple) and info else None
    return idx, worker
