"""Mixture-of-experts layers under expert parallelism (EP): the `a2a_gemm` (dispatch) and
`gemm_a2a` (combine) ops, unfused (torch's all-to-all and a grouped GEMM), pipelined (the
all-to-all cut into pieces overlapped with the grouped GEMM), fused (the same pieces consumed or
produced tile by tile by one persistent Triton grouped GEMM) or dedup (a token's row moved once a
rank: by torch's all-to-all, or in pieces beside the grouped GEMMs on the copy engine), and
`MoELayer` on them.

- :mod:`syncopate.moe.routing`: routings (drawn from a `RoutingSpec` or computed by a router) and
  the tables the all-to-alls and the grouped GEMM need;
- :mod:`syncopate.moe.ops`: `exchange_layout`, `dispatch_gemm`, `gemm_combine`, `grouped_mm`;
  `config=` a `MoeCandidate` (`syncopate.search_space.moe_workload`; `moe_space` lists a search's);
- :mod:`syncopate.moe.plan`: the pipelined plans' piece tables; :mod:`syncopate.moe.pipelined`
  runs them, :mod:`syncopate.moe.exchange` moves their rows (`nccl`, `copy_engine`,
  `nvshmem`);
  :mod:`syncopate.moe.fused` runs the fused plans on :mod:`syncopate.moe.kernels`;
  :mod:`syncopate.moe.dedup` the `dedup` template (a token's row sent once a rank), and
  :mod:`syncopate.moe.dedup_pipelined` its pieces on the copy engine;
- :mod:`syncopate.moe.layer`: `MoELayer`, a router and SwiGLU experts, with autograd.

See docs/moe.md.
"""

from __future__ import annotations

from typing import Any

_LAZY = {
    "close_moe_contexts": "syncopate.moe.exchange",
    "MoeLookupResult": "syncopate.results_db.moe_lookups",
    "clear_moe_cache": "syncopate.results_db.moe_lookups",
    "lookup_moe": "syncopate.results_db.moe_lookups",
    "MoELayer": "syncopate.moe.layer",
    "all_to_all_rows": "syncopate.moe.ops",
    "dispatch_gemm": "syncopate.moe.ops",
    "exchange_layout": "syncopate.moe.ops",
    "gemm_combine": "syncopate.moe.ops",
    "grouped_mm": "syncopate.moe.ops",
    "swiglu": "syncopate.moe.ops",
    "PiecePlan": "syncopate.moe.plan",
    "build_piece_plan": "syncopate.moe.plan",
    "ExpertLayout": "syncopate.moe.routing",
    "Routing": "syncopate.moe.routing",
    "draw_routing": "syncopate.moe.routing",
    "expert_counts": "syncopate.moe.routing",
    "expert_layout": "syncopate.moe.routing",
    "inverse": "syncopate.moe.routing",
    "MoeCandidate": "syncopate.search_space.moe_workload",
    "check_moe_candidate": "syncopate.search_space.moe_workload",
    "moe_space": "syncopate.search_space.moe_workload",
}
"""Public name → the module that defines it, imported on first use: `syncopate.moe.bench_config`
and the search values load without torch."""

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'syncopate.moe' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later accesses skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
