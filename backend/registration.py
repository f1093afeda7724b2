"""Registers the `neuron` device with PyTorch (placeholder until the device lands)."""

from __future__ import annotations


def register() -> None:
    """Nothing is registered yet."""
