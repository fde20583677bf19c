"""Triton kernels of the `fused` MoE template: persistent grouped GEMMs that consume rows as they
land (dispatch) or store their rows where the destination rank keeps them (combine).

Shape symbols

| symbol   | meaning                                                                         |
|----------|---------------------------------------------------------------------------------|
| El       | this rank's local experts                                                       |
| R        | rows this rank's experts receive (h's rows)                                     |
| K        | the reduction: H (dispatch) or F (combine)                                      |
| N        | output columns: 2F (dispatch) or H (combine)                                    |
| BM/BN/BK | BLOCK_M, BLOCK_N, BLOCK_K                                                       |
| Mt       | row tiles of the call, each in one expert's rows (`DISPATCH_WORDS`, `COMBINE_WORDS`) |
| P        | persistent programs (grid size, at most the SMs)                                |

A call's output tiles are (row tile, column block) pairs, row-tile major, in the order of the row
tile table (the dispatch's in groups of `DISPATCH_GROUP_M` row tiles, each group's column blocks in
turn): program p runs tiles p, p + P, …, each a loop over K in BK steps (fp32 accumulation,
operands in their own 16-bit type). A row tile's rows are contiguous in the output and lie in at
most two runs of A, so a tile is a base row, a count, a split and one signal word.

Signals are int32 words that only grow: a piece of call `epoch` is there when its word is >= epoch
(compared wrap-safe as a signed difference). A wait polls with an acquire atomic at system scope
(the dense kernels' `_wait_slot`, in its loop form);
`max_spin` > 0 bounds it, and a wait that runs out sets `error_ptr[0] = 1` and goes on (tests, and
a search that must not hang); its result is 0 but depends on what was read, and is added to the
rows a tile loads or stores, so that the compiler cannot move them before the wait.

- `dispatch_kernel`: row tile = up to BM rows of one expert in h, from one source or from the own
  rows and the one peer beside them (`syncopate.moe.fused.dispatch_tile_table`); the own rows are
  read from x at their tokens (no gather before the kernel), the peers' from the receive buffer
  once the word of the last piece they reach is raised; output rows go to h in the unfused layout
  (by local expert, then source, then token).
- `combine_kernel`: row tile = up to BM rows of one expert in h, going to at most two ranks (the own
  rows' edge beside a peer's), its peer rows in one piece; a tile computes its rows of
  h·W2[e], waits until the peer has entered the call (its buffer is free; a program
  waits once for each destination, as a dispatch program waits once a piece), stores them
  into each rank's receive buffer (a peer-mapped pointer), then counts itself in its piece; the
  count that completes a piece resets the counter and raises the piece's word in the destination's
  pad with a release store.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from syncopate.kernels import launch as _launch
from syncopate.kernels.triton_kernels import _wait_slot

__all__ = [
    "COMBINE_WORDS",
    "DISPATCH_WORDS",
    "combine_kernel",
    "dispatch_kernel",
    "launch_combine",
    "launch_dispatch",
    "launch_scatter_rows",
    "launch_segment_sum",
    "launch_swiglu",
    "launch_swiglu_grad",
]

DISPATCH_WORDS = 8
"""int32 words of a dispatch row tile: expert, A row, own (1: the first part's rows are x's
tokens, 0: rows of the receive buffer), rows, signal word (-1: no wait), h row, split (rows of
the first part; the rest are of the other kind), the second part's A row."""

COMBINE_WORDS = 12
"""int32 words of a combine row tile: expert, h row, rows, destination rank, destination row,
piece (-1: the own rows alone, counted by no one), the piece's word in the pad of the piece's
rank (the last word), the entry word in this rank's pad to wait on first (-1: none), split (rows
that go to the first destination; the rest go to the second), second destination rank, its row,
the piece's rank."""


