"""Reference implementations in float32: what the fused ops must compute."""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = [
    "FP8_TOLERANCE",
    "dequantized",
    "gathered_rows",
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
