"""The track table both loaders build, and the kind of a track in one of our device
processes, from its name."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd
from neuron_explorer.common import trace_format as tf
from neuron_explorer.loaders.kinds import DEVICE_PROCESS_NAME
from neuron_explorer.loaders.raw import TRACK_COLUMNS

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


def our_device(process_name: str, track_name: str) -> tuple[int, str]:
    """The device number and track kind of a track in one of our `neuron:N` processes;
    (-1, "thread") for any other process's track."""
    ours = DEVICE_PROCESS_NAME.match(process_name)
    if ours is None:
        return -1, "thread"
    return int(ours.group(1)), device_track_kind(track_name)


_NUMBERS = ("track_id", "pid", "tid", "device")


def track_table(rows: Iterable[tuple[Any, ...]]) -> pd.DataFrame:
    """The tracks table from rows of TRACK_COLUMNS (ids and numbers as int64). Built by
    column: a frame from rows, then cast, was a fifth of a small trace's load."""
    rows = list(rows)
    if not rows:
        return pd.DataFrame(rows, columns=TRACK_COLUMNS).astype(dict.fromkeys(_NUMBERS, "int64"))
    columns = zip(*rows, strict=True)
    return pd.DataFrame({name: np.array(values, np.int64) if name in _NUMBERS else list(values)
                         for name, values in zip(TRACK_COLUMNS, columns, strict=True)})
