"""Dynamic FP8 quantization on the GPU: Triton kernels where torch needs a reduction and a
dynamically-cast division (`syncopate.kernels.scaled.quantize` says what is computed).

- `slice_kernel`, where each slice (the values one scale covers) has unit stride in v and in the
  output (a row-major operand scaled by row, a weight's transpose by column): one program a slice,
  its amax, its scale, its cast, in one pass over memory (a slice beyond `SLICE_CHUNK` elements
  read a second time from the cache).
- Otherwise (the slices run across v's rows: a weight gradient's operands, scaled along the
  tokens, or a layout the output changes) two kernels:
  - `amax_kernel`: the amax of each slice in float32. Program (k, s) takes BK slices over one span
    of the reduced dimension and raises each slice's word with an atomic max on its float32 bits
    (non-negative floats order as their int32 bits), so that a reduction over the tokens (8192
    rows) still spreads over every SM.
  - `cast_kernel`: v / scale rounded to float8_e4m3fn tile by tile, read in v's layout and
    written in the output's (a transposed write goes through the tile, not through strided
    stores). The programs of the first tile column (row-wise) or row (column-wise) store the
    scales.

Every path computes the scale as torch does on a GPU, max(amax, AMAX_EPS) · (1 / E4M3_MAX) in
float32, divides with IEEE division and rounds with the hardware's round-to-nearest-even
conversion: the bytes and scales of torch's reduction and division, whose division of a 16-bit
tensor by a broadcast float32 scale into an FP8 output takes its slow dynamic-cast path (several
times these kernels' time on an FP8 layer's operands).

Under Triton's interpreter the kernels write float32 and torch rounds it to FP8 (the interpreter's
own float32 → float8 conversion rounds ties away from zero and can lose a carry into the exponent),
so the CPU suite checks the kernels' indexing, reductions and scales, and the GPU suite the bytes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["AMAX_TARGET_PROGRAMS", "fits", "launch_quantize"]

AMAX_TARGET_PROGRAMS = 1024
"""Programs the amax kernel aims at: the reduced dimension is split into spans until the kept
slices' blocks times the spans reach about this many (a few per SM)."""

_CONTIGUOUS_BLOCK = 256
"""A tile's extent along the dimension of unit stride (512 bytes of 16-bit elements)."""
_OTHER_BLOCK = 16
"""A tile's extent along the other dimension of the amax kernel's tiles."""
_CAST_BLOCK = 64
"""The cast kernel's square tiles' side (a transposed write converts the tile's layout)."""

SLICE_CHUNK = 8192
"""Elements of a slice `slice_kernel` holds at once: a slice up to this long is read once; a longer
one is read twice, the second time mostly from the cache (one program's slice, a few tens of KB)."""

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
"""The dtypes the kernels quantize."""


@triton.jit
def amax_kernel(v_ptr, amax_ptr, n_keep, n_red, s_keep, s_red, span, BK: tl.constexpr, BR: tl.constexpr):
    """amax_ptr[k] (int32 bits of a float32, zeroed by the caller) = max over the reduced index r of
    |v[k·s_keep + r·s_red]|, for k < n_keep, r < n_red; program (k, s): slices [k·BK, (k+1)·BK),
    reduced indices [s·span, (s+1)·span) (span a multiple of BR)."""
    keep = tl.program_id(0) * BK + tl.arange(0, BK)
    kmask = keep < n_keep
    start = tl.program_id(1) * span
    end = tl.minimum(start + span, n_red)
    rows = v_ptr + keep.to(tl.int64)[:, None] * s_keep
    acc = tl.zeros([BK, BR], dtype=tl.float32)  # element-wise maxima: one reduction, at the end
    for r0 in range(start, end, BR):
        red = r0 + tl.arange(0, BR)
        mask = kmask[:, None] & (red < end)[None, :]
        x = tl.load(rows + red.to(tl.int64)[None, :] * s_red, mask=mask, other=0.0)
        acc = tl.maximum(acc, tl.abs(x.to(tl.float32)))
    amax = tl.max(acc, axis=1)
    tl.atomic_max(amax_ptr + keep, amax.to(tl.int32, bitcast=True), mask=kmask)


