"""What a prediction can be asked for: the presets it targets, its modes, its dtypes.

Apart from the replay so that the command line lists them without importing it (and
pandas with it): every `neuron-explorer` command builds the `whatif` options, `record`
included."""

from __future__ import annotations

from neuron_explorer.common.presets import PRESETS

HARDWARE = tuple(PRESETS)  # the presets a prediction can target (common/presets.py)
MODES = ("eager", "compiled")
DTYPES = ("bf16", "fp8")
