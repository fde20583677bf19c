"""Reference implementations in float32: what the fused ops must compute."""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["reference", "relative_error"]


def reference(kind: str, a: torch.Tensor, b: torch.Tensor, group) -> torch.Tensor:
    """The float32 result of `kind` on this rank's inputs (collectives in float32)."""
    ws = dist.get_world_size(group)
    a32, b32 = a.float(), b.float()
    if kind == "ag_gemm":
        full = torch.empty((a.shape[0] * ws, a.shape[1]), dtype=torch.float32, device=a.device)
        dist.all_gather_into_tensor(full, a32.contiguous(), group=group)
        return full @ b32
    partial = a32 @ b32
    if kind == "gemm_rs":
        out = torch.empty((partial.shape[0] // ws, partial.shape[1]), dtype=torch.float32, device=a.device)
        dist.reduce_scatter_tensor(out, partial, group=group)
        return out
    dist.all_reduce(partial, group=group)
    return partial


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ in float64; infinite when `out` holds NaN or Inf."""
    o = out.double()
    if not torch.isfinite(o).all():
        return float("inf")
    r = ref.double()
    return float(torch.linalg.vector_norm(o - r) / torch.linalg.vector_norm(r).clamp_min(1e-30))
