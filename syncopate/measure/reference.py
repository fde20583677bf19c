"""Reference implementations in float32: what the fused ops must compute."""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = [
    "FP8_TOLERANCE",
    "dequantized",
    "gathered_rows",
    "moe_combine_group_reference",
    "moe_combine_reference",
    "moe_dispatch_group_reference",
    "moe_dispatch_reference",
    "moe_layer_reference",
    "moe_rows",
    "reference",
    "reference_unfused",
    "relative_error",
]

FP8_TOLERANCE = 2e-2
"""Largest accepted ‖out − ref‖/‖ref‖ of an op on FP8 operands against `reference` of the same FP8
operands and scales: the reference dequantizes exactly, so what is left is the bf16 rounding of
the output (and of the partials a reduction adds, one rounding a term) and the order of the
accumulation; the FP8 quantization itself is not counted (it is in both)."""


def reference(
    kind: str,
    a: torch.Tensor,
    b: torch.Tensor,
    group,
    a_scale: torch.Tensor | None = None,
    b_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """The float32 result of `kind` on this rank's inputs (collectives in float32). With scales
    (FP8 operands), of the dequantized operands: each rank's a * a_scale and b * b_scale."""
    if a_scale is not None or b_scale is not None:
        return reference_unfused(kind, dequantized(a, a_scale), dequantized(b, b_scale), group)
    return reference_unfused(kind, a.float(), b.float(), group)


def dequantized(t: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """`t` * `scale` in float32: a one-element scale on every element, a row-wise one ([rows, 1] or
    [1, columns]) broadcast along its length-1 dimension."""
    s = scale.float().reshape(()) if scale.numel() == 1 else scale.float()
    return t.float() * s


def reference_unfused(kind: str, a: torch.Tensor, b: torch.Tensor, group) -> torch.Tensor:
    """What the unfused path gives in the inputs' dtype: torch's matmul, then the collective on its
    output (NCCL reduces 16-bit partials with a rounding after each addition). Its error against
    `reference` is the rounding a fused op's result is held to. On a group that is not NCCL's
    (ranks sharing a GPU), the same arithmetic from the operands gathered through the CPU."""
    ws = dist.get_world_size(group)
    if kind == "ag_gemm":
        return gathered_rows(a, group) @ b
    if not _is_nccl(group):
        return _gathered_path(kind, a, b, group)
    partial = a @ b
    if kind == "gemm_rs":
        out = torch.empty((partial.shape[0] // ws, partial.shape[1]), dtype=a.dtype, device=a.device)
        dist.reduce_scatter_tensor(out, partial, group=group)
        return out
    dist.all_reduce(partial, group=group)
    return partial


def _is_nccl(group) -> bool:
    return "nccl" in str(dist.get_backend(group))


def _gathered_cpu(t: torch.Tensor, group) -> list[torch.Tensor]:
    """Every rank's `t` (one shape on every rank), in rank order, gathered through the CPU."""
    parts = [torch.empty(t.shape, dtype=t.dtype) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, t.contiguous().cpu(), group=group)
    return [p.to(t.device) for p in parts]


def gathered_rows(t: torch.Tensor, group) -> torch.Tensor:
    """Every rank's `t` (one shape on every rank) stacked along dimension 0 in rank order: NCCL's
    all-gather, or on any other group, through the CPU."""
    if not _is_nccl(group):
        return torch.cat(_gathered_cpu(t, group))
    full = torch.empty(
        (t.shape[0] * dist.get_world_size(group), *t.shape[1:]), dtype=t.dtype, device=t.device
    )
    dist.all_gather_into_tensor(full, t.contiguous(), group=group)
    return full


def _gathered_path(kind: str, a: torch.Tensor, b: torch.Tensor, group) -> torch.Tensor:
    """`reference_unfused` of a reduce-scatter or all-reduce from every rank's operands gathered
    through the CPU (any process group): the partials, each in the operands' dtype, summed in rank
    order with a rounding to that dtype after each addition (none for float32)."""
    ws, rank = dist.get_world_size(group), dist.get_rank(group)
    partials = [x @ y for x, y in zip(_gathered_cpu(a, group), _gathered_cpu(b, group), strict=True)]
    total = partials[0]
    for p in partials[1:]:
        total = (total.float() + p.float()).to(a.dtype)
    if kind == "gemm_rs":
        rows = total.shape[0] // ws
        return total[rank * rows : (rank + 1) * rows]
    return total


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ in float64; infinite when `out` holds NaN or Inf."""
    o = out.double()
    if not torch.isfinite(o).all():
        return float("inf")
    r = ref.double()
    return float(torch.linalg.vector_norm(o - r) / torch.linalg.vector_norm(r).clamp_min(1e-30))


def moe_rows(expert_ids: list[torch.Tensor], experts: int, rank: int) -> list[tuple[int, int, int]]:
    """The (source rank, token, slot) of each row rank `rank`'s experts receive, in the MoE ops'
    row order: by local expert, then source rank, then token. Written out as loops, independent of
    the tables `syncopate.moe.routing` derives."""
    ws = len(expert_ids)
    local = experts // ws
    rows = []
    for e in range(rank * local, (rank + 1) * local):
        for s, ids in enumerate(expert_ids):
            for t, row in enumerate(ids.tolist()):
                if e in row:
                    rows.append((s, t, row.index(e)))
    return rows


def moe_dispatch_reference(
    xs: list[torch.Tensor], expert_ids: list[torch.Tensor], w1s: list[torch.Tensor], experts: int
) -> list[torch.Tensor]:
    """Every rank's `a2a_gemm` result in float32 from all ranks' inputs: for each received row
    (`moe_rows`), its token's row of x times its expert's W1."""
    local = experts // len(xs)
    out = []
    for r, w1 in enumerate(w1s):
        rows = [
            xs[s][t].float() @ w1[expert_ids[s][t, k].item() - r * local].float()
            for s, t, k in moe_rows(expert_ids, experts, r)
        ]
        out.append(torch.stack(rows) if rows else torch.zeros(0, w1.shape[2]))
    return out


def moe_combine_reference(
    hs: list[torch.Tensor],
    w2s: list[torch.Tensor],
    expert_ids: list[torch.Tensor],
    gate_weights: list[torch.Tensor],
    experts: int,
) -> list[torch.Tensor]:
    """Every rank's `gemm_a2a` result in float32 from all ranks' inputs: each token's sum over its
    experts of the gate weight times that expert's row of h (in `moe_rows` order) times its W2."""
    ws, local = len(hs), experts // len(hs)
    hidden = w2s[0].shape[2]
    out = [torch.zeros(ids.shape[0], hidden) for ids in expert_ids]
    for r in range(ws):
        for i, (s, t, k) in enumerate(moe_rows(expert_ids, experts, r)):
            e = expert_ids[s][t, k].item() - r * local
            out[s][t] += gate_weights[s][t, k].float() * (hs[r][i].float() @ w2s[r][e].float())
    return out


class _GroupRouting:
    """A rank's routing as torch's collectives move it, derived here without the tables of
    `syncopate.moe.routing`: its pairs sorted by (expert, pair) — every key distinct, so the sort
    is the one order there is — the split sizes, and the expert of each row received."""

    def __init__(self, expert_ids: torch.Tensor, experts: int, group) -> None:
        ws = dist.get_world_size(group)
        self.group, self.local = group, experts // ws
        self.top_k = expert_ids.shape[1]
        flat = expert_ids.reshape(-1).to(torch.int64)
        pairs = flat.numel()
        self.perm = torch.argsort(flat * pairs + torch.arange(pairs, device=flat.device))
        owner = flat // self.local
        self.send = [int(n) for n in torch.bincount(owner, minlength=ws).tolist()]
        sizes = torch.tensor(self.send, device=flat.device)
        got = torch.empty_like(sizes)
        dist.all_to_all_single(got, sizes, group=group)
        self.recv = [int(n) for n in got.tolist()]
        local_expert = (flat[self.perm] % self.local).contiguous()
        self.experts = torch.empty(sum(self.recv), dtype=torch.int64, device=flat.device)
        dist.all_to_all_single(self.experts, local_expert, self.recv, self.send, group=group)
        # received rows (by source, then expert, then token) regrouped by expert, keeping that order
        self.grouped = torch.argsort(
            self.experts * max(1, self.experts.numel())
            + torch.arange(self.experts.numel(), device=flat.device)
        )


def moe_dispatch_group_reference(
    x: torch.Tensor, expert_ids: torch.Tensor, w1: torch.Tensor, experts: int, group
) -> torch.Tensor:
    """This rank's `a2a_gemm` result in float32, computed by every rank of `group` together from
    its own inputs (collective): torch's all_to_all_single of the pairs' rows sorted by expert, the
    received rows regrouped by local expert, one float32 matmul an expert. For shapes where
    `moe_dispatch_reference`'s loops over rows on one process take too long."""
    r = _GroupRouting(expert_ids, experts, group)
    rows = x.float()[r.perm // r.top_k].contiguous()
    received = rows.new_empty((sum(r.recv), x.shape[1]))
    dist.all_to_all_single(received, rows, r.recv, r.send, group=group)
    received, ids = received[r.grouped], r.experts[r.grouped]
    out = received.new_zeros((received.shape[0], w1.shape[2]))
    for e in range(r.local):
        mask = ids == e
        if bool(mask.any()):
            out[mask] = received[mask] @ w1[e].float()
    return out


def moe_combine_group_reference(
    h: torch.Tensor,
    w2: torch.Tensor,
    expert_ids: torch.Tensor,
    gate_weights: torch.Tensor,
    experts: int,
    group,
) -> torch.Tensor:
    """This rank's `gemm_a2a` result in float32, computed by every rank of `group` together
    (collective): h's rows (in the ops' order: by local expert, then source, then token) times
    their expert's W2 in float32, sent back by torch's all_to_all_single, each token's rows summed
    weighted by its gate weights."""
    r = _GroupRouting(expert_ids, experts, group)
    ids = r.experts[r.grouped]
    y = h.new_zeros((h.shape[0], w2.shape[2]), dtype=torch.float32)
    for e in range(r.local):
        mask = ids == e
        if bool(mask.any()):
            y[mask] = h[mask].float() @ w2[e].float()
    arrived = torch.empty_like(y)
    arrived[r.grouped] = y  # back in the order the rows arrived
    back = y.new_empty((sum(r.send), y.shape[1]))
    dist.all_to_all_single(back, arrived, r.send, r.recv, group=group)
    tokens = expert_ids.shape[0]
    weights = gate_weights.reshape(-1).float()[r.perm].unsqueeze(1)
    out = back.new_zeros((tokens, y.shape[1]))
    return out.index_add_(0, r.perm // r.top_k, back * weights)


def moe_layer_reference(
    x: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    top_k: int,
    gate: torch.Tensor | None = None,
    scores: torch.Tensor | None = None,
) -> torch.Tensor:
    """A MoE layer with SwiGLU experts on one process, in x's dtype (float32 for a reference): the
    router's probabilities softmax(scores) (scores = x @ gate.T when not given), each token's top_k
    experts with their probabilities renormalised to sum to 1, and the weighted sum of their
    silu(x W1_gate) * (x W1_up) W2. W1 [E, H, 2F] (gate's columns first), W2 [E, F, H]."""
    if scores is None:
        scores = x @ gate.t()
    probs = torch.softmax(scores.float(), dim=-1)
    weights, ids = probs.topk(top_k, dim=-1)
    weights = weights / weights.sum(-1, keepdim=True)
    ffn = w2.shape[1]
    out = torch.zeros_like(x)
    for e in range(w1.shape[0]):
        token, slot = (ids == e).nonzero(as_tuple=True)
        if token.numel() == 0:
            continue
        h = x[token] @ w1[e]
        y = (torch.nn.functional.silu(h[:, :ffn]) * h[:, ffn:]) @ w2[e]
        out = out.index_add(0, token, y * weights[token, slot].unsqueeze(-1).to(y.dtype))
    return out
