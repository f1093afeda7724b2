"""The kind of a track in one of our device processes, from its name."""

from __future__ import annotations

from neuron_explorer import trace_format as tf

_ENGINE_BY_TRACK = {v: k for k, v in tf.ENGINE_TRACKS.items()}


def device_track_kind(name: str) -> str:
    """`kernels`, `engine`, `dma` or `counter` for a track of a `neuron:N` process."""
    if name == tf.TRACK_KERNELS:
        return "kernels"
    if name in _ENGINE_BY_TRACK:
        return "engine"
    if name.startswith(tf.DMA_TRACK.split("{")[0]):
        return "dma"
    return "device"
