"""The MoE ops under expert parallelism: torch's all-to-all and a grouped GEMM in sequence
(`unfused`), or the all-to-all cut into pieces that the grouped GEMM consumes or produces as they
move (`pipelined`, :mod:`syncopate.moe.pipelined`), or tile by tile in one persistent Triton
grouped GEMM (`fused`, :mod:`syncopate.moe.fused`), or a token's row moved once a rank rather than
once a pair (`dedup`: by torch's all-to-all, :mod:`syncopate.moe.dedup`, or on the copy engine in
pieces beside the grouped GEMMs, :mod:`syncopate.moe.dedup_pipelined`), as the `config=` (a
`MoeCandidate`) says.

- `exchange_layout(ids, experts, group)`: ids [T, top_k] → this rank's `ExpertLayout` (one
  all-gather of every rank's per-expert counts);
- `dispatch_gemm(x, w1, layout, group)` (`a2a_gemm`): x [T, H], W1 [El, H, N] → h [R, N], rows
  grouped by local expert;
- `gemm_combine(h, w2, weights, layout, group)` (`gemm_a2a`): h [R, F], W2 [El, F, H], gate weights
  [T, top_k] → out [T, H].

R is the rows the routing sends to this rank's El experts; N is 2F for a SwiGLU expert (gate and
up projections side by side). Both ops carry autograd (the all-to-all's backward is the reverse
all-to-all; a pipelined or fused op's backward is the other kind's pipelined plan with the same
backend, chunks and order, or with `backward="unfused"` the unfused ops'), so
a layer trains through them; with `out=` the result is written there instead. With `config=None`
an op runs `unfused` (`MoELayer` looks its plans up where a results database is configured:
docs/moe.md, "Tuning and lookup").
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from syncopate.environment import job_spin_limit
from syncopate.errors import CandidateTimeoutError, ConfigError, describe
from syncopate.moe.routing import (
    ExpertLayout,
    check_id_tensor,
    id_problem,
    layout_tables,
    pair_stats,
    to_device,
)
from syncopate.search_space.moe_workload import MoeCandidate, check_moe_candidate

__all__ = [
    "all_to_all_rows",
    "dispatch_gemm",
    "exchange_layout",
    "gathered_weighted_sum",
    "gemm_combine",
    "grouped_mm",
    "grouped_weight_grad",
    "swiglu",
    "uses_grouped_mm",
]

_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


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


def _sizes(group_sizes) -> list[int]:
    return group_sizes.tolist() if isinstance(group_sizes, torch.Tensor) else list(group_sizes)


def _matrices(w: torch.Tensor) -> torch.Tensor:
    """`w` as `torch._grouped_mm` takes it: each matrix row-major or column-major (a transposed
    weight, as a backward passes it) as it is, anything else copied."""
    if w.stride(-1) == 1 or w.stride(-2) == 1:
        return w
    return w.contiguous()


def grouped_mm(
    a: torch.Tensor, w: torch.Tensor, group_sizes, *, offsets: torch.Tensor | None = None
) -> torch.Tensor:
    """[R, K] rows grouped by expert (`group_sizes[e]` rows of expert e, in order; a tensor or a
    list) times each expert's W[e] ([G, K, N]): [R, N] in a's dtype. Experts with no rows are
    skipped. `offsets`: the groups' ends (int32 on a's device) where the caller keeps them, which
    spares a copy to the device each call."""
    sizes = _sizes(group_sizes)
    if a.dim() != 2 or w.dim() != 3 or a.shape[1] != w.shape[1] or len(sizes) != w.shape[0]:
        raise ConfigError(
            f"grouped GEMM of rows {tuple(a.shape)} with weights {tuple(w.shape)} in {len(sizes)} "
            "groups: expected rows [R, K], weights [groups, K, N]"
        )
    if a.shape[0] == 0:  # a rank whose experts get no row: [0, N], its weights' gradient zero
        return a @ w[0]
    if uses_grouped_mm(a, w):
        if offsets is None:
            offsets = to_device(torch.tensor(sizes, dtype=torch.int64).cumsum(0).to(torch.int32), a.device)
        return torch._grouped_mm(a.contiguous(), _matrices(w), offs=offsets)
    parts, start = [], 0
    for e, rows in enumerate(sizes):
        if rows:
            parts.append(a[start : start + rows] @ w[e])
        start += rows
    if not parts:
        return a.new_empty((0, w.shape[2]))
    return torch.cat(parts)


def grouped_weight_grad(a: torch.Tensor, g: torch.Tensor, group_sizes) -> torch.Tensor:
    """The weights' gradient of `grouped_mm(a, W, group_sizes)` given its output's gradient `g`
    [R, N]: W_grad[e] = a[rows of e]^T @ g[rows of e], [G, K, N] in a's dtype; zero for an
    expert with no row. One `torch._grouped_mm` over K-grouped operands (a transposed: the layout
    that takes groups of any size) where `grouped_mm` uses it, over the experts that have rows."""
    sizes = _sizes(group_sizes)
    out_shape = (len(sizes), a.shape[1], g.shape[1])
    if uses_grouped_mm(a, g.unsqueeze(0)):
        full = [e for e, n in enumerate(sizes) if n]
        if not full:
            return a.new_zeros(out_shape)
        ends = torch.tensor([sizes[e] for e in full], dtype=torch.int64).cumsum(0).to(torch.int32)
        part = torch._grouped_mm(a.contiguous().t(), g.contiguous(), offs=to_device(ends, a.device))
        if len(full) == len(sizes):
            return part
        out = a.new_zeros(out_shape)
        out[to_device(torch.tensor(full), a.device)] = part
        return out
    out, start = a.new_zeros(out_shape), 0
    for e, rows in enumerate(sizes):
        if rows:
            out[e] = a[start : start + rows].t() @ g[start : start + rows]
        start += rows
    return out


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


def exchange_layout(ids: torch.Tensor, experts: int, group, *, dedup: bool = False) -> ExpertLayout:
    """This rank's `ExpertLayout` for routing `ids` [T, top_k] (collective): one all-gather of the
    per-expert counts tells each rank what it receives, and every rank what every rank receives
    (the copy-engine plans write rows where the peer keeps them).

    The host waits for the device once a routing: the ids' checks (range, repeats) travel with the
    counts, so that every rank reads them with the one copy it needs anyway, and every rank refuses
    a bad routing together (none is left waiting in the collective). With `dedup` (a `dedup` or
    `fused_dedup` plan will run on it), each rank's tokens per destination rank travel too, so that
    the plan's tables need no second wait (`syncopate.moe.dedup.dedup_tables`)."""
    check_id_tensor(ids)
    ws, rank = dist.get_world_size(group), dist.get_rank(group)
    if experts % ws:
        raise ConfigError(f"experts={experts} is not divisible by world size {ws}: experts are spread evenly")
    order, mine = pair_stats(ids, experts)  # the counts, then the ids' checks
    if dedup:  # then the tokens that pick an expert of each rank (ids out of range are refused below)
        ranks = ids.to(torch.int64).clamp(0, experts - 1) // (experts // ws)
        reach = torch.zeros(ids.shape[0], ws, dtype=torch.int64, device=ids.device).scatter_(1, ranks, 1)
        mine = torch.cat([mine, reach.sum(0)])
    every = mine.new_empty((ws * mine.numel(),))
    _ALL_GATHER(every, mine, group=group)
    every = every.view(ws, mine.numel()).cpu()
    for r in range(ws):
        low, high, repeats = every[r, experts : experts + 3].tolist()
        problem = id_problem(low, high, repeats, experts)
        if problem:
            raise ConfigError(f"rank {r}'s {problem}")
    matrix = every[:, experts + 3 :].tolist() if dedup else None
    every = every[:, :experts]
    el = experts // ws
    layout = layout_tables(
        ids, experts, order, every[rank], every[:, rank * el : (rank + 1) * el], counts=every
    )
    if matrix is not None:
        layout.cache["dedup rows"] = matrix
    return layout


