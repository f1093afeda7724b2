"""The trace store serves only files inside its folder, and uploads within a size limit."""

from __future__ import annotations

import os

import pytest
from neuron_explorer.common.errors import NeuronExplorerError, TraceFormatError
from neuron_explorer.webapp.trace_store import TraceNotFoundError, TraceStore, UploadError
from trace_files import load_trace, write_synthetic


@pytest.fixture
def store(trace_folder):
    s = TraceStore(trace_folder, loader=load_trace, max_cache_bytes=1, max_upload_bytes=100_000)
    yield s
    s.close()


def test_lists_trace_files_in_the_folder(store, trace_folder):
    (trace_folder / "notes.txt").write_text("not a trace")
    (trace_folder / "sub").mkdir()
    write_synthetic(trace_folder / "sub" / "c.pftrace")
    assert store.list_traces() == ["corrupt.json", "run_a.pftrace", "run_b.pftrace",
                                   "sub/c.pftrace"]


def test_a_run_folders_manifest_is_not_offered_as_a_trace(store, trace_folder):
    """manifest.json ends in .json, but it describes a run's ranks: opening it could only fail."""
    run = trace_folder / "train.run"
    run.mkdir()
    (run / "manifest.json").write_text('{"ranks": []}')
    write_synthetic(run / "rank0.pftrace")
    (trace_folder / "manifest.json").write_text('{"ranks": []}')  # beside traces, the same file
    assert store.list_traces() == ["corrupt.json", "run_a.pftrace", "run_b.pftrace",
                                   "train.run/rank0.pftrace"]


@pytest.mark.parametrize("name", [
    "../outside.json", "sub/../../outside.json", "/etc/passwd", "..", "upload:../x.json",
    "upload:/etc/passwd", "run_a.pftrace\x00.png", "", "%2e%2e/outside.json",
])
def test_names_outside_the_folder_are_refused(store, trace_folder, name):
    (trace_folder.parent / "outside.json").write_text("secret")
    with pytest.raises(TraceNotFoundError):
        store.get(name)


def test_a_link_leading_out_of_the_folder_is_refused(store, trace_folder, tmp_path_factory):
    secret = tmp_path_factory.mktemp("elsewhere") / "secret.json"
    write_synthetic(secret)
    os.symlink(secret, trace_folder / "link.json")
    with pytest.raises(TraceNotFoundError, match="outside the served folder"):
        store.get("link.json")


def test_a_corrupt_trace_raises_a_one_line_format_error(store):
    with pytest.raises(TraceFormatError, match="corrupt.json"):
        store.get("corrupt.json")


def test_traces_are_loaded_once_and_the_oldest_is_dropped(store):
    a = store.get("run_a.pftrace")
    assert store.get("run_a.pftrace") is a
    index = store.derived("run_a.pftrace", "x", lambda t: object())
    assert store.derived("run_a.pftrace", "x", lambda t: object()) is index
    store.get("run_b.pftrace")
    store.get("run_b.pftrace")
    write_synthetic(store.root / "run_c.pftrace")
    store.get("run_c.pftrace")
    assert store.get("run_a.pftrace") is not a  # evicted (over the memory budget), then reloaded


def test_uploads_are_kept_outside_the_folder_and_size_limited(store, trace_folder):
    data = write_synthetic(trace_folder / "tmp.pftrace").read_bytes()
    name = store.save_upload("../../evil name.pftrace", data)
    assert name == "upload:evilname.pftrace"
    assert store.get(name).steps.shape[0] == 3
    assert not (trace_folder / "evilname.pftrace").exists()
    assert name in store.list_traces()
    with pytest.raises(UploadError, match="upload limit"):
        store.save_upload("big.json", b"x" * 100_001)
    with pytest.raises(UploadError):
        store.save_upload("..", data)


def test_a_missing_folder_is_a_user_error(tmp_path):
    with pytest.raises(NeuronExplorerError, match="not a folder"):
        TraceStore(tmp_path / "nope")


