"""The default group puts each rank on neuron:LOCAL_RANK, or neuron:0 past the chip's cores."""

from __future__ import annotations

import torch  # noqa: F401 - loads the neuron device
from neuron_explorer.backend import devices
from neuron_explorer.backend.distributed.process_group import _select_local_device


def test_local_rank_picks_the_core(monkeypatch):
    saved = devices.current_index
    try:
        monkeypatch.setenv("LOCAL_RANK", "1")
        _select_local_device()
        assert devices.current_index == 1
        monkeypatch.setenv("LOCAL_RANK", str(devices.device_count()))  # one past the last core
        _select_local_device()
        assert devices.current_index == 0
    finally:
        devices.set_current(saved)
