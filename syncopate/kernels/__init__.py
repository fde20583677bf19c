"""The runtime: fused Triton kernels, communication backends, symmetric-memory contexts.

Public names (imported on first use; this package needs torch and triton):
:func:`all_gather_matmul`, :func:`matmul_reduce_scatter`, :func:`matmul_all_reduce`,
:func:`gather_buffer`, :func:`close_contexts` (:mod:`.ops`). What times these calls lives in
:mod:`syncopate.measure`, which imports this package and is never imported by it: a job runs the
ops without the measurement code.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "all_gather_matmul",
    "close_contexts",
    "gather_buffer",
    "matmul_all_reduce",
    "matmul_reduce_scatter",
]

_LAZY = dict.fromkeys(__all__, "syncopate.kernels.ops")


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'syncopate.kernels' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
