"""NEURON_EAGER_MODE: which eager policy the device starts with.

"immediate" (the default) launches each eager op's kernel at once; "adaptive"
queues fusible ops and launches each run as one fused kernel (`adaptive_eager`).
Read once when the device registers; `set_mode` switches at run time.
"""

from __future__ import annotations

import os
import warnings

from neuron_explorer.common.errors import NeuronExplorerError

ENV_VAR = "NEURON_EAGER_MODE"
MODES = ("immediate", "adaptive")


class UnknownEagerModeError(NeuronExplorerError, ValueError):
    """An eager mode name that is not one of MODES."""

    def __init__(self, mode: str) -> None:
        super().__init__(f"unknown eager mode {mode!r}; use one of {', '.join(MODES)}")


def set_mode(mode: str) -> None:
    """Switch every eager op's device work to `mode` ("immediate" or "adaptive")."""
    from neuron_explorer.backend import runtime

    if mode == "adaptive":
        from neuron_explorer.backend.compiler.adaptive_eager import AdaptivePolicy

        runtime.set_eager_policy(AdaptivePolicy())
    elif mode == "immediate":
        runtime.set_eager_policy(None)
    else:
        raise UnknownEagerModeError(mode)


def install_from_environment() -> str:
    """Apply NEURON_EAGER_MODE, if set; return the mode in force. An unknown value warns
    (naming the valid ones) and keeps "immediate": it runs at `import torch`, where an
    exception would stop the program before it starts."""
    requested = os.environ.get(ENV_VAR, "").strip().lower()
    if not requested or requested == "immediate":
        return "immediate"
    if requested not in MODES:
        warnings.warn(
            f"{ENV_VAR}={requested!r} is not an eager mode; use one of {', '.join(MODES)} "
            "(running immediate)",
            stacklevel=2,
        )
        return "immediate"
    set_mode(requested)
    return requested
