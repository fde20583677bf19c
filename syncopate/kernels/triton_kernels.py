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
(compared wrap-safe as a signed difference). Nothing resets them between calls. Waits are bounded
by MAX_SPIN polls when MAX_SPIN > 0; a wait that runs out sets `error_ptr[0] = 1` and goes on, and
the launcher reports a timeout.

Consumer (`ag_gemm`): program p walks positions p, p+P, … of the tile order; before a tile that
reads rows outside [R0, R1) (rows past M do not count) it waits once for each chunk those rows lie in, then runs the K loop.
Producer (`gemm_rs`, `gemm_ar`): tiles in the order their chunks leave; the epilogue adds the
partials received for the tile's rows (waiting for them first), stores the tile where its rows go
(the send buffer, or the output for rows this rank keeps), and the last tile of a chunk raises the
chunk's ready signal with release semantics.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = [
    "consumer_ptr_kernel",
    "consumer_tma_kernel",
    "producer_kernel",
    "chunk_copy_kernel",
]


@triton.jit
def _wait_at_least(ptr, epoch, error_ptr, MAX_SPIN: tl.constexpr):
    """Poll an int32 signal (acquire, system scope) until it reaches `epoch`."""
    value = tl.atomic_add(ptr, 0, sem="acquire", scope="sys")
    spins = 0
    if MAX_SPIN > 0:
        while ((value - epoch) < 0) & (spins < MAX_SPIN):
            value = tl.atomic_add(ptr, 0, sem="acquire", scope="sys")
            spins += 1
        if (value - epoch) < 0:
            tl.atomic_xchg(error_ptr, 1)
    else:
        while (value - epoch) < 0:
            value = tl.atomic_add(ptr, 0, sem="acquire", scope="sys")


@triton.jit
def _wait_rows(tm, mtile_lo_ptr, mtile_hi_ptr, chunk_slot_ptr, signal_ptr, epoch, error_ptr, MAX_SPIN: tl.constexpr):
    """Wait for every chunk that the rows of m-tile `tm` lie in (slot -1: nothing to wait for)."""
    lo = tl.load(mtile_lo_ptr + tm)
    hi = tl.load(mtile_hi_ptr + tm)
    for c in range(lo, hi):
        slot = tl.load(chunk_slot_ptr + c)
        if slot >= 0:
            _wait_at_least(signal_ptr + slot, epoch, error_ptr, MAX_SPIN)


@triton.jit
def _tile_coords(order_ptr, i, tiles_n):
    tile = tl.load(order_ptr + i)
    tm = tile // tiles_n
    return tm, tile - tm * tiles_n


