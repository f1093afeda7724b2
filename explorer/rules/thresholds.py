"""Every threshold the bottleneck rules use, in one place, with the reason for its value.

Shares are of the total analysed step time (the sum of step durations, or the
trace's span when it has no steps).
"""

# Severity of a finding from the share of step time it costs.
SEVERITY_HIGH_SHARE = 0.20  # a fifth of the step or more
SEVERITY_MEDIUM_SHARE = 0.05  # a twentieth of the step or more
MAX_EVIDENCE = 5  # time ranges shown per finding, largest first

# host_bound: the device waits on the host to launch work.
HOST_BOUND_MIN_SHARE = 0.10
# the share of those gaps its replayed fix must save for the device to set the pace after it
# (device findings then wait on it; below, they claim what they save now)
HOST_BOUND_FIX_FEEDS = 0.5

# sync_in_step: the host waits on the device (.item(), .cpu(), print, synchronize).
SYNC_MIN_SHARE = 0.01

# host_fallback: any op that ran on the host costs a round trip; report from one.
FALLBACK_MIN_OPS = 1

# host_device_copies: copies between host and device in most steps.
COPY_MIN_STEP_FRACTION = 0.5  # in at least half of the steps
COPY_MIN_SHARE = 0.01

# eager_beside_graphs: a compiled run the device paces, with ops launched eagerly beside its
# graphs whose work fused into the graphs saves at least this share
EAGER_BESIDE_GRAPHS_MIN_SHARE = 0.02

# dataloader_stall: the step waits for its next batch.
DATALOADER_MIN_SHARE = 0.05

# memory_bound_ops: below the roofline's ridge point, or kernels whose DMA time
# is at least this many times their compute time.
MEMORY_BOUND_MIN_SHARE = 0.05
DMA_DOMINATED_RATIO = 2.0

# tensor_engine_padding: the Tensor Engine is 128x128; dims that are not multiples
# of 128 waste rows. Report when executed FLOPs exceed model FLOPs by this much.
TE_TILE = 128
TE_PADDING_MIN_WASTE = 0.10
TE_PADDING_MIN_SHARE = 0.01

# fp32_matmul: FP32 matmuls run at a quarter of the BF16 rate on the Tensor Engine.
FP32_MATMUL_MIN_SHARE = 0.02
# ... or, judged on device time (a host-bound run: the next bottleneck), this share of
# matmul device time and this share of the device's busy time
FP32_MATMUL_MIN_MATMUL_SHARE = 0.25
FP32_MATMUL_MIN_DEVICE_SHARE = 0.05
FP32_SLOWDOWN_DEFAULT = 4.0  # used when the trace has no hardware figures
# ... and not when the what-if replay of them in bf16 saves less than this share of their
# device time: tiny matmuls, bound by fixed costs and DMA, gain nothing or lose
FP32_MATMUL_MIN_PREDICTED_GAIN = 0.05

# engine_imbalance: one engine saturated while the other compute engines idle.
ENGINE_SATURATED = 0.80
ENGINE_IDLE = 0.20

# small_dma: DMA bandwidth saturates at 4 KiB per partition; below that a transfer's fixed
# cost (descriptor generation, then 1.1-1.3 us from trigger to first byte) dominates.
SMALL_DMA_BYTES_PER_PARTITION = 4096
# A transfer is small when it takes over twice as long as its bytes need at one DMA
# engine's bandwidth: more than half its time is fixed cost.
SMALL_DMA_SLOWDOWN = 2.0
SMALL_DMA_MIN_TRANSFERS = 8
SMALL_DMA_MIN_SHARE = 0.01

# recompilation: graph breaks or recompiles inside steps; a storm from this many.
RECOMPILE_STORM = 3

# shape_recompiles: one input dimension recompiled for this many new sizes (Dynamo's
# automatic dynamic shapes absorb a single change: after it, the size is symbolic).
SHAPE_RECOMPILES_MIN = 3

# compile_dominates: compilation takes this share of the recorded run.
COMPILE_DOMINANT_SHARE = 0.50

# memory_near_capacity: peak device memory over this share of capacity.
MEMORY_NEAR_CAPACITY = 0.90
MEMORY_CRITICAL = 0.97  # high severity from here

