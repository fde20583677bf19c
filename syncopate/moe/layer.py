"""`MoELayer`: a mixture-of-experts MLP under expert parallelism, on the unfused MoE ops.

Each rank holds the router's gate (replicated: its gradient is this rank's tokens' share, to be
summed over the data-parallel ranks as any replicated weight's) and its El = E / ws experts:
W1 [El, H, 2F] (each expert's gate projection in columns [0, F), its up projection in [F, 2F)) and
W2 [El, F, H]. Forward on this rank's tokens x [T, H]:

    probs = softmax(scores)              scores given, or x @ gate.T
    weights, ids = top_k(probs); weights /= weights.sum(-1)
    layout = exchange_layout(ids)        one all-gather of counts, the host's one wait
    h = dispatch_gemm(x, W1)             a2a_gemm
    out = gemm_combine(silu(h[:, :F]) * h[:, F:], W2, weights)   gemm_a2a

Gradients reach x, W1, W2, the gate (or the given scores) through the all-to-alls' reverse
all-to-alls; every rank of the group must run backward. `config=` (a `MoeCandidate`, the same on
every rank) picks the plan of both ops; `dispatch_config` and `combine_config` may differ, since
both keep h in the unfused layout. `backward="unfused"` runs the backward of pipelined or fused
plans as the unfused ops' (torch's all-to-all and one grouped GEMM a transfer) instead of the
other op's pipelined plan; the gradients are the same.

Without `config=`, where a results database is configured (SYNCOPATE_DB), each op's plan is the
one :func:`~syncopate.results_db.moe_lookups.lookup_moe` serves for this rank's token count, the layer's
shapes and dtype and `routing` (uniform by default; the `nearest_tokens` rung does not look at
the seed), on `topology` (detected where None), looked up at the first call with that token
count and kept; where the lookup cannot answer (no topology detected, a database it cannot read)
the ops run unfused, as without a database. The ranks of a group read the same database and must
call with the same token count, so that they pick the same plan.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from syncopate.errors import ConfigError, SyncopateError
from syncopate.moe.ops import check_backward, dispatch_gemm, exchange_layout, gemm_combine
from syncopate.results_db.urls import ENV_VAR as DB_VAR
from syncopate.search_space import Topology
from syncopate.search_space.moe_workload import MoeCandidate, MoeWorkload, RoutingSpec

__all__ = ["MoELayer"]

log = logging.getLogger(__name__)


class MoELayer(nn.Module):
    """A top-k routed SwiGLU MoE layer whose experts are spread over `group` (module docstring)."""

    def __init__(
        self,
        *,
        hidden: int,
        ffn: int,
        experts: int,
        top_k: int,
        group,
        router: bool = True,
        dtype: torch.dtype = torch.bfloat16,
        device: torch.device | str | None = None,
        config: MoeCandidate | None = None,
        topology: Topology | str | None = None,
        routing: RoutingSpec | None = None,
        backward: str = "plan",
    ) -> None:
        super().__init__()
        import torch.distributed as dist

        ws = dist.get_world_size(group)
        if experts % ws:
            raise ConfigError(
                f"experts={experts} is not divisible by the group's {ws} ranks: experts are spread evenly"
            )
        if not 1 <= top_k <= experts:
            raise ConfigError(f"top_k={top_k} must be between 1 and experts={experts}")
        self.hidden, self.ffn, self.experts, self.top_k, self.group = hidden, ffn, experts, top_k, group
        local = experts // ws
        kw = {"dtype": dtype, "device": device}
        self.gate = nn.Parameter(torch.empty(experts, hidden, **kw)) if router else None
        self.w1 = nn.Parameter(torch.empty(local, hidden, 2 * ffn, **kw))
        self.w2 = nn.Parameter(torch.empty(local, ffn, hidden, **kw))
        self.dispatch_config: MoeCandidate | None = config
        """The plan of the dispatch op (`a2a_gemm`); None: unfused."""
        self.combine_config: MoeCandidate | None = config
        """The plan of the combine op (`gemm_a2a`); None: unfused."""
        self.backward = check_backward(backward)
        """What the ops' backward runs where their plan is pipelined or fused (`syncopate.moe.ops.BACKWARDS`)."""
        self.tuned = config is None and bool(os.environ.get(DB_VAR))
        """Whether the plans are looked up in the results database (module docstring)."""
        self.topology, self.routing = topology, routing or RoutingSpec()
        self.lookups: dict[int, tuple[Any, Any]] = {}
        """Token count → the (dispatch, combine) lookup results (tuned layers only)."""
        self._dtype = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}.get(
            dtype, "bf16"
        )
        self.reset_parameters()

    def _plans(self, tokens: int) -> tuple[MoeCandidate | None, MoeCandidate | None]:
        """The (dispatch, combine) plans of a call on `tokens` tokens (module docstring)."""
        if not self.tuned:
            return self.dispatch_config, self.combine_config
        found = self.lookups.get(tokens)
        if found is None:
            from syncopate.results_db.moe_lookups import lookup_moe

            try:
                found = tuple(
                    lookup_moe(
                        MoeWorkload(
                            kind=kind,
                            tokens=tokens,
                            hidden=self.hidden,
                            ffn=self.ffn,
                            experts=self.experts,
                            top_k=self.top_k,
                            routing=self.routing,
                            dtype=self._dtype,
                        ),
                        self.topology,
                    )
                    for kind in ("a2a_gemm", "gemm_a2a")
                )
            except (SyncopateError, OSError) as e:
                log.warning("MoELayer: no configuration looked up (%s): the ops run unfused", e)
                found = (None, None)
            self.lookups[tokens] = found
        return tuple(None if r is None else r.candidate for r in found)

    def reset_parameters(self) -> None:
        for p in (self.gate, self.w1, self.w2):
            if p is not None:
                nn.init.normal_(p, std=p.shape[-2] ** -0.5)

    def route(self, x: torch.Tensor, scores: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Each token's top_k expert ids and gate weights (renormalised to sum to 1, float32)."""
        if scores is None:
            if self.gate is None:
                raise ConfigError(
                    "this MoELayer has no router (router=False): pass scores= [tokens, experts]"
                )
            scores = x @ self.gate.t()
        if tuple(scores.shape) != (x.shape[0], self.experts):
            raise ConfigError(
                f"scores have shape {tuple(scores.shape)}: expected [{x.shape[0]}, {self.experts}]"
            )
        probs = torch.softmax(scores.float(), dim=-1)
        weights, ids = probs.topk(self.top_k, dim=-1)
        return ids, weights / weights.sum(-1, keepdim=True)

    def forward(self, x: torch.Tensor, scores: torch.Tensor | None = None) -> torch.Tensor:
        if x.dim() != 2 or x.shape[1] != self.hidden:
            raise ConfigError(f"x has shape {tuple(x.shape)}: expected [tokens, {self.hidden}]")
        ids, weights = self.route(x, scores)
        layout = exchange_layout(ids, self.experts, self.group)
        dispatch, combine = self._plans(x.shape[0])
        h = dispatch_gemm(x, self.w1, layout, self.group, config=dispatch, backward=self.backward)
        act = F.silu(h[:, : self.ffn]) * h[:, self.ffn :]
        return gemm_combine(act, self.w2, weights, layout, self.group, config=combine, backward=self.backward)
