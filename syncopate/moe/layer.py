"""`MoELayer`: a mixture-of-experts MLP under expert parallelism, on the unfused MoE ops.

Each rank holds the router's gate (replicated: its gradient is this rank's tokens' share, to be
summed over the data-parallel ranks as any replicated weight's) and its El = E / ws experts:
W1 [El, H, 2F] (each expert's gate projection in columns [0, F), its up projection in [F, 2F)) and
W2 [El, F, H]. Forward on this rank's tokens x [T, H]:

    probs = softmax(scores)              scores given, or x @ gate.T
    weights, ids = top_k(probs); weights /= weights.sum(-1)
    layout = exchange_layout(ids)        one all-gather of counts, the host's one wait
    h = dispatch_gemm(x, W1)             a2a_gemm
    out = gemm_combine(swiglu(h), W2, weights)   gemm_a2a; swiglu(h) = silu(h[:, :F]) * h[:, F:]

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

Each op's plan is looked up on its own, and a plan that is fastest alone can make the layer slower
(its host work, its meetings with the peers, what it leaves in the caches). So a tuned layer whose
lookup serves a plan other than unfused (`check_plans=None`, the default; `True` checks configured
plans too, `False` never checks) times those plans against the unfused ops on its first calls with
each token count and plans, as the job makes them:
CHECK_WARMUP calls of each, then CHECK_SAMPLES of each, alternating, each call's forward and, once
autograd runs it, its backward (CUDA events on the caller's stream; the wall clock on the CPU).
The next call with that token count takes the medians over the ranks' slowest (one all-reduce,
the same call on every rank) and keeps the faster of the two for every later call (logged at
INFO; `choices` holds the figures). Without backwards (inference, or any rank's sampled calls
without one) the forwards decide. A CUDA graph being captured takes the plans
unsampled. Every call of a group's ranks must be made in the same order, as for any collective.
"""

from __future__ import annotations

import logging
import math
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from syncopate.errors import ConfigError, SyncopateError
from syncopate.moe.ops import check_backward, dispatch_gemm, exchange_layout, gemm_combine, swiglu
from syncopate.results_db.urls import ENV_VAR as DB_VAR
from syncopate.search_space import Topology
from syncopate.search_space.moe_workload import MoeCandidate, MoeWorkload, RoutingSpec

__all__ = ["CHECK_SAMPLES", "CHECK_WARMUP", "PHASES", "MoELayer"]

log = logging.getLogger(__name__)

CHECK_WARMUP = 1
"""Calls of each plan a tuned layer makes before it times them (their first calls compile and
prepare; module docstring)."""
CHECK_SAMPLES = 3
"""Timed calls of each, the plans and unfused, before a layer keeps the faster."""

UNFUSED: tuple[None, None] = (None, None)

PHASES: tuple[str, ...] = ("route", "layout", "dispatch", "act", "combine")
"""The phases of a forward that `MoELayer.forward`'s `stamp` marks, in order: the router's top-k,
the routing's layout (the counts' all-gather and the host's wait for them), the dispatch op,
the experts' activation, the combine op."""


