"""Tensor-parallel linear layers whose collectives are the fused ops, in the backward pass too.

The two layers of a Megatron-style tensor-parallel MLP (or attention projection pair), with
sequence parallelism or without. Each layer's one collective runs as one of Syncopate's fused ops,
and so does the collective of its input gradient:

| layer                                          | forward                  | input gradient           |
|------------------------------------------------|--------------------------|--------------------------|
| `ColumnParallelLinear`, sequence_parallel=True | `all_gather_matmul`      | `matmul_reduce_scatter`  |
| `RowParallelLinear`, sequence_parallel=True    | `matmul_reduce_scatter`  | `all_gather_matmul`      |
| `RowParallelLinear`, sequence_parallel=False   | `matmul_all_reduce`      | a local matmul           |
| `ColumnParallelLinear`, sequence_parallel=False| a local matmul           | `matmul_all_reduce`      |

The weight gradients are local GEMMs on what a pass gathered anyway: the column layer keeps the
gathered input of its forward (`return_gathered`), the row layer's backward gathers the output
gradient with its input gradient's GEMM. Inputs are sequence-first (`[s, b, h]` or `[tokens, h]`):
with sequence parallelism every rank holds a block of dimension 0, which the column layer gathers
and the row layer scatters. `save_gathered=False` keeps only x's shard for the column layer's
weight gradient (gathered again in the backward; on `impl="fused"` issued before the input
gradient's reduce-scatter and waited for after it, so that the two move at once); the norms
between the layers, which see only their rank's block, have their gradients summed over the group
by `sync_sequence_parallel_grads`.

`impl="torch"` runs the same layers with torch's collectives and matmuls, one after the other: the
path a job would otherwise take, to A/B against, and one that runs on any device and group (gloo on
the CPU). `impl="ops"` calls the fused ops through their registration as `torch.ops.syncopate.*`,
which is what a compiled model calls: the fused kernels on CUDA tensors, torch's collective then the
matmul on others (so a model runs on the CPU through the ops' own path; eagerly on CUDA it pays the
custom op's dispatch that `impl="fused"` skips). `impl="async_tp"` runs them on torch's own fused ops
(`torch.ops.symm_mem.fused_all_gather_matmul` / `fused_matmul_reduce_scatter`, NCCL groups of one
GPU a rank); torch has
no fused matmul all-reduce, so there the layers without sequence parallelism take torch's path.

Under `torch.compile` (`fullgraph=True` too) the fused ops are traced as `torch.ops.syncopate.*`
nodes (`syncopate.kernels.library`), forward and backward; `mode="reduce-overhead"` replays them
from CUDA graphs. The forwards add the bias out of place while traced (`_add_bias`).

`float8=True` (every function and layer) runs each GEMM, forward and backward, on FP8 operands
quantized dynamically along its contracted dimension, as torchao's float8 "rowwise" recipe does,
the weights kept in bf16 (`syncopate.tp.float8`); impl `fused`, `torch` or `async_tp` (torch's
fused scaled ops), eagerly (under torch.compile, a graph break around each).

Each fused op looks its configuration up once per shape (`syncopate.lookup`) unless `configs`
names one per op kind ({"ag_gemm": …, "gemm_rs": …, "gemm_ar": …}); a layer calls at most one op
of each kind, forward and backward together.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist

from syncopate.errors import ConfigError, describe
from syncopate.kernels import ops
from syncopate.kernels.library import (
    OP_NAMES,
    all_gather_rows,
    all_gather_rows_async,
    config_text,
    gathered_rows,
    register,
    unfused,
)
from syncopate.tp.float8 import apply as float8_apply
from syncopate.tp.float8 import check_dims, check_impl

__all__ = [
    "ColumnParallelLinear",
    "RowParallelLinear",
    "all_gather_linear",
    "linear_all_reduce",
    "linear_all_reduce_grad",
    "linear_reduce_scatter",
    "sync_sequence_parallel_grads",
]

register()  # torch.ops.syncopate, which impl="ops" calls (and torch.compile traces the fused ops as)

IMPLS = ("fused", "torch", "async_tp", "ops")
KINDS = ("ag_gemm", "gemm_rs", "gemm_ar")
_KIND_SET = frozenset(KINDS)

_ANY_AUTOCAST = getattr(torch._C, "_is_any_autocast_enabled", None)
"""Whether autocast is on for any device (torch's own cheap test, where it has it): only then is the
operands' device type asked for its own."""


_PLAIN = (torch.Tensor, torch.nn.Parameter)
"""The weight types whose transposed view a layer keeps between calls (`_ParallelLinear._weight_t`)."""


def _checked_impl(impl: str) -> str:
    if impl not in IMPLS:
        raise ConfigError(
            f"impl {impl!r}: accepted are 'fused' (Syncopate's ops), 'torch' (torch's collectives and "
            f"matmuls), 'async_tp' (torch's fused symmetric-memory ops) and 'ops' (Syncopate's ops "
            f"as torch.ops.syncopate custom ops, which run torch's path on CPU tensors)"
        )
    return impl


def _checked_configs(configs: dict | None) -> dict:
    if configs is None:
        return {}
    if not isinstance(configs, dict):
        raise ConfigError(
            f"configs must be a dict keyed by op kind ({', '.join(KINDS)}), got {describe(configs)}"
        )
    if not configs.keys() <= _KIND_SET:
        unknown = sorted(set(configs) - _KIND_SET)
        raise ConfigError(f"configs has key(s) {unknown}: accepted are {', '.join(KINDS)}")
    return dict(configs)


def _checked_float8(name: str, float8) -> bool:
    if not isinstance(float8, bool):
        raise ConfigError(f"{name}: float8 must be True or False, got {describe(float8)}")
    return float8


def _world(group) -> int:
    if not dist.is_initialized():
        raise ConfigError("torch.distributed is not initialised: call init_process_group first")
    return dist.get_world_size(group)


# --- the three collectives, fused or torch's ---------------------------------------------------------------


def _symm_mem_group(group) -> str:
    """The name of `group` (None: the default one), with torch's symmetric memory enabled on it."""
    from syncopate.kernels.context import enable_symm_mem

    name = (group or dist.group.WORLD).group_name
    enable_symm_mem(name)
    return name


def _custom_op(kind: str, a, b, group, config, gathered: bool = False):
    """The op of `kind` as its `torch.ops.syncopate` custom op (`impl="ops"`; registered by
    `syncopate.kernels.library.register`, which the layers and styles call when made)."""
    name = (group or dist.group.WORLD).group_name
    text = config_text(config)
    if gathered:
        return torch.ops.syncopate.all_gather_matmul_gathered(a, b, name, text)
    return getattr(torch.ops.syncopate, OP_NAMES[kind])(a, b, name, text)


def _gather_mm(x, b, group, impl, config, gathered: bool):
    """(all_gather(x) @ b, the gathered x or None)."""
    if impl == "ops":
        result = _custom_op("ag_gemm", x, b, group, config, gathered)
        return tuple(result) if gathered else (result, None)
    if impl == "fused":
        result = ops.all_gather_matmul(x, b, group, config, return_gathered=gathered)
        return result if gathered else (result, None)
    if impl == "async_tp":
        name = _symm_mem_group(group)  # first: the import that registers torch.ops.symm_mem's ops
        full, (out,) = torch.ops.symm_mem.fused_all_gather_matmul(x, [b], gather_dim=0, group_name=name)
        return out, full if gathered else None
    if gathered:
        return unfused("ag_gemm", x, b, group, gathered=True)
    return unfused("ag_gemm", x, b, group), None


def _mm_scatter(a, b, group, impl, config):
    """reduce_scatter(a @ b) over dimension 0."""
    if impl == "ops":
        return _custom_op("gemm_rs", a, b, group, config)
    if impl == "fused":
        return ops.matmul_reduce_scatter(a, b, group, config)
    if impl == "async_tp":
        name = _symm_mem_group(group)
        return torch.ops.symm_mem.fused_matmul_reduce_scatter(a, b, "sum", scatter_dim=0, group_name=name)
    return unfused("gemm_rs", a, b, group)


def _mm_reduce(a, b, group, impl, config):
    """all_reduce(a @ b) (torch's path for `async_tp`, which has no fused all-reduce)."""
    if impl == "ops":
        return _custom_op("gemm_ar", a, b, group, config)
    if impl == "fused":
        return ops.matmul_all_reduce(a, b, group, config)
    return unfused("gemm_ar", a, b, group)


def _add_bias(out: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """out + bias: in place, but where torch.compile traces it (which fuses the addition anyway):
    torch 2.11's compiled backward gives an autograd function whose forward changed its output in
    place a zero gradient (torch 2.13's does not)."""
    if bias is None:
        return out
    return out + bias if torch.compiler.is_compiling() else out.add_(bias)


# --- autograd functions on 2-D operands --------------------------------------------------------------------


def _weight_grads(ctx, dy: torch.Tensor, x: torch.Tensor | None) -> tuple:
    """dW = dy.T @ x and db = Σ dy over the rows, each where the backward asks for it (dy and x may
    be None where neither, or x where dW, is not asked for)."""
    return (dy.t() @ x if ctx.needs_input_grad[1] else None, dy.sum(0) if ctx.needs_input_grad[2] else None)


class _GatherLinear(torch.autograd.Function):
    """all_gather(x) @ W.T + b; dx = reduce_scatter(dy @ W), dW = dy.T @ all_gather(x).

    `keep`: the weight's gradient will be asked for (needs_input_grad says so under no_grad too);
    `save_gathered`: keep the gathered x for it (else keep the shard and gather it again then);
    `wt`: weight.t() where the caller keeps it (`_ParallelLinear._weight_t`), else None."""

    @staticmethod
    def forward(ctx, x, weight, bias, group, impl, configs, keep, save_gathered, wt=None):
        b = weight.t() if wt is None else wt
        out, x_full = _gather_mm(x, b, group, impl, configs.get("ag_gemm"), gathered=keep and save_gathered)
        out = _add_bias(out, bias)
        ctx.save_for_backward(x_full if save_gathered else x, weight)
        ctx.setup = (group, impl, configs, save_gathered)
        return out

    @staticmethod
    def backward(ctx, dy):
        x_saved, weight = ctx.saved_tensors
        group, impl, configs, save_gathered = ctx.setup
        dy = dy.contiguous()
        regather = ctx.needs_input_grad[1] and not save_gathered
        # on Syncopate's ops the shard's all-gather is issued first and waited for last: it moves
        # beside the reduce-scatter's transfers (not where torch.compile traces it: it takes no
        # asynchronous collective, and orders the traced ones itself)
        early = regather and impl == "fused" and not torch.compiler.is_compiling()
        pending = all_gather_rows_async(x_saved, group) if early else None
        dx = _mm_scatter(dy, weight, group, impl, configs.get("gemm_rs")) if ctx.needs_input_grad[0] else None
        if regather:
            x_saved = gathered_rows(pending, x_saved, group)
        return dx, *_weight_grads(ctx, dy, x_saved), None, None, None, None, None, None


class _LinearScatter(torch.autograd.Function):
    """reduce_scatter(x @ W.T) + b; dx = all_gather(dy) @ W, dW = all_gather(dy).T @ x, db = Σ all_gather(dy)."""

    @staticmethod
    def forward(ctx, x, weight, bias, group, impl, configs, wt=None):
        out = _mm_scatter(x, weight.t() if wt is None else wt, group, impl, configs.get("gemm_rs"))
        out = _add_bias(out, bias)
        ctx.save_for_backward(x, weight)
        ctx.setup = (group, impl, configs)
        return out

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        group, impl, configs = ctx.setup
        dy = dy.contiguous()
        keep = ctx.needs_input_grad[1] or ctx.needs_input_grad[2]
        dx = dy_full = None
        if ctx.needs_input_grad[0]:
            dx, dy_full = _gather_mm(dy, weight, group, impl, configs.get("ag_gemm"), gathered=keep)
        elif keep:
            dy_full = all_gather_rows(dy, group)
        return dx, *_weight_grads(ctx, dy_full, x), None, None, None, None


class _LinearReduce(torch.autograd.Function):
    """all_reduce(x @ W.T) + b; the gradients are local."""

    @staticmethod
    def forward(ctx, x, weight, bias, group, impl, configs, wt=None):
        out = _mm_reduce(x, weight.t() if wt is None else wt, group, impl, configs.get("gemm_ar"))
        out = _add_bias(out, bias)
        ctx.save_for_backward(x, weight)
        return out

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        dy = dy.contiguous()
        dx = dy @ weight if ctx.needs_input_grad[0] else None
        return dx, *_weight_grads(ctx, dy, x), None, None, None, None


class _LinearReduceGrad(torch.autograd.Function):
    """x @ W.T + b, local; dx = all_reduce(dy @ W)."""

    @staticmethod
    def forward(ctx, x, weight, bias, group, impl, configs):
        out = torch.nn.functional.linear(x, weight, bias)
        ctx.save_for_backward(x, weight)
        ctx.setup = (group, impl, configs)
        return out

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        group, impl, configs = ctx.setup
        dy = dy.contiguous()
        dx = _mm_reduce(dy, weight, group, impl, configs.get("gemm_ar")) if ctx.needs_input_grad[0] else None
        return dx, *_weight_grads(ctx, dy, x), None, None, None


# --- public functions on sequence-first tensors ------------------------------------------------------------


def _operands(name: str, x, weight, bias, impl, configs, wt=None):
    """x, weight and bias checked, cast to the autocast dtype where autocast is on, x as 2-D rows;
    `wt` (the weight transposed, kept by a layer) is dropped where autocast casts the weight.
    Every call checks them all (they are a handful of attribute reads; a call's tensors are new)."""
    impl = _checked_impl(impl)
    configs = _checked_configs(configs)
    if not (isinstance(x, torch.Tensor) and isinstance(weight, torch.Tensor)):
        what, t = ("x", x) if not isinstance(x, torch.Tensor) else ("weight", weight)
        raise ConfigError(f"{name}: {what} must be a torch.Tensor, got {describe(t)}")
    if weight.dim() != 2:
        raise ConfigError(
            f"{name}: weight must be 2-D [out_features, in_features], got shape {tuple(weight.shape)}"
        )
    dims = x.dim()
    if dims < 2 or x.shape[-1] != weight.shape[1]:
        raise ConfigError(
            f"{name}: x of shape {tuple(x.shape)} must be [..., {weight.shape[1]}] (at least 2-D, its last "
            f"dimension the weight's in_features)"
        )
    if bias is not None and not isinstance(bias, torch.Tensor):
        raise ConfigError(f"{name}: bias must be a torch.Tensor or None, got {describe(bias)}")
    if (_ANY_AUTOCAST is None or _ANY_AUTOCAST()) and torch.is_autocast_enabled(x.device.type):
        dtype = torch.get_autocast_dtype(x.device.type)
        x, weight, wt = x.to(dtype), weight.to(dtype), None
        bias = bias.to(dtype) if bias is not None else None
    dtype = x.dtype
    if weight.dtype != dtype or (bias is not None and bias.dtype != dtype):
        what, t = ("weight", weight) if weight.dtype != dtype else ("bias", bias)
        raise ConfigError(
            f"{name}: x has dtype {dtype} but {what} has {t.dtype}: cast one to the other, or call under "
            f"torch.autocast"
        )
    rows = x.contiguous() if dims == 2 else x.reshape(-1, x.shape[-1]).contiguous()
    return rows, weight, bias, impl, configs, wt


def _check_bias(name: str, bias, size: int) -> None:
    if bias is not None and bias.shape != (size,):
        raise ConfigError(f"{name}: bias must have shape ({size},), got {tuple(bias.shape)}")


def _shaped(out: torch.Tensor, x: torch.Tensor, first: int) -> torch.Tensor:
    """A call's output rows [rows, out_features] as its input's shape was, dimension 0 `first`: the
    rows themselves where the input was 2-D (no view to make)."""
    return out if x.dim() == 2 else out.view(first, *x.shape[1:-1], out.shape[-1])


def _untracked(x: torch.Tensor, weight: torch.Tensor, bias) -> bool:
    """Whether autograd records nothing of a call (grad off, or none of its operands requires it)
    and torch.compile is not tracing it. Such a call runs its op and adds the bias as its autograd
    function's forward would, without the function around them (whose apply costs more host time
    than the rest of a small call); a traced one keeps the function, as the compiled graphs expect."""
    if torch.is_grad_enabled() and (
        x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
    ):
        return False
    return not torch.compiler.is_compiling()


def all_gather_linear(
    x,
    weight,
    bias=None,
    group=None,
    *,
    impl: str = "fused",
    configs: dict | None = None,
    save_gathered: bool = True,
    float8: bool = False,
):
    """all_gather(x, dim 0) @ weight.T + bias: a column-parallel linear with sequence parallelism.

    x: [s/ws, ..., in] this rank's block of the sequence; weight: [out/ws, in] this rank's rows of
    the full weight; bias: [out/ws] or None. Returns [s, ..., out/ws]. Its input gradient is
    reduce-scattered back to [s/ws, ..., in] (`matmul_reduce_scatter`). The weight's gradient needs
    the gathered x: kept from the forward (`save_gathered`, the default), or, to keep only the shard
    (ws times less activation memory), gathered again in the backward by the group's own all-gather,
    after the input gradient's op. `float8`: its GEMMs on FP8 operands (`syncopate.tp.float8`; x's
    shard kept, `save_gathered` aside).
    """
    return _gather_linear(x, weight, bias, group, impl, configs, save_gathered, float8, None)


def _gather_linear(x, weight, bias, group, impl, configs, save_gathered, float8, wt):
    """`all_gather_linear`, `wt` weight.t() or None (the layers' path to it: arguments by position)."""
    rows, weight, bias, impl, configs, wt = _operands("all_gather_linear", x, weight, bias, impl, configs, wt)
    _check_bias("all_gather_linear", bias, weight.shape[0])
    ws = _world(group)
    if _checked_float8("all_gather_linear", float8):
        out = float8_apply("all_gather_linear", "gather", rows, weight, bias, group, impl, configs)
    elif _untracked(rows, weight, bias):
        b = weight.t() if wt is None else wt
        out = _gather_mm(rows, b, group, impl, configs.get("ag_gemm"), False)[0]
        out = _add_bias(out, bias)
    else:
        keep = torch.is_grad_enabled() and weight.requires_grad
        out = _GatherLinear.apply(rows, weight, bias, group, impl, configs, keep, bool(save_gathered), wt)
    return _shaped(out, x, x.shape[0] * ws)


def linear_reduce_scatter(
    x,
    weight,
    bias=None,
    group=None,
    *,
    impl: str = "fused",
    configs: dict | None = None,
    float8: bool = False,
):
    """reduce_scatter(x @ weight.T, dim 0) + bias: a row-parallel linear with sequence parallelism.

    x: [s, ..., in/ws]; weight: [out, in/ws] this rank's columns of the full weight; bias: [out] (the
    same on every rank) or None. Returns this rank's block [s/ws, ..., out] of the sum over ranks;
    s must divide by the group's size. Its input gradient takes the output gradient's blocks from
    every rank (`all_gather_matmul`), and the weight's and bias's gradients are over the whole sequence.
    `float8`: its GEMMs on FP8 operands (`syncopate.tp.float8`).
    """
    return _linear_scatter(x, weight, bias, group, impl, configs, float8, None)


def _linear_scatter(x, weight, bias, group, impl, configs, float8, wt):
    """`linear_reduce_scatter`, `wt` weight.t() or None."""
    rows, weight, bias, impl, configs, wt = _operands(
        "linear_reduce_scatter", x, weight, bias, impl, configs, wt
    )
    _check_bias("linear_reduce_scatter", bias, weight.shape[0])
    ws = _world(group)
    if x.shape[0] % ws:
        raise ConfigError(
            f"linear_reduce_scatter: x's first (sequence) dimension {x.shape[0]} is not divisible by the group's "
            f"size {ws}: each rank takes an equal block of it"
        )
    if _checked_float8("linear_reduce_scatter", float8):
        out = float8_apply("linear_reduce_scatter", "scatter", rows, weight, bias, group, impl, configs)
    elif _untracked(rows, weight, bias):
        out = _mm_scatter(rows, weight.t() if wt is None else wt, group, impl, configs.get("gemm_rs"))
        out = _add_bias(out, bias)
    else:
        out = _LinearScatter.apply(rows, weight, bias, group, impl, configs, wt)
    return _shaped(out, x, x.shape[0] // ws)


def linear_all_reduce(
    x,
    weight,
    bias=None,
    group=None,
    *,
    impl: str = "fused",
    configs: dict | None = None,
    float8: bool = False,
):
    """all_reduce(x @ weight.T) + bias: a row-parallel linear without sequence parallelism.

    x: [..., in/ws]; weight: [out, in/ws]; bias: [out] (the same on every rank) or None. Returns
    [..., out], the sum over ranks, on every rank. The gradients are local. `float8`: its GEMMs on
    FP8 operands (`syncopate.tp.float8`).
    """
    return _linear_reduce(x, weight, bias, group, impl, configs, float8, None)


def _linear_reduce(x, weight, bias, group, impl, configs, float8, wt):
    """`linear_all_reduce`, `wt` weight.t() or None."""
    rows, weight, bias, impl, configs, wt = _operands("linear_all_reduce", x, weight, bias, impl, configs, wt)
    _check_bias("linear_all_reduce", bias, weight.shape[0])
    _world(group)
    if _checked_float8("linear_all_reduce", float8):
        out = float8_apply("linear_all_reduce", "reduce", rows, weight, bias, group, impl, configs)
    elif _untracked(rows, weight, bias):
        out = _mm_reduce(rows, weight.t() if wt is None else wt, group, impl, configs.get("gemm_ar"))
        out = _add_bias(out, bias)
    else:
        out = _LinearReduce.apply(rows, weight, bias, group, impl, configs, wt)
    return _shaped(out, x, x.shape[0])


def linear_all_reduce_grad(
    x,
    weight,
    bias=None,
    group=None,
    *,
    impl: str = "fused",
    configs: dict | None = None,
    float8: bool = False,
):
    """x @ weight.T + bias, local: a column-parallel linear without sequence parallelism.

    x: [..., in], the same on every rank; weight: [out/ws, in]; bias: [out/ws] or None. Returns
    [..., out/ws]. Its input gradient is summed over ranks (`matmul_all_reduce`). `float8`: its
    GEMMs on FP8 operands (`syncopate.tp.float8`).
    """
    rows, weight, bias, impl, configs, _ = _operands("linear_all_reduce_grad", x, weight, bias, impl, configs)
    _check_bias("linear_all_reduce_grad", bias, weight.shape[0])
    _world(group)
    if _checked_float8("linear_all_reduce_grad", float8):
        out = float8_apply("linear_all_reduce_grad", "reduce_grad", rows, weight, bias, group, impl, configs)
    elif _untracked(rows, weight, bias):
        out = torch.nn.functional.linear(rows, weight, bias)
    else:
        out = _LinearReduceGrad.apply(rows, weight, bias, group, impl, configs)
    return _shaped(out, x, x.shape[0])


# --- modules -----------------------------------------------------------------------------------------------


class _ParallelLinear(torch.nn.Module):
    _kept_t: tuple | None = None
    """(key, weight.t()) of the last call (`_weight_t`)."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        group,
        bias: bool,
        sequence_parallel: bool,
        impl: str,
        configs: dict | None,
        split: str,
        device,
        dtype,
        float8: bool = False,
    ) -> None:
        super().__init__()
        for what, v in (("in_features", in_features), ("out_features", out_features)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"{type(self).__name__}: {what} must be a positive integer, got {v!r}")
        ws = _world(group)
        size = out_features if split == "out" else in_features
        if size % ws:
            raise ConfigError(
                f"{type(self).__name__}: {split}_features={size} is not divisible by the group's size {ws}: "
                f"each rank holds an equal share of the weight"
            )
        self.in_features, self.out_features = in_features, out_features
        self.group = group
        self.sequence_parallel = bool(sequence_parallel)
        self.impl = _checked_impl(impl)
        self.configs = _checked_configs(configs)
        self.world_size = ws
        self.rank = dist.get_rank(group)
        shape = (out_features // ws, in_features) if split == "out" else (out_features, in_features // ws)
        self.float8 = _checked_float8(type(self).__name__, float8)
        if self.float8:
            check_dims(type(self).__name__, local_out_features=shape[0], local_in_features=shape[1])
            check_impl(type(self).__name__, self.impl)
        self.weight = torch.nn.Parameter(torch.empty(shape, device=device, dtype=dtype))
        bias_size = out_features // ws if split == "out" else out_features
        self.bias = torch.nn.Parameter(torch.empty(bias_size, device=device, dtype=dtype)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Weights drawn as nn.Linear draws the full matrix's (uniform within 1/sqrt(in_features))."""
        bound = 1 / math.sqrt(self.in_features)
        torch.nn.init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            self._reset_bias(bound)

    def _reset_bias(self, bound: float) -> None:
        """Draw the bias (each layer its own way)."""
        raise NotImplementedError

    def _params(self) -> tuple:
        """(weight, bias) as a call reads them: from `_parameters` where they are (`self.weight`
        goes through Module.__getattr__), else as attributes (a parametrization, say)."""
        params = self._parameters
        weight = params["weight"] if "weight" in params else self.weight
        bias = params["bias"] if "bias" in params else self.bias
        return weight, bias

    def _weight_t(self, weight) -> torch.Tensor | None:
        """weight.t() for the ops' B, kept between calls: a view of the weight's storage, so
        in-place updates (an optimizer step, load_state_dict) show through it; made again once the
        weight is another tensor or its storage, shape, strides or dtype changed (a parameter
        replaced, `.data` assigned). None (the caller transposes) while torch.compile traces the
        call, and for a weight that is not a plain tensor or keeps no storage of its own (a subclass,
        a torch.func transform's wrapper)."""
        if type(weight) not in _PLAIN or torch.compiler.is_compiling():
            return None
        try:
            key = (id(weight), weight.data_ptr(), weight.shape, weight.stride(), weight.dtype)
        except RuntimeError:  # "Cannot access data pointer of Tensor that doesn't have storage"
            return None
        kept = self._kept_t
        if kept is not None and kept[0] == key:
            return kept[1]
        wt = weight.detach().t()
        self.__dict__["_kept_t"] = (key, wt)
        return wt

    def register_parameter(self, name: str, param) -> None:
        """Module's, dropping the kept weight.t() (which would otherwise hold the old storage)."""
        self.__dict__["_kept_t"] = None
        super().register_parameter(name, param)

    def _apply(self, fn, recurse: bool = True):
        """Module's (`to`, `half`, ...), dropping the kept weight.t() first."""
        self.__dict__["_kept_t"] = None
        return super()._apply(fn, recurse)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
            f"world_size={self.world_size}, sequence_parallel={self.sequence_parallel}, impl={self.impl!r}"
            + (", float8=True" if self.float8 else "")
        )


class ColumnParallelLinear(_ParallelLinear):
    """y = x @ W.T + b with W's rows (the output features) split over the group's ranks.

    With `sequence_parallel` (the default) x is this rank's block of the sequence, [s/ws, ..., in],
    gathered by the fused op as the GEMM consumes it; without, x is the whole input on every rank.
    Returns this rank's output features, [s, ..., out/ws]: the input of a `RowParallelLinear`.
    `save_gathered=False` keeps only x's shard for the weight's gradient and gathers it again in
    the backward (`all_gather_linear`). `float8=True` runs its GEMMs on FP8 operands, dynamically
    scaled row-wise, the weight kept in its dtype (`syncopate.tp.float8`).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        group=None,
        *,
        bias: bool = True,
        sequence_parallel: bool = True,
        impl: str = "fused",
        configs: dict | None = None,
        save_gathered: bool = True,
        float8: bool = False,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__(
            in_features,
            out_features,
            group,
            bias,
            sequence_parallel,
            impl,
            configs,
            "out",
            device,
            dtype,
            float8,
        )
        self.parts = (self.weight.shape[0],)  # a rank's output features of each layer it holds (from_linear)
        self.save_gathered = bool(save_gathered)

    def _reset_bias(self, bound: float) -> None:
        torch.nn.init.uniform_(self.bias, -bound, bound)

    @classmethod
    def from_linear(cls, linear, group=None, **kwargs: Any) -> ColumnParallelLinear:
        """This rank's share of a whole nn.Linear (the same on every rank): its block of the rows.

        Given several nn.Linear of one input (a SwiGLU MLP's gate and up projections), one layer
        holding this rank's block of each, in the order given: one all-gather then feeds them all.
        Its output's last dimension holds their shares in turn; `out.split(layer.parts, -1)`
        separates them.
        """
        linears = list(linear) if isinstance(linear, (list, tuple)) else [linear]
        if not linears or not all(isinstance(x, torch.nn.Linear) for x in linears):
            raise ConfigError(f"from_linear takes an nn.Linear or a list of them, got {linear!r}")
        first = linears[0]
        for x in linears[1:]:
            if (
                x.in_features != first.in_features
                or (x.bias is None) != (first.bias is None)
                or x.weight.dtype != first.weight.dtype
                or x.weight.device != first.weight.device
            ):
                raise ConfigError(
                    "from_linear: the layers given together must share in_features, bias, dtype and device; got "
                    + ", ".join(
                        f"{y.in_features}/{'bias' if y.bias is not None else 'no bias'}/{y.weight.dtype}/"
                        f"{y.weight.device}"
                        for y in linears
                    )
                )
        ws = _world(group)
        for x in linears:
            if x.out_features % ws:
                raise ConfigError(
                    f"ColumnParallelLinear: out_features={x.out_features} of a layer given is not divisible by the "
                    f"group's size {ws}: each rank holds an equal share of each"
                )
        layer = cls(
            first.in_features,
            sum(x.out_features for x in linears),
            group,
            bias=first.bias is not None,
            device=first.weight.device,
            dtype=first.weight.dtype,
            **kwargs,
        )
        layer.parts = tuple(x.out_features // ws for x in linears)
        with torch.no_grad():
            layer.weight.copy_(
                torch.cat(
                    [x.weight[layer.rank * n : (layer.rank + 1) * n] for x, n in zip(linears, layer.parts)]
                )
            )
            if layer.bias is not None:
                layer.bias.copy_(
                    torch.cat(
                        [x.bias[layer.rank * n : (layer.rank + 1) * n] for x, n in zip(linears, layer.parts)]
                    )
                )
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight, bias = self._params()
        if self.sequence_parallel:
            return _gather_linear(
                x,
                weight,
                bias,
                self.group,
                self.impl,
                self.configs,
                self.save_gathered,
                self.float8,
                None if self.float8 else self._weight_t(weight),
            )
        return linear_all_reduce_grad(
            x, weight, bias, self.group, impl=self.impl, configs=self.configs, float8=self.float8
        )


class RowParallelLinear(_ParallelLinear):
    """y = x @ W.T + b with W's columns (the input features) split over the group's ranks.

    x is this rank's input features, [s, ..., in/ws] (a `ColumnParallelLinear`'s output). With
    `sequence_parallel` (the default) the products are reduce-scattered: this rank's block of the
    sequence, [s/ws, ..., out]; without, all-reduced: [s, ..., out] on every rank. The bias is
    whole on every rank, added after the sum, and starts at zero (as each rank draws its own).
    `float8=True`: as for `ColumnParallelLinear`.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        group=None,
        *,
        bias: bool = True,
        sequence_parallel: bool = True,
        impl: str = "fused",
        configs: dict | None = None,
        float8: bool = False,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__(
            in_features,
            out_features,
            group,
            bias,
            sequence_parallel,
            impl,
            configs,
            "in",
            device,
            dtype,
            float8,
        )

    def _reset_bias(self, bound: float) -> None:
        torch.nn.init.zeros_(self.bias)

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, group=None, **kwargs: Any) -> RowParallelLinear:
        """This rank's share of a whole nn.Linear (the same on every rank): its block of the columns."""
        layer = cls(
            linear.in_features,
            linear.out_features,
            group,
            bias=linear.bias is not None,
            device=linear.weight.device,
            dtype=linear.weight.dtype,
            **kwargs,
        )
        cols = slice(layer.rank * layer.weight.shape[1], (layer.rank + 1) * layer.weight.shape[1])
        with torch.no_grad():
            layer.weight.copy_(linear.weight[:, cols])
            if layer.bias is not None:
                layer.bias.copy_(linear.bias)
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight, bias = self._params()
        f = _linear_scatter if self.sequence_parallel else _linear_reduce
        wt = None if self.float8 else self._weight_t(weight)
        return f(x, weight, bias, self.group, self.impl, self.configs, self.float8, wt)


def sync_sequence_parallel_grads(params, group=None) -> None:
    """Sum the gradients of `params` over `group`, in place (one all-reduce of their flattened grads).

    With sequence parallelism the layers between the row and the column layer (norms, with their
    weights the same on every rank) see only this rank's block of the sequence, so each rank's
    gradient of their weights covers its block only; summed over the group, it is the whole
    sequence's, as without sequence parallelism. Call it after the backward, before the optimizer
    step (the layers of this module need nothing: their gradients are whole already). Parameters
    without a gradient are left out; every rank must pass the same parameters in the same order.
    """
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()
