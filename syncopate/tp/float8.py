"""FP8 training in the tensor-parallel layers: torchao's float8 "rowwise" recipe on the fused ops.

The weights stay in their own dtype (bf16: the master copy the optimizer updates). Each GEMM of a
layer, forward and backward, quantizes both its operands dynamically to `torch.float8_e4m3fn`,
each along the dimension the GEMM contracts, and runs scaled (`torch._scaled_mm`, bf16 out); the
forward's GEMM with the scaled GEMM's fast accumulation (`FAST_OUTPUT`; `use_fast_accum`: faster,
each sum rounded more coarsely), the gradients' GEMMs without, as torchao's recipes configure them
(`Float8LinearConfig.gemm_config_output`), on every impl:

    amax  = max |v| over the contracted dimension (one per row of A, one per column of B)
    scale = max(amax, 1e-12) / 448        (float32; 448 = float8_e4m3fn's largest value)
    v8    = clamp(v / scale, -448, 448) as float8_e4m3fn,   v ≈ v8 * scale

| GEMM                      | A (scale per row, over) | B (scale per column, over) |
|---------------------------|-------------------------|----------------------------|
| out = x @ Wᵀ              | x (K, in_features)      | W's rows (K)               |
| grad_x = grad_out @ W     | grad_out (N)            | W's columns (N)            |
| grad_W = grad_outᵀ @ x    | grad_out's columns (M)  | x's columns (M, tokens)    |

Where a GEMM's collective is a fused op, it is the op's FP8 form (`syncopate.kernels.ops` with
`a_scale`/`b_scale`): an all-gather moves FP8 rows and their scales; a reduce-scatter or all-reduce
sums the bf16 partials, each rank's dequantized by its own scales (a row-parallel layer's K is
split, so each rank scales its own slice of it). The weight's gradient contracts the tokens, which
the FP8 rows of the forward's all-gather are not scaled along: the column layer keeps x's bf16
shard (m·K·2 bytes, as `save_gathered=False`) and all-gathers it in bf16 again in the backward; the
row layer all-gathers the bf16 output gradient beside its FP8 `all_gather_matmul`. On Syncopate's
ops (`fused`) that all-gather is issued before the input gradient's op and waited for after it, so
that the two move at once; the other impls run them in sequence. Outputs and
gradients come back in the operands' dtype; a bias is added in it.

`impl` (`IMPLS`): `fused`, Syncopate's FP8 ops; `torch`, torch's collectives and `torch._scaled_mm`
in sequence; `async_tp`, torch's fused scaled symmetric-memory ops (`fused_all_gather_scaled_matmul`,
`fused_scaled_matmul_reduce_scatter`) on the same operands and scales, the all-reduce on torch's
path (torch has no fused one, as in bf16).

Under torch.compile a float8 linear runs eagerly, a graph break around it (`torch.compiler.disable`;
`fullgraph=True` stops there), as the fused ops take FP8 operands eagerly only. Under a plain CUDA
graph capture (`torch.cuda.graph`) it is captured: its scales stay on the device and nothing in a
call waits for the host; as with every op, a call like it (same shapes) must have run before the
capture, which makes the ops' buffers.

`torch._scaled_mm` on CUDA takes only dimensions that are multiples of 16: every dimension of
these GEMMs (the local in and out features, and the tokens) is checked to be one, on any device,
so that a model that runs here runs on GPUs.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from syncopate.errors import ConfigError
from syncopate.kernels.library import all_gather_rows_async, gathered_rows, unfused
from syncopate.kernels.scaled import AMAX_EPS, E4M3_MAX, OUT_DTYPE, Scales, quantize, scaled_mm

__all__ = [
    "AMAX_EPS",
    "DIM_MULTIPLE",
    "E4M3_MAX",
    "FAST_OUTPUT",
    "IMPLS",
    "MODES",
    "Float8Linear",
    "check_dims",
    "check_impl",
    "quantize",
]

FAST_OUTPUT = True
"""Whether the forward's GEMM (the layer's output) accumulates fast, on every impl; the gradients'
GEMMs never do (module docstring)."""
DIM_MULTIPLE = 16
"""`torch._scaled_mm` on CUDA takes dimensions that are multiples of this only."""
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
"""The operand dtypes a float8 layer quantizes from."""
IMPLS = ("fused", "torch", "async_tp")
"""The layers' impls that run float8: Syncopate's ops, torch's collectives and `torch._scaled_mm`,
torch's fused scaled symmetric-memory ops (`async_tp8`). Not `ops`: the custom ops take no scales."""

