"""The c10d ops a Python process group cannot override, implemented for `neuron` tensors.

torch.distributed reaches a Python backend through the methods its C++ trampoline
forwards (allreduce, allgather, broadcast, ...). `all_gather_into_tensor`,
`reduce_scatter_tensor` (which FSDP2 and DTensor use), `scatter` (DTensor's
`distribute_tensor`), `gather`, `reduce` and the ops this backend does not support go
through the c10d dispatcher ops instead: their PrivateUse1 kernels are
replaced here, so the former reach `ProcessGroupNeuron` and the latter fail with one
clear message naming the op instead of an error from deep inside c10d.
"""

from __future__ import annotations

import collections
import contextlib
import warnings

import torch

_libraries: list[torch.library.Library] = []
# Works handed to C++ as boxed objects: their Python side (whose `wait` makes the stream
# wait) must outlive the call, or C++ falls back to a base Work that never completes.
_recent_works: collections.deque = collections.deque(maxlen=4096)

# c10d op -> the user-facing name of the collective this backend does not run
_UNSUPPORTED = {
    "alltoall_": "all_to_all",
    "allgather_coalesced_": "all_gather_coalesced",
    "recv_any_source_": "recv from any source",
}


def _backend(process_group):
    import torch.distributed as dist
    from neuron_explorer.backend.distributed.process_group import (
        CollectiveError,
        ProcessGroupNeuron,
    )

    if isinstance(process_group, torch.ScriptObject):
        process_group = dist.ProcessGroup.unbox(process_group)
    if isinstance(process_group, ProcessGroupNeuron):
        return process_group  # the wrapper group handed the op to this backend
    try:
        backend = process_group._get_backend(torch.device("neuron"))
    except RuntimeError:
        backend = None
    if not isinstance(backend, ProcessGroupNeuron):
        raise CollectiveError("neuron tensors in a collective of a process group without the "
                              "neuron backend: use init_process_group('neuron') or "
                              "'cpu:gloo,neuron:neuron'")
    return backend


def _allgather_base(output, input, process_group, async_op=True, timeout=-1):
    work = _backend(process_group).all_gather_into_tensor(output, input)
    _recent_works.append(work)
    return output, work.boxed()


def _reduce_scatter_base(output, input, process_group, reduce_op, async_op=True, timeout=-1):
    work = _backend(process_group).reduce_scatter_tensor(output, input, _reduce_op(reduce_op))
    _recent_works.append(work)
    return output, work.boxed()


def _reduce_op(reduce_op):
    import torch.distributed as dist

    if isinstance(reduce_op, torch.ScriptObject):  # the boxed ReduceOp: op() is its type
        # a method of the boxed class, which ScriptObject's stub cannot list
        return dist.ReduceOp.RedOpType(reduce_op.op())  # type: ignore[attr-defined]
    return reduce_op


def _scatter(outputs, input_lists, process_group, root_rank, async_op=True, timeout=-1):
    work = _backend(process_group).scatter_tensors(outputs, input_lists, root_rank)
    _recent_works.append(work)
    return outputs, work.boxed()


def _gather(output_lists, inputs, process_group, root_rank, async_op=True, timeout=-1):
    work = _backend(process_group).gather_tensors(output_lists, inputs, root_rank)
    _recent_works.append(work)
    return work.boxed()


def _reduce(tensors, process_group, reduce_op, root_rank, root_tensor, async_op=True,
            timeout=-1):
    work = _backend(process_group).reduce_tensors(tensors, _reduce_op(reduce_op), root_rank)
    _recent_works.append(work)
    return work.boxed()


def _unsupported(name: str):
    def fail(*args, **kwargs):
        from neuron_explorer.backend.distributed.process_group import CollectiveError

        raise CollectiveError(f"{name} is not supported by the neuron collective backend "
                              "(supported: all_reduce, broadcast, all_gather, "
                              "all_gather_into_tensor, reduce_scatter_tensor, "
                              "all_to_all_single, send, recv, barrier)")
    return fail


def register() -> None:
    """Install the PrivateUse1 kernels (replacing c10d's defaults, which would fail)."""
    lib = torch.library.Library("c10d", "IMPL")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "overriding a previously registered kernel"
        lib.impl("_allgather_base_", _allgather_base, "PrivateUse1")
        lib.impl("_reduce_scatter_base_", _reduce_scatter_base, "PrivateUse1")
        lib.impl("scatter_", _scatter, "PrivateUse1")
        lib.impl("gather_", _gather, "PrivateUse1")
        lib.impl("reduce_", _reduce, "PrivateUse1")
        for op, name in _UNSUPPORTED.items():
            with contextlib.suppress(RuntimeError):  # an op this torch does not have
                lib.impl(op, _unsupported(name), "PrivateUse1")
    _libraries.append(lib)
