"""Where the ranks' host clocks meet at a collective.

Each rank measures its own host clock (the program's work, less the emulator's), so two
ranks running the same code drift apart by their clocks' measurement noise: a few
percent of the work measured, the same noise the script's own CPU time shows in plain
PyTorch on a loaded machine. Left alone, that drift never closes in a host-bound run (no
host ever blocks on another rank), and the rank whose clock ran fast would wait at every
later collective for a lead that is only noise.

So at each collective the ranks compare the host times at which they called it. When
the spread is within the noise of the work measured since their clocks last met, it
carries no evidence that one rank did more work: the ranks meet at the latest one's time
(the others wait for it on the host, `host_wait_ns`, a few microseconds). A larger spread
is real work (a rank that sleeps, loads more data, runs more Python): the clocks keep it,
and the early ranks' devices wait at the collective as they would under NCCL's
asynchronous semantics, until a real synchronisation (a blocking collective, a barrier,
the host waiting on a device that waited for the late rank) brings them together.
"""

from __future__ import annotations

import statistics

# The measured host clock's noise: this share of the work measured since the ranks'
# clocks last met (load-free CPU time of the same code varies this much between runs on a
# machine under load), and never less than this floor (a clock read and a scheduler tick).
NOISE_SHARE = 0.25
NOISE_FLOOR_NS = 20_000


def meeting_times(host_ns: list[int], last_met_ns: int) -> list[int] | None:
    """The host time at which each rank leaves the call when the ranks' clocks meet
    (the latest rank's, for all), or None when the spread is real work and each keeps its
    own. `host_ns` are the ranks' clocks at the call; `last_met_ns` when they last met."""
    latest = max(host_ns)
    spread = latest - min(host_ns)
    work = statistics.median(host_ns) - last_met_ns
    if spread <= max(NOISE_FLOOR_NS, NOISE_SHARE * work):
        return [latest] * len(host_ns)
    return None
