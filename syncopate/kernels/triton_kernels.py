"""Triton kernels: the chunk-ordered persistent GEMMs and the SM-driven chunk copier.

Shape symbols

| symbol    | meaning                                                                  |
|-----------|--------------------------------------------------------------------------|
| M, N, K   | the GEMM each rank computes: out[M, N] = A[M, K] @ B[K, N]               |
| R0, R1    | consumer: rows [R0, R1) of A are this rank's own shard (no wait needed)  |
| BM/BN/BK  | BLOCK_M, BLOCK_N, BLOCK_K                                                |
| P         | persistent programs (grid size)                                          |
| C         | chunks of the communicated tensor, in row order                          |

Signals are int32 words that only grow: a chunk of call `epoch` is there when its word is >= epoch
(compared wrap-safe as a signed difference). Nothing resets them between calls, but for calls
captured in a CUDA graph, whose replays repeat their epoch: `graph_entry_kernel` clears the pads
before each of those. `epoch` is not
specialized on: otherwise the epochs 1 and 16k would each compile a variant of their own, in the
middle of a run, while the peers' waits run down. Waits are bounded
by `max_spin` polls when it is positive (MAX_SPIN for the copier); a wait that runs out sets
`error_ptr[0] = 1` and goes on, and the caller reports a timeout.

Both GEMMs are persistent and flattened by hand: program p runs one loop over (tile, k-step)
pairs of positions p, p+P, … of the tile order, so the compiler's software pipeline keeps loading
the next tile's operands while the current tile finishes. Waits contain no loop the compiler can
see (on the GPU they are a PTX polling loop, `ld.acquire.sys` then `fence.proxy.async.global` so
that TMA reads see what the wait saw), which keeps the main loop pipelineable. Chunks are at
least BLOCK_M rows, so a tile overlaps at most two chunks (`lo` and `hi - 1`).

Consumer (`ag_gemm`): the leading tiles of the order whose rows are all the rank's own shard read
it from the caller's tensor, with no wait; the others read the gathered buffer, and when such a tile
starts, the program waits for the chunk(s) its rows lie in (the rank's own chunks are signalled too,
by the local copy, for tiles across the shard's edge). A last wave of at most half the programs is
cut in K (`search_space.tail_split`): each of its tiles in parts on as many programs, the last part
waiting for the others' float32 sums (`_consumer_tail`).
Producer (`gemm_rs`, `gemm_ar`): entries (a tile and the one chunk whose rows it finishes) in the
order their chunks leave; the epilogue adds the partials received for the chunk's rows of the tile
(waiting for them first), stores them where they go (the send buffer, or the output for rows this
rank keeps), and the last tile of a chunk raises the chunk's ready signal with release semantics.
A tile with rows of two chunks is two entries, each computing the tile, so that no entry waits for
one chunk's partials while it holds a count that another rank waits for.

FP8 operands (SCALED): the same loops on float8 tiles, and each tile's float32 sum scaled by its
rows' and columns' scales (`_dequantized`) before anything is stored or added to it: a
reduction's partials are bf16, as `torch._scaled_mm`'s outputs would be.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = [
    "consumer_kernel",
    "producer_kernel",
    "chunk_copy_kernel",
    "pull_kernel",
    "graph_entry_kernel",
    "POLL_PTX",
    "STORES_DONE_PTX",
]

POLL_PTX = tl.constexpr("""
{
.reg .pred %p;
.reg .s32 %d;
.reg .u32 %n;
mov.u32 %n, 0;
WAIT:
ld.global.acquire.sys.b32 $0, [$1];
sub.s32 %d, $0, $2;
setp.ge.s32 %p, %d, 0;
@%p bra DONE;
add.u32 %n, %n, 1;
setp.lt.u32 %p, %n, $3;
@%p bra WAIT;
DONE:
fence.proxy.async.global;
}
""")
"""PTX of a bounded poll: $0 = *$1 (acquire, system scope) until $0 - $2 >= 0 or $3 polls, then a
proxy fence so that later TMA reads are ordered after it (`_poll_asm`, and the Gluon producer's)."""

STORES_DONE_PTX = tl.constexpr("""
{
cp.async.bulk.wait_group 0;
fence.proxy.async.global;
bar.sync 0;
mov.u32 $0, 0;
}
""")
"""PTX that waits until the thread's TMA stores are written, orders them before generic-proxy
accesses and meets the other threads (`_tma_stores_done`, and the Gluon producer's)."""


@triton.jit
def _timed_out(error_ptr, word_ptr):
    """A bounded wait for `word_ptr` ran out: the error word takes the low 32 bits of that word's
    address with its lowest bit set (a word is 4-byte aligned, so the code is never 0), from which
    the host names the word (`OverlapContext.check_error`)."""
    tl.atomic_xchg(error_ptr, ((word_ptr.to(tl.int64) & 0xFFFFFFFF) | 1).to(tl.int32))


@triton.jit
def _wait_at_least(ptr, epoch, error_ptr, MAX_SPIN: tl.constexpr):
    """Poll an int32 signal (acquire, system scope) until it reaches `epoch`; loops (interpreter, copier)."""
    value = tl.atomic_add(ptr, 0, sem="acquire", scope="sys")
    spins = 0
    if MAX_SPIN > 0:
        while ((value - epoch) < 0) & (spins < MAX_SPIN):
            value = tl.atomic_add(ptr, 0, sem="acquire", scope="sys")
            spins += 1
        if (value - epoch) < 0:
            _timed_out(error_ptr, ptr)
    else:
        while (value - epoch) < 0:
            value = tl.atomic_add(ptr, 0, sem="acquire", scope="sys")
    return value


@triton.jit
def _poll_asm(ptr, epoch, max_spin):
    """Poll until `(int)(*ptr - epoch) >= 0` or `max_spin` polls; returns the last value read.

    One inline-PTX instruction for the compiler: no loop in the IR, so the enclosing loop stays
    software-pipelined. Ends with a proxy fence so that later TMA reads are ordered after it.
    """
    return tl.inline_asm_elementwise(
        asm=POLL_PTX,
        constraints="=r,l,r,r",
        args=[ptr, epoch, max_spin],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


@triton.jit
def _poll_loop(ptr, epoch, max_spin):
    """The same poll as `_poll_asm` written as a loop (the Triton interpreter); max_spin <= 0: no bound."""
    value = tl.atomic_add(ptr, 0, sem="acquire", scope="sys")
    spins = 1
    while ((value - epoch) < 0) & ((spins < max_spin) | (max_spin <= 0)):
        value = tl.atomic_add(ptr, 0, sem="acquire", scope="sys")
        spins += 1
    return value


@triton.jit
def _wait_slot(signal_ptr, slot, epoch, error_ptr, max_spin, ASM_WAIT: tl.constexpr):
    """Wait for signal word `slot` (nothing when slot < 0); returns 0, also after a timeout.

    The result is data-dependent on what was read, so callers add it to load and store coordinates:
    the compiler then cannot issue those before the wait. A bounded wait that gives up (max_spin >
    0) sets the error word (`_timed_out`) and still returns 0: what follows reads stale data, but stays inside its
    buffers (a -1 there would store a partial one element before the all-reduce's buffer).
    """
    value = epoch
    if slot >= 0:
        if ASM_WAIT:
            value = _poll_asm(signal_ptr + slot, epoch, max_spin)
        else:
            value = _poll_loop(signal_ptr + slot, epoch, max_spin)
        if (value - epoch) < 0:
            _timed_out(error_ptr, signal_ptr + slot)
    return ((value - epoch) >> 31) & (max_spin >> 31)


@triton.jit
def _load_ab(
    a_ptr,
    b_ptr,
    a_desc,
    b_desc,
    off_m,
    off_n,
    k,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    USE_TMA: tl.constexpr,
    B_KMAJOR: tl.constexpr,
):
    if USE_TMA:
        a = a_desc.load([off_m, k])
        if B_KMAJOR:
            b = b_desc.load([off_n, k]).T
        else:
            b = b_desc.load([k, off_n])
    else:
        rows = off_m + tl.arange(0, BLOCK_M)
        cols = off_n + tl.arange(0, BLOCK_N)
        ks = k + tl.arange(0, BLOCK_K)
        a = tl.load(
            a_ptr + rows[:, None] * stride_am + ks[None, :] * stride_ak,
            mask=(rows[:, None] < M) & (rows[:, None] >= 0) & (ks[None, :] < K),
            other=0.0,
        )
        b = tl.load(
            b_ptr + ks[:, None] * stride_bk + cols[None, :] * stride_bn,
            mask=(ks[:, None] < K) & (cols[None, :] < N),
            other=0.0,
        )
    return a, b


@triton.jit
def _dequantized(
    acc,
    sa_ptr,
    sb_ptr,
    stride_sa,
    stride_sb,
    off_m,
    off_n,
    M,
    N,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """An FP8 tile's float32 sum scaled as `torch._scaled_mm` scales it: row r by `sa[r * stride_sa]`,
    column j by `sb[j * stride_sb]` (stride 0: a tensor-wise scale)."""
    rows = off_m + tl.arange(0, BLOCK_M)
    cols = off_n + tl.arange(0, BLOCK_N)
    sa = tl.load(sa_ptr + rows * stride_sa, mask=(rows >= 0) & (rows < M), other=0.0)
    sb = tl.load(sb_ptr + cols * stride_sb, mask=cols < N, other=0.0)
    return acc * sa[:, None] * sb[None, :]


@triton.jit
def _tile_at(
    order_ptr,
    i,
    tiles_n,
    mtile_lo_ptr,
    mtile_hi_ptr,
    chunk_slot_ptr,
    signal_ptr,
    epoch,
    error_ptr,
    max_spin,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ASM_WAIT: tl.constexpr,
    WAIT: tl.constexpr,
):
    """The output tile at position i of the consumer's order: its first row and column, and, with
    WAIT, once the chunk(s) its rows lie in have arrived, the wait's gate (0, to add to an offset
    so that the loads depend on the wait)."""
    tile = tl.load(order_ptr + i)
    tm = tile // tiles_n
    gate = 0
    if WAIT:
        lo = tl.load(mtile_lo_ptr + tm)
        hi = tl.load(mtile_hi_ptr + tm)
        gate = _wait_slot(signal_ptr, tl.load(chunk_slot_ptr + lo), epoch, error_ptr, max_spin, ASM_WAIT)
        if hi - 1 != lo:
            gate += _wait_slot(
                signal_ptr, tl.load(chunk_slot_ptr + hi - 1), epoch, error_ptr, max_spin, ASM_WAIT
            )
    return tm * BLOCK_M, (tile - tm * tiles_n) * BLOCK_N, gate


@triton.jit
def _consumer_tiles(
    a_ptr,
    b_ptr,
    c_ptr,
    a_desc,
    b_desc,
    c_desc,
    a_row0,
    M_A,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    order_ptr,
    mtile_lo_ptr,
    mtile_hi_ptr,
    chunk_slot_ptr,
    signal_ptr,
    epoch,
    error_ptr,
    max_spin,
    num_programs,
    first,
    count,
    tiles_n,
    k_tiles,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    USE_TMA: tl.constexpr,
    B_KMAJOR: tl.constexpr,
    ASM_WAIT: tl.constexpr,
    OUT_DTYPE: tl.constexpr,
    WAIT: tl.constexpr,
    sa_ptr,
    sb_ptr,
    stride_sa,
    stride_sb,
    SCALED: tl.constexpr,
):
    """Positions first, first + P, … (`count` of them) of the tile order, one flattened loop over
    (tile, k-step) pairs. Output row r reads row r - a_row0 of the A source (M_A rows); with WAIT,
    a tile first waits for the chunk(s) its rows lie in."""
    i = first - num_programs
    ki = -1
    off_m = 0
    a_row = 0
    off_n = 0
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in range(0, count * k_tiles):
        ki = tl.where(ki == k_tiles - 1, 0, ki + 1)
        if ki == 0:
            i += num_programs
            off_m, off_n, gate = _tile_at(
                order_ptr,
                i,
                tiles_n,
                mtile_lo_ptr,
                mtile_hi_ptr,
                chunk_slot_ptr,
                signal_ptr,
                epoch,
                error_ptr,
                max_spin,
                BLOCK_M,
                BLOCK_N,
                ASM_WAIT,
                WAIT,
            )
            a_row = off_m - a_row0 + gate
        a, b = _load_ab(
            a_ptr,
            b_ptr,
            a_desc,
            b_desc,
            a_row,
            off_n,
            ki * BLOCK_K,
            M_A,
            N,
            K,
            stride_am,
            stride_ak,
            stride_bk,
            stride_bn,
            BLOCK_M,
            BLOCK_N,
            BLOCK_K,
            USE_TMA,
            B_KMAJOR,
        )
        acc = tl.dot(a, b, acc)
        if ki == k_tiles - 1:
            if SCALED:
                acc = _dequantized(
                    acc, sa_ptr, sb_ptr, stride_sa, stride_sb, off_m, off_n, M_A + a_row0, N, BLOCK_M, BLOCK_N
                )
            if USE_TMA:
                c_desc.store([off_m, off_n], acc.to(OUT_DTYPE))
            else:
                rows = off_m + tl.arange(0, BLOCK_M)
                cols = off_n + tl.arange(0, BLOCK_N)
                tl.store(
                    c_ptr + rows[:, None] * stride_cm + cols[None, :] * stride_cn,
                    acc.to(OUT_DTYPE),
                    mask=(rows[:, None] < M_A + a_row0) & (cols[None, :] < N),
                )
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)


@triton.jit
def _consumer_tail(
    a_ptr,
    b_ptr,
    c_ptr,
    a_desc,
    b_desc,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    order_ptr,
    mtile_lo_ptr,
    mtile_hi_ptr,
    chunk_slot_ptr,
    signal_ptr,
    epoch,
    error_ptr,
    max_spin,
    unit,
    tail_start,
    tail_split,
    tiles_n,
    k_tiles,
    part_ptr,
    flag_ptr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    USE_TMA: tl.constexpr,
    B_KMAJOR: tl.constexpr,
    ASM_WAIT: tl.constexpr,
    OUT_DTYPE: tl.constexpr,
    sa_ptr,
    sb_ptr,
    stride_sa,
    stride_sb,
    SCALED: tl.constexpr,
):
    """Part `unit % tail_split` of the K steps of tail tile `unit // tail_split` (position
    tail_start + that of the order). Every part stores its float32 sum in its slot of `part_ptr`;
    every part but the last then raises its word of `flag_ptr` (release), and the last waits for
    those words, adds the slots up a slice of rows at a time (no second tile in registers, so the
    kernel keeps the registers of its main loop), stores the tile and clears the words."""
    SLICE: tl.constexpr = 32 if BLOCK_M >= 32 else BLOCK_M
    t = unit // tail_split
    q = unit - t * tail_split
    off_m, off_n, gate = _tile_at(
        order_ptr,
        tail_start + t,
        tiles_n,
        mtile_lo_ptr,
        mtile_hi_ptr,
        chunk_slot_ptr,
        signal_ptr,
        epoch,
        error_ptr,
        max_spin,
        BLOCK_M,
        BLOCK_N,
        ASM_WAIT,
        True,
    )
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for ki in range(q * k_tiles // tail_split, (q + 1) * k_tiles // tail_split):
        a, b = _load_ab(
            a_ptr,
            b_ptr,
            a_desc,
            b_desc,
            off_m + gate,
            off_n,
            ki * BLOCK_K,
            M,
            N,
            K,
            stride_am,
            stride_ak,
            stride_bk,
            stride_bn,
            BLOCK_M,
            BLOCK_N,
            BLOCK_K,
            USE_TMA,
            B_KMAJOR,
        )
        acc = tl.dot(a, b, acc)
    if SCALED:  # each part scaled: their sum is the scaled sum
        acc = _dequantized(acc, sa_ptr, sb_ptr, stride_sa, stride_sb, off_m, off_n, M, N, BLOCK_M, BLOCK_N)
    first = t * tail_split
    cells = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    tl.store(part_ptr + (first + q).to(tl.int64) * (BLOCK_M * BLOCK_N) + cells, acc)
    tl.debug_barrier()  # every thread's part stored before the release below, or the slices read
    if q < tail_split - 1:
        tl.atomic_xchg(flag_ptr + first + q, epoch, sem="release", scope="gpu")
    else:
        g = 0
        for p in range(0, tail_split - 1):
            g += _wait_slot(flag_ptr, first + p, epoch, error_ptr, max_spin, ASM_WAIT)
        cols = off_n + tl.arange(0, BLOCK_N)
        for r in tl.static_range(0, BLOCK_M, SLICE):
            local = r + tl.arange(0, SLICE)
            part_cells = local[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
            total = tl.zeros((SLICE, BLOCK_N), dtype=tl.float32)
            for p in range(0, tail_split):
                total += tl.load(part_ptr + (first + p + g).to(tl.int64) * (BLOCK_M * BLOCK_N) + part_cells)
            rows = off_m + local
            tl.store(
                c_ptr + rows[:, None] * stride_cm + cols[None, :] * stride_cn,
                total.to(OUT_DTYPE),
                mask=(rows[:, None] < M) & (cols[None, :] < N),
            )
        for p in range(0, tail_split - 1):
            tl.atomic_xchg(flag_ptr + first + p, 0, sem="relaxed", scope="gpu")


@triton.jit(do_not_specialize=["epoch"])
def consumer_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    a_desc,
    b_desc,
    c_desc,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    order_ptr,
    mtile_lo_ptr,
    mtile_hi_ptr,
    chunk_slot_ptr,
    signal_ptr,
    epoch,
    error_ptr,
    max_spin,
    num_programs,
    own_ptr,
    own_desc,
    own_rows,
    own_row0,
    stride_om,
    stride_ok,
    own_tiles,
    tail_start,
    tail_split,
    part_ptr,
    flag_ptr,
    sa_ptr,
    sb_ptr,
    stride_sa,
    stride_sb,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    USE_TMA: tl.constexpr,
    B_KMAJOR: tl.constexpr,
    ASM_WAIT: tl.constexpr,
    OUT_DTYPE: tl.constexpr,
    SCALED: tl.constexpr,
):
    """All-gather consumer: out[M, N] = A[M, K] @ B[K, N].

    The first `own_tiles` positions of the order have all their rows in this rank's own shard
    (`own_ptr` / `own_desc`: `own_rows` rows, output row `own_row0` first): they are read from there,
    with no wait for the shard's copy into the gathered buffer (made, if at all, beside). The other
    positions read A from the gathered buffer; chunk c of it is there once
    `signal[chunk_slot[c]] >= epoch`. With USE_TMA, `a_desc`, `own_desc`, `b_desc` (over B, or Bᵀ
    with B_KMAJOR) and `c_desc` are TMA descriptors; otherwise pointers and strides.

    With `tail_split` of 2 or more, the positions from `tail_start` on (fewer than half a wave of
    programs; `tail_start` a multiple of P) are cut in K: program u < (tiles - tail_start) ·
    tail_split computes part u % tail_split of position tail_start + u // tail_split after its
    whole tiles (`_consumer_tail`; float32 parts in `part_ptr`, tail_split slots a tile, their words
    in `flag_ptr`), so that
    the last wave is as short as a part rather than a tile.

    With SCALED (float8 operands), every sum is scaled by `_dequantized` before it is stored: row r
    of the output by `sa[r * stride_sa]`, column j by `sb[j * stride_sb]`.
    """
    pid = tl.program_id(0)
    tiles_n = tl.cdiv(N, BLOCK_N)
    num_tiles = tl.cdiv(M, BLOCK_M) * tiles_n
    k_tiles = tl.cdiv(K, BLOCK_K)
    whole = tl.where(tail_split > 1, tail_start, num_tiles)
    my_tiles = tl.cdiv(whole - pid, num_programs)
    my_own = tl.cdiv(tl.maximum(own_tiles - pid, 0), num_programs)
    _consumer_tiles(
        own_ptr,
        b_ptr,
        c_ptr,
        own_desc,
        b_desc,
        c_desc,
        own_row0,
        own_rows,
        N,
        K,
        stride_om,
        stride_ok,
        stride_bk,
        stride_bn,
        stride_cm,
        stride_cn,
        order_ptr,
        mtile_lo_ptr,
        mtile_hi_ptr,
        chunk_slot_ptr,
        signal_ptr,
        epoch,
        error_ptr,
        max_spin,
        num_programs,
        pid,
        my_own,
        tiles_n,
        k_tiles,
        BLOCK_M,
        BLOCK_N,
        BLOCK_K,
        USE_TMA,
        B_KMAJOR,
        ASM_WAIT,
        OUT_DTYPE,
        False,
        sa_ptr,
        sb_ptr,
        stride_sa,
        stride_sb,
        SCALED,
    )
    _consumer_tiles(
        a_ptr,
        b_ptr,
        c_ptr,
        a_desc,
        b_desc,
        c_desc,
        0,
        M,
        N,
        K,
        stride_am,
        stride_ak,
        stride_bk,
        stride_bn,
        stride_cm,
        stride_cn,
        order_ptr,
        mtile_lo_ptr,
        mtile_hi_ptr,
        chunk_slot_ptr,
        signal_ptr,
        epoch,
        error_ptr,
        max_spin,
        num_programs,
        pid + my_own * num_programs,
        my_tiles - my_own,
        tiles_n,
        k_tiles,
        BLOCK_M,
        BLOCK_N,
        BLOCK_K,
        USE_TMA,
        B_KMAJOR,
        ASM_WAIT,
        OUT_DTYPE,
        True,
        sa_ptr,
        sb_ptr,
        stride_sa,
        stride_sb,
        SCALED,
    )
    if tail_split > 1:
        if pid < (num_tiles - tail_start) * tail_split:
            _consumer_tail(
                a_ptr,
                b_ptr,
                c_ptr,
                a_desc,
                b_desc,
                M,
                N,
                K,
                stride_am,
                stride_ak,
                stride_bk,
                stride_bn,
                stride_cm,
                stride_cn,
                order_ptr,
                mtile_lo_ptr,
                mtile_hi_ptr,
                chunk_slot_ptr,
                signal_ptr,
                epoch,
                error_ptr,
                max_spin,
                pid,
                tail_start,
                tail_split,
                tiles_n,
                k_tiles,
                part_ptr,
                flag_ptr,
                BLOCK_M,
                BLOCK_N,
                BLOCK_K,
                USE_TMA,
                B_KMAJOR,
                ASM_WAIT,
                OUT_DTYPE,
                sa_ptr,
                sb_ptr,
                stride_sa,
                stride_sb,
                SCALED,
            )


@triton.jit
def _epilogue_chunk(
    acc,
    c,
    rows,
    cols,
    col_ok,
    N,
    OUT_ROW0,
    chunk_row_ptr,
    inc_start_ptr,
    inc_slot_ptr,
    inc_offset_ptr,
    recv_ptr,
    recv_signal_ptr,
    epoch,
    error_ptr,
    max_spin,
    INC_MAX: tl.constexpr,
    ASM_WAIT: tl.constexpr,
):
    """Add the partials received for the rows of chunk c in this tile."""
    r0 = tl.load(chunk_row_ptr + c)
    r1 = tl.load(chunk_row_ptr + c + 1)
    in_chunk = (rows >= r0) & (rows < r1)
    first = tl.load(inc_start_ptr + c)
    count = tl.load(inc_start_ptr + c + 1) - first
    for j in tl.static_range(INC_MAX):
        if j < count:
            gate = _wait_slot(
                recv_signal_ptr, tl.load(inc_slot_ptr + first + j), epoch, error_ptr, max_spin, ASM_WAIT
            )
            base = recv_ptr + tl.load(inc_offset_ptr + first + j) + gate
            part = tl.load(
                base + rows[:, None] * N + cols[None, :], mask=in_chunk[:, None] & col_ok, other=0.0
            )
            acc += part.to(tl.float32)
    return acc


@triton.jit
def _column_halves(acc, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The left and right column halves of a [BLOCK_M, BLOCK_N] accumulator."""
    return tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1)))


@triton.jit
def _store_chunk(
    acc,
    c,
    rows,
    cols,
    col_ok,
    N,
    OUT_ROW0,
    chunk_row_ptr,
    keep_ptr,
    send_ptr,
    out_ptr,
    reduced_ptr,
    free_ptr,
    epoch,
    error_ptr,
    max_spin,
    RANK,
    WORLD: tl.constexpr,
    ALL_REDUCE: tl.constexpr,
    ASM_WAIT: tl.constexpr,
):
    """Store the rows of chunk c in this tile where they go: kept rows to out (and reduced), others to send."""
    r0 = tl.load(chunk_row_ptr + c)
    r1 = tl.load(chunk_row_ptr + c + 1)
    mask = ((rows >= r0) & (rows < r1))[:, None] & col_ok
    if tl.load(keep_ptr + c) != 0:
        tl.store(
            out_ptr + (rows[:, None] - OUT_ROW0) * N + cols[None, :],
            acc.to(out_ptr.dtype.element_ty),
            mask=mask,
        )
        if ALL_REDUCE:
            gate = 0
            for p in tl.static_range(WORLD):
                if p != RANK:
                    gate += _wait_slot(free_ptr, p, epoch, error_ptr, max_spin, ASM_WAIT)
            tl.store(
                reduced_ptr + gate + rows[:, None] * N + cols[None, :],
                acc.to(reduced_ptr.dtype.element_ty),
                mask=mask,
            )
    else:
        tl.store(send_ptr + rows[:, None] * N + cols[None, :], acc.to(send_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _count_chunk(
    c,
    counter_ptr,
    chunk_tiles_ptr,
    chunk_ready_ptr,
    ready_ptr,
    keep_ptr,
    gather_slot_ptr,
    peer_signal_ptrs,
    epoch,
    WORLD: tl.constexpr,
    ALL_REDUCE: tl.constexpr,
    tiles=1,
):
    """Count `tiles` tiles in chunk c; the count that completes the chunk resets the counter and
    raises its signals.

    The count is an acquire-release at GPU scope (every tile of the chunk is counted on this GPU):
    the last tile's program acquires every earlier tile's release, and its signal write, a release
    at system scope, passes all of their stores on to whoever acquires the signal."""
    n = tl.full((), tiles, tl.int64)
    done = tl.atomic_add(counter_ptr + c, n, sem="acq_rel", scope="gpu") + n
    if done == tl.load(chunk_tiles_ptr + c).to(tl.int64):
        tl.atomic_xchg(counter_ptr + c, 0, sem="relaxed", scope="gpu")
        ready = tl.load(chunk_ready_ptr + c)
        if ready >= 0:
            tl.atomic_xchg(ready_ptr + ready, epoch, sem="release", scope="sys")
        if ALL_REDUCE:
            if tl.load(keep_ptr + c) != 0:
                for p in tl.static_range(WORLD):
                    slot = tl.load(gather_slot_ptr + c * WORLD + p)
                    if slot >= 0:
                        sig = tl.load(peer_signal_ptrs + p).to(tl.pointer_type(tl.int32))
                        tl.atomic_xchg(sig + slot, epoch, sem="release", scope="sys")


@triton.jit(do_not_specialize=["epoch"])
def producer_kernel(
    a_ptr,
    b_ptr,
    a_desc,
    b_desc,
    send_ptr,
    out_ptr,
    reduced_ptr,
    recv_ptr,
    send_desc,
    out_desc,
    reduced_desc,
    recv_desc,
    M,
    N,
    K,
    OUT_ROW0,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    order_ptr,
    entry_chunk_ptr,
    num_entries,
    chunk_row_ptr,
    inc_start_ptr,
    inc_slot_ptr,
    inc_offset_ptr,
    chunk_ready_ptr,
    chunk_tiles_ptr,
    counter_ptr,
    ready_ptr,
    keep_ptr,
    peer_signal_ptrs,
    gather_slot_ptr,
    free_ptr,
    RANK,
    recv_signal_ptr,
    epoch,
    error_ptr,
    max_spin,
    num_programs,
    sa_ptr,
    sb_ptr,
    stride_sa,
    stride_sb,
    WORLD: tl.constexpr,
    INC_MAX: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    USE_TMA: tl.constexpr,
    B_KMAJOR: tl.constexpr,
    ALL_REDUCE: tl.constexpr,
    ASM_WAIT: tl.constexpr,
    EPI_SPLIT: tl.constexpr,
    TMA_EPI: tl.constexpr,
    OUT_DTYPE: tl.constexpr,
    SCALED: tl.constexpr,
):
    """Reduce-scatter / all-reduce producer.

    Entry i (of `num_entries`) computes tile `order[i]` and finishes its rows of chunk
    `entry_chunk[i]`. Per chunk c (row order): rows [chunk_row[c], chunk_row[c+1]); incoming
    partials j in [inc_start[c], inc_start[c+1]) (at most INC_MAX) wait for
    `recv_signal[inc_slot[j]]` and live at `recv + inc_offset[j] + row * N`; `keep[c]` says the
    rows stay here (stored to
    `out[row - OUT_ROW0]`, and for an all-reduce also to `reduced[row]` once every peer p has entered
    this call, `free[p] >= epoch`), otherwise they go to `send[row]`. When the last of the chunk's
    `chunk_tiles[c]` tiles is stored (its counter, which it resets to 0 for the next call, reaches
    the count), `ready[chunk_ready[c]]` is raised (none where -1); for an all-reduce a kept chunk also
    raises, on every peer p, `peer_signal[p][gather_slot[c * WORLD + p]]`. With EPI_SPLIT=2 the
    epilogue works on the two column halves of the tile in turn (half the registers). With SCALED
    (float8 operands), a tile's sum is scaled by `_dequantized` before anything else.

    With TMA_EPI (every chunk boundary a multiple of BLOCK_M, so an entry is a whole tile of one
    chunk), the epilogue reads the partials and writes its rows through TMA descriptors over `recv`
    (as [rows, N]; partial j's rows start at row `inc_offset[j] / N`), `send`, `out` and `reduced`,
    each of box [BLOCK_M, BLOCK_N / EPI_SPLIT]: no per-element addresses or masks in registers. The
    stores are waited for and fenced before the tile is counted, so a chunk's signal still follows
    every write of its rows.
    """
    pid = tl.program_id(0)
    tiles_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    my_entries = tl.cdiv(num_entries - pid, num_programs)
    i = pid - num_programs
    ki = -1
    tm = 0
    off_n = 0
    c = 0
    pending = 0
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in range(0, my_entries * k_tiles):
        ki = tl.where(ki == k_tiles - 1, 0, ki + 1)
        if ki == 0:
            i += num_programs
            tile = tl.load(order_ptr + i)
            c = tl.load(entry_chunk_ptr + i)
            tm = tile // tiles_n
            off_n = (tile - tm * tiles_n) * BLOCK_N
        a, b = _load_ab(
            a_ptr,
            b_ptr,
            a_desc,
            b_desc,
            tm * BLOCK_M,
            off_n,
            ki * BLOCK_K,
            M,
            N,
            K,
            stride_am,
            stride_ak,
            stride_bk,
            stride_bn,
            BLOCK_M,
            BLOCK_N,
            BLOCK_K,
            USE_TMA,
            B_KMAJOR,
        )
        acc = tl.dot(a, b, acc)
        if ki == k_tiles - 1:
            if SCALED:
                acc = _dequantized(
                    acc, sa_ptr, sb_ptr, stride_sa, stride_sb, tm * BLOCK_M, off_n, M, N, BLOCK_M, BLOCK_N
                )
            if TMA_EPI:
                nxt = i + num_programs
                pending = _close_tile_tma(
                    acc,
                    tm * BLOCK_M,
                    off_n,
                    c,
                    N,
                    OUT_ROW0,
                    inc_start_ptr,
                    inc_slot_ptr,
                    inc_offset_ptr,
                    recv_desc,
                    recv_signal_ptr,
                    keep_ptr,
                    send_desc,
                    out_desc,
                    reduced_desc,
                    free_ptr,
                    counter_ptr,
                    chunk_tiles_ptr,
                    chunk_ready_ptr,
                    ready_ptr,
                    peer_signal_ptrs,
                    gather_slot_ptr,
                    epoch,
                    error_ptr,
                    max_spin,
                    RANK,
                    tl.load(entry_chunk_ptr + nxt, mask=nxt < num_entries, other=-1),
                    pending,
                    BLOCK_M,
                    BLOCK_N,
                    WORLD,
                    INC_MAX,
                    ALL_REDUCE,
                    ASM_WAIT,
                    EPI_SPLIT,
                    OUT_DTYPE,
                )
            else:
                rows = tm * BLOCK_M + tl.arange(0, BLOCK_M)
                _close_chunk(
                    acc,
                    rows,
                    off_n,
                    c,
                    N,
                    OUT_ROW0,
                    chunk_row_ptr,
                    inc_start_ptr,
                    inc_slot_ptr,
                    inc_offset_ptr,
                    recv_ptr,
                    recv_signal_ptr,
                    keep_ptr,
                    send_ptr,
                    out_ptr,
                    reduced_ptr,
                    free_ptr,
                    counter_ptr,
                    chunk_tiles_ptr,
                    chunk_ready_ptr,
                    ready_ptr,
                    peer_signal_ptrs,
                    gather_slot_ptr,
                    epoch,
                    error_ptr,
                    max_spin,
                    RANK,
                    BLOCK_M,
                    BLOCK_N,
                    WORLD,
                    INC_MAX,
                    ALL_REDUCE,
                    ASM_WAIT,
                    EPI_SPLIT,
                )
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)


@triton.jit
def _close_chunk(
    acc,
    rows,
    off_n,
    c,
    N,
    OUT_ROW0,
    chunk_row_ptr,
    inc_start_ptr,
    inc_slot_ptr,
    inc_offset_ptr,
    recv_ptr,
    recv_signal_ptr,
    keep_ptr,
    send_ptr,
    out_ptr,
    reduced_ptr,
    free_ptr,
    counter_ptr,
    chunk_tiles_ptr,
    chunk_ready_ptr,
    ready_ptr,
    peer_signal_ptrs,
    gather_slot_ptr,
    epoch,
    error_ptr,
    max_spin,
    RANK,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    WORLD: tl.constexpr,
    INC_MAX: tl.constexpr,
    ALL_REDUCE: tl.constexpr,
    ASM_WAIT: tl.constexpr,
    EPI_SPLIT: tl.constexpr,
):
    """Finish the rows of chunk c in a tile (both column halves with EPI_SPLIT=2), then count the tile in c."""
    if EPI_SPLIT == 2:
        acc0, acc1 = _column_halves(acc, BLOCK_M, BLOCK_N)
        _finish_chunk(
            acc0,
            rows,
            off_n,
            c,
            N,
            OUT_ROW0,
            chunk_row_ptr,
            inc_start_ptr,
            inc_slot_ptr,
            inc_offset_ptr,
            recv_ptr,
            recv_signal_ptr,
            keep_ptr,
            send_ptr,
            out_ptr,
            reduced_ptr,
            free_ptr,
            epoch,
            error_ptr,
            max_spin,
            RANK,
            BLOCK_N // 2,
            WORLD,
            INC_MAX,
            ALL_REDUCE,
            ASM_WAIT,
        )
        _finish_chunk(
            acc1,
            rows,
            off_n + BLOCK_N // 2,
            c,
            N,
            OUT_ROW0,
            chunk_row_ptr,
            inc_start_ptr,
            inc_slot_ptr,
            inc_offset_ptr,
            recv_ptr,
            recv_signal_ptr,
            keep_ptr,
            send_ptr,
            out_ptr,
            reduced_ptr,
            free_ptr,
            epoch,
            error_ptr,
            max_spin,
            RANK,
            BLOCK_N // 2,
            WORLD,
            INC_MAX,
            ALL_REDUCE,
            ASM_WAIT,
        )
    else:
        _finish_chunk(
            acc,
            rows,
            off_n,
            c,
            N,
            OUT_ROW0,
            chunk_row_ptr,
            inc_start_ptr,
            inc_slot_ptr,
            inc_offset_ptr,
            recv_ptr,
            recv_signal_ptr,
            keep_ptr,
            send_ptr,
            out_ptr,
            reduced_ptr,
            free_ptr,
            epoch,
            error_ptr,
            max_spin,
            RANK,
            BLOCK_N,
            WORLD,
            INC_MAX,
            ALL_REDUCE,
            ASM_WAIT,
        )
    _count_chunk(
        c,
        counter_ptr,
        chunk_tiles_ptr,
        chunk_ready_ptr,
        ready_ptr,
        keep_ptr,
        gather_slot_ptr,
        peer_signal_ptrs,
        epoch,
        WORLD,
        ALL_REDUCE,
    )


@triton.jit
def _tma_stores_done():
    """Wait until this thread's TMA stores are written (not only read from shared memory), order
    them before later generic-proxy accesses, and meet the other threads, so that the counter's
    release (by whichever thread) follows every store of the tile. The barrier is in the same
    inline PTX: `tl.debug_barrier()` would keep the compiler from pipelining the main loop."""
    tl.inline_asm_elementwise(
        asm=STORES_DONE_PTX,
        constraints="=r",
        args=[],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


@triton.jit
def _finish_tile_tma(
    acc,
    row0,
    col0,
    N,
    OUT_ROW0,
    first,
    count,
    inc_offset_ptr,
    recv_desc,
    keep,
    gate,
    send_desc,
    out_desc,
    reduced_desc,
    INC_MAX: tl.constexpr,
    ALL_REDUCE: tl.constexpr,
    OUT_DTYPE: tl.constexpr,
):
    """`_finish_chunk` for a whole tile of a chunk (rows from row0, columns from col0) through TMA,
    once what it waits for is there (`gate`, 0 then, is added to the coordinates that depend on it):
    add the `count` partials received from `inc_offset[first]` on, store the rows where they go."""
    for j in tl.static_range(INC_MAX):
        if j < count:
            prow = (tl.load(inc_offset_ptr + first + j) // N).to(tl.int32)
            acc += recv_desc.load([row0 + prow + gate, col0]).to(tl.float32)
    if keep:
        out_desc.store([row0 - OUT_ROW0, col0], acc.to(OUT_DTYPE))
        if ALL_REDUCE:
            reduced_desc.store([row0 + gate, col0], acc.to(OUT_DTYPE))
    else:
        send_desc.store([row0, col0], acc.to(OUT_DTYPE))


@triton.jit
def _close_tile_tma(
    acc,
    row0,
    off_n,
    c,
    N,
    OUT_ROW0,
    inc_start_ptr,
    inc_slot_ptr,
    inc_offset_ptr,
    recv_desc,
    recv_signal_ptr,
    keep_ptr,
    send_desc,
    out_desc,
    reduced_desc,
    free_ptr,
    counter_ptr,
    chunk_tiles_ptr,
    chunk_ready_ptr,
    ready_ptr,
    peer_signal_ptrs,
    gather_slot_ptr,
    epoch,
    error_ptr,
    max_spin,
    RANK,
    next_chunk,
    pending,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    WORLD: tl.constexpr,
    INC_MAX: tl.constexpr,
    ALL_REDUCE: tl.constexpr,
    ASM_WAIT: tl.constexpr,
    EPI_SPLIT: tl.constexpr,
    OUT_DTYPE: tl.constexpr,
):
    """`_close_chunk` for TMA_EPI: wait once for the tile's partials (and, for a kept chunk of an
    all-reduce, for every peer to have entered the call), finish the tile (in column halves with
    EPI_SPLIT=2); returns the tiles of chunk c this program has finished but not yet counted.

    When the program's next tile (`next_chunk`, -1 after its last) is of the same chunk, this tile
    is only added to `pending`: the chunk cannot be complete before that tile is, so nothing waits
    longer, and the program saves the store-completion wait and the counter's round trip. Otherwise
    it waits for all its stores and counts `pending + 1` tiles at once. (A later tile of the same
    chunk may wait for that chunk's partials while earlier ones are uncounted; those partials never
    depend on this rank's count of the same chunk: on a ring the chunk's path ends at its owner.)"""
    first = tl.load(inc_start_ptr + c)
    count = tl.load(inc_start_ptr + c + 1) - first
    keep = tl.load(keep_ptr + c) != 0
    gate = 0
    for j in tl.static_range(INC_MAX):
        if j < count:
            gate += _wait_slot(
                recv_signal_ptr, tl.load(inc_slot_ptr + first + j), epoch, error_ptr, max_spin, ASM_WAIT
            )
    if ALL_REDUCE:
        if keep:
            for p in tl.static_range(WORLD):
                if p != RANK:
                    gate += _wait_slot(free_ptr, p, epoch, error_ptr, max_spin, ASM_WAIT)
    if EPI_SPLIT == 2:
        acc0, acc1 = _column_halves(acc, BLOCK_M, BLOCK_N)
        _finish_tile_tma(
            acc0,
            row0,
            off_n,
            N,
            OUT_ROW0,
            first,
            count,
            inc_offset_ptr,
            recv_desc,
            keep,
            gate,
            send_desc,
            out_desc,
            reduced_desc,
            INC_MAX,
            ALL_REDUCE,
            OUT_DTYPE,
        )
        _finish_tile_tma(
            acc1,
            row0,
            off_n + BLOCK_N // 2,
            N,
            OUT_ROW0,
            first,
            count,
            inc_offset_ptr,
            recv_desc,
            keep,
            gate,
            send_desc,
            out_desc,
            reduced_desc,
            INC_MAX,
            ALL_REDUCE,
            OUT_DTYPE,
        )
    else:
        _finish_tile_tma(
            acc,
            row0,
            off_n,
            N,
            OUT_ROW0,
            first,
            count,
            inc_offset_ptr,
            recv_desc,
            keep,
            gate,
            send_desc,
            out_desc,
            reduced_desc,
            INC_MAX,
            ALL_REDUCE,
            OUT_DTYPE,
        )
    if next_chunk != c:
        if ASM_WAIT:
            _tma_stores_done()
        _count_chunk(
            c,
            counter_ptr,
            chunk_tiles_ptr,
            chunk_ready_ptr,
            ready_ptr,
            keep_ptr,
            gather_slot_ptr,
            peer_signal_ptrs,
            epoch,
            WORLD,
            ALL_REDUCE,
            pending + 1,
        )
    return tl.where(next_chunk == c, pending + 1, 0)


@triton.jit
def _finish_chunk(
    acc,
    rows,
    col0,
    c,
    N,
    OUT_ROW0,
    chunk_row_ptr,
    inc_start_ptr,
    inc_slot_ptr,
    inc_offset_ptr,
    recv_ptr,
    recv_signal_ptr,
    keep_ptr,
    send_ptr,
    out_ptr,
    reduced_ptr,
    free_ptr,
    epoch,
    error_ptr,
    max_spin,
    RANK,
    WIDTH: tl.constexpr,
    WORLD: tl.constexpr,
    INC_MAX: tl.constexpr,
    ALL_REDUCE: tl.constexpr,
    ASM_WAIT: tl.constexpr,
):
    """Epilogue of the rows of chunk c in `WIDTH` columns of a tile: add its received partials (the
    other chunk's rows are untouched), store the rows where they go."""
    cols = col0 + tl.arange(0, WIDTH)
    col_ok = cols[None, :] < N
    acc = _epilogue_chunk(
        acc,
        c,
        rows,
        cols,
        col_ok,
        N,
        OUT_ROW0,
        chunk_row_ptr,
        inc_start_ptr,
        inc_slot_ptr,
        inc_offset_ptr,
        recv_ptr,
        recv_signal_ptr,
        epoch,
        error_ptr,
        max_spin,
        INC_MAX,
        ASM_WAIT,
    )
    _store_chunk(
        acc,
        c,
        rows,
        cols,
        col_ok,
        N,
        OUT_ROW0,
        chunk_row_ptr,
        keep_ptr,
        send_ptr,
        out_ptr,
        reduced_ptr,
        free_ptr,
        epoch,
        error_ptr,
        max_spin,
        RANK,
        WORLD,
        ALL_REDUCE,
        ASM_WAIT,
    )


@triton.jit(do_not_specialize=["epoch", "NUM_JOBS"])
def chunk_copy_kernel(
    job_src_ptr,
    job_dst_ptr,
    job_elems_ptr,
    job_wait_ptr,
    job_signal_ptr,
    job_peer_ptr,
    NUM_JOBS,
    local_signal_ptr,
    peer_signal_ptrs,
    free_ptr,
    counter_ptr,
    epoch,
    error_ptr,
    NUM_PROGRAMS: tl.constexpr,
    BLOCK: tl.constexpr,
    ELEM: tl.constexpr,
    MAX_SPIN: tl.constexpr,
):
    """SM-driven chunk copies: the `sm_copy` backend's communication programs.

    Job j copies `job_elems[j]` elements of type ELEM from address `job_src[j]` to `job_dst[j]` (a
    peer's symmetric buffer, or a local one), all NUM_PROGRAMS programs sharing it in BLOCK-sized
    pieces, after `local_signal[job_wait[j]] >= epoch` (the chunk is ready here; -1: no wait) and
    `free[job_peer[j]] >= epoch` (the peer has entered this call). When every program has finished
    its share, the last one raises `peer_signal[job_peer[j]][job_signal[j]] = epoch` with release
    semantics (no signal where `job_signal[j]` is -1). Jobs run in order, so chunks leave in plan
    order. Counters count programs and are reset by the last one, so they start at 0 every call.
    """
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    for j in range(0, NUM_JOBS):
        peer = tl.load(job_peer_ptr + j)
        _wait_at_least(free_ptr + peer, epoch, error_ptr, MAX_SPIN)
        wait_slot = tl.load(job_wait_ptr + j)
        if wait_slot >= 0:
            _wait_at_least(local_signal_ptr + wait_slot, epoch, error_ptr, MAX_SPIN)
        src = tl.load(job_src_ptr + j).to(tl.pointer_type(ELEM))
        dst = tl.load(job_dst_ptr + j).to(tl.pointer_type(ELEM))
        n = tl.load(job_elems_ptr + j)
        for start in range(pid * BLOCK, n, NUM_PROGRAMS * BLOCK):
            idx = start + offs
            tl.store(dst + idx, tl.load(src + idx, mask=idx < n), mask=idx < n)
        done = tl.atomic_add(counter_ptr + j, 1, sem="acq_rel", scope="sys") + 1
        if done == NUM_PROGRAMS:
            tl.atomic_xchg(counter_ptr + j, 0, sem="relaxed", scope="gpu")
            signal = tl.load(job_signal_ptr + j)
            if signal >= 0:
                sig = tl.load(peer_signal_ptrs + peer).to(tl.pointer_type(tl.int32))
                tl.atomic_xchg(sig + signal, epoch, sem="release", scope="sys")


@triton.jit(do_not_specialize=["n", "word", "epoch", "max_spin"])
def pull_kernel(src_ptr, dst_ptr, n, pad_ptr, word, epoch, error_ptr, max_spin, BLOCK: tl.constexpr):
    """A peer's chunk copied by the SMs once the peer says it is ready: the decomposed all-reduce's
    last pull, which the call ends on (`kernels/decomposed.py`).

    Every program waits until word `word` of this rank's pad reaches `epoch` (acquire, system scope;
    `max_spin` > 0 bounds the polls, and a wait that runs out sets the error flag) and copies its
    BLOCK of the `n` elements of `src` (the peer's memory) to `dst`."""
    # The poll's acquire orders the loads after it; its result is not added to the offsets, which
    # would hide their 16-byte alignment from the compiler (and the loads' vector width with it).
    _wait_slot(pad_ptr, word, epoch, error_ptr, max_spin, False)
    start = tl.program_id(0).to(tl.int64) * BLOCK
    offs = start + tl.arange(0, BLOCK)
    if start + BLOCK <= n:  # a full block, unmasked: 16-byte loads and stores (`n` is not specialized)
        tl.store(dst_ptr + offs, tl.load(src_ptr + offs))
    else:
        ok = offs < n
        tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=ok), mask=ok)


@triton.jit
def _meet(pad_ptr, peer_pads_ptr, slot, RANK, WORLD: tl.constexpr, LANES: tl.constexpr):
    """Every rank of the group reaches this point: raise word `slot + RANK` of every pad, then wait
    for word `slot + p` of this pad to be raised by each rank p and lower them all again, so that
    the next meeting on these words finds them at 0. A rank raises a word of a meeting only after it
    has passed the meeting before it, on the other words, which every rank enters only after
    lowering these.

    The raises go out to every pad at once, one lane a rank (LANES, a power of two >= WORLD), so a
    meeting costs about one round trip across the links, not one a rank in turn; the polls read
    this rank's own pad (release on the raises, acquire on the polls, at system scope)."""
    lanes = tl.arange(0, LANES)
    mask = lanes < WORLD
    peers = tl.load(peer_pads_ptr + lanes, mask=mask, other=0).to(tl.pointer_type(tl.int32))
    tl.atomic_xchg(peers + slot + RANK, tl.full([LANES], 1, tl.int32), mask=mask, sem="release", scope="sys")
    for p in range(WORLD):
        seen = tl.atomic_add(pad_ptr + slot + p, 0, sem="acquire", scope="sys")
        while seen == 0:
            seen = tl.atomic_add(pad_ptr + slot + p, 0, sem="acquire", scope="sys")
    tl.store(pad_ptr + slot + lanes, tl.zeros([LANES], tl.int32), mask=mask)


@triton.jit
def graph_entry_kernel(
    pad_ptr,
    peer_pads_ptr,
    RANK,
    MEET_BASE,
    WORLD: tl.constexpr,
    CLEAR: tl.constexpr,
    BLOCK: tl.constexpr,
    LANES: tl.constexpr,
):
    """The start of a call captured in a CUDA graph, one program: every rank has ended its previous
    call (a meeting), this rank's pad words [0, CLEAR) are set to 0, and every rank has done so (a
    second meeting) before any rank goes on to raise a word of this call in a peer's pad.

    A replay repeats the epoch it was captured with (1), so the words a call waits on must start
    each call below it: the first meeting makes sure no peer still writes this pad (a rank's writes
    of a call are done when its next call starts, in stream order), the second that no peer raises
    a word before its owner has cleared it. With WORLD = 1 there is nobody to meet. LANES: a power
    of two >= WORLD (`_meet`'s lanes)."""
    if WORLD > 1:
        _meet(pad_ptr, peer_pads_ptr, MEET_BASE, RANK, WORLD, LANES)
        tl.debug_barrier()
    offs = tl.arange(0, BLOCK)
    for start in range(0, CLEAR, BLOCK):
        tl.store(pad_ptr + start + offs, tl.zeros([BLOCK], tl.int32), mask=start + offs < CLEAR)
    if WORLD > 1:
        tl.debug_barrier()  # every thread's stores come before the release that raises the meeting's words
        _meet(pad_ptr, peer_pads_ptr, MEET_BASE + WORLD, RANK, WORLD, LANES)
