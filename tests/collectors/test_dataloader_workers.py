"""DataLoader worker tracks through `neuron-explorer record` (#12 item 6): each worker's batches
on a track of its own, on the recording's clock, and each wait naming the worker it waited on."""

from __future__ import annotations

import itertools
import tempfile
from pathlib import Path
from types import SimpleNamespace

import neuron_explorer
import pytest
from neuron_explorer.common.trace_format import CAT_DATALOADER, CAT_DATALOADER_WORKER
from neuron_explorer.plot.timeline_index import TimelineIndex

from .trace_reading import parse

STEPS = 6


def _worker_log_folders(stdout: str) -> list[str]:
    """The workers' log folders the recorded program (its pid printed first) left behind:
    those of other tests' recordings running beside it are not its."""
    pid = stdout.split()[1]
    return [p.name for p in Path(tempfile.gettempdir()).glob(f"neuron-explorer-workers-{pid}-*")]


@pytest.mark.parametrize("method, workers", [("fork", ""), ("spawn", ""),
                                             ("fork", "persistent")])
def test_each_worker_has_a_track_with_its_batches_linked_to_the_waits(
        record_cli, programs: Path, method: str, workers: str) -> None:
    proc = record_cli("-o", "dl.pftrace", "dataloader_workers.py", str(STEPS), method,
                      *([workers] if workers else []))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("step ") == STEPS
    # the workers' own traces held nothing (no device work): none is left beside the trace,
    # not even by persistent workers, which the loader ends before they can finish theirs
    assert sorted(p.name for p in programs.glob("dl*.pftrace")) == ["dl.pftrace"], proc.stderr
    assert "child processes" not in proc.stderr
    assert _worker_log_folders(proc.stdout) == []  # the workers' logs are cleaned up

    trace = parse(programs / "dl.pftrace")
    batches = [s for s in trace.by_category(CAT_DATALOADER_WORKER) if s.depth == 0]
    tracks = {trace.track_name(s.track) for s in batches}
    assert tracks == {"DataLoader worker 0", "DataLoader worker 1"}
    # every batch the loop used was fetched once, by the worker torch gave it to
    assert sorted(s.args["batch"] for s in batches) == list(range(STEPS))
    previous_end: dict[int, int] = {}
    for s in sorted(batches, key=lambda s: s.ts):
        assert s.args["worker"] == s.args["batch"] % 2
        assert trace.track_name(s.track) == f"DataLoader worker {s.args['worker']}"
        assert s.args["samples"] == 4
        inner = [c for c in trace.slices if c.parent is s]
        assert [c.name for c in inner] == ["fetch samples", "collate"]
        # as long as it took the worker: four samples of a millisecond's sleep each, less
        # the time it waited for a core after them (left out, as the host clock leaves it;
        # beside a loaded suite the fetch alone read 3.56 ms)
        waited = s.args.get("waited_for_core_ns", 0)
        assert inner[0].dur + waited >= 4 * 900_000 or s.ts == previous_end.get(s.track)
        previous_end[s.track] = s.ts + s.dur

    waits = [s for s in trace.by_category(CAT_DATALOADER) if "batch" in s.args]
    assert [w.args["batch"] for w in waits] == list(range(STEPS))
    steps = trace.by_category("step")
    assert [w.args["step"] for w in waits] == [s.args["step"] for s in steps[:STEPS]]
    by_flow = {f: s for s in batches for f in s.flow_out}
    for wait in waits:
        (flow,) = wait.flow_in
        fetched = by_flow[flow]  # the wait is linked to the batch it got ...
        assert fetched.args["batch"] == wait.args["batch"]
        assert fetched.args["worker_pid"] == wait.args["worker_pid"]
        # ... which, on the same clock, was sent before the wait ended
        assert fetched.ts + fetched.dur <= wait.ts + wait.dur

    # the dashboard's timeline names the worker rows, below the program's own threads
    loaded = neuron_explorer.load(programs / "dl.pftrace")
    labels = TimelineIndex(loaded.table("slices"), loaded.tracks, loaded.counters).labels
    assert labels[0] == "MainThread"
    assert "DataLoader worker 0" in labels and "DataLoader worker 1" in labels
    assert labels.index("DataLoader worker 0") > labels.index("MainThread")
    # the data-loader finding says which part of a batch takes the workers' time: the
    # program's Dataset sleeps in __getitem__, its collate is torch's default
    stall = next(f for f in loaded.bottlenecks() if f.rule_id == "dataloader_stall")
    assert "fetching samples (the Dataset's __getitem__) takes" in stall.explanation