# exposed_communication: a device only communicates (collectives with no compute beside).
EXPOSED_COMM_MIN_SHARE = 0.05

# dependency_idle: the device idles with its next kernel already launched (cross-stream or
# cross-rank waits).
DEPENDENCY_IDLE_MIN_SHARE = 0.10

# kernel_* rules: NKI kernels (ops `nki::<kernel>`).
# kernel_dma_not_pipelined: DMA and compute each busy this share of the kernel, and less
# than KERNEL_MIN_OVERLAP of the shorter one runs under the other.
KERNEL_BUSY_SHARE = 0.10
KERNEL_MIN_OVERLAP = 0.50
# kernel_memory_pressure: SBUF or PSUM high-water over this share of the capacity.
KERNEL_MEMORY_PRESSURE = 0.85
# kernel_matmul_tile_shape: the array filled below this share (K x M of 128 x 128), or a
# moving free size below KERNEL_MOVING_FREE_MIN columns.
KERNEL_ARRAY_MIN_FILL = 0.75
KERNEL_MOVING_FREE_MIN = 128
# kernel_small_dma: a line's transfers spend over half their time on fixed cost.
KERNEL_SMALL_DMA_OVERHEAD = 0.5
# a kernel finding counts when its time lost is at least this share of the kernel's time
KERNEL_MIN_SHARE = 0.05

# queued_idle: a device queue (stream) idle although work was already launched to it (HTA's
# `other` idle: not a wait on the host, and longer than back-to-back kernel overhead).
QUEUED_IDLE_MIN_SHARE = 0.01

# launch_delay: a kernel launched onto an idle queue that still waited after its launch
# returned, longer than HTA's launch-delay cutoff (launch latencies are microseconds).
LAUNCH_DELAY_MIN_NS = 100_000
LAUNCH_DELAY_MIN_SHARE = 0.01

# short_kernel_sequence: this many linked kernels, each shorter than its launch (HTA's
# short kernels), in every analysed step and at least FUSION_MIN_REPEATS times (it repeats).
FUSION_SEQUENCE_KERNELS = 3
FUSION_MIN_REPEATS = 2
FUSION_MIN_SHARE = 0.01

# checkpoint_recompute: a recompute whose removal saves less than this share of the step
RECOMPUTE_MIN_SHARE = 0.02

# zeroed_gradients: zeroing whose removal saves less than this share of the step
ZEROED_GRADIENTS_MIN_SHARE = 0.02
# uploads converted on the device: what converting on the host saves, share of the steps
CONVERTED_UPLOADS_MIN_SHARE = 0.02

# python_loop: a loop whose vectorising saves less than this share of the step
PYTHON_LOOP_MIN_SHARE = 0.05
# parameter_loop: a loop over the parameters whose fix (its foreach form, or compiled) saves
# less than this share
PARAMETER_LOOP_MIN_SHARE = 0.02
# unbatched_calls: batching the calls saves less than this share of the analysed steps
UNBATCHED_CALLS_MIN_SHARE = 0.05
# joined_calls: joining a step's independent calls of the model saves less than this share
JOINED_CALLS_MIN_SHARE = 0.05

# optimizer_recreated: state made anew whose removal saves less than this share
OPTIMIZER_RECREATED_MIN_SHARE = 0.02

# unfused_optimizer: a fused step that saves less than this share of the step (a replayed
# saving, as the two above: 5% once hid a straggler rank's 4.7%, fused=True saved it)
UNFUSED_OPTIMIZER_MIN_SHARE = 0.02

# layout_copies: strided views made contiguous whose removal saves less than this share
LAYOUT_COPIES_MIN_SHARE = 0.02
# cast_round_trip: casts up to float32 undone at once, at least this share of the step
CAST_ROUND_TRIP_MIN_SHARE = 0.02

# accumulation_all_reduce: early reductions whose removal saves less than this share
ACCUMULATION_ALL_REDUCE_MIN_SHARE = 0.02

# host_bound: compiling the training step (the loss with the model) is stated beside
# compiling the model where it saves this much more: a share of the model's saving, and of
# the analysed steps
WHOLE_STEP_MORE = 0.25
WHOLE_STEP_MIN_SHARE = 0.05
