"""How far a trace's background load is (`TraceStore.start_loading`), for the loading page."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field


@dataclass
class LoadProgress:
    """Where one trace's load is: its bars' latest (what, done, total), done or failed."""

    name: str
    size_bytes: int
    started: float = field(default_factory=time.monotonic)
    what: str = ""
    done: int = 0
    total: int = 0
    error: BaseException | None = None
    finished: threading.Event = field(default_factory=threading.Event)

    def update(self, what: str, done: int, total: int) -> None:
        self.what, self.done, self.total = what, done, total

    def fraction(self) -> float | None:
        """Share done per the loader's bars; None when they cannot tell (a bar of one step)."""
        if self.finished.is_set():
            return 1.0
        if self.total > 1:
            return min(self.done / self.total, 1.0)
        return None

    def elapsed_s(self) -> float:
        return time.monotonic() - self.started
