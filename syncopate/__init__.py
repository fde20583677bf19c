"""Syncopate: schedule-search autotuner for chunk-centric compute-communication overlap.

Public API (every name but the errors is imported on first use, so `import syncopate` stays light:
no torch, and nothing a command line that only reads the database does not need):

- :func:`lookup` — the best known configuration for a shape and topology, at job start;
- :class:`Topology`, :class:`Shape`, :class:`Workload`, :class:`Candidate`, and :func:`detect_topology`
  (the topology of this machine or process group);
- the fused ops :func:`all_gather_matmul`, :func:`matmul_reduce_scatter`, :func:`matmul_all_reduce`;
- :func:`use_nvshmem` — NVSHMEM symmetric memory for this process (backend `nvshmem`; opt-in,
  before the first fused call: torch async-TP does not run in such a process).
- :mod:`syncopate.tp`: tensor-parallel linear layers on the fused ops, with autograd.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from syncopate.errors import ConfigError, DatabaseError, SchemaError, SyncopateError
from syncopate.version import __version__

__all__ = [
    "Candidate",
    "ConfigError",
    "DatabaseError",
    "LookupResult",
    "SchemaError",
    "Shape",
    "SyncopateError",
    "Topology",
    "Workload",
    "__version__",
    "all_gather_matmul",
    "close_contexts",
    "detect_topology",
    "gather_buffer",
    "get_launch",
    "get_mode",
    "launch_choices",
    "launch_report",
    "lookup",
    "matmul_all_reduce",
    "matmul_reduce_scatter",
    "mode",
    "set_launch",
    "set_mode",
    "use_nvshmem",
]

_LAZY: dict[str, str] = {
    "Candidate": "syncopate.search_space",
    "Shape": "syncopate.search_space",
    "Topology": "syncopate.search_space",
    "Workload": "syncopate.search_space",
    "detect_topology": "syncopate.platform",
    "lookup": "syncopate.results_db.lookups",
    "LookupResult": "syncopate.results_db.lookups",
    "all_gather_matmul": "syncopate.kernels.ops",
    "matmul_reduce_scatter": "syncopate.kernels.ops",
    "matmul_all_reduce": "syncopate.kernels.ops",
    "gather_buffer": "syncopate.kernels.ops",
    "close_contexts": "syncopate.kernels.ops",
    "set_mode": "syncopate.kernels.ops",
    "set_launch": "syncopate.kernels.ops",
    "get_launch": "syncopate.kernels.ops",
    "launch_choices": "syncopate.kernels.ops",
    "launch_report": "syncopate.kernels.ops",
    "get_mode": "syncopate.kernels.ops",
    "mode": "syncopate.kernels.ops",
    "use_nvshmem": "syncopate.kernels.symmetric_memory",
}


if TYPE_CHECKING:
    from syncopate.search_space import Candidate, Shape, Topology, Workload


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'syncopate' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later accesses skip this function
    return value
