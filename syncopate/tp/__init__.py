"""Tensor parallelism on Syncopate's fused ops.

- :mod:`syncopate.tp.layers`: Megatron-style layers (`ColumnParallelLinear`, `RowParallelLinear`)
  and the functions under them (`all_gather_linear`, `linear_reduce_scatter`, ...), with autograd;
- :mod:`syncopate.tp.styles`: `ColwiseParallel`, `RowwiseParallel`, `PrepareModuleInput` and
  `SequenceParallel` for torch's `parallelize_module`, drop-in for torch's own in a plan
  (docs/tp.md);
- :mod:`syncopate.tp.float8`: FP8 training in both (`float8=True`): every GEMM on FP8 operands
  scaled row-wise along its contracted dimension, as torchao's float8 "rowwise" recipe;
- :mod:`syncopate.tp.bench`: `syncopate bench --layer`, a layer timed as a job runs it, against
  torch's paths.
"""

from syncopate.tp.layers import (
    IMPLS,
    KINDS,
    ColumnParallelLinear,
    RowParallelLinear,
    all_gather_linear,
    linear_all_reduce,
    linear_all_reduce_grad,
    linear_reduce_scatter,
    sync_sequence_parallel_grads,
)
from syncopate.tp.styles import ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel

__all__ = [
    "IMPLS",
    "KINDS",
    "ColumnParallelLinear",
    "ColwiseParallel",
    "PrepareModuleInput",
    "RowParallelLinear",
    "RowwiseParallel",
    "SequenceParallel",
    "all_gather_linear",
    "linear_all_reduce",
    "linear_all_reduce_grad",
    "linear_reduce_scatter",
    "sync_sequence_parallel_grads",
]
