"""The traces a dashboard serves: the files under one folder plus uploads, loaded once each.

Every trace is named by its path relative to the served folder; names that would
reach outside it (absolute paths, `..`, links leading out) or that are not trace
files are refused, so URLs cannot read other files on the machine. Loaded traces
are kept within a memory budget (not a count), and uploads within a quota.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import sys
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any

import numpy as np
import pandas as pd
import psutil
from neuron_explorer.common.errors import NeuronExplorerError
from neuron_explorer.runs.files import MANIFEST
from neuron_explorer.webapp.load_progress import LoadProgress

log = logging.getLogger("neuron_explorer.webapp")

TRACE_SUFFIXES = (".pftrace", ".perfetto-trace", ".json", ".json.gz", ".pb", ".pb.gz")
UPLOAD_PREFIX = "upload:"
UPLOADS_DIR_PREFIX = "neuron-explorer-uploads-"
DEFAULT_MAX_UPLOAD_BYTES = 200 * 2**20
DEFAULT_MAX_UPLOADS = 20
DEFAULT_MAX_UPLOAD_TOTAL_BYTES = 2 * 2**30
MAX_LISTED = 500
CHUNK_BYTES = 2**20
MAX_NAME_CHARS = 200  # file systems take 255 bytes; room for the upload prefix
# a trace's first byte: a Perfetto TracePacket (field 1, length-delimited), or JSON
TRACE_FIRST_BYTES = (b"\x0a", b"{", b"[", b" ", b"\n", b"\r", b"\t", b"\xef")  # \xef: a BOM


def default_cache_bytes() -> int:
    """A quarter of the machine's memory, at most 4 GiB: room for many traces, not all of RAM."""
    return min(psutil.virtual_memory().total // 4, 4 * 2**30)


class TraceNotFoundError(NeuronExplorerError):
    """A trace name that is not a trace file inside the served folder."""


class UploadError(NeuronExplorerError):
    """An uploaded file that is too large or has no usable name."""


def default_loader(path: str) -> Any:
    import neuron_explorer

    return neuron_explorer.load(path)


class TraceStore:
    """Resolves trace names safely, loads traces on demand and keeps the recent ones."""

    def __init__(
        self,
        root: str | os.PathLike,
        loader: Callable[[str], Any] = default_loader,
        max_cache_bytes: int | None = None,
        max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES,
        max_uploads: int = DEFAULT_MAX_UPLOADS,
        max_upload_total_bytes: int = DEFAULT_MAX_UPLOAD_TOTAL_BYTES,
    ) -> None:
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise TraceNotFoundError(
                f"{root} is not a folder; pass a trace file or a folder of traces")
        self.loader = loader
        self.max_cache_bytes = default_cache_bytes() if max_cache_bytes is None else max_cache_bytes
        self.max_upload_bytes = max_upload_bytes
        self.max_uploads = max_uploads
        self.max_upload_total_bytes = max_upload_total_bytes
        remove_abandoned_upload_folders()
        self._uploads = Path(tempfile.mkdtemp(prefix=f"{UPLOADS_DIR_PREFIX}{os.getpid()}-"))
        self._cache: OrderedDict[str, Any] = OrderedDict()
        # estimated bytes of each cached trace and what derives from it
        self._sizes: dict[str, int] = {}
        self._pinned: dict[str, Any] = {}  # traces handed over in-process, never evicted
        # per-trace derived objects (timeline index, ...)
        self._extras: dict[tuple[str, str], Any] = {}
        self._lock = threading.Lock()
        self._upload_lock = threading.Lock()
        self._loading: dict[str, threading.Lock] = {}  # one lock per trace being loaded
        self._progress: dict[str, LoadProgress] = {}  # background loads (`start_loading`)
        self.skipped: dict[str, str] = {}  # files left out of the list, and why
        self._closed = False

    # -- names ------------------------------------------------------------------
    def list_traces(self) -> list[str]:
        """Trace files under the served folder and the uploads, by name.

        A link that leads out of the folder is left out (and noted in `skipped`),
        so one stray link does not stop the others from being served. A linked folder
        that stays inside it (a run folder linked from elsewhere in the served folder)
        is listed like any other, each real folder once."""
        names = []
        seen = {self.root.resolve()}
        for dirpath, dirnames, filenames in os.walk(self.root, followlinks=True):
            kept = []
            for d in sorted(d for d in dirnames if not d.startswith(".")):
                real = Path(dirpath, d).resolve()
                if not real.is_relative_to(self.root):
                    rel = Path(dirpath, d).relative_to(self.root).as_posix()
                    self.skipped[rel + "/"] = "it links to a folder outside the served folder"
                elif real not in seen:  # a link back up would walk forever
                    seen.add(real)
                    kept.append(d)
            dirnames[:] = kept
            for filename in sorted(filenames):
                if filename == MANIFEST or not filename.lower().endswith(TRACE_SUFFIXES):
                    continue  # a run folder's manifest.json describes its ranks: it is no trace
                path = Path(dirpath, filename)
                name = path.relative_to(self.root).as_posix()
                if not path.resolve().is_relative_to(self.root):
                    self.skipped[name] = "it links to a file outside the served folder"
                    continue
                names.append(name)
                if len(names) >= MAX_LISTED:
                    return names
        names += [UPLOAD_PREFIX + p.name for p in self._upload_files()]
        return names + sorted(n for n in self._pinned if n not in names)

    def resolve(self, name: str) -> Path:
        """The file a trace name stands for; refuses anything outside the served folder."""
        if not name or "\x00" in name:
            raise TraceNotFoundError("no trace named; pick one from the list")
        if name.startswith(UPLOAD_PREFIX):
            base, rel = self._uploads, name[len(UPLOAD_PREFIX):]
        else:
            base, rel = self.root, name
        outside = f"{name!r} is outside the served folder; pick a trace from the list"
        if os.path.isabs(rel) or ".." in Path(rel).parts:
            raise TraceNotFoundError(outside)
        if not rel.lower().endswith(TRACE_SUFFIXES):
            raise TraceNotFoundError(f"{name!r} is not a trace file (the dashboard opens "
                                     f"{', '.join(TRACE_SUFFIXES)}); pick a trace from the list")
        path = (base / rel).resolve()
        if not path.is_relative_to(base):
            raise TraceNotFoundError(outside)
        if not path.is_file():
            raise TraceNotFoundError(
                f"no trace file {name!r} in the served folder; pick one from the list")
        return path

    def public_message(self, message: str) -> str:
        """A message fit for the page: served paths relative to the folder, no other absolute
        path."""
        return hide_paths(message, {self._uploads: UPLOAD_PREFIX, self.root: ""})

    # -- loading ----------------------------------------------------------------
    def start_loading(self, name: str) -> LoadProgress | None:
        """Load `name` on a thread of its own (None: it is loaded already); its progress, fed by
        the loader's progress bars, is `load_progress(name)` until the load ends."""
        from neuron_explorer.progress import observe

        if self._cached(name) is not None:
            return None
        path = self.resolve(name)
        with self._lock:
            progress = self._progress.get(name)
            if progress is not None and not progress.finished.is_set():
                return progress
            progress = self._progress[name] = LoadProgress(name, path.stat().st_size)

        def load() -> None:
            try:
                with observe(progress.update):
                    self.get(name)
            except BaseException as exc:  # noqa: BLE001 - kept for the page that asked
                progress.error = exc
            finally:
                progress.finished.set()

        threading.Thread(target=load, name=f"load {name}", daemon=True).start()
        return progress

    def load_progress(self, name: str) -> LoadProgress | None:
        """The progress of a background load of `name` (None: none was started)."""
        with self._lock:
            return self._progress.get(name)

    def get(self, name: str) -> Any:
        """The loaded trace for a name (loaded on first use; TraceFormatError if it is bad)."""
        cached = self._cached(name)
        if cached is not None:
            return cached
        with self._lock:
            progress = self._progress.get(name)
            if progress is not None and progress.finished.is_set() and progress.error is not None:
                del self._progress[name]  # a failed background load: say why, once; then retry
                raise progress.error
        path = self.resolve(name)
        with self._lock:
            loading = self._loading.setdefault(name, threading.Lock())
        with loading:  # pages asking for the same trace at once share one load
            cached = self._cached(name)
            if cached is not None:
                return cached
            try:
                trace = self.loader(str(path))
            finally:
                with self._lock:
                    self._loading.pop(name, None)
            with self._lock:
                self._cache[name] = trace
                self._sizes[name] = max(estimated_bytes(trace), path.stat().st_size)
                self._evict_over_budget()
        return trace

    def _evict_over_budget(self) -> None:
        """Drops the least recently used traces until the rest fit the budget (the newest stays)."""
        while len(self._cache) > 1 and sum(self._sizes.values()) > self.max_cache_bytes:
            old, _ = self._cache.popitem(last=False)
            self._forget(old)

    def _forget(self, name: str) -> None:
        self._cache.pop(name, None)
        self._sizes.pop(name, None)
        self._extras = {k: v for k, v in self._extras.items() if k[0] != name}

    def cached_bytes(self) -> int:
        """Estimated memory of the traces kept loaded."""
        with self._lock:
            return sum(self._sizes.values())

    def _cached(self, name: str) -> Any:
        with self._lock:
            if name in self._pinned:
                return self._pinned[name]
            if name in self._cache:
                self._cache.move_to_end(name)
                return self._cache[name]
        return None

    def add(self, name: str, trace: Any) -> str:
        """Serves a trace already loaded in this process (a notebook's, say) under a name."""
        with self._lock:
            self._pinned[name] = trace
            self._extras = {k: v for k, v in self._extras.items() if k[0] != name}
        return name

    def derived(self, name: str, key: str, build: Callable[[Any], Any]) -> Any:
        """An object derived from a trace (such as its timeline index), built once and kept."""
        trace = self.get(name)
        with self._lock:
            if (name, key) in self._extras:
                return self._extras[(name, key)]
        value = build(trace)
        with self._lock:
            self._extras[(name, key)] = value
            if name in self._sizes:  # what derives from a trace counts against the budget too
                self._sizes[name] += estimated_bytes(value)
                self._evict_over_budget()
        return value

    # -- uploads ----------------------------------------------------------------
    def save_upload(self, filename: str, data: bytes) -> str:
        """Keeps an uploaded trace (outside the served folder) and returns its name."""
        import io

        return self.save_upload_stream(filename, io.BytesIO(data))

    def save_upload_stream(self, filename: str, stream: IO[bytes]) -> str:
        """Copies an upload to the uploads folder chunk by chunk, refusing it as soon as it passes
        the size limit (so a huge upload never sits in memory); then trims the uploads to the
        quota."""
        safe = "".join(ch for ch in Path(filename or "").name if ch.isalnum() or ch in "._-+")
        if not safe or safe.startswith("."):
            raise UploadError(
                f"cannot use {filename!r} as a file name; rename the trace and upload again")
        if len(safe) > MAX_NAME_CHARS:
            raise UploadError(f"the file name is {len(safe)} characters long; rename the trace to "
                              f"at most {MAX_NAME_CHARS} and upload again")
        if not safe.lower().endswith(TRACE_SUFFIXES):
            raise UploadError(
                f"{safe} is not a trace file (the dashboard opens {', '.join(TRACE_SUFFIXES)})")
        partial = Path(tempfile.mkstemp(dir=self._uploads, prefix=".partial-")[1])
        size = 0
        try:
            with partial.open("wb") as out:
                while chunk := stream.read(CHUNK_BYTES):
                    size += len(chunk)
                    if size > self.max_upload_bytes:
                        raise self.too_large(safe)
                    out.write(chunk)
            self._check_content(safe, partial)
            target = self._uploads / safe
            with self._upload_lock:  # an upload of the same name may be moving in too
                partial.replace(target)
                name = UPLOAD_PREFIX + safe
                with self._lock:
                    self._forget(name)
                self._enforce_upload_quota(keep=target)
        finally:
            partial.unlink(missing_ok=True)
        return name

    def _check_inflated_size(self, filename: str, f: IO[bytes]) -> None:
        """Inflate gzip data (every member) a chunk at a time, keeping none of it; refuse
        it once it passes the upload limit."""
        import zlib

        inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)  # gzip header and trailer
        inflated = 0
        while chunk := f.read(CHUNK_BYTES):
            data = chunk
            while data:
                inflated += len(inflater.decompress(data, CHUNK_BYTES))
                if inflated > self.max_upload_bytes:
                    raise UploadError(
                        f"{filename} inflates to more than the "
                        f"{self.max_upload_bytes / 2**20:.0f} MiB upload limit; put it in the "
                        "served folder instead")
                if inflater.eof:  # the bytes after this member start the next one
                    data = inflater.unused_data
                    inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
                else:
                    data = inflater.unconsumed_tail

    def _check_content(self, filename: str, path: Path) -> None:
        """Refuses an upload that cannot be a trace (its first bytes) or whose gzip data
        inflates past the upload limit: compressed or not, an upload is at most that much
        trace data, and it is inflated here a chunk at a time (bounded memory, whatever
        the ratio) before anything loads it."""
        import zlib

        with path.open("rb") as f:
            head = f.read(2)
            if head == b"\x1f\x8b":
                f.seek(0)
                try:
                    self._check_inflated_size(filename, f)
                except zlib.error as exc:
                    raise UploadError(f"{filename} is not valid gzip data ({exc})") from None
                return
        if head[:1] not in TRACE_FIRST_BYTES:
            raise UploadError(f"{filename} is not a trace: it starts with neither a Perfetto "
                              "packet nor JSON nor gzip data")

    def get_upload(self, name: str) -> Any:
        """Loads a fresh upload; one that does not load is deleted rather than kept."""
        try:
            return self.get(name)
        except BaseException:
            self.resolve(name).unlink(missing_ok=True)
            raise

    def too_large(self, filename: str) -> UploadError:
        return UploadError(f"{filename} is over the {self.max_upload_bytes / 2**20:.0f} MiB "
                           "upload limit; put it in the served folder instead")

    def _upload_files(self) -> list[Path]:
        """The kept uploads, oldest first."""
        files = [p for p in self._uploads.iterdir() if not p.name.startswith(".")]
        return sorted(files, key=lambda p: (p.stat().st_mtime_ns, p.name))

    def _enforce_upload_quota(self, keep: Path) -> None:
        """Deletes the oldest uploads while there are too many or they take too much disk."""
        files = [p for p in self._upload_files() if p != keep]
        sizes = {p: _size(p) for p in files}
        total = _size(keep) + sum(sizes.values())
        while files and (len(files) + 1 > self.max_uploads or total > self.max_upload_total_bytes):
            old = files.pop(0)
            total -= sizes[old]
            old.unlink(missing_ok=True)
            with self._lock:
                self._forget(UPLOAD_PREFIX + old.name)

    def close(self) -> None:
        """Deletes the uploads folder (safe to call more than once)."""
        if self._closed:
            return
        self._closed = True
        shutil.rmtree(self._uploads, ignore_errors=True)


