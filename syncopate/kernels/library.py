"""The fused ops as torch custom ops, `torch.ops.syncopate.*`: what `torch.compile` traces as one
node each (with `fullgraph=True` too) instead of breaking its graph around them.

| op                                   | returns                 |
|--------------------------------------|-------------------------|
| `all_gather_matmul(a, b, group_name, config)`          | out                     |
| `all_gather_matmul_gathered(a, b, group_name, config)` | (out, gathered A)       |
| `matmul_reduce_scatter(a, b, group_name, config)`      | out                     |
| `matmul_all_reduce(a, b, group_name, config)`          | out                     |

`group_name` is a process group's `group_name`; `config` a candidate's fields as text (`config_text`), or
None for the looked-up one. On CUDA tensors each runs the fused op of `syncopate.kernels.ops`; on
others (CPU tensors in a gloo group) torch's collective and matmul in sequence (`unfused`, which
is also `syncopate.tp`'s `impl="torch"`), the same result, so that a compiled model runs on the
CPU too. Their fake implementations give the output shapes
compile-time tracing needs. The public ops (`syncopate.all_gather_matmul`, …, and so
`syncopate.tp`'s layers) call them while torch.compile traces, and run directly otherwise (a
custom op's dispatch costs host time an eager call need not pay).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
from typing import Any

import torch
import torch.distributed as dist

from syncopate.search_space import Candidate

__all__ = [
    "OP_NAMES",
    "all_gather_rows",
    "all_gather_rows_async",
    "config_text",
    "gathered_rows",
    "register",
    "unfused",
    "unfused_scaled",
]


def config_text(config) -> str | None:
    """A config (Candidate, dict of its fields, or None) as the ops' `config` argument: its fields
    sorted, `name=repr(value)` joined by `;` (made of string formatting that torch.compile traces
    as a constant, where JSON's encoder is not traced)."""
    if config is None:
        return None
    if isinstance(config, Candidate):
        config = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    return ";".join(f"{k}={v!r}" for k, v in sorted(config.items()))


@functools.lru_cache(maxsize=256)
def _config(text: str | None) -> dict | None:
    if text is None:
        return None
    return {k: ast.literal_eval(v) for k, v in (item.split("=", 1) for item in text.split(";"))}


def _group(name: str):
    from torch.distributed.distributed_c10d import _resolve_process_group

    return _resolve_process_group(name)


def _world(name: str) -> int:
    return dist.get_world_size(_group(name))


OP_NAMES = {
    "ag_gemm": "all_gather_matmul",
    "gemm_rs": "matmul_reduce_scatter",
    "gemm_ar": "matmul_all_reduce",
}
"""The op of each kind, by its name in `syncopate.kernels.ops` and `torch.ops.syncopate`."""

_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
"""torch's collectives into one tensor (renamed in newer torch, the old names deprecated)."""


def all_gather_rows(x: torch.Tensor, group) -> torch.Tensor:
    """Every rank's rows of x (2-D, one shape on every rank) stacked in rank order: torch's all-gather."""
    full = x.new_empty((x.shape[0] * dist.get_world_size(group), x.shape[1]))
    _ALL_GATHER(full, x.contiguous(), group=group)
    return full


def all_gather_rows_async(x: torch.Tensor, group) -> tuple[torch.Tensor, Any]:
    """`all_gather_rows` issued without waiting for it: (the stacked rows, the collective's work,
    whose `wait()` orders the caller's stream after it; until then the rows are not there)."""
    full = x.new_empty((x.shape[0] * dist.get_world_size(group), x.shape[1]))
    work = _ALL_GATHER(full, x.contiguous(), group=group, async_op=True)
    return full, work


def gathered_rows(pending: tuple[torch.Tensor, Any] | None, x: torch.Tensor, group) -> torch.Tensor:
    """Every rank's rows of `x`: those of `pending` (`all_gather_rows_async`'s) once its all-gather
    is done, or, where none was issued, `all_gather_rows` now."""
    if pending is None:
        return all_gather_rows(x, group)
    rows, work = pending
    work.wait()
    return rows


def unfused(
    kind: str,
    a: torch.Tensor,
    b: torch.Tensor,
    group,
    gathered: bool = False,
    out: torch.Tensor | None = None,
    scales: tuple[torch.Tensor, torch.Tensor] | None = None,
):
    """The op of `kind` as torch's collective and matmul in sequence (the path the fused ops
    replace, and their template `unfused`); with `gathered`, an all-gather's output and its gathered
    A; with `out`, the output written there (its shape and dtype checked by the caller). With
    `scales` (a_scale, b_scale) of FP8 operands (checked by the caller), `unfused_scaled`."""
    if scales is not None:
        return unfused_scaled(kind, a, b, scales, group, out=out)
    if kind == "ag_gemm":
        full = all_gather_rows(a, group)
        y = full @ b if out is None else torch.matmul(full, b, out=out)
        return (y, full) if gathered else y
    if kind == "gemm_ar":
        y = a @ b if out is None else torch.matmul(a, b, out=out)
        dist.all_reduce(y, group=group)
        return y
    y = a @ b
    if out is None:
        out = y.new_empty((y.shape[0] // dist.get_world_size(group), y.shape[1]))
    _REDUCE_SCATTER(out, y, group=group)
    return out


def unfused_scaled(
    kind: str,
    a: torch.Tensor,
    b: torch.Tensor,
    scales,
    group,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The op of `kind` on FP8 operands with their scales (`syncopate.kernels.scaled`), bf16 out:
    an all-gather moves A's FP8 bytes (as uint8: NCCL and gloo take no float8 tensors) and A's
    scale row-wise (a tensor-wise one on each of the shard's rows, so that every rank's rows keep
    their own), then one `torch._scaled_mm`; a reduce-scatter or all-reduce runs this rank's
    `torch._scaled_mm` (its partial dequantized by its own scales) and reduces the bf16 partials.
    `scales`: (a_scale, b_scale), or a `scaled.Scales` that may ask for fast accumulation."""
    from syncopate.kernels.scaled import column_major, fast_accumulation, row_scales, scaled_mm

    a_scale, b_scale, fast = scales[0], scales[1], fast_accumulation(scales)
    b = column_major(b)
    if kind == "ag_gemm":
        full = all_gather_rows(a.view(torch.uint8), group).view(a.dtype)
        full_scale = all_gather_rows(row_scales(a_scale, a.shape[0]), group)
        return scaled_mm(full, b, full_scale, b_scale, out=out, fast_accum=fast)
    if kind == "gemm_ar":
        y = scaled_mm(a, b, a_scale, b_scale, out=out, fast_accum=fast)
        dist.all_reduce(y, group=group)
        return y
    y = scaled_mm(a, b, a_scale, b_scale, fast_accum=fast)
    if out is None:
        out = y.new_empty((y.shape[0] // dist.get_world_size(group), y.shape[1]))
    _REDUCE_SCATTER(out, y, group=group)
    return out


def _run(
    kind: str, a: torch.Tensor, b: torch.Tensor, group_name: str, config: str | None, gathered: bool = False
):
    """The op of `kind` on `a` and `b`: the fused one on CUDA tensors, else `unfused`."""
    group = _group(group_name)
    if not a.is_cuda:
        return unfused(kind, a, b, group, gathered)
    from syncopate.kernels import ops  # the kernels' modules, imported at the first call

    extra = {"return_gathered": True} if gathered else {}
    return getattr(ops, OP_NAMES[kind])(a, b, group, _config(config), **extra)


@functools.cache
def register() -> None:
    """Define the ops (once a process); `torch.ops.syncopate` has them afterwards."""

    @torch.library.custom_op("syncopate::all_gather_matmul", mutates_args=())
    def all_gather_matmul(
        a: torch.Tensor, b: torch.Tensor, group_name: str, config: str | None = None
    ) -> torch.Tensor:
        return _run("ag_gemm", a, b, group_name, config)

    @all_gather_matmul.register_fake
    def _(a, b, group_name, config=None):
        return a.new_empty((a.shape[0] * _world(group_name), b.shape[1]))

    @torch.library.custom_op("syncopate::all_gather_matmul_gathered", mutates_args=())
    def all_gather_matmul_gathered(
        a: torch.Tensor, b: torch.Tensor, group_name: str, config: str | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return _run("ag_gemm", a, b, group_name, config, gathered=True)

    @all_gather_matmul_gathered.register_fake
    def _(a, b, group_name, config=None):
        ws = _world(group_name)
        return a.new_empty((a.shape[0] * ws, b.shape[1])), a.new_empty((a.shape[0] * ws, a.shape[1]))

    @torch.library.custom_op("syncopate::matmul_reduce_scatter", mutates_args=())
    def matmul_reduce_scatter(
        a: torch.Tensor, b: torch.Tensor, group_name: str, config: str | None = None
    ) -> torch.Tensor:
        return _run("gemm_rs", a, b, group_name, config)

    @matmul_reduce_scatter.register_fake
    def _(a, b, group_name, config=None):
        return a.new_empty((a.shape[0] // _world(group_name), b.shape[1]))

    @torch.library.custom_op("syncopate::matmul_all_reduce", mutates_args=())
    def matmul_all_reduce(
        a: torch.Tensor, b: torch.Tensor, group_name: str, config: str | None = None
    ) -> torch.Tensor:
        return _run("gemm_ar", a, b, group_name, config)

    @matmul_all_reduce.register_fake
    def _(a, b, group_name, config=None):
        return a.new_empty((a.shape[0], b.shape[1]))