@triton.jit
def cast_kernel(
    v_ptr,
    out_ptr,
    amax_ptr,
    scale_ptr,
    rows,
    cols,
    s_vr,
    s_vc,
    s_or,
    s_oc,
    eps,
    inv_top,
    PER_ROW: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """out[r, c] = v[r, c] / scale, scale = max(amax, eps) · inv_top of row r (PER_ROW) or column c,
    for the BLOCK × BLOCK tile (program_id(0), program_id(1)); scale_ptr[r] (or [c]) stored by the
    first tile column (row)."""
    pr = tl.program_id(0)
    pc = tl.program_id(1)
    r = pr * BLOCK + tl.arange(0, BLOCK)
    c = pc * BLOCK + tl.arange(0, BLOCK)
    rmask = r < rows
    cmask = c < cols
    if PER_ROW:
        amax = tl.load(amax_ptr + r, mask=rmask, other=0).to(tl.float32, bitcast=True)
        scale = tl.maximum(amax, eps) * inv_top
        div = scale[:, None]
        if pc == 0:
            tl.store(scale_ptr + r, scale, mask=rmask)
    else:
        amax = tl.load(amax_ptr + c, mask=cmask, other=0).to(tl.float32, bitcast=True)
        scale = tl.maximum(amax, eps) * inv_top
        div = scale[None, :]
        if pr == 0:
            tl.store(scale_ptr + c, scale, mask=cmask)
    mask = rmask[:, None] & cmask[None, :]
    r64 = r.to(tl.int64)[:, None]
    c64 = c.to(tl.int64)[None, :]
    x = tl.load(v_ptr + r64 * s_vr + c64 * s_vc, mask=mask, other=0.0).to(tl.float32)
    y = tl.math.div_rn(x, div)
    tl.store(out_ptr + r64 * s_or + c64 * s_oc, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def slice_kernel(
    v_ptr, out_ptr, scale_ptr, n_red, s_v, s_o, eps, inv_top, CHUNK: tl.constexpr, ONE_CHUNK: tl.constexpr
):
    """One slice of unit stride a program (slice k at v_ptr + k·s_v, written at out_ptr + k·s_o in
    the same order): its amax over chunks of CHUNK elements, its scale stored, then each chunk cast
    (read again, from the cache where the slice is longer than a chunk; ONE_CHUNK: kept in
    registers)."""
    k = tl.program_id(0).to(tl.int64)
    src = v_ptr + k * s_v
    dst = out_ptr + k * s_o
    offs = tl.arange(0, CHUNK)
    if ONE_CHUNK:
        mask = offs < n_red
        x = tl.load(src + offs, mask=mask, other=0.0).to(tl.float32)
        scale = tl.maximum(tl.max(tl.abs(x), axis=0), eps) * inv_top
        tl.store(scale_ptr + k, scale)
        tl.store(dst + offs, tl.math.div_rn(x, scale).to(dst.dtype.element_ty), mask=mask)
    else:
        acc = tl.zeros([CHUNK], dtype=tl.float32)
        for c0 in range(0, n_red, CHUNK):
            mask = c0 + offs < n_red
            x = tl.load(src + c0 + offs, mask=mask, other=0.0)
            acc = tl.maximum(acc, tl.abs(x.to(tl.float32)))
        scale = tl.maximum(tl.max(acc, axis=0), eps) * inv_top
        tl.store(scale_ptr + k, scale)
        for c0 in range(0, n_red, CHUNK):
            mask = c0 + offs < n_red
            x = tl.load(src + c0 + offs, mask=mask, other=0.0).to(tl.float32)
            tl.store(dst + c0 + offs, tl.math.div_rn(x, scale).to(dst.dtype.element_ty), mask=mask)


def fits(v: torch.Tensor) -> bool:
    """Whether the kernels quantize `v`: a non-empty 2-D tensor of a 16-bit or float32 dtype, on a
    GPU, or anywhere under Triton's interpreter."""
    from syncopate.kernels.launch import interpreting

    return v.dim() == 2 and v.numel() > 0 and v.dtype in DTYPES and (v.is_cuda or interpreting())


def _amax_tiles(s_keep: int, s_red: int) -> tuple[int, int]:
    """(BK, BR): the amax tile's extents, the longer along the dimension of unit stride."""
    if s_red == 1:
        return _OTHER_BLOCK, _CONTIGUOUS_BLOCK
    if s_keep == 1:
        return _CONTIGUOUS_BLOCK, _OTHER_BLOCK
    return 32, 32


_AMAX_ARGS = ("v_ptr", "amax_ptr", "n_keep", "n_red", "s_keep", "s_red", "span")
_CAST_ARGS = (
    "v_ptr", "out_ptr", "amax_ptr", "scale_ptr", "rows", "cols", "s_vr", "s_vc", "s_or", "s_oc", "eps", "inv_top",
)  # fmt: skip
_SLICE_ARGS = ("v_ptr", "out_ptr", "scale_ptr", "n_red", "s_v", "s_o", "eps", "inv_top")
_LAUNCHES: dict = {}
"""The compiled kernels of earlier launches, by shape, strides and dtypes (`launch.run_kept`): a
job quantizes the same few operand shapes at every step."""


def launch_quantize(
    v: torch.Tensor, dim: int, out: torch.Tensor, scale: torch.Tensor, eps: float, top: float
) -> None:
    """out (float8_e4m3fn, v's shape, any strides) = v / scale with one scale per slice along `dim`
    (dim=1: per row, `scale` [rows, 1]; dim=0: per column, `scale` [1, cols]; float32, contiguous),
    scale = max(amax, eps) · (1 / top) in float32 (as torch on a GPU divides by a number: by its
    reciprocal); v as `fits` takes it."""
    from syncopate.kernels.launch import interpreting, run_kept

    rows, cols = v.shape
    per_row = dim == 1
    n_keep, n_red = (rows, cols) if per_row else (cols, rows)
    s_keep, s_red = (v.stride(0), v.stride(1)) if per_row else (v.stride(1), v.stride(0))
    target = out
    if interpreting():
        target = torch.empty_strided(out.shape, out.stride(), dtype=torch.float32, device=v.device)
    o_keep, o_red = (target.stride(0), target.stride(1)) if per_row else (target.stride(1), target.stride(0))
    if s_red == 1 and o_red == 1:  # slices of unit stride in and out: one program a slice, one pass
        chunk = min(SLICE_CHUNK, triton.next_power_of_2(n_red))
        args = (v, target, scale, n_red, s_keep, o_keep, eps, 1.0 / top)
        meta = {"CHUNK": chunk, "ONE_CHUNK": n_red <= chunk, "num_warps": 8 if chunk >= 4096 else 4}
        run_kept(_LAUNCHES, slice_kernel, "slice", (n_keep,), _SLICE_ARGS, args, meta, ())
    else:  # two passes: the amax over spans of the reduced dimension, then the tiled cast
        bk, br = _amax_tiles(s_keep, s_red)
        keep_blocks = triton.cdiv(n_keep, bk)
        red_blocks = triton.cdiv(n_red, br)
        spans = max(1, min(red_blocks, triton.cdiv(AMAX_TARGET_PROGRAMS, keep_blocks)))
        span = triton.cdiv(red_blocks, spans) * br
        amax = torch.zeros(n_keep, dtype=torch.int32, device=v.device)
        grid = (keep_blocks, triton.cdiv(n_red, span))
        args = (v, amax, n_keep, n_red, s_keep, s_red, span)
        meta = {"BK": bk, "BR": br, "num_warps": 4}
        run_kept(_LAUNCHES, amax_kernel, "amax", grid, _AMAX_ARGS, args, meta, ())
        grid = (triton.cdiv(rows, _CAST_BLOCK), triton.cdiv(cols, _CAST_BLOCK))
        strides = (v.stride(0), v.stride(1), target.stride(0), target.stride(1))
        args = (v, target, amax, scale, rows, cols, *strides, eps, 1.0 / top)
        meta = {"PER_ROW": per_row, "BLOCK": _CAST_BLOCK, "num_warps": 4}
        run_kept(_LAUNCHES, cast_kernel, "cast", grid, _CAST_ARGS, args, meta, ())
    if target is not out:
        out.copy_(target)
