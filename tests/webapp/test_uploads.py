"""Uploads are refused while they stream in, kept within a quota, and gone when the server stops
(#20 item 8)."""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from dash_requests import request
from neuron_explorer.webapp.trace_store import TraceStore, UploadError
from trace_files import load_trace, write_synthetic

UPLOAD_HEADERS = {"X-Upload-Name": "big.json", "Content-Type": "application/octet-stream"}


def _raw_upload(server, head: str, chunks, pause_after_bytes: int) -> tuple[str, int]:
    """Sends an upload head and body chunks until the server answers; (status line, bytes sent)."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    sent = 0
    try:
        sock.sendall(head.encode())
        for chunk in chunks:
            try:
                sock.sendall(chunk)
            except OSError:  # the server answered and closed: stop sending
                break
            sent += len(chunk)
            if sent >= pause_after_bytes:
                break
        sock.settimeout(10)
        answer = sock.recv(65536).decode(errors="replace")
    finally:
        sock.close()
    return answer.split("\r\n", 1)[0], sent


def test_an_upload_declared_too_large_is_refused_before_its_body_is_read(live_server):
    head = (f"POST /_upload HTTP/1.1\r\nHost: 127.0.0.1:{live_server.port}\r\n"
            "X-Upload-Name: big.json\r\nContent-Type: application/octet-stream\r\n"
            f"Content-Length: {500 * 2**20}\r\n\r\n")
    status, _ = _raw_upload(live_server, head, [b"x" * 65536], pause_after_bytes=65536)
    assert " 413 " in status, status


def test_a_streamed_upload_is_refused_as_soon_as_it_passes_the_limit(live_server):
    """Chunked, so the server cannot know the size in advance: it must stop reading at the limit
    (1 MiB here) rather than take in the whole body first."""
    head = (f"POST /_upload HTTP/1.1\r\nHost: 127.0.0.1:{live_server.port}\r\n"
            "X-Upload-Name: big.json\r\nContent-Type: application/octet-stream\r\n"
            "Transfer-Encoding: chunked\r\n\r\n")
    piece = b"x" * 65536
    chunk = f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
    endless = (chunk for _ in range(100_000))  # 6 GiB if the server read it all
    status, sent = _raw_upload(live_server, head, endless, pause_after_bytes=3 * 2**20)
    assert " 413 " in status, status
    assert sent <= 3 * 2**20 + len(chunk)
    assert request(live_server, "GET", "/_dash-layout")[0] == 200  # the server is still up


def _upload(server, name: str, data) -> tuple[int, dict, bytes]:
    return request(server, "POST", "/_upload", data, {**UPLOAD_HEADERS, "X-Upload-Name": name})


def test_an_upload_is_saved_loaded_and_named(live_server, tmp_path):
    data = write_synthetic(tmp_path / "mine.pftrace").read_bytes()
    status, _, body = _upload(live_server, "mine.pftrace", data)
    assert status == 200 and json.loads(body) == {"trace": "upload:mine.pftrace"}
    status, _, body = _upload(live_server, "bad.json", b"garbage")
    assert status == 400 and "bad.json" in json.loads(body)["error"]
    status, _, body = _upload(live_server, "a.txt", data)
    assert status == 400 and "not a trace file" in json.loads(body)["error"]
    status, _, body = request(live_server, "POST", "/_upload", data, {"Content-Type": "text/plain"})
    assert status == 400  # a cross-site form cannot set the name header


def test_uploads_are_kept_within_a_quota_the_oldest_going_first(trace_folder):
    store = TraceStore(trace_folder, loader=load_trace, max_uploads=3,
                       max_upload_total_bytes=10_000)
    data = b'{"kept": "never loaded"}'
    try:
        for i in range(6):
            store.save_upload(f"u{i}.json", data)
            time.sleep(0.01)  # distinct modification times
        uploads = [n for n in store.list_traces() if n.startswith("upload:")]
        assert uploads == ["upload:u3.json", "upload:u4.json", "upload:u5.json"]
        # over the total with the others: they go
        store.save_upload("big.json", b"[" + b" " * 9_989)
        assert [n for n in store.list_traces() if n.startswith("upload:")] == ["upload:big.json"]
        with pytest.raises(UploadError, match="upload limit"):
            store.save_upload("huge.json", b"x" * (store.max_upload_bytes + 1))
    finally:
        store.close()


def _uploads_folders(pid: int) -> list[Path]:
    from neuron_explorer.webapp.trace_store import UPLOADS_DIR_PREFIX

    return list(Path(tempfile.gettempdir()).glob(f"{UPLOADS_DIR_PREFIX}{pid}-*"))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_the_upload_folder_is_removed_when_view_stops(real_traces_dir, tmp_path, sig):
    shutil.copy(real_traces_dir / "amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz",
                tmp_path / "a.json.gz")
    proc = subprocess.Popen([sys.executable, "-m", "neuron_explorer", "view", str(tmp_path),
                             "--no-browser", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        port = int(line.split("http://127.0.0.1:", 1)[1].split("/", 1)[0])
        folders = _uploads_folders(proc.pid)
        assert len(folders) == 1 and folders[0].is_dir()
        server = type("S", (), {"port": port})
        data = (tmp_path / "a.json.gz").read_bytes()
        status, _, body = request(server, "POST", "/_upload", data,
                                  {**UPLOAD_HEADERS, "X-Upload-Name": "b.json.gz"})
        assert status == 200, body
        assert (folders[0] / "b.json.gz").is_file()
    finally:
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert not folders[0].exists()


def test_upload_folders_of_killed_dashboards_are_removed(trace_folder):
    from neuron_explorer.webapp.trace_store import UPLOADS_DIR_PREFIX

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    left = Path(tempfile.mkdtemp(prefix=f"{UPLOADS_DIR_PREFIX}{dead.pid}-"))
    (left / "x.json").write_bytes(b"x")
    TraceStore(trace_folder, loader=load_trace).close()
    assert not left.exists()


def test_an_upload_is_copied_to_disk_without_being_held_in_memory(trace_folder):
    """A 96 MiB upload costs the server a few buffers (under 16 MiB), not its size."""
    import tracemalloc

    from neuron_explorer.webapp.app import AppContext, create_app
    from neuron_explorer.webapp.server import DashboardServer

    def head_only_loader(path):  # looks at the first bytes only, like a loader that streams
        with open(path, "rb") as f:
            return f.read(16)

    store = TraceStore(trace_folder, loader=head_only_loader, max_upload_bytes=128 * 2**20)
    server = DashboardServer(create_app(AppContext(store)).server).start()
    body = b"[" + b" " * (96 * 2**20 - 1)
    try:
        _upload(server, "warm.json", b"[warm]")
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        status, _, answer = _upload(server, "large.json", memoryview(body))
        peak = tracemalloc.get_traced_memory()[1] - before
        tracemalloc.stop()
        assert status == 200, answer
        assert (store.resolve("upload:large.json")).stat().st_size == len(body)
        assert peak < 16 * 2**20, f"the upload took {peak / 2**20:.0f} MiB of server memory"
    finally:
        server.stop()
        store.close()


def test_a_small_gzip_that_inflates_past_the_limit_is_refused_before_it_loads(trace_folder):
    """A 0.9 MB gzip of valid JSON that inflates to 250 MB once took the server to 3.4 GB:
    compressed or not, an upload is at most the upload limit of trace data, checked while
    inflating a chunk at a time."""
    import gzip
    import resource

    store = TraceStore(trace_folder, loader=load_trace, max_upload_bytes=2 * 2**20)
    bomb = gzip.compress(b'{"traceEvents": [' + b"{}, " * (16 * 2**20) + b"{}]}")
    assert len(bomb) < store.max_upload_bytes
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        with pytest.raises(UploadError, match="inflates to more than the 2 MiB upload limit"):
            store.save_upload("bomb.json.gz", bomb)
        assert not [n for n in store.list_traces() if n.startswith("upload:")]
        # a small trace, gzipped, is accepted, in two members too; damaged gzip is refused
        store.save_upload("small.json.gz", gzip.compress(b'{"traceEvents": []}'))
        store.save_upload("two.json.gz", gzip.compress(b'{"traceEvents": ') + gzip.compress(b"[]}"))
        with pytest.raises(UploadError, match="is not valid gzip data"):
            store.save_upload("bad.json.gz", gzip.compress(b"{}")[:-12] + b"\xff" * 40)
    finally:
        store.close()
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mib < 64, grown_mib


def test_uploads_that_cannot_be_traces_or_kept_are_refused_with_a_reason(trace_folder):
    store = TraceStore(trace_folder, loader=load_trace)
    try:
        with pytest.raises(UploadError, match="is not a trace: it starts with"):
            store.save_upload("noise.pftrace", bytes(range(256)) * 8)
        with pytest.raises(UploadError, match="file name is 300 characters long"):
            store.save_upload("a" * 292 + ".pftrace", b"\x0a\x00")
        assert not [n for n in store.list_traces() if n.startswith("upload:")]
    finally:
        store.close()


def test_uploads_racing_under_one_name_both_succeed(trace_folder):
    """Two uploads of one name at once, with a quota that removes files: one used to find
    its file gone (FileNotFoundError, a 500)."""
    import threading

    store = TraceStore(trace_folder, loader=load_trace, max_uploads=1)
    errors: list[BaseException] = []

    def upload(i: int) -> None:
        try:
            for _ in range(20):
                store.save_upload("same.json" if i % 2 else f"other{i}.json", b'{"n": %d}' % i)
        except BaseException as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=upload, args=(i,)) for i in range(4)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert len([n for n in store.list_traces() if n.startswith("upload:")]) == 1
    finally:
        store.close()
