"""Where ranks' host clocks meet at a collective (`host_alignment.meeting_times`): a
spread within the clocks' noise closes at the latest rank's time; a spread that is real
work is kept."""

from __future__ import annotations

from neuron_explorer.backend.distributed.host_alignment import NOISE_FLOOR_NS, meeting_times


def test_a_spread_within_the_noise_of_the_work_since_the_last_meeting_closes():
    # 10 ms of work since the clocks met, one rank 5% behind the other
    assert meeting_times([10_000_000, 10_500_000], 0) == [10_500_000, 10_500_000]


def test_a_spread_larger_than_the_noise_is_kept():
    # 15 ms of sleep on one rank after 2 ms of shared work: real, not noise
    hosts = [2_000_000, 17_000_000]
    assert meeting_times(hosts, 0) is None


def test_the_noise_is_measured_from_the_last_meeting():
    hosts = [100_000_000, 101_000_000]
    assert meeting_times(hosts, 99_000_000) is None  # 1 ms apart after ~1.5 ms of work
    assert meeting_times(hosts, 0) == [101_000_000] * 2  # ... after 100 ms of work


def test_back_to_back_calls_meet_within_the_floor():
    hosts = [5_000, 5_000 + NOISE_FLOOR_NS]
    assert meeting_times(hosts, 0) == [hosts[1]] * 2
    assert meeting_times([0, int(NOISE_FLOOR_NS + 1)], 0) is None