def test_workers_slower_than_the_step_set_its_pace(record_cli, programs: Path) -> None:
    """Two workers take 40 ms a batch (four samples of a 10 ms sleep); a step's own host
    time is a few ms, and its matmuls' emulation takes longer than a batch. The workers'
    batches were laid where they were sent on the host clock, which leaves out that
    emulation: 6 ms batches, steps of 2.7 ms, an input-bound loop shown as host-bound. A
    batch keeps its length, a worker's batches follow each other, and each wait lasts
    until its batch is ready: a batch every 20 ms."""
    proc = record_cli("-o", "pace.pftrace", "dataloader_pace.py", "12")
    assert proc.returncode == 0, proc.stderr
    trace = parse(programs / "pace.pftrace")
    batches = [s for s in trace.by_category(CAT_DATALOADER_WORKER) if s.depth == 0]
    batch_ns = sorted(b.dur for b in batches)[len(batches) // 2]
    assert batch_ns >= 40_000_000  # the samples' sleeps: nothing to leave out
    for track in {b.track for b in batches}:
        own = sorted((b.ts, b.ts + b.dur) for b in batches if b.track == track)
        assert all(end <= start for (_, end), (start, _) in itertools.pairwise(own))
    waits = sorted((s for s in trace.by_category(CAT_DATALOADER) if "batch" in s.args),
                   key=lambda s: s.ts)
    assert len(waits) == 13  # the loop takes a 13th batch, then stops
    steady = waits[2:]  # after the workers' start and the batches they had ready
    per_batch = (steady[-1].ts + steady[-1].dur - steady[0].ts) / (len(steady) - 1)
    assert per_batch >= 0.8 * batch_ns / 2, (per_batch, batch_ns)


def test_a_batch_that_raised_says_so(record_cli, programs: Path) -> None:
    """A worker's __getitem__ raises at sample 13 (batch 3): the program fails with
    torch's error, and the trace keeps what was recorded. The failed batch looked like any
    other; it names the exception it raised."""
    proc = record_cli("-o", "raises.pftrace", "dataloader_workers.py", str(STEPS), "fork",
                      "raise")
    assert proc.returncode == 1 and "ValueError: sample 13 is corrupt" in proc.stderr
    trace = parse(programs / "raises.pftrace")
    batches = {s.args["batch"]: s for s in trace.by_category(CAT_DATALOADER_WORKER)
               if s.depth == 0}
    assert batches[3].name == "batch 3 (raised ValueError)"
    assert batches[3].args["raised"] == "ValueError"
    assert all("raised" not in b.args for n, b in batches.items() if n != 3)


def test_an_iterable_datasets_end_is_no_batch(record_cli, programs: Path) -> None:
    """Each worker of an IterableDataset sends a marker once its data ends; it showed as a
    batch of the requested samples, a few microseconds long, one per worker."""
    proc = record_cli("-o", "iterable.pftrace", "dataloader_iterable.py")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("step ") == 6
    trace = parse(programs / "iterable.pftrace")
    batches = [s for s in trace.by_category(CAT_DATALOADER_WORKER) if s.depth == 0]
    assert sorted(b.args["batch"] for b in batches) == list(range(6))


def test_a_worker_that_dies_loses_nothing_already_recorded(record_cli, programs: Path) -> None:
    proc = record_cli("-o", "dies.pftrace", "dataloader_workers.py", str(STEPS), "fork", "die")
    # torch's own error, either way: it notices the dead worker, or (when the worker died
    # while the program was receiving a batch's shared memory from it) the transfer fails,
    # as a reset connection or, where the pipe ends mid-message, an EOFError (a shuffled
    # suite's run saw it); where writing that traceback fails partway ("lost sys.stderr"),
    # Python dumps the error object, its repr, instead
    torch_error = ("exited unexpectedly" in proc.stderr
                   or "ConnectionResetError: [Errno 104] Connection reset by peer" in proc.stderr
                   or "ConnectionResetError(104, 'Connection reset by peer')" in proc.stderr
                   or "EOFError" in proc.stderr)
    assert proc.returncode == 1 and torch_error, proc.stderr
    assert "trace written to dies.pftrace" in proc.stderr
    trace = parse(programs / "dies.pftrace")
    fetched = sorted(s.args["batch"] for s in trace.by_category(CAT_DATALOADER_WORKER)
                     if s.depth == 0)
    # batch 3 holds sample 13: worker 1 died fetching it, after it had sent batch 1
    assert 1 in fetched and 3 not in fetched, fetched
    waits = [s for s in trace.by_category(CAT_DATALOADER) if "batch" in s.args]
    assert waits and all(w.flow_in for w in waits)  # each batch received is linked to its worker


class _Writer:
    """The part of the trace writer the worker tracks use."""

    def process(self, pid: int, name: str) -> None:
        pass

    def thread(self, pid: int, tid: int, name: str) -> int:
        return 1

    def begin(self, *args, **kwargs) -> None:
        pass

    def end(self, *args, **kwargs) -> None:
        pass


MS = 1_000_000


def _tracks(tmp_path: Path, batch: int):
    """Worker tracks reading the logs in `tmp_path`, the host clock 500 ms behind the
    monotonic one, and a loader that gives `batch` to its worker 0 (pid 4242)."""
    from neuron_explorer.collectors.dataloader_workers import WorkerTracks

    recorder = SimpleNamespace(modelled=False, writer=_Writer(), step=0)
    tracks = WorkerTracks(recorder)  # type: ignore[arg-type]
    tracks.dir = str(tmp_path)
    tracks.anchor(1000 * MS, 500 * MS)
    tracks.anchor(3000 * MS, 2500 * MS)
    loader = SimpleNamespace(_workers=[SimpleNamespace(pid=4242)], _task_info={batch: (0,)})
    return tracks, loader


def test_a_workers_start_up_counts_without_its_wait_for_a_core(tmp_path: Path) -> None:
    """A worker's first batch starts no earlier than the worker had started. Under load,
    its start-up waits for a core, which moved that first batch and every batch after
    it: that wait, logged as its run delay before its first task, is left out, as the
    host clock leaves it out of the program's time."""
    tracks, loader = _tracks(tmp_path, 0)
    # batch 0 of worker 0: its task sent at host 520 ms; the worker got it at monotonic
    # 1200 ms (host 700 ms) after a start-up that waited 150 ms for a core; it took 10 ms
    got, sent, delay_before = 1200 * MS, 1210 * MS, 150 * MS
    (tmp_path / "4242.log").write_text(f"0 0 {got} -1 -1 {sent} 4 0 {delay_before}\n")
    tracks.task_sent(loader, 0, 520 * MS)
    receipt = tracks.received(loader, 0, 0)
    assert receipt.ready == (700 - 150 + 10) * MS


def test_a_task_sent_in_a_wait_leaves_when_the_wait_ends(tmp_path: Path) -> None:
    """The iterator sends the next task while it waits (on receiving a batch). The host
    clock runs on while the program is blocked there, and the wait then ends where its
    batch was ready: under load 100 ms sooner than the clock had run. The task stamped
    as the clock read started its batch that much late, and every batch of its worker
    after it (a 2-worker run's mean step moved 1.7x where the script's CPU time moved
    1.1x)."""
    tracks, loader = _tracks(tmp_path, 4)
    tracks.wait_started()
    tracks.task_sent(loader, 4, 620 * MS)  # the clock ran on in the wait
    tracks.wait_ended(530 * MS)  # where the batch it received was ready
    # the worker got task 4 at monotonic 1020 ms (host 520 ms) and took 10 ms
    (tmp_path / "4242.log").write_text(f"4 0 {1020 * MS} -1 -1 {1030 * MS} 4 0 0\n")
    receipt = tracks.received(loader, 4, 0)
    assert receipt.ready == (530 + 10) * MS