@triton.jit
def _tile_product(
    a_ptrs,
    w_ptrs,
    m_ok,
    n_ok,
    offs_k,
    K,
    stride_wk,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    EVEN_K: tl.constexpr,
    EVEN_N: tl.constexpr,
):
    """Σ_k A[rows, k] · W[k, cols] in float32: A contiguous along K, W at stride `stride_wk`.
    `EVEN_K` / `EVEN_N`: K is a multiple of BLOCK_K / N of BLOCK_N, so no load of a K step (of W's
    columns) is masked there (the grouped GEMMs of the layers served are all even)."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=m_ok[:, None], other=0.0)
            if EVEN_N:
                b = tl.load(w_ptrs)
            else:
                b = tl.load(w_ptrs, mask=n_ok[None, :], other=0.0)
        else:
            k_ok = (offs_k + k) < K
            a = tl.load(a_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
            b = tl.load(w_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K * stride_wk
    return acc


@triton.jit(do_not_specialize=["epoch", "max_spin"])
def dispatch_kernel(
    x_ptr,
    token_ptr,
    recv_ptr,
    recv_index_ptr,
    w_ptr,
    h_ptr,
    tiles_ptr,
    pad_ptr,
    error_ptr,
    epoch,
    max_spin,
    row_tiles,
    N,
    K,
    stride_x,
    stride_a,
    stride_we,
    stride_wk,
    stride_wn,
    stride_hm,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    EVEN_K: tl.constexpr,
    EVEN_N: tl.constexpr,
    GATHER: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    """h[tile rows, cols] = A[tile rows] @ W[e][:, cols] for every tile of the table (module docstring).
    The own rows are tokens of x: their A rows are token-side rows, each read from x at its token
    (`token_ptr`); the peers' are rows of the receive buffer, with GATHER each at the row
    `recv_index[row]` of it (a token's row received once a rank and read once for each of its
    experts there). A tile split in two reads each row from its part's place."""
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    tiles_n = tl.cdiv(N, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    seen = -1  # the word this program last waited for: its next tiles of that piece need no wait
    for t in range(pid, row_tiles * tiles_n, programs):
        # GROUP_M consecutive row tiles of the table at a time, their column blocks in turn: the
        # programs working at once share W's blocks in L2 (GROUP_M 1: row tile by row tile)
        group_start = (t // (GROUP_M * tiles_n)) * GROUP_M
        in_group = tl.minimum(row_tiles - group_start, GROUP_M)
        mt = group_start + (t % (GROUP_M * tiles_n)) % in_group
        tn = (t % (GROUP_M * tiles_n)) // in_group
        entry = tiles_ptr + mt * 8
        e = tl.load(entry).to(tl.int64)
        a_row = tl.load(entry + 1)
        own = tl.load(entry + 2)
        rows = tl.load(entry + 3)
        word = tl.load(entry + 4)
        h_row = tl.load(entry + 5)
        split = tl.load(entry + 6)
        gate = 0
        if word != seen:
            gate = _wait_slot(pad_ptr, word, epoch, error_ptr, max_spin, False)
            seen = word
        offs_n = tn * BLOCK_N + tl.arange(0, BLOCK_N)
        m_ok = offs_m < rows
        n_ok = offs_n < N
        if split < rows:  # the own rows' edge beside the partner's: each row from its own place
            first = offs_m < split
            row = tl.where(first, a_row + offs_m, tl.load(entry + 7) + offs_m - split)
            from_x = first == (own != 0)
            tokens = tl.load(token_ptr + row, mask=m_ok & from_x, other=0).to(tl.int64)
            x_ptrs = x_ptr + (tokens * stride_x)[:, None] + offs_k[None, :]
            if GATHER:
                row = tl.load(recv_index_ptr + row, mask=m_ok & ~from_x, other=0)
            r_ptrs = recv_ptr + ((row + gate).to(tl.int64) * stride_a)[:, None] + offs_k[None, :]
            a_ptrs = tl.where(from_x[:, None], x_ptrs, r_ptrs)
        elif own != 0:
            tokens = tl.load(token_ptr + a_row + offs_m, mask=m_ok, other=0).to(tl.int64)
            a_ptrs = x_ptr + (tokens * stride_x)[:, None] + offs_k[None, :]
        else:
            if GATHER:
                a_rows = (tl.load(recv_index_ptr + a_row + offs_m, mask=m_ok, other=0) + gate).to(tl.int64)
            else:
                a_rows = (a_row + gate + offs_m).to(tl.int64)
            a_ptrs = recv_ptr + (a_rows * stride_a)[:, None] + offs_k[None, :]
        w_ptrs = w_ptr + e * stride_we + offs_k[:, None] * stride_wk + offs_n[None, :] * stride_wn
        acc = _tile_product(
            a_ptrs,
            w_ptrs,
            m_ok,
            n_ok,
            offs_k,
            K,
            stride_wk,
            BLOCK_M,
            BLOCK_N,
            BLOCK_K,
            NUM_STAGES,
            EVEN_K,
            EVEN_N,
        )
        out_rows = (h_row + offs_m).to(tl.int64) * stride_hm
        tl.store(
            h_ptr + out_rows[:, None] + offs_n[None, :],
            acc.to(h_ptr.dtype.element_ty),
            mask=m_ok[:, None] & n_ok[None, :],
        )


@triton.jit(do_not_specialize=["epoch", "max_spin"])
def combine_kernel(
    h_ptr,
    w_ptr,
    dest_ptrs,
    tiles_ptr,
    piece_tiles_ptr,
    counter_ptr,
    pad_ptr,
    peer_pads_ptr,
    error_ptr,
    epoch,
    max_spin,
    row_tiles,
    N,
    K,
    stride_hm,
    stride_we,
    stride_wk,
    stride_wn,
    stride_dm,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    EVEN_K: tl.constexpr,
    EVEN_N: tl.constexpr,
):
    """Each tile's rows of h @ W[e] stored into its destination rank's buffer; a piece's last tile
    raises its word there (module docstring). `piece_tiles_ptr[p]`: row tiles of piece p."""
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    tiles_n = tl.cdiv(N, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    elem = h_ptr.dtype.element_ty
    seen = -1  # the entry word this program last waited for
    for t in range(pid, row_tiles * tiles_n, programs):
        mt = t // tiles_n
        entry = tiles_ptr + mt * 12
        e = tl.load(entry).to(tl.int64)
        h_row = tl.load(entry + 1)
        rows = tl.load(entry + 2)
        dest = tl.load(entry + 3)
        dest_row = tl.load(entry + 4)
        piece = tl.load(entry + 5)
        word = tl.load(entry + 6)
        entered = tl.load(entry + 7)
        split = tl.load(entry + 8)
        offs_n = (t - mt * tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N)
        m_ok = offs_m < rows
        n_ok = offs_n < N
        a_ptrs = h_ptr + ((h_row + offs_m).to(tl.int64) * stride_hm)[:, None] + offs_k[None, :]
        w_ptrs = w_ptr + e * stride_we + offs_k[:, None] * stride_wk + offs_n[None, :] * stride_wn
        acc = _tile_product(
            a_ptrs,
            w_ptrs,
            m_ok,
            n_ok,
            offs_k,
            K,
            stride_wk,
            BLOCK_M,
            BLOCK_N,
            BLOCK_K,
            NUM_STAGES,
            EVEN_K,
            EVEN_N,
        )
        gate = 0
        if entered != seen:  # the destination's buffer is free
            gate = _wait_slot(pad_ptr, entered, epoch, error_ptr, max_spin, False)
            seen = entered
        base = tl.multiple_of(tl.load(dest_ptrs + dest).to(tl.pointer_type(elem)), 16)  # vector stores
        out_rows = (dest_row + gate + offs_m).to(tl.int64) * stride_dm
        out = acc.to(elem)
        if split < rows:  # the own rows' edge beside a peer's: two stores, each to its rank
            first = offs_m < split
            tl.store(
                base + out_rows[:, None] + offs_n[None, :], out, mask=(m_ok & first)[:, None] & n_ok[None, :]
            )
            base = tl.load(dest_ptrs + tl.load(entry + 9)).to(tl.pointer_type(elem))
            base = tl.multiple_of(base, 16)
            out_rows = (tl.load(entry + 10) - split + gate + offs_m).to(tl.int64) * stride_dm
            tl.store(
                base + out_rows[:, None] + offs_n[None, :], out, mask=(m_ok & ~first)[:, None] & n_ok[None, :]
            )
        else:
            tl.store(base + out_rows[:, None] + offs_n[None, :], out, mask=m_ok[:, None] & n_ok[None, :])
        if piece >= 0:
            tl.debug_barrier()  # every thread's rows stored before the count below releases them
            done = tl.atomic_add(counter_ptr + piece, 1, sem="acq_rel", scope="sys") + 1
            if done == tl.load(piece_tiles_ptr + piece) * tiles_n:
                tl.atomic_xchg(counter_ptr + piece, 0, sem="relaxed", scope="gpu")
                peer_pad = tl.load(peer_pads_ptr + tl.load(entry + 11)).to(tl.pointer_type(tl.int32))
                tl.atomic_xchg(peer_pad + word, epoch, sem="release", scope="sys")


def _args_before(kernel, constexpr: str) -> tuple[str, ...]:
    """The names of `kernel`'s arguments before its first constant `constexpr`: what `_run` binds."""
    return tuple(kernel.arg_names[: kernel.arg_names.index(constexpr)])


_DISPATCH_ARGS = _args_before(dispatch_kernel, "BLOCK_M")
_COMBINE_ARGS = _args_before(combine_kernel, "BLOCK_M")


def _meta(block_m: int, block_n: int, block_k: int, num_warps: int, num_stages: int, n: int, k: int) -> dict:
    """A grouped GEMM kernel's tile sizes and launch options, as its launch takes them, for W's
    [K, N] `k`, `n` (whether its loads need masks along them)."""
    return dict(
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        NUM_STAGES=num_stages,
        EVEN_K=k % block_k == 0,
        EVEN_N=n % block_n == 0,
        num_warps=num_warps,
        num_stages=num_stages,
    )


def _programs(tiles: int, programs: int) -> int:
    return max(1, min(tiles, programs))


_RELAUNCHES: dict = {}
"""Compiled MoE kernels kept for relaunch (`_run`), by everything a launch fixes."""

_PER_CALL = ("epoch", "row_tiles")
"""The integer arguments that change from call to call: relaunched with the new value."""


def _run(kernel, name: str, grid: tuple[int], names: tuple[str, ...], args: tuple, kwargs: dict) -> None:
    """`kernel[grid](*args, **kwargs)`, or the compiled kernel of an earlier launch that fixed the
    same choices, launched again with its tensors and per-call integers replaced
    (`syncopate.kernels.launch.run_kept`: Triton's dispatch binds and specializes every argument,
    which on a busy host costs a call about a hundred microseconds on its path; an MoE call comes
    right after the host has waited for its routing, when the device has nothing else to run)."""
    _launch.run_kept(_RELAUNCHES, kernel, name, grid, names, args, kwargs, _PER_CALL)


DISPATCH_GROUP_M = 4
"""Row tiles of the dispatch's table that its programs take together, column block by column block
(`dispatch_kernel`), so that the programs running at once share the weights' blocks in L2; 1 takes
them row tile by row tile. On one H200 (the kernel alone, `benchmarks/moe_kernel.py`) 4 ran the
DeepSeek-like layer's dispatch 3–5 % faster than 1, and 8 less so; Qwen3-30B-A3B's alike."""


def _check_operands(a: torch.Tensor, w: torch.Tensor, out_width: int) -> None:
    if a.dtype not in (torch.bfloat16, torch.float16) or w.dtype != a.dtype:
        raise ValueError(
            f"the fused MoE kernels take bf16 or fp16 operands of one type, got {a.dtype} and {w.dtype}"
        )
    if a.stride(-1) != 1:
        raise ValueError(f"the fused MoE kernels read rows contiguous along K, got strides {a.stride()}")
    if w.shape[2] != out_width:
        raise ValueError(f"weights {tuple(w.shape)} give {w.shape[2]} columns, the output has {out_width}")


def launch_dispatch(
    x: torch.Tensor,
    token_rows: torch.Tensor,
    recv: torch.Tensor,
    w: torch.Tensor,
    h: torch.Tensor,
    tiles: torch.Tensor,
    pad: torch.Tensor,
    error: torch.Tensor,
    *,
    epoch: int,
    programs: int,
    block_m: int,
    block_n: int,
    block_k: int,
    num_warps: int,
    num_stages: int,
    spin_limit: int = 0,
    recv_index: torch.Tensor | None = None,
) -> None:
    """Run `dispatch_kernel` on the current stream over `tiles` ([Mt, DISPATCH_WORDS] int32): x [T, K]
    (this rank's tokens) and token_rows [T·top_k] (each token-side row's token: the own tiles' rows),
    recv [*, K] (the receive buffer, expert side; with `recv_index` [R] int32, each expert-side
    row's row in it), W [El, K, N], h [R, N]; `pad` this rank's signal words; at most `programs`
    programs."""
    _check_operands(x, w, h.shape[1])
    if recv.stride(-1) != 1 or recv.shape[1] != x.shape[1] or recv.dtype != x.dtype:
        raise ValueError("the tokens and the receive buffer must hold rows of one width and type")
    row_tiles = tiles.shape[0]
    if row_tiles == 0:
        return
    n, k = w.shape[2], w.shape[1]
    grid = (_programs(row_tiles * triton.cdiv(n, block_n), programs),)
    _run(
        dispatch_kernel,
        "dispatch",
        grid,
        _DISPATCH_ARGS,
        (
            x,
            token_rows,
            recv,
            token_rows if recv_index is None else recv_index,
            w,
            h,
            tiles,
            pad,
            error,
            epoch,
            spin_limit,
            row_tiles,
            n,
            k,
            x.stride(0),
            recv.stride(0),
            w.stride(0),
            w.stride(1),
            w.stride(2),
            h.stride(0),
        ),
        {
            **_meta(block_m, block_n, block_k, num_warps, num_stages, n, k),
            "GATHER": recv_index is not None,
            "GROUP_M": DISPATCH_GROUP_M,
        },
    )


def launch_combine(
    h: torch.Tensor,
    w: torch.Tensor,
    dest_ptrs: torch.Tensor,
    dest_stride: int,
    tiles: torch.Tensor,
    piece_tiles: torch.Tensor,
    counters: torch.Tensor,
    pad: torch.Tensor,
    peer_pads: torch.Tensor,
    error: torch.Tensor,
    *,
    epoch: int,
    programs: int,
    block_m: int,
    block_n: int,
    block_k: int,
    num_warps: int,
    num_stages: int,
    spin_limit: int = 0,
) -> None:
    """Run `combine_kernel` on the current stream over `tiles` ([Mt, COMBINE_WORDS] int32): h [R, K],
    W [El, K, N]; `dest_ptrs` [ws] int64, each rank's receive buffer (rows of N elements of h's type,
    `dest_stride` apart) as mapped here, 16-byte aligned (the stores are vectors); `piece_tiles`
    [pieces] int32, each piece's row tiles; `counters` [pieces] int32 or int64, zero; `pad` this
    rank's signal words, `peer_pads` [ws] int64 every rank's pad as mapped here; at most
    `programs` programs."""
    _check_operands(h, w, w.shape[2])
    if dest_ptrs.dtype != torch.int64 or peer_pads.dtype != torch.int64:
        raise ValueError("the destination and pad pointers are int64 tensors")
    if (dest_stride * h.element_size()) % 16:
        raise ValueError(
            f"destination rows {dest_stride} elements apart: the stores take 16-byte aligned rows"
        )
    row_tiles = tiles.shape[0]
    if row_tiles == 0:
        return
    n, k = w.shape[2], w.shape[1]
    grid = (_programs(row_tiles * triton.cdiv(n, block_n), programs),)
    _run(
        combine_kernel,
        "combine",
        grid,
        _COMBINE_ARGS,
        (
            h,
            w,
            dest_ptrs,
            tiles,
            piece_tiles,
            counters,
            pad,
            peer_pads,
            error,
            epoch,
            spin_limit,
            row_tiles,
            n,
            k,
            h.stride(0),
            w.stride(0),
            w.stride(1),
            w.stride(2),
            dest_stride,
        ),
        _meta(block_m, block_n, block_k, num_warps, num_stages, n, k),
    )


# The gate-weighted top-k sum of the combine's rows, read in place ---------------------------------


@triton.jit
def _landed_row(rows_ptr, own_ptr, row, own_lo, own_hi, stride_r, stride_own):
    """Where row `row` of the send order is: in `own_ptr` (at row - own_lo) for rows in [own_lo,
    own_hi), the rows a rank computed for itself and kept where its GEMM wrote them; else in
    `rows_ptr`."""
    mine = (row >= own_lo) & (row < own_hi)
    return tl.where(mine, own_ptr + (row - own_lo) * stride_own, rows_ptr + row * stride_r)


@triton.jit
def gathered_sum_kernel(
    rows_ptr,
    own_ptr,
    index_ptr,
    gate_ptr,
    out_ptr,
    H,
    own_lo,
    own_hi,
    stride_r,
    stride_own,
    stride_o,
    TOP_K: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    """out[t] = Σ_j gate[t, j] · rows[index[t·TOP_K + j]] over columns [BLOCK_H·b, BLOCK_H·(b+1)),
    float32 accumulation in j's order; program (t, b). Rows [own_lo, own_hi) are read from
    `own_ptr` (`_landed_row`)."""
    t = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask = offs < H
    acc = tl.zeros([BLOCK_H], dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        row = tl.load(index_ptr + t * TOP_K + j).to(tl.int64)
        gate = tl.load(gate_ptr + t * TOP_K + j).to(tl.float32)
        src = _landed_row(rows_ptr, own_ptr, row, own_lo, own_hi, stride_r, stride_own)
        acc += gate * tl.load(src + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + t * stride_o + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def gathered_sum_rows_grad_kernel(
    grad_ptr, order_ptr, gate_ptr, out_ptr, H, stride_g, stride_o, TOP_K: tl.constexpr, BLOCK_H: tl.constexpr
):
    """The rows' gradient of `gathered_sum_kernel`, in the rows' order: out[i] = gate[p] · grad[p //
    TOP_K] for the pair p = order[i] that row i is (order: the inverse of the sum's index)."""
    i = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask = offs < H
    pair = tl.load(order_ptr + i).to(tl.int64)
    gate = tl.load(gate_ptr + pair).to(tl.float32)
    g = tl.load(grad_ptr + (pair // TOP_K) * stride_g + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + i * stride_o + offs, (gate * g).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def gathered_sum_gates_grad_kernel(
    grad_ptr,
    rows_ptr,
    own_ptr,
    index_ptr,
    out_ptr,
    H,
    own_lo,
    own_hi,
    stride_g,
    stride_r,
    stride_own,
    TOP_K: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    """The gates' gradient of `gathered_sum_kernel`: out[t, j] = <grad[t], rows[index[t·TOP_K + j]]>,
    float32; program t. Rows [own_lo, own_hi) are read from `own_ptr`, as the sum reads them."""
    t = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_H)
    for j in tl.static_range(TOP_K):
        row = tl.load(index_ptr + t * TOP_K + j).to(tl.int64)
        src = _landed_row(rows_ptr, own_ptr, row, own_lo, own_hi, stride_r, stride_own)
        acc = tl.zeros([BLOCK_H], dtype=tl.float32)
        for h0 in range(0, H, BLOCK_H):
            offs = h0 + cols
            mask = offs < H
            g = tl.load(grad_ptr + t * stride_g + offs, mask=mask, other=0.0).to(tl.float32)
            x = tl.load(src + offs, mask=mask, other=0.0).to(tl.float32)
            acc += g * x
        tl.store(out_ptr + t * TOP_K + j, tl.sum(acc, axis=0))


_SUM_ARGS = _args_before(gathered_sum_kernel, "TOP_K")
_SUM_ROWS_ARGS = _args_before(gathered_sum_rows_grad_kernel, "TOP_K")
_SUM_GATES_ARGS = _args_before(gathered_sum_gates_grad_kernel, "TOP_K")
SUM_BLOCK = 1024
"""Columns a program of the gathered-sum kernels takes at a time."""


def _sum_block(h: int) -> int:
    return min(SUM_BLOCK, triton.next_power_of_2(max(1, h)))


def _own_args(rows: torch.Tensor, own: tuple[torch.Tensor, int] | None) -> tuple:
    """(own rows, first row, end row, row stride) as the kernels take them; no own rows: an empty range."""
    if own is None:
        return rows, 0, 0, rows.stride(0)
    kept, lo = own
    if kept.stride(-1) != 1 or kept.dtype != rows.dtype or kept.shape[1] != rows.shape[1]:
        raise ValueError(
            f"own rows {tuple(kept.shape)} {kept.dtype} stride {kept.stride()} must be rows like "
            f"{tuple(rows.shape)} {rows.dtype} with unit column stride"
        )
    return kept, lo, lo + kept.shape[0], kept.stride(0)


def launch_gathered_sum(
    rows: torch.Tensor,
    index: torch.Tensor,
    gates: torch.Tensor,
    out: torch.Tensor,
    own: tuple[torch.Tensor, int] | None = None,
) -> None:
    """out [T, H] = Σ_j gates[t, j] · rows[index[t·top_k + j]]: rows [*, H] with unit column stride,
    index [T·top_k] int64, gates [T, top_k] contiguous (any float type), out [T, H] with unit column
    stride. `own` = (kept [n, H], lo): rows [lo, lo + n) are read from kept instead."""
    tokens, top_k = gates.shape
    h = rows.shape[1]
    if tokens == 0 or h == 0:
        return
    block = _sum_block(h)
    kept, lo, hi, stride_own = _own_args(rows, own)
    _run(
        gathered_sum_kernel,
        "gathered_sum",
        (tokens, triton.cdiv(h, block)),
        _SUM_ARGS,
        (rows, kept, index, gates, out, h, lo, hi, rows.stride(0), stride_own, out.stride(0)),
        dict(TOP_K=top_k, BLOCK_H=block, num_warps=4),
    )


def launch_gathered_sum_grads(
    grad: torch.Tensor,
    rows: torch.Tensor,
    index: torch.Tensor,
    order: torch.Tensor,
    gates: torch.Tensor,
    grad_rows: torch.Tensor | None,
    grad_gates: torch.Tensor | None,
    own: tuple[torch.Tensor, int] | None = None,
) -> None:
    """The gradients of `launch_gathered_sum` given its output's `grad` [T, H] (unit column stride):
    into `grad_rows` [T·top_k, H] (rows' order; `order` the inverse of `index`) and `grad_gates`
    [T, top_k] float32, each where given; `own` as the sum took it."""
    tokens, top_k = gates.shape
    h = rows.shape[1]
    if tokens == 0 or h == 0:
        if grad_gates is not None:
            grad_gates.zero_()
        return
    block = _sum_block(h)
    if grad_rows is not None:
        _run(
            gathered_sum_rows_grad_kernel,
            "gathered_sum_rows",
            (tokens * top_k, triton.cdiv(h, block)),
            _SUM_ROWS_ARGS,
            (grad, order, gates, grad_rows, h, grad.stride(0), grad_rows.stride(0)),
            dict(TOP_K=top_k, BLOCK_H=block, num_warps=4),
        )
    if grad_gates is not None:
        kept, lo, hi, stride_own = _own_args(rows, own)
        _run(
            gathered_sum_gates_grad_kernel,
            "gathered_sum_gates",
            (tokens,),
            _SUM_GATES_ARGS,
            (grad, rows, kept, index, grad_gates, h, lo, hi, grad.stride(0), rows.stride(0), stride_own),
            dict(TOP_K=top_k, BLOCK_H=block, num_warps=4),
        )


# Rows put where an index says --------------------------------------------------------------------


@triton.jit
def scatter_rows_kernel(src_ptr, index_ptr, dst_ptr, N, stride_s, stride_d, BLOCK_N: tl.constexpr):
    """dst[index[i], cols] = src[i, cols] over columns [BLOCK_N·b, BLOCK_N·(b+1)); program (i, b).
    Each program moves a contiguous piece of one row (torch's `index_copy_` moves elements one by
    one, at a third of the bandwidth on rows a few kilobytes wide)."""
    i = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = offs < N
    row = tl.load(index_ptr + i).to(tl.int64)
    tl.store(dst_ptr + row * stride_d + offs, tl.load(src_ptr + i * stride_s + offs, mask=mask), mask=mask)


_SCATTER_ARGS = _args_before(scatter_rows_kernel, "BLOCK_N")


def launch_scatter_rows(dst: torch.Tensor, index: torch.Tensor, src: torch.Tensor) -> None:
    """dst[index[i]] = src[i] for every row i of src [M, N] (unit column stride, dst's type and
    width); index [M] int64 or int32, each row of dst at most once."""
    rows, n = src.shape
    if rows == 0 or n == 0:
        return
    block = _sum_block(n)
    _run(
        scatter_rows_kernel,
        "scatter_rows",
        (rows, triton.cdiv(n, block)),
        _SCATTER_ARGS,
        (src, index, dst, n, src.stride(0), dst.stride(0)),
        dict(BLOCK_N=block, num_warps=4),
    )


# Rows summed by segment (the dedup template's sums) ---------------------------------------------


@triton.jit
def segment_sum_kernel(
    rows_ptr,
    order_ptr,
    starts_ptr,
    weight_ptr,
    out_ptr,
    R,
    N,
    stride_r,
    stride_o,
    MOST: tl.constexpr,
    WEIGHTED: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """out[s, cols] = Σ_{i in [starts[s], starts[s+1])} w[order[i]] · rows[order[i], cols] (w = 1
    without WEIGHTED) over columns [BLOCK_N·b, BLOCK_N·(b+1)), float32 accumulation in `order`'s
    order; program (s, b); a segment has at most MOST rows. Each program reads its segment's rows
    once, whole pieces of rows (torch's `index_add_` adds element by element, with atomics on a
    GPU)."""
    s = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = offs < N
    lo = tl.load(starts_ptr + s)
    hi = tl.load(starts_ptr + s + 1)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for j in range(0, MOST):
        # past the segment's end: a row of `order` that exists (R > 0), read by no column
        row = tl.load(order_ptr + tl.minimum(lo + j, R - 1)).to(tl.int64)
        take = mask & ((offs * 0 + lo + j) < hi)
        x = tl.load(rows_ptr + row * stride_r + offs, mask=take, other=0.0).to(tl.float32)
        if WEIGHTED:
            x = x * tl.load(weight_ptr + row).to(tl.float32)
        acc += x
    tl.store(out_ptr + s * stride_o + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


_SEGMENT_ARGS = _args_before(segment_sum_kernel, "MOST")


def launch_segment_sum(
    rows: torch.Tensor,
    order: torch.Tensor,
    starts: torch.Tensor,
    most: int,
    weights: torch.Tensor | None,
    out: torch.Tensor,
) -> None:
    """out [n, N] = per segment s, the sum of rows[order[i]] (weighted by weights[order[i]] where
    given) over i in [starts[s], starts[s+1]), at most `most` of them: rows [R, N] and out with unit
    column stride, order [R] and starts [n + 1] int64, weights [R] of any float type; float32
    accumulation."""
    n, width = out.shape
    if n == 0 or width == 0:
        return
    if rows.shape[0] == 0:  # every segment empty
        out.zero_()
        return
    block = _sum_block(width)
    _run(
        segment_sum_kernel,
        "segment_sum",
        (n, triton.cdiv(width, block)),
        _SEGMENT_ARGS,
        (
            rows,
            order,
            starts,
            rows if weights is None else weights,
            out,
            rows.shape[0],
            width,
            rows.stride(0),
            out.stride(0),
        ),
        dict(MOST=max(1, most), WEIGHTED=weights is not None, BLOCK_N=block, num_warps=4),
    )


# The experts' SwiGLU activation, fused ------------------------------------------------------------


@triton.jit
def _gate_up(h_ptr, F, stride_h, BLOCK_F: tl.constexpr):
    """Program (r, b)'s row r, its columns [BLOCK_F·b, BLOCK_F·(b+1)) below F, and h's gate and up
    values there in float32."""
    r = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    mask = offs < F
    row = h_ptr + r * stride_h
    gate = tl.load(row + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(row + F + offs, mask=mask, other=0.0).to(tl.float32)
    return r, offs, mask, gate, up


@triton.jit
def swiglu_kernel(h_ptr, out_ptr, F, stride_h, stride_o, BLOCK_F: tl.constexpr):
    """out[r, c] = silu(h[r, c]) · h[r, F + c] over columns [BLOCK_F·b, BLOCK_F·(b+1)), in float32;
    program (r, b)."""
    r, offs, mask, gate, up = _gate_up(h_ptr, F, stride_h, BLOCK_F)
    y = gate * tl.sigmoid(gate) * up
    tl.store(out_ptr + r * stride_o + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def swiglu_grad_kernel(g_ptr, h_ptr, out_ptr, F, stride_g, stride_h, stride_o, BLOCK_F: tl.constexpr):
    """The gradient of `swiglu_kernel` given its output's g: out[r, c] = g · up · σ(gate) · (1 +
    gate · (1 − σ(gate))) and out[r, F + c] = g · silu(gate), in float32; program (r, b)."""
    r, offs, mask, gate, up = _gate_up(h_ptr, F, stride_h, BLOCK_F)
    g = tl.load(g_ptr + r * stride_g + offs, mask=mask, other=0.0).to(tl.float32)
    s = tl.sigmoid(gate)
    out = out_ptr + r * stride_o
    kind = out_ptr.dtype.element_ty
    tl.store(out + offs, (g * up * s * (1.0 + gate * (1.0 - s))).to(kind), mask=mask)
    tl.store(out + F + offs, (g * gate * s).to(kind), mask=mask)


SWIGLU_BLOCK = 1024
"""Columns a program of the SwiGLU kernels takes at a time."""


def _swiglu_grid(rows: int, f: int) -> tuple[tuple[int, int], int]:
    block = min(SWIGLU_BLOCK, triton.next_power_of_2(max(1, f)))
    return (rows, triton.cdiv(f, block)), block


def launch_swiglu(h: torch.Tensor, out: torch.Tensor) -> None:
    """out [R, F] = silu(h[:, :F]) · h[:, F:] for h [R, 2F]; both of unit column stride."""
    rows, f = out.shape
    if rows == 0 or f == 0:
        return
    grid, block = _swiglu_grid(rows, f)
    swiglu_kernel[grid](h, out, f, h.stride(0), out.stride(0), BLOCK_F=block, num_warps=4)


def launch_swiglu_grad(grad: torch.Tensor, h: torch.Tensor, grad_h: torch.Tensor) -> None:
    """grad_h [R, 2F], the gradient of `launch_swiglu` at h [R, 2F] given its output's grad [R, F];
    all of unit column stride."""
    rows, f = grad.shape
    if rows == 0 or f == 0:
        return
    grid, block = _swiglu_grid(rows, f)
    swiglu_grad_kernel[grid](
        grad, h, grad_h, f, grad.stride(0), h.stride(0), grad_h.stride(0), BLOCK_F=block, num_warps=4
    )


# A routing's pair counts and checks ---------------------------------------------------------------


@triton.jit
def _count_below(sorted_ptr, v, n, steps, BLOCK: tl.constexpr):
    """For each of `v` [BLOCK]: how many of the n ascending values at `sorted_ptr` are below it,
    by `steps` rounds of bisection (at least n's bit length)."""
    lo = tl.zeros([BLOCK], dtype=tl.int64)
    hi = tl.zeros([BLOCK], dtype=tl.int64) + n
    for _ in range(steps):
        mid = (lo + hi) // 2
        open_ = lo < hi
        below = open_ & (tl.load(sorted_ptr + mid, mask=open_, other=0) < v)
        hi = tl.where(open_ & ~below, mid, hi)
        lo = tl.where(below, mid + 1, lo)
    return lo


@triton.jit
def pair_stats_kernel(
    keys_ptr, order_ptr, out_ptr, n, experts, top_k, steps, BLOCK_E: tl.constexpr, BLOCK: tl.constexpr
):
    """From a routing's expert ids sorted stably (`keys` [n], `order` [n]: each key's pair index):
    out[e] = the pairs of expert e (e < `experts`; ids outside [0, experts) are counted by no
    one), out[E] and out[E + 1] the smallest and largest id, out[E + 2] 1 where a token names an
    expert twice (two equal keys side by side of one token, pair // top_k), else left as it is
    (zero). Program 0 counts (a binary search of every expert's first and end key, `steps` rounds)
    and reads the extremes; every program tests its BLOCK keys for repeats."""
    pid = tl.program_id(0)
    i = pid * BLOCK + tl.arange(0, BLOCK)
    later = (i >= 1) & (i < n)
    key = tl.load(keys_ptr + i, mask=later, other=0)
    before = tl.load(keys_ptr + i - 1, mask=later, other=1)
    token = tl.load(order_ptr + i, mask=later, other=0) // top_k
    token_before = tl.load(order_ptr + i - 1, mask=later, other=0) // top_k
    repeat = tl.max((later & (key == before) & (token == token_before)).to(tl.int64), 0)
    if repeat > 0:
        tl.atomic_max(out_ptr + experts + 2, repeat)
    if pid == 0:
        e = tl.arange(0, BLOCK_E).to(tl.int64)
        first = _count_below(keys_ptr, e, n, steps, BLOCK_E)  # expert e's first key
        end = _count_below(keys_ptr, e + 1, n, steps, BLOCK_E)
        tl.store(out_ptr + e, end - first, mask=e < experts)
        tl.store(out_ptr + experts, tl.load(keys_ptr))
        tl.store(out_ptr + experts + 1, tl.load(keys_ptr + n - 1))


_PAIR_STATS_ARGS = _args_before(pair_stats_kernel, "BLOCK_E")


def launch_pair_stats(keys: torch.Tensor, order: torch.Tensor, top_k: int, experts: int) -> torch.Tensor:
    """[experts + 3] int64 on keys' device, by `pair_stats_kernel` from a routing's sorted ids
    `keys` [n] (n >= 1) and their pair indices `order` [n], both int64: the pairs per expert, the
    smallest and largest id, 1 where a token names an expert twice. Two launches (the zeroed
    output, the kernel), where the same from torch's ops takes about ten."""
    n = keys.numel()
    out = torch.zeros(experts + 3, dtype=torch.int64, device=keys.device)
    block = 1024
    _run(
        pair_stats_kernel,
        "pair_stats",
        (triton.cdiv(n, block),),
        _PAIR_STATS_ARGS,
        (keys, order, out, n, experts, top_k, max(1, n.bit_length())),
        dict(BLOCK_E=triton.next_power_of_2(experts), BLOCK=block, num_warps=4),
    )
    return out


# A layout's expert-side permutations --------------------------------------------------------------


@triton.jit
def expert_orders_kernel(table_ptr, forward_ptr, backward_ptr, rows, blocks, steps, BLOCK: tl.constexpr):
    """forward[i] = i + table[0][b] for i in block b of the starts table[1] (the blocks by expert,
    then source); backward[j] = j + table[2][b] for j in block b of table[3] (by source, then
    expert): each row's place is its block's new start plus its offset in the block."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = i < rows
    # row i's block: the last whose start is <= i (starts ascending from 0; an empty block shares its
    # start with the next, which is taken)
    b = _count_below(table_ptr + blocks, i + 1, blocks, steps, BLOCK) - 1
    tl.store(forward_ptr + i, i + tl.load(table_ptr + b), mask=ok)
    b = _count_below(table_ptr + 3 * blocks, i + 1, blocks, steps, BLOCK) - 1
    tl.store(backward_ptr + i, i + tl.load(table_ptr + 2 * blocks + b), mask=ok)


_ORDERS_ARGS = _args_before(expert_orders_kernel, "BLOCK")


def launch_expert_orders(table: torch.Tensor, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(forward, backward) [rows] int64 on table's device by `expert_orders_kernel`, from `table`
    [4, blocks] int64: the forward shifts and starts (blocks by expert, then source), the backward
    shifts and starts (by source, then expert). One launch, where repeat_interleave and an arange
    take five."""
    forward = torch.empty(rows, dtype=torch.int64, device=table.device)
    backward = torch.empty_like(forward)
    if rows == 0:
        return forward, backward
    blocks = table.shape[1]
    block = 1024
    _run(
        expert_orders_kernel,
        "expert_orders",
        (triton.cdiv(rows, block),),
        _ORDERS_ARGS,
        (table, forward, backward, rows, blocks, max(1, blocks.bit_length())),
        dict(BLOCK=block, num_warps=4),
    )
    return forward, backward
