"""What the ranks of a group agree on with one collective."""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["slowest"]


def slowest(values, group, device: torch.device | str = "cpu") -> list[float]:
    """Each of `values` at its largest over the ranks of `group`: the slowest rank's times, the
    worst rank's errors (one all-reduce, which every rank makes alike; NaN counts as infinite).
    `device`: where the group's backend reduces (a CUDA device for NCCL, the CPU for gloo)."""
    t = torch.tensor([v if v == v else float("inf") for v in values], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.tolist()
