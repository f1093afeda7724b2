"""The traces a dashboard serves: the files under one folder plus uploads, loaded once each.

Every trace is named by its path relative to the served folder; names that would
reach outside it (absolute paths, `..`, links leading out) are refused, so URLs
cannot read other files on the machine.
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from neuron_explorer.errors import NeuronExplorerError

TRACE_SUFFIXES = (".pftrace", ".perfetto-trace", ".json", ".json.gz", ".pb", ".pb.gz")
UPLOAD_PREFIX = "upload:"
DEFAULT_MAX_UPLOAD_BYTES = 200 * 2**20
MAX_LISTED = 500


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
        max_loaded: int = 4,
        max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES,
    ) -> None:
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise TraceNotFoundError(f"{root} is not a folder; pass a trace file or a folder of traces")
        self.loader = loader
        self.max_loaded = max_loaded
        self.max_upload_bytes = max_upload_bytes
        self._uploads = Path(tempfile.mkdtemp(prefix="neuron-explorer-uploads-"))
        self._cache: OrderedDict[str, Any] = OrderedDict()
        self._pinned: dict[str, Any] = {}  # traces handed over in-process, never evicted
        self._extras: dict[str, Any] = {}  # per-trace derived objects (timeline index, ...)
        self._lock = threading.Lock()
        self._loading: dict[str, threading.Lock] = {}  # one lock per trace being loaded

    # -- names ------------------------------------------------------------------
    def list_traces(self) -> list[str]:
        """Trace files under the served folder and the uploads, by name."""
        names = []
        for dirpath, dirnames, filenames in os.walk(self.root):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for filename in sorted(filenames):
                if filename.lower().endswith(TRACE_SUFFIXES):
                    names.append(Path(dirpath, filename).relative_to(self.root).as_posix())
                    if len(names) >= MAX_LISTED:
                        return names
        names += [UPLOAD_PREFIX + p.name for p in sorted(self._uploads.iterdir())]
        return names + sorted(n for n in self._pinned if n not in names)

    def resolve(self, name: str) -> Path:
        """The file a trace name stands for; refuses anything outside the served folder."""
        if not name or "\x00" in name:
            raise TraceNotFoundError("no trace named; pick one from the list")
        if name.startswith(UPLOAD_PREFIX):
            base, rel = self._uploads, name[len(UPLOAD_PREFIX):]
        else:
            base, rel = self.root, name
        if os.path.isabs(rel) or ".." in Path(rel).parts:
            raise TraceNotFoundError(f"{name!r} is outside the served folder; pick a trace from the list")
        path = (base / rel).resolve()
        if not path.is_relative_to(base):
            raise TraceNotFoundError(f"{name!r} is outside the served folder; pick a trace from the list")
        if not path.is_file():
            raise TraceNotFoundError(f"no trace file {name!r} in {self.root}; pick one from the list")
        return path

    # -- loading ----------------------------------------------------------------
    def get(self, name: str) -> Any:
        """The loaded trace for a name (loaded on first use; TraceFormatError if it is bad)."""
        cached = self._cached(name)
        if cached is not None:
            return cached
        path = self.resolve(name)
        with self._lock:
            loading = self._loading.setdefault(name, threading.Lock())
        with loading:  # pages asking for the same trace at once share one load
            cached = self._cached(name)
            if cached is not None:
                return cached
            trace = self.loader(str(path))
            with self._lock:
                self._cache[name] = trace
                self._loading.pop(name, None)
                while len(self._cache) > self.max_loaded:
                    old, _ = self._cache.popitem(last=False)
                    self._extras = {k: v for k, v in self._extras.items() if k[0] != old}
        return trace

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
        return value

    # -- uploads ----------------------------------------------------------------
    def save_upload(self, filename: str, data: bytes) -> str:
        """Keeps an uploaded trace (outside the served folder) and returns its name."""
        if len(data) > self.max_upload_bytes:
            raise UploadError(
                f"{filename} is {len(data) / 2**20:.1f} MiB, over the {self.max_upload_bytes / 2**20:.0f} MiB "
                "upload limit; put it in the served folder instead"
            )
        safe = "".join(ch for ch in Path(filename or "").name if ch.isalnum() or ch in "._-+")
        if not safe or safe.startswith("."):
            raise UploadError(f"cannot use {filename!r} as a file name; rename the trace and upload again")
        target = self._uploads / safe
        target.write_bytes(data)
        name = UPLOAD_PREFIX + safe
        with self._lock:
            self._cache.pop(name, None)
            self._extras = {k: v for k, v in self._extras.items() if k[0] != name}
        return name

    def close(self) -> None:
        """Deletes the uploads folder."""
        for p in self._uploads.iterdir():
            p.unlink(missing_ok=True)
        self._uploads.rmdir()
