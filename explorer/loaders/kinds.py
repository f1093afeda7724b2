"""What each slice of one of our traces is (`kind`): its category (docs/trace-format.md).

PyTorch-profiler (Kineto) traces map their own categories onto the same kinds in
`loaders/kineto.py`.
"""

from __future__ import annotations

import re

from neuron_explorer.common import trace_format as tf

OUR_KINDS = {
    tf.CAT_STEP, tf.CAT_MODULE, tf.CAT_BACKWARD, tf.CAT_OPTIMIZER, tf.CAT_OP, tf.CAT_KERNEL,
    tf.CAT_INSTRUCTION, tf.CAT_DMA, tf.CAT_SYNC, tf.CAT_DATALOADER, tf.CAT_COMPILE,
    tf.CAT_GRAPH_BREAK, tf.CAT_RECOMPILE, tf.CAT_ANNOTATION, tf.CAT_METADATA, tf.CAT_COLLECTIVE,
    tf.CAT_DATALOADER_WORKER,
}
DEVICE_PROCESS_NAME = re.compile(r"^neuron:(\d+)\b")

# Kinds: step module backward optimizer op kernel memcpy memset instruction dma runtime
# sync device_sync dataloader compile graph_break recompile annotation python metadata other


def our_kind(category: str) -> str:
    """Kind of a slice in one of our traces."""
    return category if category in OUR_KINDS else "other"
