"""Tensor parallelism on Syncopate's fused ops.

- :mod:`syncopate.tp.layers`: Megatron-style layers (`ColumnParallelLinear`, `RowParallelLinear`)
  and the functions under them (`all_gather_linear`, `linear_reduce_scatter`, ...), with autograd.
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

__all__ = [
    "IMPLS",
    "KINDS",
    "ColumnParallelLinear",
    "RowParallelLinear",
    "all_gather_linear",
    "linear_all_reduce",
    "linear_all_reduce_grad",
    "linear_reduce_scatter",
    "sync_sequence_parallel_grads",
]
