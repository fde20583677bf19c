"""FP8 operands: their scales, checked, and the scaled GEMM (`torch._scaled_mm`) the templates run.

| operand | dtype               | tensor-wise scale | row-wise scale              |
|---------|---------------------|-------------------|-----------------------------|
| a       | torch.float8_e4m3fn | one element       | [rows of a, 1]              |
| b       | torch.float8_e4m3fn | one element       | [1, columns of b]           |

Scales are float32 on the operands' device; the result is bf16 (`a_scale * a) @ (b * b_scale)`,
each rank's operands with its own scales). `torch._scaled_mm` takes B column-major: pass
`weight.t()` of a row-major [N, K] weight, which costs nothing; a row-major B is copied into that
layout on every call (`column_major`). It takes both scales tensor-wise or both row-wise:
where one is row-wise the other is widened to row-wise (`scaled_mm`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from syncopate.errors import ConfigError, describe
from syncopate.kernels import fp8_cast

__all__ = [
    "AMAX_EPS",
    "E4M3_MAX",
    "FP8",
    "LAYOUTS",
    "OUT_DTYPE",
    "SCALE_ALIGN",
    "Scales",
    "fast_accumulation",
    "check_scales",
    "chunk_scale",
    "column_major",
    "quantize",
    "row_scales",
    "scaled_mm",
]

FP8 = torch.float8_e4m3fn
"""The FP8 operand dtype the ops take."""
OUT_DTYPE = torch.bfloat16
"""The output (and reduced partials') dtype of FP8 operands."""


class Scales(NamedTuple):
    """A call's FP8 scales, and whether its GEMMs accumulate fast (`scaled_mm`'s `fast_accum`); a
    plain (a_scale, b_scale) pair is taken wherever one of these is."""

    a_scale: torch.Tensor
    b_scale: torch.Tensor
    fast_accum: bool = False


def fast_accumulation(scales) -> bool:
    """Whether `scales` (a `Scales`, or a plain (a_scale, b_scale) pair: no) ask for fast accumulation."""
    return len(scales) > 2 and bool(scales[2])


E4M3_MAX = 448.0
"""float8_e4m3fn's largest finite value: a scale maps the amax onto it."""
AMAX_EPS = 1e-12
"""The smallest amax a scale is made from: an all-zero row or column gets a finite scale."""
LAYOUTS = ("row", "column")
"""The layouts `quantize` writes an FP8 tensor in besides its input's."""
SCALE_ALIGN = 16
"""Bytes a row-wise scale's address must be a multiple of: the row-wise kernels read it in 16-byte
words (torch's own fused scaled ops copy a scale slice that is not)."""


def quantize(v: torch.Tensor, dim: int, layout: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(v as float8_e4m3fn, its float32 scale) with one scale per slice along `dim` (the contracted
    dimension): dim=1 gives a [rows, 1] scale, dim=0 a [1, columns] one. `layout`: the FP8 tensor's,
    `"row"` (row-major, as `torch._scaled_mm` takes A), `"column"` (column-major, as it takes B) or
    None (v's: a transposed view stays column-major).

    scale = max(amax, AMAX_EPS) · (1 / E4M3_MAX) in float32 (the reciprocal's product, as torch
    divides by a number on a GPU, on every device and path alike).

    v's amax, then v / scale computed in float32 and cast to FP8 as it is stored, written in
    `layout` (no copy into it after): on a GPU by Triton kernels (`syncopate.kernels.fp8_cast`: one
    pass where each scale's slice has unit stride in and out, else two, coalesced whatever the two
    layouts), elsewhere torch's reduction and division. No clamp to ±448: scale = amax / 448 puts
    every |v| / scale within a rounding of 448, far below 464, where e4m3 would round up to NaN,
    so clamping would change no value (the bytes are those of clamp(v / scale, ±448) as
    float8)."""
    if layout is None:
        v8 = torch.empty_like(v, dtype=FP8)
    elif layout in LAYOUTS:
        rows, cols = v.shape
        strides = (cols, 1) if layout == "row" else (1, rows)
        v8 = torch.empty_strided((rows, cols), strides, dtype=FP8, device=v.device)
    else:
        raise ConfigError(f"quantize: layout={layout!r}: accepted are 'row', 'column' and None (v's own)")
    if dim in (0, 1) and fp8_cast.fits(v):
        shape = (v.shape[0], 1) if dim == 1 else (1, v.shape[1])
        scale = torch.empty(shape, dtype=torch.float32, device=v.device)
        fp8_cast.launch_quantize(v, dim, v8, scale, AMAX_EPS, E4M3_MAX)
        return v8, scale
    amax = torch.linalg.vector_norm(v, float("inf"), dim=dim, keepdim=True).float()
    scale = amax.clamp_min(AMAX_EPS) * (1 / E4M3_MAX)
    torch.div(v, scale, out=v8)
    return v8, scale


def _tensor_wise(scale: torch.Tensor) -> bool:
    return scale.numel() == 1


def check_scales(a: torch.Tensor, b: torch.Tensor, a_scale: Any, b_scale: Any, out_dtype: Any = None) -> None:
    """ConfigError unless `a_scale`, `b_scale` and `out_dtype` fit the operands: with FP8 operands,
    float32 scales, each tensor-wise (one element) or row-wise (a: [rows, 1], b: [1, columns]),
    contiguous, on the operands' device, and an output in bfloat16 (None: bfloat16); with other
    operands, no scales and an `out_dtype` of None or the operands' dtype."""
    if a.dtype != FP8 and b.dtype != FP8:
        for name, value in (("a_scale", a_scale), ("b_scale", b_scale)):
            if value is not None:
                raise ConfigError(
                    f"{name} is given but a and b are {a.dtype}: scales go with float8_e4m3fn operands only"
                )
        if out_dtype is not None and out_dtype != a.dtype:
            raise ConfigError(
                f"out_dtype={out_dtype} for {a.dtype} operands: the output is in the operands' dtype "
                f"(out_dtype bfloat16 goes with float8_e4m3fn operands)"
            )
        return
    if a.dtype != b.dtype:
        raise ConfigError(
            f"a has dtype {a.dtype} but b has {b.dtype}: fp8 takes both operands in torch.float8_e4m3fn"
        )
    if out_dtype is not None and out_dtype != OUT_DTYPE:
        raise ConfigError(f"out_dtype={out_dtype} for float8_e4m3fn operands: accepted is torch.bfloat16")
    rows, cols = a.shape[0], b.shape[1]
    for name, scale, row_wise in (("a_scale", a_scale, (rows, 1)), ("b_scale", b_scale, (1, cols))):
        if scale is None:
            raise ConfigError(
                f"{name} is missing: float8_e4m3fn operands need a_scale and b_scale, float32, each one "
                f"element (tensor-wise) or row-wise (here a_scale {(rows, 1)}, b_scale {(1, cols)})"
            )
        if not isinstance(scale, torch.Tensor):
            raise ConfigError(f"{name} must be a torch.Tensor, got {describe(scale)}")
        if scale.dtype != torch.float32:
            raise ConfigError(f"{name} has dtype {scale.dtype}: accepted is torch.float32")
        if not (_tensor_wise(scale) or tuple(scale.shape) == row_wise):
            raise ConfigError(
                f"{name} has shape {tuple(scale.shape)}: accepted are one element (tensor-wise) or "
                f"{row_wise} (row-wise, for {'a' if name == 'a_scale' else 'b'} of shape "
                f"{tuple(a.shape) if name == 'a_scale' else tuple(b.shape)})"
            )
        if not scale.is_contiguous():
            raise ConfigError(
                f"{name} must be contiguous; got strides {scale.stride()} for {tuple(scale.shape)}"
            )
        if scale.device != a.device:
            raise ConfigError(
                f"{name} is on {scale.device} but a is on {a.device}: put it beside the operands"
            )


def column_major(b: torch.Tensor) -> torch.Tensor:
    """`b` as `torch._scaled_mm` takes it, column-major: itself where it is already (`weight.t()`),
    else a column-major copy (made on every call: B's values may change between calls)."""
    if b.stride(0) == 1 and b.stride(1) == b.shape[0]:
        return b
    return b.t().contiguous().t()


def row_scales(scale: torch.Tensor, rows: int) -> torch.Tensor:
    """A's scale row-wise: itself where it is, else the tensor-wise value on each of `rows` rows."""
    if not _tensor_wise(scale):
        return scale
    return scale.reshape(1, 1).expand(rows, 1).contiguous()


def chunk_scale(scale: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """The scale of rows [lo, hi) of A: those rows of a row-wise scale (a copy where they do not
    start at a multiple of `SCALE_ALIGN` bytes: rows not a multiple of 4 in), a tensor-wise one itself."""
    if _tensor_wise(scale):
        return scale
    rows = scale[lo:hi]
    return rows if rows.data_ptr() % SCALE_ALIGN == 0 else rows.clone()


def scaled_mm(
    a: torch.Tensor,
    b: torch.Tensor,
    a_scale: torch.Tensor,
    b_scale: torch.Tensor,
    out: torch.Tensor | None = None,
    fast_accum: bool = False,
) -> torch.Tensor:
    """(a * a_scale) @ (b * b_scale) in bf16 by `torch._scaled_mm`, into `out` where given. `b` must
    be column-major (`column_major`). Both scales are passed tensor-wise (as 0-d) or row-wise: where
    one is row-wise, the other is widened to row-wise (a small copy). `fast_accum`: Hopper's fast
    FP8 accumulation (`use_fast_accum`: faster, its sums rounded more coarsely)."""
    a_row, b_row = not _tensor_wise(a_scale), not _tensor_wise(b_scale)
    if a_row or b_row:
        if not a_row:
            a_scale = row_scales(a_scale, a.shape[0])
        if not b_row:
            b_scale = b_scale.reshape(1, 1).expand(1, b.shape[1]).contiguous()
    else:
        a_scale, b_scale = a_scale.reshape(()), b_scale.reshape(())
    return torch._scaled_mm(a, b, a_scale, b_scale, out_dtype=OUT_DTYPE, use_fast_accum=fast_accum, out=out)
