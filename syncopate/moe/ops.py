"""The MoE ops under expert parallelism, unfused: torch's all-to-all and a grouped GEMM in sequence.

- `exchange_layout(ids, experts, group)`: ids [T, top_k] → this rank's `ExpertLayout` (one
  all-to-all of counts);
- `dispatch_gemm(x, w1, layout, group)` (`a2a_gemm`): x [T, H], W1 [El, H, N] → h [R, N], rows
  grouped by local expert;
- `gemm_combine(h, w2, weights, layout, group)` (`gemm_a2a`): h [R, F], W2 [El, F, H], gate weights
  [T, top_k] → out [T, H].

R is the rows the routing sends to this rank's El experts; N is 2F for a SwiGLU expert (gate and
up projections side by side). Both ops carry autograd (the all-to-all's backward is the reverse
all-to-all), so a layer trains through them; with `out=` the result is written there instead.
The fused plans will serve the same calls.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from syncopate.errors import ConfigError
from syncopate.moe.routing import ExpertLayout, check_ids, expert_counts, expert_layout

__all__ = [
    "all_to_all_rows",
    "dispatch_gemm",
    "exchange_layout",
    "gemm_combine",
    "grouped_mm",
    "uses_grouped_mm",
]


def uses_grouped_mm(a: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether `grouped_mm` runs `torch._grouped_mm`: bf16 operands whose row strides are multiples
    of 16 bytes, on a GPU of compute capability 9.0 or newer (its constraints on CUDA) or the CPU
    builds that have it; else a matmul loop."""
    return (
        hasattr(torch, "_grouped_mm")
        and (a.device.type != "cuda" or torch.cuda.get_device_capability(a.device) >= (9, 0))
        and a.dtype == torch.bfloat16
        and w.dtype == torch.bfloat16
        and a.shape[1] % 8 == 0
        and w.shape[2] % 8 == 0
    )


def grouped_mm(a: torch.Tensor, w: torch.Tensor, group_sizes: torch.Tensor) -> torch.Tensor:
    """[R, K] rows grouped by expert (`group_sizes[e]` rows of expert e, in order) times each
    expert's W[e] ([G, K, N]): [R, N] in a's dtype. Experts with no rows are skipped."""
    if a.shape[1] != w.shape[1] or group_sizes.numel() != w.shape[0]:
        raise ConfigError(
            f"grouped GEMM of rows {tuple(a.shape)} with weights {tuple(w.shape)} in {group_sizes.numel()} "
            "groups: expected rows [R, K], weights [groups, K, N]"
        )
    if uses_grouped_mm(a, w):
        offs = torch.cumsum(group_sizes.to(device=a.device), 0).to(torch.int32)
        return torch._grouped_mm(a.contiguous(), w.contiguous(), offs=offs)
    parts, start = [], 0
    for e, rows in enumerate(group_sizes.tolist()):
        if rows:
            parts.append(a[start : start + rows] @ w[e])
        start += rows
    if not parts:
        return a.new_empty((0, w.shape[2]))
    return torch.cat(parts)


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group):
        ctx.splits, ctx.group = (out_splits, in_splits), group
        out = x.new_empty((sum(out_splits), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        out_splits, in_splits = ctx.splits
        gx = grad.new_empty((sum(in_splits), *grad.shape[1:]))
        dist.all_to_all_single(gx, grad.contiguous(), in_splits, out_splits, group=ctx.group)
        return gx, None, None, None


def all_to_all_rows(x: torch.Tensor, out_splits: list[int], in_splits: list[int], group) -> torch.Tensor:
    """torch's `all_to_all_single` on rows, with autograd: `in_splits[d]` rows of x go to rank d,
    `out_splits[s]` rows come from rank s."""
    return _AllToAll.apply(x, list(out_splits), list(in_splits), group)


def exchange_layout(ids: torch.Tensor, experts: int, group) -> ExpertLayout:
    """This rank's `ExpertLayout` for routing `ids` [T, top_k] (collective): one all-to-all of the
    per-expert counts tells each rank what it receives."""
    check_ids(ids, experts)
    ws = dist.get_world_size(group)
    if experts % ws:
        raise ConfigError(f"experts={experts} is not divisible by world size {ws}: experts are spread evenly")
    counts = expert_counts(ids, experts)
    recv = torch.empty_like(counts)
    dist.all_to_all_single(recv, counts, group=group)
    return expert_layout(ids, experts, recv.view(ws, experts // ws))


def _check_rows(label: str, t: torch.Tensor, rows: int, width: int) -> None:
    if t.dim() != 2 or t.shape[0] != rows or t.shape[1] != width:
        raise ConfigError(f"{label} has shape {tuple(t.shape)}: expected [{rows}, {width}]")


def _check_weight(label: str, w: torch.Tensor, layout: ExpertLayout, k: int) -> None:
    if w.dim() != 3 or w.shape[0] != layout.local_experts or w.shape[1] != k:
        raise ConfigError(
            f"{label} has shape {tuple(w.shape)}: expected [{layout.local_experts}, {k}, N], one "
            f"matrix for each of this rank's {layout.local_experts} experts"
        )


def _written(result: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    if out is None:
        return result
    if out.shape != result.shape or out.dtype != result.dtype:
        raise ConfigError(
            f"out= is {tuple(out.shape)} {out.dtype}: expected {tuple(result.shape)} {result.dtype}"
        )
    return out.copy_(result)


def dispatch_gemm(
    x: torch.Tensor, w1: torch.Tensor, layout: ExpertLayout, group, out: torch.Tensor | None = None
) -> torch.Tensor:
    """`a2a_gemm`: send each of this rank's (token, expert) pairs' row of x [T, H] to its expert's
    rank (all-to-all), then each local expert's W1 [El, H, N] on its received rows: [R, N], rows
    grouped by local expert, then source rank, then the source's token order."""
    _check_rows("x", x, layout.tokens, x.shape[1] if x.dim() == 2 else -1)
    _check_weight("w1", w1, layout, x.shape[1])
    send = x[layout.order // layout.top_k]
    received = all_to_all_rows(send, layout.recv_splits, layout.send_splits, group)
    return _written(grouped_mm(received[layout.expert_order], w1, layout.group_sizes), out)


def gemm_combine(
    h: torch.Tensor,
    w2: torch.Tensor,
    gate_weights: torch.Tensor,
    layout: ExpertLayout,
    group,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """`gemm_a2a`: each local expert's W2 [El, F, H] on its rows of h [R, F] (dispatch's row order),
    every output row back to its token's rank (all-to-all), and there the sum over a token's top_k
    rows weighted by its gate weights [T, top_k] (in float32, then the rows' dtype): [T, H]."""
    _check_rows("h", h, layout.rows_received, h.shape[1] if h.dim() == 2 else -1)
    _check_weight("w2", w2, layout, h.shape[1])
    if tuple(gate_weights.shape) != (layout.tokens, layout.top_k):
        raise ConfigError(
            f"gate weights have shape {tuple(gate_weights.shape)}: expected [{layout.tokens}, {layout.top_k}]"
        )
    y = grouped_mm(h, w2, layout.group_sizes)[layout.expert_order_inverse]
    back = all_to_all_rows(y, layout.send_splits, layout.recv_splits, group)
    pairs = back[layout.order_inverse].view(layout.tokens, layout.top_k, -1)
    result = (pairs.float() * gate_weights.float().unsqueeze(-1)).sum(1).to(h.dtype)
    return _written(result, out)
