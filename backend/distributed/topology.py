"""Where each rank sits: which chip and which instance (from `NEURON_TOPOLOGY` or the preset).

By default rank r runs on NeuronCore r of a fleet of identical chips: `cores_per_chip`
ranks share a chip and `chips_per_instance` chips share an instance (the preset's
figures). `NEURON_TOPOLOGY="ranks_per_chip=2,chips_per_instance=4"` overrides either.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from neuron_explorer.common.errors import NeuronExplorerError
from neuron_explorer.common.presets import HardwarePreset, interconnect_for

TOPOLOGY_ENV = "NEURON_TOPOLOGY"
_KEYS = ("ranks_per_chip", "chips_per_instance")


class TopologyError(NeuronExplorerError, ValueError):
    """`NEURON_TOPOLOGY` cannot be read."""


@dataclass(frozen=True)
class Topology:
    """How many ranks share a chip, and how many chips share an instance."""

    ranks_per_chip: int
    chips_per_instance: int

    def chip_of(self, rank: int) -> int:
        return rank // self.ranks_per_chip

    def instance_of(self, rank: int) -> int:
        return rank // (self.ranks_per_chip * self.chips_per_instance)

    def tier(self, ranks: tuple[int, ...]) -> str:
        """The slowest link a group's ranks must cross: "core", "chip" or "instance"."""
        if len({self.instance_of(r) for r in ranks}) > 1:
            return "instance"
        if len({self.chip_of(r) for r in ranks}) > 1:
            return "chip"
        return "core"

    def as_dict(self) -> dict[str, int]:
        return {"ranks_per_chip": self.ranks_per_chip,
                "chips_per_instance": self.chips_per_instance}


def topology_for(preset: HardwarePreset, spec: str | None = None) -> Topology:
    """The topology `spec` (default: `NEURON_TOPOLOGY`) describes, the preset's otherwise."""
    values = {"ranks_per_chip": preset.cores_per_chip,
              "chips_per_instance": interconnect_for(preset).chips_per_instance}
    spec = os.environ.get(TOPOLOGY_ENV, "") if spec is None else spec
    for part in filter(None, (p.strip() for p in spec.split(","))):
        key, _, value = part.partition("=")
        key = key.strip()
        if key not in _KEYS or not value.strip().isdigit() or int(value) < 1:
            raise TopologyError(
                f"cannot read {TOPOLOGY_ENV}={spec!r}: expected comma-separated "
                "ranks_per_chip=N and/or chips_per_instance=N with N >= 1, "
                "e.g. ranks_per_chip=2,chips_per_instance=16")
        values[key] = int(value)
    return Topology(**values)