def test_pages_asking_for_one_trace_at_once_share_a_single_load(trace_folder):
    import threading
    import time

    calls = []

    def slow_loader(path):
        calls.append(path)
        time.sleep(0.2)
        return load_trace(path)

    store = TraceStore(trace_folder, loader=slow_loader)
    results = []
    threads = [threading.Thread(target=lambda: results.append(store.get("run_a.pftrace")))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    store.close()
    assert len(calls) == 1 and len(results) == 4 and all(r is results[0] for r in results)


def test_view_of_a_folder_skips_a_link_leading_out_with_a_warning(trace_folder, tmp_path_factory):
    """One stray link must not stop the folder from being served (#20 item 7)."""
    import subprocess
    import sys

    secret = tmp_path_factory.mktemp("elsewhere") / "secret.json"
    write_synthetic(secret)
    os.symlink(secret, trace_folder / "link.json")
    (trace_folder / "corrupt.json").unlink()
    proc = subprocess.Popen([sys.executable, "-m", "neuron_explorer", "view", str(trace_folder),
                             "--no-browser", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert "http://127.0.0.1:" in line, err
    assert "warning: skipping link.json: it links to a file outside the served folder" in err
    assert "Traceback" not in err


def test_a_linked_folder_inside_the_served_folder_is_listed_once(store, trace_folder,
                                                                  tmp_path_factory):
    """A run folder reached through a link was skipped without a word: a linked folder
    that stays inside is listed (each real folder once, a link back up does not loop);
    one that leads out is noted as skipped."""
    hidden = trace_folder / ".store" / "train.run"  # a dot-folder is not listed itself
    hidden.mkdir(parents=True)
    write_synthetic(hidden / "rank0.pftrace")
    os.symlink(hidden, trace_folder / "train.run")
    runs = trace_folder / "runs" / "train.run"
    runs.mkdir(parents=True)
    write_synthetic(runs / "rank0.pftrace")
    os.symlink(runs, trace_folder / "latest.run")  # points at a folder walked anyway
    os.symlink(trace_folder, trace_folder / "runs" / "loop")  # a link back up
    outside = tmp_path_factory.mktemp("outside_run")
    write_synthetic(outside / "rank0.pftrace")
    os.symlink(outside, trace_folder / "elsewhere.run")
    listed = store.list_traces()
    assert "train.run/rank0.pftrace" in listed  # served only through its link
    assert ("latest.run/rank0.pftrace" in listed) != ("runs/train.run/rank0.pftrace" in listed)
    assert not any(n.startswith(("elsewhere.run/", "runs/loop/")) for n in listed)
    assert "elsewhere.run/" in store.skipped
    only = tmp_path_factory.mktemp("only_linked")
    os.symlink(runs, only / "linked.run")
    assert TraceStore(only, loader=load_trace).list_traces() == []  # leads out of `only`
    assert store.resolve("train.run/rank0.pftrace") == (hidden / "rank0.pftrace").resolve()


def test_a_link_leading_out_is_not_listed(store, trace_folder, tmp_path_factory):
    secret = tmp_path_factory.mktemp("elsewhere") / "secret.json"
    write_synthetic(secret)
    os.symlink(secret, trace_folder / "link.json")
    # a link within the folder is fine
    os.symlink(trace_folder / "run_a.pftrace", trace_folder / "inside.json")
    assert store.list_traces() == ["corrupt.json", "inside.json", "run_a.pftrace", "run_b.pftrace"]
    assert "link.json" in store.skipped


def test_the_cache_is_sized_by_memory_not_by_count(trace_folder):
    """Nine traces fit a budget that holds them all: none is loaded twice (#20 item 13)."""
    from neuron_explorer.webapp.trace_store import estimated_bytes

    for i in range(9):
        write_synthetic(trace_folder / f"t{i}.pftrace", seed=i)
    loads = []

    def counting_loader(path):
        loads.append(path)
        return load_trace(path)

    one = estimated_bytes(load_trace(str(trace_folder / "t0.pftrace")))
    roomy = TraceStore(trace_folder, loader=counting_loader, max_cache_bytes=12 * one)
    tight = TraceStore(trace_folder, loader=counting_loader, max_cache_bytes=int(2.5 * one))
    try:
        for _ in range(3):
            for i in range(9):
                roomy.get(f"t{i}.pftrace")
        assert len(loads) == 9
        assert 8 * one <= roomy.cached_bytes() <= 12 * one
        loads.clear()
        for _ in range(2):
            for i in range(9):
                tight.get(f"t{i}.pftrace")
        assert len(loads) == 18  # two fit, so a round over nine reloads each
        assert tight.cached_bytes() <= 2.5 * one
    finally:
        roomy.close()
        tight.close()


def test_a_trace_is_estimated_at_what_its_tables_hold(trace_folder):
    from neuron_explorer.webapp.trace_store import estimated_bytes

    trace = load_trace(str(trace_folder / "run_b.pftrace"))
    frames = sum(int(df.memory_usage(deep=True).sum())
                 for df in (trace.slices, trace.ops, trace.kernels))
    assert estimated_bytes(trace) >= frames


def test_view_of_a_linked_trace_file_serves_the_file_it_links_to(trace_folder, tmp_path_factory):
    from neuron_explorer.webapp.view_command import start_dashboard

    elsewhere = tmp_path_factory.mktemp("links")
    os.symlink(trace_folder / "run_a.pftrace", elsewhere / "mine.pftrace")
    server, store = start_dashboard(elsewhere / "mine.pftrace", port=0, loader=load_trace)
    try:
        assert store.root == trace_folder.resolve() and "run_a.pftrace" in store.list_traces()
    finally:
        server.stop()
        store.close()