class _Clock:
    """Stamps on this device's timeline: CUDA events on the caller's stream, else the wall clock
    (the CPU runs the ops as they are called)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def stamp(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def us(self, start, end) -> float:
        if not self.cuda:
            return (end - start) * 1e6
        end.synchronize()
        return start.elapsed_time(end) * 1e3


class _Sample:
    """One sampled call's stamps: forward start and end, backward start and end (autograd's)."""

    def __init__(self, plan: int, clock: _Clock) -> None:
        self.plan, self.clock = plan, clock
        self.forward: tuple[Any, Any] | None = None
        self.backward_start = self.backward_end = None

    def times(self) -> tuple[float, float | None]:
        """(forward µs, backward µs or None where autograd has not run this call's backward)."""
        fwd = self.clock.us(*self.forward)
        if self.backward_start is None or self.backward_end is None:
            return fwd, None
        return fwd, self.clock.us(self.backward_start, self.backward_end)


class _Stamp(torch.autograd.Function):
    """The identity, whose backward stamps `sample`'s `field` (the layer's backward starts at its
    output's gradient and ends at its input's)."""

    @staticmethod
    def forward(ctx, x, sample, field):
        ctx.sample, ctx.field = sample, field
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        setattr(ctx.sample, ctx.field, ctx.sample.clock.stamp())
        return grad, None, None


class _PlanCheck:
    """A layer's plans against the unfused ops at one token count and plans (module
    docstring): which plan each sampling call runs, its stamps, and the choice."""

    def __init__(self, looked_up: tuple[Any, Any], clock: _Clock) -> None:
        self.plans = (looked_up, UNFUSED)
        self.clock = clock
        self.calls = 0
        self.samples: list[_Sample] = []
        self.chosen: tuple[Any, Any] | None = None
        self.figures: dict[str, Any] = {}

    def next_sample(self) -> _Sample | None:
        """The sample this call records (its plan alternating), or None once every sampling call
        has been made (the caller then decides)."""
        if self.calls >= 2 * (CHECK_WARMUP + CHECK_SAMPLES):
            return None
        sample = _Sample(self.calls % 2, self.clock)
        self.calls += 1
        if self.calls > 2 * CHECK_WARMUP:
            self.samples.append(sample)
        return sample

    def decide(self, group) -> tuple[Any, Any]:
        """The faster plan by the medians of the sampled calls, the slowest rank's (one all-reduce
        on every rank alike); the forwards alone where any rank lacks a sampled backward."""
        from syncopate.kernels.ranks import slowest

        local = []
        missing = 0.0
        for plan in range(2):
            times = [s.times() for s in self.samples if s.plan == plan]
            local.append(statistics.median(t[0] for t in times))
            backwards = [t[1] for t in times if t[1] is not None]
            missing = max(missing, float(len(backwards) < len(times)))
            local.append(statistics.median(backwards) if backwards else 0.0)
        device = "cuda" if self.clock.cuda else "cpu"
        fwd_plan, bwd_plan, fwd_unfused, bwd_unfused, missing = slowest([*local, missing], group, device)
        with_backward = missing == 0.0
        plan_us = fwd_plan + (bwd_plan if with_backward else 0.0)
        unfused_us = fwd_unfused + (bwd_unfused if with_backward else 0.0)
        keep = plan_us < unfused_us and math.isfinite(plan_us)
        self.chosen = self.plans[0] if keep else UNFUSED
        self.figures = {
            "plans_us": plan_us,
            "unfused_us": unfused_us,
            "timed": "forward + backward" if with_backward else "forward",
            "kept": "plans" if keep else "unfused",
        }
        self.samples = []
        return self.chosen


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
        check_plans: bool | None = None,
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
        self.check_plans = check_plans
        """Whether the plans are timed against unfused before they are kept (None: a tuned layer's)."""
        self._checks: dict[tuple[int, tuple[Any, Any]], _PlanCheck] = {}
        self._dtype = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}.get(
            dtype, "bf16"
        )
        self.reset_parameters()

    @property
    def choices(self) -> dict[int, dict[str, Any]]:
        """Token count → what the check of its plans against unfused found (`check_plans`): each
        one's median µs (the slowest rank's), what was timed, which is kept; of the plans the layer
        has now (a configured layer's plans may have been set anew since)."""
        return {
            t: dict(c.figures)
            for (t, plans), c in self._checks.items()
            if c.figures and plans == self._looked_up(t)
        }

    def _plans(
        self, tokens: int, x: torch.Tensor
    ) -> tuple[MoeCandidate | None, MoeCandidate | None, _Sample | None]:
        """The (dispatch, combine) plans of a call on `tokens` tokens (module docstring), and the
        sample this call records where the plans are being checked."""
        looked_up = self._looked_up(tokens)
        checking = self.tuned if self.check_plans is None else self.check_plans
        if not checking or all(p is None or p.template == "unfused" for p in looked_up):
            return (*looked_up, None)
        check = self._checks.get((tokens, looked_up))
        if check is None:
            check = self._checks[tokens, looked_up] = _PlanCheck(looked_up, _Clock(x.device))
        if check.chosen is not None:
            return (*check.chosen, None)
        if x.is_cuda and torch.cuda.is_current_stream_capturing():
            return (*looked_up, None)
        sample = check.next_sample()
        if sample is None:
            chosen = check.decide(self.group)
            log.info(
                "MoELayer at %d tokens: plans %s + %s %.1f us, unfused %.1f us (%s, the slowest "
                "rank's medians): keeping %s",
                tokens,
                *(p.short() if p is not None else "unfused" for p in looked_up),
                check.figures["plans_us"],
                check.figures["unfused_us"],
                check.figures["timed"],
                check.figures["kept"],
            )
            return (*chosen, None)
        return (*check.plans[sample.plan], sample)

    def _looked_up(self, tokens: int) -> tuple[MoeCandidate | None, MoeCandidate | None]:
        """The configured plans, or for a tuned layer the database's (module docstring)."""
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

    def forward(
        self,
        x: torch.Tensor,
        scores: torch.Tensor | None = None,
        *,
        stamp: Callable[[str], None] | None = None,
    ) -> torch.Tensor:
        """The layer on this rank's tokens x [T, H] (`scores` [T, E]: the router's, given). `stamp`,
        where given, is called with each of `PHASES` as that phase has been enqueued (a profile of
        the layer's host and device time per phase: `benchmarks/moe_bench.py --phases`)."""
        if x.dim() != 2 or x.shape[1] != self.hidden:
            raise ConfigError(f"x has shape {tuple(x.shape)}: expected [tokens, {self.hidden}]")
        mark = stamp or (lambda phase: None)
        dispatch, combine, sample = self._plans(x.shape[0], x)
        if sample is not None:
            start = sample.clock.stamp()
            if torch.is_grad_enabled() and x.requires_grad:
                x = _Stamp.apply(x, sample, "backward_end")
        ids, weights = self.route(x, scores)
        mark("route")
        dedup = any(p is not None and p.template in ("dedup", "fused_dedup") for p in (dispatch, combine))
        layout = exchange_layout(ids, self.experts, self.group, dedup=dedup)
        mark("layout")
        h = dispatch_gemm(x, self.w1, layout, self.group, config=dispatch, backward=self.backward)
        mark("dispatch")
        act = swiglu(h, self.ffn)
        mark("act")
        y = gemm_combine(act, self.w2, weights, layout, self.group, config=combine, backward=self.backward)
        mark("combine")
        if sample is not None:
            sample.forward = (start, sample.clock.stamp())
            if y.requires_grad:
                y = _Stamp.apply(y, sample, "backward_start")
        return y
