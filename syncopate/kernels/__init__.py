"""The runtime: fused Triton kernels, communication backends, symmetric-memory contexts.

Public names (imported on first use; this package needs torch and triton):
- :func:`all_gather_matmul`, :func:`matmul_reduce_scatter`, :func:`matmul_all_reduce`,
  :func:`gather_buffer`, :func:`close_contexts` (:mod:`.ops`);
- :class:`Harness` (:mod:`.harness`), used by the GPU workers and `syncopate bench`.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "Harness",
    "all_gather_matmul",
    "close_contexts",
    "gather_buffer",
    "matmul_all_reduce",
    "matmul_reduce_scatter",
]

_LAZY = {name: "syncopate.kernels.ops" for name in __all__ if name != "Harness"} | {
    "Harness": "syncopate.kernels.harness"
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'syncopate.kernels' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
