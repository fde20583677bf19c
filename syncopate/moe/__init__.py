"""Mixture-of-experts layers under expert parallelism (EP): the `a2a_gemm` (dispatch) and
`gemm_a2a` (combine) ops, unfused (torch's all-to-all and a grouped GEMM) or pipelined (the
all-to-all cut into pieces overlapped with the grouped GEMM), and `MoELayer` on them.

- :mod:`syncopate.moe.routing`: routings (drawn from a `RoutingSpec` or computed by a router) and
  the tables the all-to-alls and the grouped GEMM need;
- :mod:`syncopate.moe.ops`: `exchange_layout`, `dispatch_gemm`, `gemm_combine`, `grouped_mm`;
  `config=` a `MoeCandidate` (`syncopate.search_space.moe_workload`; `moe_space` lists a search's);
- :mod:`syncopate.moe.plan`: the pipelined plans' piece tables; :mod:`syncopate.moe.pipelined`
  runs them, :mod:`syncopate.moe.exchange` moves their rows (`nccl`, `copy_engine`);
- :mod:`syncopate.moe.layer`: `MoELayer`, a router and SwiGLU experts, with autograd.

See docs/moe.md.
"""

from syncopate.moe.exchange import close_moe_contexts
from syncopate.moe.layer import MoELayer
from syncopate.moe.ops import all_to_all_rows, dispatch_gemm, exchange_layout, gemm_combine, grouped_mm
from syncopate.moe.plan import PiecePlan, build_piece_plan
from syncopate.moe.routing import ExpertLayout, Routing, draw_routing, expert_counts, expert_layout, inverse
from syncopate.search_space.moe_workload import MoeCandidate, check_moe_candidate, moe_space

__all__ = [
    "ExpertLayout",
    "MoELayer",
    "MoeCandidate",
    "PiecePlan",
    "Routing",
    "all_to_all_rows",
    "build_piece_plan",
    "check_moe_candidate",
    "close_moe_contexts",
    "dispatch_gemm",
    "draw_routing",
    "exchange_layout",
    "expert_counts",
    "expert_layout",
    "gemm_combine",
    "grouped_mm",
    "inverse",
    "moe_space",
]
