"""Errors a kernel raises, each naming the kernel source line that caused it."""

from __future__ import annotations


class NkiError(ValueError):
    """A kernel did something the NeuronCore cannot do; the message names the line."""

    def __init__(self, message: str, where: str = "") -> None:
        self.where = where
        super().__init__(f"{where}: {message}" if where else message)
