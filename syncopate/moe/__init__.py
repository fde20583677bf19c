"""Mixture-of-experts layers under expert parallelism (EP): the `a2a_gemm` (dispatch) and
`gemm_a2a` (combine) ops, unfused (torch's all-to-all and a grouped GEMM), and `MoELayer` on them.

- :mod:`syncopate.moe.routing`: routings (drawn from a `RoutingSpec` or computed by a router) and
  the tables the all-to-alls and the grouped GEMM need;
- :mod:`syncopate.moe.ops`: `exchange_layout`, `dispatch_gemm`, `gemm_combine`, `grouped_mm`;
- :mod:`syncopate.moe.layer`: `MoELayer`, a router and SwiGLU experts, with autograd.

See docs/moe.md.
"""

from syncopate.moe.layer import MoELayer
from syncopate.moe.ops import all_to_all_rows, dispatch_gemm, exchange_layout, gemm_combine, grouped_mm
from syncopate.moe.routing import ExpertLayout, Routing, draw_routing, expert_counts, expert_layout, inverse

__all__ = [
    "ExpertLayout",
    "MoELayer",
    "Routing",
    "all_to_all_rows",
    "dispatch_gemm",
    "draw_routing",
    "exchange_layout",
    "expert_counts",
    "expert_layout",
    "gemm_combine",
    "grouped_mm",
    "inverse",
]