MODES = ("gather", "scatter", "reduce", "reduce_grad", "local")
"""The layer a `Float8Linear` computes: `all_gather_linear`, `linear_reduce_scatter`,
`linear_all_reduce`, `linear_all_reduce_grad`, and a local linear whose input gradient the caller
reduces (a styles' column layer on a replicated DTensor)."""

_FORWARD_OP = {"gather": "ag_gemm", "scatter": "gemm_rs", "reduce": "gemm_ar"}
"""The fused op of each mode's forward (the others' GEMM is local)."""
_INPUT_GRAD_OP = {"gather": "gemm_rs", "scatter": "ag_gemm", "reduce_grad": "gemm_ar"}
"""The fused op of each mode's input gradient (the others' GEMM is local)."""


def _operands8(a: torch.Tensor, b: torch.Tensor):
    """a [M, K] and b [K, N] quantized along K, written as the scaled GEMM takes them (whatever
    their own layout: no copy after): A row-major with a [M, 1] scale, B column-major with a [1, N] one."""
    a8, sa = quantize(a, 1, "row")
    b8, sb = quantize(b, 0, "column")
    return a8, b8, sa, sb


def mm8(a: torch.Tensor, b: torch.Tensor, fast_accum: bool = False) -> torch.Tensor:
    """a @ b, local, on FP8 operands quantized along the contracted dimension (bf16 out); with
    `fast_accum`, the scaled GEMM's fast accumulation."""
    a8, b8, sa, sb = _operands8(a, b)
    return scaled_mm(a8, b8, sa, sb, fast_accum=fast_accum)


def op8(
    kind: str, a: torch.Tensor, b: torch.Tensor, group, impl: str, config, fast_accum: bool = False
) -> torch.Tensor:
    """The op of `kind` on a and b quantized along K (bf16 out): the fused op (`impl="fused"`),
    torch's fused scaled op (`impl="async_tp"`) or torch's collective and the scaled GEMM
    (`impl="torch"`, and `async_tp`'s all-reduce)."""
    a8, b8, sa, sb = _operands8(a, b)
    if impl == "fused":
        from syncopate.kernels import ops
        from syncopate.kernels.library import OP_NAMES

        return getattr(ops, OP_NAMES[kind])(
            a8, b8, group, config, a_scale=sa, b_scale=sb, fast_accum=fast_accum
        )
    if impl == "async_tp" and kind != "gemm_ar":
        return async_tp8(kind, a8, b8, sa, sb, group, fast_accum)
    return unfused(kind, a8, b8, group, scales=Scales(sa, sb, fast_accum))


def async_tp8(kind: str, a8, b8, sa, sb, group, fast_accum: bool = False) -> torch.Tensor:
    """The op of `kind` (`ag_gemm` or `gemm_rs`) on FP8 operands as torch's fused scaled async-TP
    op: `torch.ops.symm_mem.fused_all_gather_scaled_matmul` (A's rows and their scales gathered
    row-wise-sharded, each shard's `_scaled_mm` as it lands) or `fused_scaled_matmul_reduce_scatter`
    (each block's `_scaled_mm` with its scale rows, the bf16 partials reduced); B column-major with
    a [1, N] scale, bf16 out. torch has no fused all-reduce: `op8` runs torch's path for it."""
    from syncopate.kernels.context import enable_symm_mem

    name = (group or dist.group.WORLD).group_name
    enable_symm_mem(name)  # first: the import that registers torch.ops.symm_mem's ops
    if kind == "ag_gemm":
        _, (out,) = torch.ops.symm_mem.fused_all_gather_scaled_matmul(
            a8, [b8], sa, [sb], 0, name, [None], [None], [OUT_DTYPE], [fast_accum]
        )
    else:
        shape = [a8.shape[0], b8.shape[1]]
        out = torch.ops.symm_mem.fused_scaled_matmul_reduce_scatter(
            a8, b8, sa, sb, "sum", 0, 0, name, shape, out_dtype=OUT_DTYPE, use_fast_accum=fast_accum
        )
    # torch's ops may return a view of a buffer of theirs; autograd forbids changing in place (an
    # input's accumulated gradient) a view made inside a custom Function, so such a view is copied
    return out if out._base is None else out.clone()


