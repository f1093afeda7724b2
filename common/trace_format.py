"""Names shared by the trace writer (collectors) and the trace loader (explorer).

This module is the trace layout's single source of truth (docs/trace-format.md
explains it); it imports nothing, so the collectors may use it without pulling in
the explorer's dependencies.
"""

FORMAT_VERSION = 1

# Slice categories (TrackEvent.categories[0], Chrome-trace "cat").
CAT_STEP = "step"
CAT_MODULE = "module"  # forward of an nn.Module; args: module, phase
CAT_BACKWARD = "backward"  # backward of an nn.Module; args: module, phase
CAT_OPTIMIZER = "optimizer"  # optimizer.step / zero_grad
CAT_OP = "op"  # one op dispatched to the device (host side)
CAT_KERNEL = "kernel"  # device kernel
CAT_INSTRUCTION = "instruction"  # one engine instruction
CAT_DMA = "dma"  # one DMA transfer on a queue
CAT_SYNC = "sync"  # host waiting on the device
CAT_DATALOADER = "dataloader"  # host waiting on the next batch
CAT_DATALOADER_WORKER = "dataloader_worker"  # a DataLoader worker process fetching a batch
CAT_COMPILE = "compile"  # torch.compile spans (dynamo, aot_autograd, neuron_compile)
CAT_GRAPH_BREAK = "graph_break"  # instant
CAT_RECOMPILE = "recompile"  # instant
CAT_ANNOTATION = "annotation"  # user ranges: neuron_explorer.annotate, record_function
CAT_METADATA = "metadata"  # one instant holding the run's metadata as JSON
CAT_UNCOUNTED = "uncounted"  # instant: a pause the host clock left out (GC, recording)

# Debug-annotation (Chrome "args") keys.
ARG_OP_ID = "op_id"
ARG_KERNEL_ID = "kernel_id"
ARG_STEP = "step"
ARG_SHAPES = "shapes"  # str, e.g. "[[64, 512], [512, 512]]"
ARG_DTYPES = "dtypes"  # str, e.g. "[float32, float32]"
ARG_OP_KEY = "key"  # str on eager ops: outputs and attrs as JSON (common/op_key_codec.py)
ARG_FLOPS = "flops"  # int, model FLOPs
ARG_HW_FLOPS = "hw_flops"  # int, executed FLOPs (padding included)
ARG_BYTES = "bytes"  # int, HBM bytes read + written
ARG_MODULE = "module"  # str, module path like "model.layers.3.attn"
ARG_PHASE = "phase"  # "forward" | "backward"; on an annotation, neuron_explorer.phase's name
ARG_REQUEST = "request"  # str JSON list, on an annotation: the ids neuron_explorer.request marks
ARG_GRAD = "grad"  # int, on a thread's outermost module call: 0 when grad mode is off
# int, on such a call without grad: the model's training flag (0 after model.eval())
ARG_TRAINING = "training"
# str, on a module call torch.compile runs eager: why ("rnn": Dynamo does not trace
# nn.RNN, nn.GRU or nn.LSTM unless torch._dynamo.config.allow_rnn)
ARG_COMPILE_SKIPS = "compile_skips"
# bool, on a call of a module PyTorch defines that is built of others (nn.MultiheadAttention)
ARG_LIBRARY_MODULE = "library_module"
ARG_TOKENS = "tokens"  # str, ... and the shape of its first arg when token ids ("[4, 39]")
ARG_SOURCE = "source"  # str, "train.py:42"
ARG_FALLBACK = "fallback"  # bool, op ran on the host
ARG_DEVICE = "device"  # int
ARG_ENGINE = "engine"  # "tensor" | "vector" | "scalar" | "gpsimd" | "dma.<q>"
ARG_OPCODE = "opcode"
ARG_OPS = "ops"  # str, on a compiled graph's instructions: the aten op(s) they run
ARG_SECTION = "section"  # str, ... and the fused group they belong to ("fused_addmm_gelu")
# str JSON, on a compiled program's kernel slices: [[section, module, source, written,
# matmul dtype], ...]: what the user's code called ("LayerNorm", "F.gelu") and the dtype
# of the section's matmul ("float32"), once per program rather than on every instruction
ARG_SECTIONS = "sections"
# int ns, on a compiled program's kernel slices when its matmuls ran in float32: the
# program's length with the model cast whole to bfloat16 (every float32 tensor of the graph)
ARG_WHOLE_BF16_NS = "whole_bf16_ns"
# int ns, on an inference program's kernel slices: the program's length over
# BATCHED_CALLS times its requests' rows (backend/compiler/batched_program.py), what one
# call serving that many calls' requests would run
ARG_BATCHED_NS = "batched_ns"
BATCHED_CALLS = 8
ARG_GRAPH_ID = "graph_id"
ARG_NKI_KERNEL = "kernel"  # str, on an NKI kernel's compile span: the kernel's name
# int ns, on an NKI kernel's compile span: the kernel's scheduled length, and its length
# with its SBUF tiles rotated (a fresh buffer for each write: backend/hardware/rotated.py)
ARG_KERNEL_DURATION = "duration_ns"
ARG_KERNEL_ROTATED = "rotated_ns"
ARG_REASON = "reason"  # graph break / recompile reason
# str, on a graph break raised inside torch's own code, and on a sync inside a torch
# function the user called: where ("torch/optim/optimizer.py:85 in _use_grad", "torch/
# distributions/categorical.py:70 in __init__"); `source` is still the user's line
ARG_WITHIN = "within"
ARG_HINT = "hint"  # str, on a graph break: Dynamo's hint for it ("" when it gave none)
ARG_SYNC_KIND = "kind"  # item | cpu | tolist | print | synchronize
# bool, on an upload: the host tensor was uploaded before, unchanged (a constant)
ARG_SAME_HOST_TENSOR = "same_host_tensor"
# on a copy within the device whose source is a strided view (a permute, transpose or slice
# made contiguous): a layout copy the program could do without
ARG_LAYOUT_COPY = "layout_copy"
# str JSON list on eager ops: per tensor input, how many op ids back the op that made it
# was (0: not a recorded op's result); the data flow `whatif --mode compiled` fuses along
ARG_PRODUCERS = "producers"
ARG_ENGINE_BUSY = "engine_busy_ns"  # JSON str {"tensor": ns, ...} on kernels
ARG_SBUF = "sbuf_bytes"
ARG_PSUM = "psum_bytes"
ARG_METADATA_JSON = "json"
ARG_PAUSED_NS = "paused_ns"  # int, on CAT_UNCOUNTED instants: the real length of the pause
ARG_BATCH = "batch"  # int, DataLoader waits and worker batches: the batch index
ARG_WORKER = "worker"  # int, ... the DataLoader worker id (0..num_workers-1)
ARG_WORKER_PID = "worker_pid"  # int, ... the worker's process id
ARG_SAMPLES = "samples"  # int, on worker batches: samples fetched
ARG_RAISED = "raised"  # str, on a worker batch that raised: the exception's type
# int, on worker batches: ns the worker waited for a core, left out of the batch's length
ARG_WAITED_FOR_CORE = "waited_for_core_ns"

