"""Every threshold the run rules use, with the reason for its value. Shares are of the
run's step time (the mean over ranks of each rank's total step time)."""

# straggler_rank: removing one rank's extra work would save this share of the run's step
# time (analyses/ranks.py `straggler_savings`).
STRAGGLER_MIN_SHARE = 0.05
# straggler_rank: below this share, a straggler whose excess is its host's own Python,
# running the same ops as the others, is said to be possibly the machine's: balanced
# 2-rank runs on a 2-core machine measured one rank 6.6-10.5% slower in 2 of 6 quiet
# recordings of 3 ms steps (examples/straggler.py --extra-ms 0), 6.8% in an FSDP run beside
# a busy process, each consistently over the steps, on either rank.
STRAGGLER_MACHINE_SHARE = 0.15

# collective_wait: the waits at collectives that held up steps (their hosts waited them out).
COLLECTIVE_WAIT_MIN_SHARE = 0.05

# exposed_communication: time a device only moves data, with no compute to hide it.
EXPOSED_COMM_MIN_SHARE = 0.05

# small_collectives: messages below this size are latency-bound on any interconnect (the
# per-call latency of NCCL or NeuronLink is microseconds; 1 MiB at 100 GB/s takes ~10 us).
SMALL_COLLECTIVE_BYTES = 1 << 20
SMALL_COLLECTIVES_MIN_COUNT = 16  # per rank: a handful of small calls is no pattern
SMALL_COLLECTIVES_MIN_SHARE = 0.02

# load_imbalance: the busiest rank computes this much longer than the least busy one.
LOAD_IMBALANCE_MIN_SPREAD = 0.10
LOAD_IMBALANCE_MIN_SHARE = 0.02

# a rank finding whose run saving is at least this share of the straggler finding's time
# is that time (its fix takes the straggler down to the others' pace): said to overlap
SAME_AS_STRAGGLER = 0.95
