"""What a device-time finding says sets the step. On a compiled CNN the device set the
steps' length, yet `memory_bound_ops`, its saving capped at the device's lead over the
host, said "The host's own work sets most of each step" beside `fp32_matmul` saying the
device sets it: a capped saving now says only where it stops."""

from __future__ import annotations

from neuron_explorer.rules import host_bound


def test_a_capped_saving_says_where_it_stops_not_that_the_host_sets_the_step(
        monkeypatch) -> None:
    monkeypatch.setattr(host_bound, "is_host_bound", lambda trace: False)
    monkeypatch.setattr(host_bound, "device_time_saving", lambda trace, ns, *_: min(ns, 21_710_000))
    capped = host_bound.device_saving(object(), 30_000_000)
    assert capped.time_lost_ns == 21_710_000
    assert "sets most of each step" not in capped.note
    assert "over the analysed steps shortens them by 21.7 ms only: past that, the host's own " \
           "work" in capped.note
    whole = host_bound.device_saving(object(), 6_000_000)
    assert whole.note == "" and "the device sets the steps' length" in whole.basis
