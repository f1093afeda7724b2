"""Progress bars: on stderr only when it is a terminal (or asked for), never under --quiet."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest
import scenarios
from neuron_explorer.cli import main as cli_main
from neuron_explorer.progress import steps


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(("terminal", "enabled", "shown"), [
    (False, None, False), (True, None, True), (True, False, False), (False, True, True)])
def test_a_bar_shows_on_a_terminal_unless_silenced(monkeypatch: pytest.MonkeyPatch,
                                                   terminal: bool, enabled: bool | None,
                                                   shown: bool) -> None:
    err = _Terminal() if terminal else io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    with steps(3, "loading", enabled) as bar:
        assert bar.disable is (not shown)
        bar.update(3)


def test_a_bar_shows_in_a_jupyter_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel's stderr is no terminal, but a notebook user wants the bar (tqdm.auto
    draws it as a widget there)."""
    import types

    shell = types.SimpleNamespace(kernel=object())
    monkeypatch.setitem(sys.modules, "IPython",
                        types.SimpleNamespace(get_ipython=lambda: shell))
    monkeypatch.setattr("sys.stderr", io.StringIO())
    with steps(3, "loading") as bar:
        assert not bar.disable
    shell.kernel = None  # plain IPython in a terminal-less pipe: no bar
    with steps(3, "loading") as bar:
        assert bar.disable


def test_quiet_turns_the_bars_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import neuron_explorer.trace as trace_module

    seen = {}
    real = trace_module.load

    def spy(path, **kw):
        seen.update(kw)
        return real(path, **kw)

    monkeypatch.setattr(trace_module, "load", spy)
    path = scenarios.basic().write(tmp_path, "basic")
    assert cli_main(["report", str(path), "--quiet", "--no-cache", "-o",
                     str(tmp_path / "r.txt")]) == 0
    assert seen == {"cache": False, "scheduler": None, "progress": False}