@triton.jit
def _mma_ptr(a_ptr, stride_am, stride_ak, rows_a, b_ptr, stride_bk, stride_bn, N, K, off_n,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NUM_STAGES: tl.constexpr):
    """acc[BM, BN] = A[rows_a, :] @ B[:, off_n:off_n+BN] with pointer loads (rows_a: BM row indices,
    negative or out-of-range rows masked to zero by the caller through `a_ptr`'s mask)."""
    offs_n = off_n + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    row_ok = rows_a >= 0
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kk in tl.range(0, tl.cdiv(K, BLOCK_K), num_stages=NUM_STAGES):
        k = kk * BLOCK_K + offs_k
        a = tl.load(a_ptr + rows_a[:, None] * stride_am + k[None, :] * stride_ak,
                    mask=row_ok[:, None] & (k[None, :] < K), other=0.0)
        b = tl.load(b_ptr + k[:, None] * stride_bk + offs_n[None, :] * stride_bn,
                    mask=(k[:, None] < K) & (offs_n[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def consumer_ptr_kernel(
    a_full_ptr, a_local_ptr, b_ptr, c_ptr,
    M, N, K, R0, R1,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    order_ptr, mtile_lo_ptr, mtile_hi_ptr, chunk_slot_ptr, signal_ptr, epoch, error_ptr,
    NUM_PROGRAMS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    NUM_STAGES: tl.constexpr, MAX_SPIN: tl.constexpr,
):
    """All-gather consumer, pointer loads (any GPU, and the Triton interpreter).

    Rows in [R0, R1) come from `a_local` (this rank's shard, row r at r - R0); the others from
    `a_full` (the gathered buffer, row r at r) once their chunk has arrived.
    """
    pid = tl.program_id(0)
    tiles_n = tl.cdiv(N, BLOCK_N)
    num_tiles = tl.cdiv(M, BLOCK_M) * tiles_n
    for i in range(pid, num_tiles, NUM_PROGRAMS):
        tm, tn = _tile_coords(order_ptr, i, tiles_n)
        rows = tm * BLOCK_M + tl.arange(0, BLOCK_M)
        local = (tm * BLOCK_M >= R0) & (tl.minimum(tm * BLOCK_M + BLOCK_M, M) <= R1)
        if local:
            acc = _mma_ptr(a_local_ptr, stride_am, stride_ak, rows - R0, b_ptr, stride_bk, stride_bn, N, K,
                           tn * BLOCK_N, BLOCK_M, BLOCK_N, BLOCK_K, NUM_STAGES)
        else:
            _wait_rows(tm, mtile_lo_ptr, mtile_hi_ptr, chunk_slot_ptr, signal_ptr, epoch, error_ptr, MAX_SPIN)
            acc = _mma_ptr(a_full_ptr, stride_am, stride_ak, tl.where(rows < M, rows, -1), b_ptr, stride_bk,
                           stride_bn, N, K, tn * BLOCK_N, BLOCK_M, BLOCK_N, BLOCK_K, NUM_STAGES)
        cols = tn * BLOCK_N + tl.arange(0, BLOCK_N)
        tl.store(c_ptr + rows[:, None] * stride_cm + cols[None, :] * stride_cn,
                 acc.to(c_ptr.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < N))


@triton.jit
def consumer_tma_kernel(
    a_full_desc, a_local_desc, b_desc, c_desc,
    M, N, K, R0, R1,
    order_ptr, mtile_lo_ptr, mtile_hi_ptr, chunk_slot_ptr, signal_ptr, epoch, error_ptr,
    NUM_PROGRAMS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    NUM_STAGES: tl.constexpr, B_KMAJOR: tl.constexpr, OUT_DTYPE: tl.constexpr, MAX_SPIN: tl.constexpr,
):
    """All-gather consumer with TMA tensor descriptors (Hopper and newer).

    `b_desc` is over B[K, N] or, with B_KMAJOR, over Bᵀ[N, K] (a transposed nn.Linear weight).
    Tiles wholly inside [R0, R1) read `a_local_desc`; the others wait, then read `a_full_desc`.
    """
    pid = tl.program_id(0)
    tiles_n = tl.cdiv(N, BLOCK_N)
    num_tiles = tl.cdiv(M, BLOCK_M) * tiles_n
    k_tiles = tl.cdiv(K, BLOCK_K)
    for i in range(pid, num_tiles, NUM_PROGRAMS):
        tm, tn = _tile_coords(order_ptr, i, tiles_n)
        off_m = tm * BLOCK_M
        off_n = tn * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if (off_m >= R0) & (tl.minimum(off_m + BLOCK_M, M) <= R1):
            for kk in tl.range(0, k_tiles, num_stages=NUM_STAGES):
                a = a_local_desc.load([off_m - R0, kk * BLOCK_K])
                if B_KMAJOR:
                    b = b_desc.load([off_n, kk * BLOCK_K]).T
                else:
                    b = b_desc.load([kk * BLOCK_K, off_n])
                acc = tl.dot(a, b, acc)
        else:
            _wait_rows(tm, mtile_lo_ptr, mtile_hi_ptr, chunk_slot_ptr, signal_ptr, epoch, error_ptr, MAX_SPIN)
            for kk in tl.range(0, k_tiles, num_stages=NUM_STAGES):
                a = a_full_desc.load([off_m, kk * BLOCK_K])
                if B_KMAJOR:
                    b = b_desc.load([off_n, kk * BLOCK_K]).T
                else:
                    b = b_desc.load([kk * BLOCK_K, off_n])
                acc = tl.dot(a, b, acc)
        c_desc.store([off_m, off_n], acc.to(OUT_DTYPE))


@triton.jit
def _mma_tma(a_desc, b_desc, off_m, off_n, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             BLOCK_K: tl.constexpr, NUM_STAGES: tl.constexpr, B_KMAJOR: tl.constexpr):
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kk in tl.range(0, tl.cdiv(K, BLOCK_K), num_stages=NUM_STAGES):
        a = a_desc.load([off_m, kk * BLOCK_K])
        if B_KMAJOR:
            b = b_desc.load([off_n, kk * BLOCK_K]).T
        else:
            b = b_desc.load([kk * BLOCK_K, off_n])
        acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def producer_kernel(
    a_ptr, b_ptr, a_desc, b_desc,
    send_ptr, out_ptr, reduced_ptr, recv_ptr,
    M, N, K, OUT_ROW0, stride_am, stride_ak, stride_bk, stride_bn,
    order_ptr, mtile_lo_ptr, mtile_hi_ptr, chunk_row_ptr,
    inc_start_ptr, inc_slot_ptr, inc_offset_ptr,
    chunk_ready_ptr, chunk_tiles_ptr, counter_ptr, ready_ptr,
    keep_ptr, peer_signal_ptrs, gather_slot_ptr, free_ptr, WORLD, RANK,
    recv_signal_ptr, epoch, error_ptr,
    NUM_PROGRAMS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    NUM_STAGES: tl.constexpr, USE_TMA: tl.constexpr, B_KMAJOR: tl.constexpr, ALL_REDUCE: tl.constexpr,
    MAX_SPIN: tl.constexpr,
):
    """Reduce-scatter / all-reduce producer.

    Per chunk c (row order): rows [chunk_row[c], chunk_row[c+1]); incoming partials j in
    [inc_start[c], inc_start[c+1]) wait for `recv_signal[inc_slot[j]]` and live at
    `recv + inc_offset[j] + row * N`; `keep[c]` says the rows stay here (stored to
    `out[row - OUT_ROW0]`, and for an all-reduce also to `reduced[row]`), otherwise they go to
    `send[row]`. When the last of the chunk's `chunk_tiles[c]` tiles is stored (its counter, which
    it resets to 0 for the next call, reaches the count), `ready[chunk_ready[c]]` is raised (no
    signal where -1). For an all-reduce the last tile of a kept chunk raises, on every peer p,
    `peer_signal[p][gather_slot[c * WORLD + p]]`, once p has entered this call (`free[p] >= epoch`).
    """
    pid = tl.program_id(0)
    tiles_n = tl.cdiv(N, BLOCK_N)
    num_tiles = tl.cdiv(M, BLOCK_M) * tiles_n
    for i in range(pid, num_tiles, NUM_PROGRAMS):
        tm, tn = _tile_coords(order_ptr, i, tiles_n)
        off_m = tm * BLOCK_M
        off_n = tn * BLOCK_N
        rows = off_m + tl.arange(0, BLOCK_M)
        cols = off_n + tl.arange(0, BLOCK_N)
        if USE_TMA:
            acc = _mma_tma(a_desc, b_desc, off_m, off_n, K, BLOCK_M, BLOCK_N, BLOCK_K, NUM_STAGES, B_KMAJOR)
        else:
            acc = _mma_ptr(a_ptr, stride_am, stride_ak, tl.where(rows < M, rows, -1), b_ptr, stride_bk, stride_bn,
                           N, K, off_n, BLOCK_M, BLOCK_N, BLOCK_K, NUM_STAGES)
        col_ok = cols[None, :] < N
        lo = tl.load(mtile_lo_ptr + tm)
        hi = tl.load(mtile_hi_ptr + tm)
        # Add the partials received for these rows.
        for c in range(lo, hi):
            r0 = tl.load(chunk_row_ptr + c)
            r1 = tl.load(chunk_row_ptr + c + 1)
            in_chunk = (rows >= r0) & (rows < r1)
            for j in range(tl.load(inc_start_ptr + c), tl.load(inc_start_ptr + c + 1)):
                _wait_at_least(recv_signal_ptr + tl.load(inc_slot_ptr + j), epoch, error_ptr, MAX_SPIN)
                base = recv_ptr + tl.load(inc_offset_ptr + j)
                part = tl.load(base + rows[:, None] * N + cols[None, :], mask=in_chunk[:, None] & col_ok, other=0.0)
                acc += part.to(tl.float32)
        # Store each chunk's rows where they go.
        for c in range(lo, hi):
            r0 = tl.load(chunk_row_ptr + c)
            r1 = tl.load(chunk_row_ptr + c + 1)
            mask = ((rows >= r0) & (rows < r1))[:, None] & col_ok
            keep = tl.load(keep_ptr + c)
            if keep != 0:
                tl.store(out_ptr + (rows[:, None] - OUT_ROW0) * N + cols[None, :], acc.to(out_ptr.dtype.element_ty),
                         mask=mask)
                if ALL_REDUCE:
                    for p in range(0, WORLD):
                        if p != RANK:
                            _wait_at_least(free_ptr + p, epoch, error_ptr, MAX_SPIN)
                    tl.store(reduced_ptr + rows[:, None] * N + cols[None, :], acc.to(reduced_ptr.dtype.element_ty),
                             mask=mask)
            else:
                tl.store(send_ptr + rows[:, None] * N + cols[None, :], acc.to(send_ptr.dtype.element_ty), mask=mask)
        # Count the tile in each chunk it touches; the chunk's last tile raises its signal(s).
        for c in range(lo, hi):
            target = tl.load(chunk_tiles_ptr + c).to(tl.int64)
            done = tl.atomic_add(counter_ptr + c, 1, sem="acq_rel", scope="sys") + 1
            if done == target:
                tl.atomic_xchg(counter_ptr + c, 0, sem="relaxed", scope="gpu")
                ready = tl.load(chunk_ready_ptr + c)
                if ready >= 0:
                    tl.atomic_xchg(ready_ptr + ready, epoch, sem="release", scope="sys")
                if ALL_REDUCE:
                    if tl.load(keep_ptr + c) != 0:
                        for p in range(0, WORLD):
                            slot = tl.load(gather_slot_ptr + c * WORLD + p)
                            if slot >= 0:
                                sig = tl.load(peer_signal_ptrs + p).to(tl.pointer_type(tl.int32))
                                tl.atomic_xchg(sig + slot, epoch, sem="release", scope="sys")


@triton.jit
def chunk_copy_kernel(
    job_src_ptr, job_dst_ptr, job_elems_ptr, job_wait_ptr, job_signal_ptr, job_peer_ptr,
    NUM_JOBS, local_signal_ptr, peer_signal_ptrs, free_ptr, counter_ptr, epoch, error_ptr,
    NUM_PROGRAMS: tl.constexpr, BLOCK: tl.constexpr, ELEM: tl.constexpr, MAX_SPIN: tl.constexpr,
):
    """SM-driven chunk copies: the `nvshmem` backend's communication programs.

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
