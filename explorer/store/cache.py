"""The trace cache: the first load of a trace file writes its store, a reload reads it.

Entries live in `$NEURON_EXPLORER_CACHE` (a folder), else
`$XDG_CACHE_HOME/neuron-explorer/traces` (`~/.cache/...` without it), one folder per
trace file, named from its absolute path. An entry is used only while the file's size,
modification and change times, inode and a fingerprint of its first and last bytes are
those the entry recorded: a file rewritten in place (even to the same size within one
clock tick) is read again and its entry rebuilt. A trace that changes while it is being
read is not cached. An entry that cannot be read (corrupt, cut short, of another
version) is rebuilt, never trusted; a cache folder that cannot be written leaves loads
uncached, with one warning. `NEURON_EXPLORER_CACHE=off` (or `load(..., cache=False)`,
`--no-cache`) turns the cache off.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import warnings
from typing import Any

from neuron_explorer.loaders.raw import RawTrace
from neuron_explorer.store.parquet import Store, StoreError, open_store, write_store

ENV_CACHE = "NEURON_EXPLORER_CACHE"
OFF = ("off", "0", "no", "false", "none")
FINGERPRINT_BYTES = 1 << 16  # of the head and of the tail


class CacheWarning(UserWarning):
    """The trace cache could not be used; the trace loaded without it."""


def cache_root() -> str | None:
    """The cache folder, or None when the cache is off."""
    setting = os.environ.get(ENV_CACHE, "").strip()
    if setting.lower() in OFF:
        return None
    if setting:
        return os.path.abspath(os.path.expanduser(setting))
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "neuron-explorer", "traces")


def entry_folder(path: str, root: str) -> str:
    """The cache entry of a trace file (one per absolute path)."""
    real = os.path.realpath(path)
    digest = hashlib.sha256(real.encode("utf-8", "surrogateescape")).hexdigest()[:24]
    return os.path.join(root, f"{os.path.basename(real)[:40]}-{digest}")


def source_key(path: str) -> dict[str, Any]:
    """What identifies a trace file's content: path, size, times, inode, fingerprint."""
    real = os.path.realpath(path)
    st = os.stat(real)
    return {"path": os.path.abspath(path), "real_path": real, "size": st.st_size,
            "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns, "inode": st.st_ino,
            "fingerprint": _fingerprint(real, st.st_size)}


def _fingerprint(path: str, size: int) -> str:
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        h.update(f.read(FINGERPRINT_BYTES))
        if size > FINGERPRINT_BYTES:
            f.seek(max(FINGERPRINT_BYTES, size - FINGERPRINT_BYTES))
            h.update(f.read(FINGERPRINT_BYTES))
    return h.hexdigest()


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    keys = ("real_path", "size", "mtime_ns", "ctime_ns", "inode", "fingerprint")
    return all(a.get(k) == b.get(k) for k in keys)


def lookup(path: str, root: str) -> Store | None:
    """The trace's valid cache entry, or None (absent, stale or unreadable)."""
    folder = entry_folder(path, root)
    try:
        key = source_key(path)
        store = open_store(folder)
    except (OSError, StoreError):
        return None
    return store if _same(store.manifest["source"], key) else None


def read_cached(path: str, read: Any, root: str, streamable: bool = False
                ) -> tuple[RawTrace, Store | None]:
    """A trace from its cache entry when valid; else `read(path)` and a new entry.
    `streamable`: a .pftrace, whose entry is built as it is decoded, a window of the file
    at a time (`store/streamed.py`), instead of from the trace read whole.

    Returns the loader's tables and the entry they are kept in (None when not cached).
    """
    store = lookup(path, root)
    if store is not None:
        opened = store
        try:
            raw = store.raw(reparse=lambda: _read_unchanged(path, read, opened))
        except StoreError as exc:
            warnings.warn(f"the cache entry of {path} is damaged ({exc}); it is built "
                          "again from the trace", CacheWarning, stacklevel=3)
            store = None
        else:
            raw.path = os.fspath(path)
            store.replay_warnings(stacklevel=4)
            return raw, store
    before = _key_or_none(path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        streamed = _streamed(path, read, root, before, caught) if streamable else None
        if streamed is not None:
            raw, entry = streamed
        else:
            raw = read(path)
            after = _key_or_none(path)
            entry = None
            if before is not None and after is not None and _same(before, after):
                entry = _write_entry(path, raw, after, root, caught)
    for w in caught:  # the load's warnings, heard by the caller as without the cache
        warnings.warn(w.message, w.category, stacklevel=3)
    return raw, entry


def _streamed(path: str, read: Any, root: str, before: dict[str, Any] | None,
              caught: list[warnings.WarningMessage]) -> tuple[RawTrace, Store] | None:
    """The trace decoded into its new entry a window at a time; None where it is read
    whole instead: a trace that changed while it was read (its entry is not kept), a
    cache that cannot be written."""
    from neuron_explorer.store.streamed import write_streamed_entry

    if before is None:
        return None
    folder = entry_folder(path, root)
    seen = len(caught)
    try:
        raw, store = write_streamed_entry(path, folder, before, caught,
                                          reparse=lambda: _read_unchanged(path, read, store))
    except OSError as exc:
        del caught[seen:]
        _warn_unwritable(root, exc)
        return None
    after = _key_or_none(path)
    if after is None or not _same(before, after):
        shutil.rmtree(folder, ignore_errors=True)
        del caught[seen:]
        return None
    return raw, store


def _read_unchanged(path: str, read: Any, store: Store) -> RawTrace:
    """The trace read again for a table its entry could not give, when the trace is
    still the one the entry was built from (other tables would not match it otherwise)."""
    key = _key_or_none(path)
    if key is None or not _same(store.manifest["source"], key):
        raise StoreError(f"{path} changed since it was loaded, and its cache entry cannot "
                         "give the rest of its tables: load it again")
    return read(path)


def _key_or_none(path: str) -> dict[str, Any] | None:
    try:
        return source_key(path)
    except OSError:
        return None


def _write_entry(path: str, raw: RawTrace, key: dict[str, Any], root: str,
                 caught: list[warnings.WarningMessage]) -> Store | None:
    try:
        return write_store(entry_folder(path, root), raw, key,
                           caught=[(w.category.__name__, str(w.message)) for w in caught
                                   if issubclass(w.category, UserWarning)])
    except OSError as exc:
        _warn_unwritable(root, exc)
        return None


_warned: set[str] = set()


def _warn_unwritable(root: str, exc: OSError) -> None:
    if root in _warned:
        return
    _warned.add(root)
    reason = exc.strerror or str(exc)
    warnings.warn(f"the trace cache {root} cannot be written ({reason}); traces load without "
                  f"it. Set {ENV_CACHE} to a writable folder, or to 'off'", CacheWarning,
                  stacklevel=5)