# Track names. Host threads are named by their thread; device tracks live in one
# process per device named DEVICE_PROCESS.format(index=..., preset=...).
DEVICE_PROCESS = "neuron:{index} ({preset})"
TRACK_KERNELS = "Kernels"
TRACK_COLLECTIVES = "Collectives"  # the device's collective queue (backend/distributed)
TRACK_UNCOUNTED = "Not counted (GC, recording)"  # host process: CAT_UNCOUNTED instants
ENGINES = ("tensor", "vector", "scalar", "gpsimd")  # the compute engines, in this order
ENGINE_DMA = "dma"  # every DMA queue as one engine (an instruction says "dma.<queue>")
ENGINE_TRACKS = {
    "tensor": "Tensor Engine",
    "vector": "Vector Engine",
    "scalar": "Scalar Engine",
    "gpsimd": "GpSimd Engine",
}
DMA_TRACK = "DMA q{queue}"
COUNTER_HBM = "HBM in use (bytes)"
COUNTER_SBUF = "SBUF occupancy (bytes)"
COUNTER_PSUM = "PSUM occupancy (bytes)"
COUNTER_UTIL = "{engine} utilisation (%)"

# Metadata keys (the JSON held by the CAT_METADATA instant).
META_HARDWARE = "hardware"  # preset name: trn1 | trn2 | trn3
META_HARDWARE_FIGURES = "hardware_figures"  # dict of the preset's peak figures
META_COMMAND = "command"
META_TORCH = "torch_version"
META_VERSION = "neuron_explorer_version"
META_START = "start_time_unix_ns"
META_LEVEL = "level"
LEVELS = ("framework", "op", "engine")  # META_LEVEL's values: each records more than the last
META_PID = "pid"
META_HOST_CPUS = "host_cpus"  # int: the cores the recorded process could run on
META_RANK = "rank"  # this process's rank in a distributed run
# A recording says at its start that it will end with a mark (true), and writes the mark
# (META_COMPLETE: true) when it closes: a trace that declares one and lacks it was cut
# short, however the process died (a SIGKILL between two flushes leaves whole packets).
META_END_MARK = "end_mark"
META_COMPLETE = "recording_complete"
# Written with the end mark when the program did not end well: its exit code, and the
# error that ended it ("RuntimeError: ... (train.py:12)"), if one did
META_EXIT_CODE = "exit_code"
META_PROGRAM_ERROR = "program_error"
META_WORLD_SIZE = "world_size"
# Set by the loader of a format whose op slices include framework ops that ran on the host
# (PyTorch-profiler cpu_ops), where ours are all ops dispatched to the device: true there.
META_HOST_OPS = "host_ops"

# Collectives (torch.distributed on neuron): one slice per collective on the device's
# TRACK_COLLECTIVES track, from this rank's arrival to the collective's end.
CAT_COLLECTIVE = "collective"
ARG_COLLECTIVE = "collective"  # str: all_reduce, all_gather_into_tensor, send, ...
ARG_GROUP = "group"  # str: the group's global ranks, "[0, 1, 2, 3]"
ARG_SEQ = "seq"  # int: the group's call number, the same on every rank
ARG_ALGORITHM = "algorithm"  # str: ring, tree, pairwise, p2p, local
ARG_WAIT_NS = "wait_ns"  # int: waiting for the group's last rank
ARG_HOST_WAIT_NS = "host_wait_ns"  # int: the host's wait in the call for the others' clocks
ARG_TRANSFER_NS = "transfer_ns"  # int: moving the data
ARG_RANK = "rank"  # int: global rank of the recorded process
META_HOST_CLOCK = "host_clock"  # {"source": "load-free" | "modelled" | "wall", costs...}