def check_dims(name: str, **dims: int) -> None:
    """ConfigError naming the first of `dims` that is not a multiple of 16."""
    for what, size in dims.items():
        if size % DIM_MULTIPLE:
            raise ConfigError(
                f"{name}: float8 needs every dimension of its GEMMs to be a multiple of {DIM_MULTIPLE} "
                f"(torch._scaled_mm on CUDA), but {what.replace('_', ' ')} is {size}: pad it, or keep "
                f"this layer in bf16 (float8=False)"
            )


def check_impl(name: str, impl: str) -> None:
    """ConfigError unless `impl` runs float8 (`IMPLS`)."""
    if impl not in IMPLS:
        raise ConfigError(
            f"{name}: float8=True runs with impl 'fused' (Syncopate's ops, FP8 operands), 'torch' (torch's "
            f"collectives and torch._scaled_mm) or 'async_tp' (torch's fused scaled symmetric-memory ops), "
            f"got impl={impl!r}: torch.ops.syncopate's custom ops take no scales"
        )


def check(name: str, x: torch.Tensor, weight: torch.Tensor, impl: str, tokens: int) -> None:
    """ConfigError unless a float8 call of these operands can run: its impl, dtype and the dimensions
    of its GEMMs (`tokens`: M, the rows of the whole input, every rank's where the layer gathers it)."""
    check_impl(name, impl)
    if x.dtype not in DTYPES:
        raise ConfigError(
            f"{name}: float8=True quantizes bfloat16, float16 or float32 operands, got {x.dtype} (keep the "
            f"weights in bf16: they are the master copy, quantized at every GEMM)"
        )
    out_f, in_f = weight.shape
    check_dims(name, local_out_features=out_f, local_in_features=in_f, tokens=tokens)


class Float8Linear(torch.autograd.Function):
    """x @ Wᵀ + b of `mode` (MODES) on FP8 GEMMs, dynamically scaled; the module docstring says which
    operand is scaled along which dimension and what each mode keeps for its backward."""

    @staticmethod
    def forward(ctx, x, weight, bias, group, impl, configs, mode):
        wt = weight.t()
        kind = _FORWARD_OP.get(mode)
        if kind is None:
            out = mm8(x, wt, fast_accum=FAST_OUTPUT)
        else:
            out = op8(kind, x, wt, group, impl, configs.get(kind), fast_accum=FAST_OUTPUT)
        out = out.to(x.dtype)
        if bias is not None:
            out = out.add_(bias)
        ctx.save_for_backward(x, weight)
        ctx.setup = (group, impl, configs, mode)
        return out

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        group, impl, configs, mode = ctx.setup
        dy = dy.contiguous()
        # the weight gradient's all-gather (bf16 rows, module docstring): with Syncopate's ops issued
        # first and waited for last, so that it moves beside the input gradient's op
        early = impl == "fused" and ctx.needs_input_grad[0] and mode in _INPUT_GRAD_OP
        dy_early = x_early = None
        if early and (ctx.needs_input_grad[1] or ctx.needs_input_grad[2]) and mode == "scatter":
            dy_early = all_gather_rows_async(dy, group)
        if early and ctx.needs_input_grad[1] and mode == "gather":
            x_early = all_gather_rows_async(x, group)
        dx = None
        if ctx.needs_input_grad[0]:
            kind = _INPUT_GRAD_OP.get(mode)
            dx = mm8(dy, weight) if kind is None else op8(kind, dy, weight, group, impl, configs.get(kind))
            dx = dx.to(x.dtype)
        dw = db = None
        if ctx.needs_input_grad[1] or ctx.needs_input_grad[2]:
            dy_rows = gathered_rows(dy_early, dy, group) if mode == "scatter" else dy
            if ctx.needs_input_grad[1]:
                x_rows = gathered_rows(x_early, x, group) if mode == "gather" else x
                dw = mm8(dy_rows.t(), x_rows).to(weight.dtype)
            if ctx.needs_input_grad[2]:
                db = dy_rows.sum(0)
        return dx, dw, db, None, None, None, None


@torch.compiler.disable(reason="syncopate.tp float8: the FP8 linears run eagerly (a graph break each)")
def apply(name: str, mode: str, rows, weight, bias, group, impl: str, configs: dict) -> torch.Tensor:
    """`Float8Linear` of `mode` on 2-D rows, checked first (`check`) on every rank alike. Eager
    under torch.compile too (a graph break), as the fused ops take FP8 operands eagerly only."""
    ws = dist.get_world_size(group)
    tokens = rows.shape[0] * ws if mode == "gather" else rows.shape[0]
    check(name, rows, weight, impl, tokens)
    return Float8Linear.apply(rows, weight, bias, group, impl, configs, mode)