def _size(path: Path) -> int:
    """A file's size, 0 once it is gone (another upload's quota removed it)."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def remove_abandoned_upload_folders() -> None:
    """Deletes upload folders left by dashboards that were killed (their process is gone)."""
    for folder in Path(tempfile.gettempdir()).glob(f"{UPLOADS_DIR_PREFIX}*-*"):
        pid = folder.name[len(UPLOADS_DIR_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not psutil.pid_exists(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


_ABSOLUTE_PATH = re.compile(r"(?<![\w.:/])/(?:[^\s'\"<>:,;()]+/)*([^\s'\"<>:,;()/]*)")


def hide_paths(message: str, roots: dict[Path, str]) -> str:
    """Rewrites paths under each root as `prefix + relative path`, and any other absolute path as
    its last part, so that the page never shows where the server keeps files."""
    for root, prefix in roots.items():
        message = message.replace(str(root) + os.sep, prefix).replace(str(root), prefix or ".")
    return _ABSOLUTE_PATH.sub(lambda m: m.group(1) or "/", message)


def estimated_bytes(obj: Any, _seen: set[int] | None = None, _depth: int = 0) -> int:
    """Roughly what an object's tables and arrays take in memory: frames, arrays and buffers,
    found through the dicts, lists, attributes and closures holding them, a few levels deep."""
    seen = set() if _seen is None else _seen
    if id(obj) in seen or _depth > 4:
        return 0
    seen.add(id(obj))
    if isinstance(obj, pd.DataFrame):
        return int(obj.memory_usage(index=True, deep=False).sum()) + sum(
            _strings_bytes(obj[c]) for c in obj.columns
            if not pd.api.types.is_numeric_dtype(obj[c]))
    if isinstance(obj, (pd.Series, pd.Index)):
        strings = 0 if pd.api.types.is_numeric_dtype(obj) else _strings_bytes(obj)
        return int(obj.memory_usage(deep=False)) + strings
    if isinstance(obj, np.ndarray):
        return int(obj.nbytes)
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return len(obj)
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return 0
    if callable(obj) and getattr(obj, "__closure__", None):  # a lazy table holds its source
        items: Iterable[Any] = [cell.cell_contents for cell in obj.__closure__
                                if cell.cell_contents is not None]
    elif isinstance(obj, dict):
        items = obj.values()
    elif isinstance(obj, (list, tuple)):
        items = obj
    elif hasattr(obj, "__dict__"):
        items = vars(obj).values()
    elif hasattr(obj, "__slots__"):
        items = [getattr(obj, s, None) for s in obj.__slots__]
    else:
        return 0
    return sum(estimated_bytes(v, seen, _depth + 1) for v in items)


def _strings_bytes(column: pd.Series | pd.Index) -> int:
    """What the Python objects of a text column take, from a sample (measuring every value of a
    million-row column would cost a second per trace)."""
    n = len(column)
    if not n:
        return 0
    sample = column[:: max(n // 256, 1)]
    return int(np.mean([sys.getsizeof(v) for v in sample]) * n)