def _check_rows(label: str, t: torch.Tensor, rows: int, width: int) -> None:
    if t.dim() != 2 or t.shape[0] != rows or t.shape[1] != width:
        raise ConfigError(f"{label} has shape {tuple(t.shape)}: expected [{rows}, {width}]")


def _check_weight(label: str, w: torch.Tensor, layout: ExpertLayout, k: int) -> None:
    if w.dim() != 3 or w.shape[0] != layout.local_experts or w.shape[1] != k:
        raise ConfigError(
            f"{label} has shape {tuple(w.shape)}: expected [{layout.local_experts}, {k}, N], one "
            f"matrix for each of this rank's {layout.local_experts} experts"
        )


def _check_out(out: torch.Tensor | None, shape: tuple[int, ...], like: torch.Tensor) -> None:
    if out is not None and (
        tuple(out.shape) != shape or out.dtype != like.dtype or out.device != like.device
    ):
        raise ConfigError(
            f"out= is {tuple(out.shape)} {out.dtype} on {out.device}: expected {shape} {like.dtype} on {like.device}"
        )


def _written(result: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    if out is None:
        return result
    _check_out(out, tuple(result.shape), result)
    return out.copy_(result)


def _config(config: MoeCandidate | None, group, x: torch.Tensor) -> MoeCandidate:
    """The candidate a call runs: `config`, checked against the group and the tensors' device; None
    runs `unfused`."""
    if config is None:
        return MoeCandidate()
    if not isinstance(config, MoeCandidate):
        raise ConfigError(f"config= takes a MoeCandidate (or None for unfused), got {describe(config)}")
    check_moe_candidate(config, dist.get_world_size(group))
    if config.backend != "nccl" and x.device.type != "cuda":
        from syncopate.moe.exchange import cuda_only

        raise ConfigError(cuda_only(config.backend, x.device))
    return config


def _grad_wanted(*tensors: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _token_rows(layout: ExpertLayout) -> torch.Tensor:
    """Each pair's token in send order (`order // top_k`), made once per layout."""
    rows = layout.cache.get("token rows")
    if rows is None:
        rows = layout.cache["token rows"] = layout.order // layout.top_k
    return rows


class _Permute(torch.autograd.Function):
    """Rows `x[perm]` whose gradient is the gather by the inverse permutation (what `x[perm]`'s
    autograd does with a zero-filled buffer and an accumulating scatter)."""

    @staticmethod
    def forward(ctx, x, perm, perm_inverse):
        ctx.perm_inverse = perm_inverse
        return x.index_select(0, perm)

    @staticmethod
    def backward(ctx, grad):
        return grad.index_select(0, ctx.perm_inverse), None, None


def permute_rows(x: torch.Tensor, perm: torch.Tensor, perm_inverse: torch.Tensor) -> torch.Tensor:
    """`x[perm]` for a permutation `perm` of x's rows, with autograd through `perm_inverse`."""
    return _Permute.apply(x, perm, perm_inverse)


class _TokenRows(torch.autograd.Function):
    """Each pair's token row in send order; its gradient is the top_k pairs' rows summed per token
    (gathered into token order, then summed with float32 accumulation: no scatter)."""

    @staticmethod
    def forward(ctx, x, layout):
        ctx.layout = layout
        return x.index_select(0, _token_rows(layout))

    @staticmethod
    def backward(ctx, grad):
        return token_sum(grad, ctx.layout), None


def token_sum(rows: torch.Tensor, layout: ExpertLayout, own: Own | None = None) -> torch.Tensor:
    """[T, N]: each token's top_k rows of `rows` [T·top_k, N] (send order; `own` as `summed_rows`
    takes it) summed with float32 accumulation (no autograd); on a GPU with 16-bit rows by the
    gathered sum's kernel with unit weights, which reads the rows in place (no [T, top_k, N] copy in
    pair order)."""
    if _row_kernels_run(rows, rows):
        ones = torch.ones(layout.tokens, layout.top_k, dtype=torch.float32, device=rows.device)
        return summed_rows(rows, ones, layout, own)
    return token_pairs(_landed(rows, own), layout).sum(1)


def token_pairs(rows: torch.Tensor, layout: ExpertLayout) -> torch.Tensor:
    """`rows` [T·top_k, N] in send order as [T, top_k, N] in pair order (no autograd)."""
    return rows.index_select(0, layout.order_inverse).view(layout.tokens, layout.top_k, -1)


def weighted_sum(pairs: torch.Tensor, gate_weights: torch.Tensor) -> torch.Tensor:
    """Σ_k gate[t, k] · pairs[t, k]: [T, H] in pairs' dtype, one batched matmul of the weights (in
    that dtype) by the rows, accumulated in float32 (no float32 copy of the [T, top_k, H] rows).
    Its autograd is that of the matmul (both gradients are matmuls)."""
    w = gate_weights.to(pairs.dtype).unsqueeze(1)
    return torch.bmm(w, pairs).squeeze(1)


def scatter_rows(dst: torch.Tensor, index: torch.Tensor, src: torch.Tensor) -> None:
    """dst[index[i]] = src[i] (`index_copy_` along rows, no autograd): on a GPU with 16-bit rows one
    Triton kernel moving each row whole (`syncopate.moe.kernels.launch_scatter_rows`)."""
    if not (_row_kernels_run(src, dst) and dst.stride(-1) == 1 and dst.dtype == src.dtype):
        dst.index_copy_(0, index, src)
        return
    from syncopate.moe.kernels import launch_scatter_rows

    launch_scatter_rows(dst, index, src)


def _row_kernels_run(rows: torch.Tensor, other: torch.Tensor) -> bool:
    """Whether the row kernels (`summed_rows`' gathered sum and its gradients, `swiglu`'s) run on
    `rows` (and `other`, on the same device): 16-bit rows of unit column stride on a GPU, or on the
    CPU under Triton's interpreter (TRITON_INTERPRET=1)."""
    from syncopate.kernels.launch import interpreting

    return (
        rows.dtype in (torch.bfloat16, torch.float16)
        and rows.stride(-1) == 1
        and rows.device == other.device
        and (rows.is_cuda or interpreting())
    )


Own = tuple[torch.Tensor, int]
"""(kept [n, N], lo): rows [lo, lo + n) of a combine's rows in send order, which a rank computed for
itself and left where its GEMM wrote them instead of copying them into the rows' buffer."""


def _landed(rows: torch.Tensor, own: Own | None) -> torch.Tensor:
    """`rows` with the own rows copied into their place (the paths that read the rows as one tensor)."""
    if own is not None:
        kept, lo = own
        rows[lo : lo + kept.shape[0]].copy_(kept)
    return rows


def summed_rows(
    rows: torch.Tensor,
    gate_weights: torch.Tensor,
    layout: ExpertLayout,
    own: Own | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """[T, N]: each token's top_k rows of `rows` [T·top_k, N] (send order; rows `own` says read from
    there) summed, weighted by its gate weights [T, top_k], accumulated in float32, without autograd,
    into `out` where given. On a GPU with 16-bit rows one kernel reads the rows in place
    (`syncopate.moe.kernels.launch_gathered_sum`); elsewhere the rows are gathered into pair order
    and summed by `weighted_sum`."""
    if not _row_kernels_run(rows, gate_weights) or (out is not None and out.stride(-1) != 1):
        return _written(weighted_sum(token_pairs(_landed(rows, own), layout), gate_weights), out)
    from syncopate.moe.kernels import launch_gathered_sum

    out = rows.new_empty((layout.tokens, rows.shape[1])) if out is None else out
    launch_gathered_sum(rows, layout.order_inverse, gate_weights.contiguous(), out, own)
    return out


def summed_rows_grads(
    grad: torch.Tensor,
    rows: torch.Tensor | None,
    gate_weights: torch.Tensor,
    layout: ExpertLayout,
    *,
    rows_grad: bool,
    gates_grad: bool,
    own: Own | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The gradients of `summed_rows` given its output's `grad` [T, N]: the rows' [T·top_k, N] in
    send order (where `rows_grad`) and the gate weights' [T, top_k] in their dtype (where
    `gates_grad`, which reads `rows` and `own` as the sum did)."""
    grad = grad if grad.stride(-1) == 1 else grad.contiguous()
    if not _row_kernels_run(grad, gate_weights):
        grad_rows = grad_gates = None
        if rows_grad:
            gates = gate_weights.reshape(-1).index_select(0, layout.order).to(grad.dtype)
            grad_rows = grad.index_select(0, _token_rows(layout)) * gates.unsqueeze(1)
        if gates_grad:
            pairs = token_pairs(_landed(rows, own), layout)
            grad_gates = torch.bmm(pairs, grad.unsqueeze(-1)).squeeze(-1).to(gate_weights.dtype)
        return grad_rows, grad_gates
    from syncopate.moe.kernels import launch_gathered_sum_grads

    gates = gate_weights.contiguous()
    grad_rows = grad.new_empty((layout.tokens * layout.top_k, grad.shape[1])) if rows_grad else None
    grad_gates = torch.empty(gates.shape, dtype=torch.float32, device=grad.device) if gates_grad else None
    launch_gathered_sum_grads(
        grad,
        rows if gates_grad else grad,
        layout.order_inverse,
        layout.order,
        gates,
        grad_rows,
        grad_gates,
        own if gates_grad else None,
    )
    return grad_rows, None if grad_gates is None else grad_gates.to(gate_weights.dtype)


class _GatheredSum(torch.autograd.Function):
    """`summed_rows` with autograd: on a GPU each gradient one kernel (no [T, top_k, N] copy in
    pair order, no batched matmul of one-row matrices)."""

    @staticmethod
    def forward(ctx, rows, gate_weights, layout):
        ctx.save_for_backward(rows, gate_weights)
        ctx.layout = layout
        return summed_rows(rows, gate_weights, layout)

    @staticmethod
    def backward(ctx, grad):
        rows, gates = ctx.saved_tensors
        grad_rows, grad_gates = summed_rows_grads(
            grad,
            rows,
            gates,
            ctx.layout,
            rows_grad=ctx.needs_input_grad[0],
            gates_grad=ctx.needs_input_grad[1],
        )
        return grad_rows, grad_gates, None


def gathered_weighted_sum(
    rows: torch.Tensor, gate_weights: torch.Tensor, layout: ExpertLayout
) -> torch.Tensor:
    """`summed_rows` with autograd (`_GatheredSum`): on a GPU with 16-bit rows its kernels read the
    rows in place; elsewhere `summed_rows` and `summed_rows_grads` take torch's ops."""
    return _GatheredSum.apply(rows, gate_weights, layout)


class _SwiGLU(torch.autograd.Function):
    """silu(h[:, :F]) · h[:, F:] by one kernel, and its gradient by one more (`syncopate.moe.kernels`),
    both in float32 with one rounding; only h is kept for the backward."""

    @staticmethod
    def forward(ctx, h, ffn):
        from syncopate.moe.kernels import launch_swiglu

        out = h.new_empty((h.shape[0], ffn))
        launch_swiglu(h, out)
        ctx.save_for_backward(h)
        return out

    @staticmethod
    def backward(ctx, grad):
        from syncopate.moe.kernels import launch_swiglu_grad

        (h,) = ctx.saved_tensors
        grad_h = torch.empty_like(h)
        launch_swiglu_grad(grad if grad.stride(-1) == 1 else grad.contiguous(), h, grad_h)
        return grad_h, None


def swiglu(h: torch.Tensor, ffn: int) -> torch.Tensor:
    """The experts' activation on h [R, 2·ffn] (gate columns first): silu(gate) · up, [R, ffn], with
    autograd. On a GPU with 16-bit rows (or under Triton's interpreter) one kernel each way (no
    intermediate tensors); elsewhere torch's ops."""
    if h.dim() != 2 or h.shape[1] != 2 * ffn:
        raise ConfigError(f"h has shape {tuple(h.shape)}: expected [rows, {2 * ffn}] (gate and up)")
    if _row_kernels_run(h, h):
        return _SwiGLU.apply(h, ffn)
    return F.silu(h[:, :ffn]) * h[:, ffn:]


BACKWARDS: tuple[str, ...] = ("plan", "unfused")
"""What a pipelined or fused op's backward runs: its own plan (`plan`: the other op's plan with the
same config), or torch's all-to-all and grouped GEMMs as the unfused ops' autograd does
(`unfused`). Every plan keeps the same row layouts, so either gives the same gradients."""


def check_backward(backward: str) -> str:
    if backward not in BACKWARDS:
        raise ConfigError(f"backward={backward!r}: accepted are {', '.join(map(repr, BACKWARDS))}")
    return backward


def unfused_dispatch_rows(
    rows: torch.Tensor,
    w: torch.Tensor,
    layout: ExpertLayout,
    group,
    *,
    tokens: bool,
    keep_received: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The unfused dispatch of `rows` (x [T, K] with `tokens`, else one row a pair in send order
    [T·top_k, K]) times W [El, K, N], without autograd: (h [R, N] in the unfused layout, and with
    `keep_received` the received rows [R, K] in arrival order), as `pipelined.dispatch_rows` returns
    them."""
    send = rows[_token_rows(layout)] if tokens else rows
    received = rows.new_empty((layout.rows_received, rows.shape[1]))
    dist.all_to_all_single(received, send, list(layout.recv_splits), list(layout.send_splits), group=group)
    h = grouped_mm(received[layout.expert_order], w, layout.group_sizes, offsets=layout.offsets(rows.device))
    return h, received if keep_received else None


def unfused_combine_rows(h: torch.Tensor, w: torch.Tensor, layout: ExpertLayout, group) -> torch.Tensor:
    """The unfused combine's rows before their weighted sum, without autograd: each local expert's W
    on its rows of h, every row back to its token's rank: [T·top_k, N] in send order, as
    `pipelined.combine_rows` returns them."""
    y = grouped_mm(h, w, layout.group_sizes, offsets=layout.offsets(h.device))[layout.expert_order_inverse]
    back = y.new_empty((layout.tokens * layout.top_k, y.shape[1]))
    dist.all_to_all_single(back, y, list(layout.send_splits), list(layout.recv_splits), group=group)
    return back


def dispatch_gemm(
    x: torch.Tensor,
    w1: torch.Tensor,
    layout: ExpertLayout,
    group,
    out: torch.Tensor | None = None,
    config: MoeCandidate | None = None,
    backward: str = "plan",
) -> torch.Tensor:
    """`a2a_gemm`: send each of this rank's (token, expert) pairs' row of x [T, H] to its expert's
    rank (all-to-all), then each local expert's W1 [El, H, N] on its received rows: [R, N], rows
    grouped by local expert, then source rank, then the source's token order (every config).
    `backward` (`BACKWARDS`): what a pipelined or fused config's backward runs."""
    _check_rows("x", x, layout.tokens, x.shape[1] if x.dim() == 2 else -1)
    _check_weight("w1", w1, layout, x.shape[1])
    _check_out(out, (layout.rows_received, w1.shape[2]), x)
    check_backward(backward)
    config = _config(config, group, x)
    return job_bounded(
        "syncopate.moe.dispatch_gemm",
        group,
        x,
        config,
        lambda: _dispatch(x, w1, layout, group, out, config, backward),
    )


def _dispatch(x, w1, layout, group, out, config, backward) -> torch.Tensor:
    if config.template == "pipelined":
        from syncopate.moe import pipelined

        if _grad_wanted(x, w1):
            return _written(pipelined.dispatch_autograd(x, w1, layout, group, config, backward), out)
        return pipelined.dispatch_rows(x, w1, layout, group, config, tokens=True, out=out)[0]
    if config.template == "fused":
        from syncopate.moe import fused

        if _grad_wanted(x, w1):
            return _written(fused.dispatch_autograd(x, w1, layout, group, config, backward), out)
        return fused.dispatch_rows(x, w1, layout, group, config, out=out)[0]
    if config.template == "fused_dedup" or (config.template == "dedup" and config.backend != "nccl"):
        from syncopate.moe import dedup_pipelined, fused

        if _grad_wanted(x, w1):
            return _written(dedup_pipelined.dispatch(x, w1, layout, group, config), out)
        if config.template == "fused_dedup":
            return fused.dedup_dispatch_rows(x, w1, layout, group, config, out=out)[0]
        return dedup_pipelined.dispatch_rows(x, w1, layout, group, config, out=out)[0]
    if config.template == "dedup":
        from syncopate.moe import dedup

        return _written(dedup.dispatch(x, w1, layout, group), out)
    send = _TokenRows.apply(x, layout)
    received = all_to_all_rows(send, layout.recv_splits, layout.send_splits, group)
    by_expert = permute_rows(received, layout.expert_order, layout.expert_order_inverse)
    h = grouped_mm(by_expert, w1, layout.group_sizes, offsets=layout.offsets(x.device))
    return _written(h, out)


def gemm_combine(
    h: torch.Tensor,
    w2: torch.Tensor,
    gate_weights: torch.Tensor,
    layout: ExpertLayout,
    group,
    out: torch.Tensor | None = None,
    config: MoeCandidate | None = None,
    backward: str = "plan",
) -> torch.Tensor:
    """`gemm_a2a`: each local expert's W2 [El, F, H] on its rows of h [R, F] (dispatch's row order),
    every output row back to its token's rank (all-to-all), and there the sum over a token's top_k
    rows weighted by its gate weights [T, top_k] (`weighted_sum`: a matmul in the rows' dtype,
    accumulated in float32): [T, H]. `backward` as for `dispatch_gemm`."""
    _check_rows("h", h, layout.rows_received, h.shape[1] if h.dim() == 2 else -1)
    _check_weight("w2", w2, layout, h.shape[1])
    if tuple(gate_weights.shape) != (layout.tokens, layout.top_k):
        raise ConfigError(
            f"gate weights have shape {tuple(gate_weights.shape)}: expected [{layout.tokens}, {layout.top_k}]"
        )
    _check_out(out, (layout.tokens, w2.shape[2]), h)
    check_backward(backward)
    config = _config(config, group, h)
    return job_bounded(
        "syncopate.moe.gemm_combine",
        group,
        h,
        config,
        lambda: _combine(h, w2, gate_weights, layout, group, out, config, backward),
    )


def _combine(h, w2, gate_weights, layout, group, out, config, backward) -> torch.Tensor:
    if config.template == "pipelined":
        from syncopate.moe import pipelined

        if _grad_wanted(h, w2, gate_weights):
            return _written(
                pipelined.combine_autograd(h, w2, gate_weights, layout, group, config, backward), out
            )
        rows, own = pipelined.combine_rows(h, w2, layout, group, config)
        return summed_rows(rows, gate_weights, layout, own, out)
    if config.template == "fused":
        from syncopate.moe import fused

        if _grad_wanted(h, w2, gate_weights):
            return _written(fused.combine_autograd(h, w2, gate_weights, layout, group, config, backward), out)
        rows = fused.combine_rows(h, w2, layout, group, config)
        return summed_rows(rows, gate_weights, layout, out=out)
    if config.template == "fused_dedup" or (config.template == "dedup" and config.backend != "nccl"):
        from syncopate.moe import dedup, dedup_pipelined

        if _grad_wanted(h, w2, gate_weights):
            return _written(dedup_pipelined.combine(h, w2, gate_weights, layout, group, config), out)
        gates = dedup.expert_gates(gate_weights, layout, group)
        return dedup_pipelined.combine_rows(h, w2, gates, layout, group, config, out=out)
    if config.template == "dedup":
        from syncopate.moe import dedup

        return _written(dedup.combine(h, w2, gate_weights, layout, group), out)
    y = grouped_mm(h, w2, layout.group_sizes, offsets=layout.offsets(h.device))
    y = permute_rows(y, layout.expert_order_inverse, layout.expert_order)
    back = all_to_all_rows(y, layout.send_splits, layout.recv_splits, group)
    return _written(gathered_weighted_sum(back, gate_weights, layout), out)


def job_bounded(op: str, group, a: torch.Tensor, config: MoeCandidate, call):
    """`call()`, bounded by SYNCOPATE_SPIN_LIMIT where `_job_spin` says (`_bounded`), as `op`
    (a forward op, or a backward's plan: `syncopate.moe.pipelined`)."""
    limit = _job_spin(a, config)
    return _bounded(op, group, limit, call) if limit else call()


def waits_on_words(a: torch.Tensor, config: MoeCandidate) -> bool:
    """Whether a call on `a` with `config` waits on signal words, which a spin limit can bound: a
    call on the GPU, eager (not captured, not traced), of a plan whose transfers wait on them
    (`fused`, and `pipelined` or `dedup` off NCCL, whose waits are NCCL's)."""
    if a.device.type != "cuda" or not (
        config.template in ("fused", "fused_dedup")
        or (config.template in ("pipelined", "dedup") and config.backend != "nccl")
    ):
        return False
    return not (torch.compiler.is_compiling() or torch.cuda.is_current_stream_capturing())


def _job_spin(a: torch.Tensor, config: MoeCandidate) -> int:
    """The spin limit SYNCOPATE_SPIN_LIMIT sets an MoE call (`_bounded`) where it waits on signal
    words (`waits_on_words`); 0 elsewhere."""
    return job_spin_limit() if waits_on_words(a, config) else 0


class _GroupContexts:
    """The MoE contexts of a group, as `kernels.ops.check_waits` asks a call's context."""

    def __init__(self, contexts: list) -> None:
        self.contexts = contexts

    def release_waits(self, waits) -> list[str]:
        return [said for ctx in self.contexts for said in ctx.release_waits(waits)]

    def check_error(self) -> None:
        """Each context's timeout read and cleared; the first raised."""
        first = None
        for ctx in self.contexts:
            try:
                ctx.check_error()
            except CandidateTimeoutError as e:
                first = first or e
        if first is not None:
            raise first


def _bounded(op: str, group, limit: int, call, **said):
    """`call()` with its fused kernels' waits bounded to `limit` polls and its streams' waits to
    `limit` microseconds, then checked as the dense ops check theirs (`kernels.ops.check_waits`:
    a wait that ran out raises CandidateTimeoutError naming its word, held streams released;
    `said`: its `setting` and `advice`, where not SYNCOPATE_SPIN_LIMIT's)."""
    from syncopate.kernels import streamops
    from syncopate.kernels.ops import check_waits
    from syncopate.moe.exchange import CONTEXTS, job_bound
    from syncopate.moe.pipelined import _group

    outer = job_bound.limit
    job_bound.limit = limit
    try:
        with streamops.watching() as waits:
            result = call()
    finally:
        job_bound.limit = outer
    check_waits(_GroupContexts(CONTEXTS.of(_group(group))), op, limit, waits, **said)
    return result
