"""Gluon kernels (Hopper): the fused GEMMs' TMA paths in Triton's lower-level dialect.

`producer_kernel` and `consumer_kernel` (triton_kernels.py) leave their software pipelining to
Triton's compiler, which does not pipeline across tiles, waits for each tile's output store before
the next tile's first K step, and issues each partial load in the epilogue only to wait for it at
once. These kernels compute the same tiles from the same tables with the pipeline written out.

`gluon_producer_kernel`:

- a ring of NUM_BUF shared-memory operand buffers filled by TMA loads that run NUM_BUF - 1 K steps
  ahead of the tensor cores, into the program's next tile near the end of a tile;
- asynchronous wgmma, one group in flight;
- the partial received for the tile's rows polled for and loaded by TMA into the output's staging
  buffer PARTIAL_LEAD K steps before the tile's end, and waited for only in the epilogue; where more
  ranks send partials of the same rows (direct plans on three or more ranks), the others are then
  loaded and added in turn in the epilogue;
- the tile's TMA stores left in flight; a finished run of tiles of one chunk is counted at K step 1
  of the program's next tile (or after its last), once the stores have completed, so no program
  waits for its own stores; always before the program waits for a partial (step 0 where the
  partial is polled at step 0), so that no count is held while waiting.

Semantics (entries, chunks, signals, counters, the all-reduce's second store and gather signals,
bounded waits that set `error_ptr[0]` and go on) are those of `producer_kernel` with TMA_EPI and
EPI_SPLIT=1; see its docstring.

`gluon_consumer_kernel` (the all-gather's consumer, `consumer_kernel`'s TMA path): the same operand
ring, loads running ahead into the program's next tile. A tile outside the rank's own shard needs
its chunk(s) before its first load is issued, which is NUM_BUF - 1 K steps before the tile before
it ends: there the chunk's word is read once, and if the chunk is not there yet the next tile's
first loads are left for its start, where the program waits for the chunk (a late chunk holds
back no step of the tile in flight, and the current tile's output is stored before the wait).
The output tile's TMA store is left in flight until the next tile's epilogue.

No interpreter runs Gluon: the CPU suite compiles both kernels for sm_90
(tests/support/compile_sm90.py), the GPU suite checks their results.

The module imports where Triton lacks Gluon's Hopper API; `AVAILABLE` says whether it has it.
"""

from __future__ import annotations

from syncopate.kernels.triton_kernels import POLL_PTX, STORES_DONE_PTX

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
except ImportError:  # a Triton without Gluon's Hopper API
    AVAILABLE = False
else:
    AVAILABLE = True

__all__ = ["AVAILABLE", "gluon_producer_kernel", "gluon_consumer_kernel", "TensorDescriptor"]

if AVAILABLE:
    # Renamed after triton 3.6: the TMA copies (async_copy_global_to_shared -> async_load, …).
    _tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    _tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
    # … and the CTA barrier (thread_barrier -> barrier).
    _cta_barrier = getattr(gl, "barrier", None) or gl.thread_barrier

    @gluon.jit
    def _poll(ptr, epoch, max_spin):
        """`_poll_asm` of triton_kernels.py: poll an int32 word (acquire, system scope) until it reaches
        `epoch` or `max_spin` polls, then order later TMA reads after it; returns the last value."""
        return gl.inline_asm_elementwise(
            asm=POLL_PTX,
            constraints="=r,l,r,r",
            args=[ptr, epoch, max_spin],
            dtype=gl.int32,
            is_pure=False,
            pack=1,
        )

    @gluon.jit
    def _timed_out(error_ptr, word_ptr):
        """`_timed_out` of triton_kernels.py: the waited-for word's address, low 32 bits, lowest bit set."""
        gl.atomic_xchg(error_ptr, ((word_ptr.to(gl.int64) & 0xFFFFFFFF) | 1).to(gl.int32))

    @gluon.jit
    def _wait_word(ptr, epoch, error_ptr, max_spin):
        """Wait for `*ptr >= epoch`; 0, also after a bounded wait gave up (which sets the error flag:
        what follows reads stale data inside its buffers). The result depends on what was read and
        is added to the coordinates of what must follow the wait (`_wait_slot` in triton_kernels)."""
        value = _poll(ptr, epoch, max_spin)
        if (value - epoch) < 0:
            _timed_out(error_ptr, ptr)
        return ((value - epoch) >> 31) & (max_spin >> 31)

    @gluon.jit
    def _stores_done():
        """The program's TMA stores written (not only read out of shared memory), ordered before its
        generic-proxy accesses, and every thread past that point."""
        gl.inline_asm_elementwise(
            asm=STORES_DONE_PTX,
            constraints="=r",
            args=[],
            dtype=gl.int32,
            is_pure=False,
            pack=1,
        )

    @gluon.jit
    def _load_partial(
        j,
        row0,
        col0,
        N,
        recv_desc,
        recv_signal_ptr,
        inc_slot_ptr,
        inc_offset_ptr,
        p_bar,
        c_smem,
        epoch,
        error_ptr,
        max_spin,
    ):
        """Wait for incoming partial j (its word `recv_signal[inc_slot[j]]`) and start the TMA load of
        its rows of the tile (from row `inc_offset[j] / N` of `recv`) into `c_smem`, on `p_bar`."""
        gate = _wait_word(recv_signal_ptr + gl.load(inc_slot_ptr + j), epoch, error_ptr, max_spin)
        prow = (gl.load(inc_offset_ptr + j) // N).to(gl.int32)
        mbarrier.expect(p_bar.index(0), recv_desc.block_type.nbytes)
        _tma_load(recv_desc, [row0 + prow + gate, col0], p_bar.index(0), c_smem)

    @gluon.jit
    def _count(
        c,
        tiles,
        counter_ptr,
        chunk_tiles_ptr,
        chunk_ready_ptr,
        ready_ptr,
        keep_ptr,
        gather_slot_ptr,
        peer_signal_ptrs,
        epoch,
        WORLD: gl.constexpr,
        ALL_REDUCE: gl.constexpr,
    ):
        """`_count_chunk` of triton_kernels.py: count `tiles` stored tiles of chunk c; the count that
        completes the chunk resets its counter and raises its ready word (and, for a kept chunk of an
        all-reduce, its gather words on every peer)."""
        n = tiles.to(gl.int64)
        done = gl.atomic_add(counter_ptr + c, n, sem="acq_rel", scope="gpu") + n
        if done == gl.load(chunk_tiles_ptr + c).to(gl.int64):
            gl.atomic_xchg(counter_ptr + c, 0, sem="relaxed", scope="gpu")
            ready = gl.load(chunk_ready_ptr + c)
            if ready >= 0:
                gl.atomic_xchg(ready_ptr + ready, epoch, sem="release", scope="sys")
            if ALL_REDUCE:
                if gl.load(keep_ptr + c) != 0:
                    for p in gl.static_range(WORLD):
                        slot = gl.load(gather_slot_ptr + c * WORLD + p)
                        if slot >= 0:
                            sig = gl.load(peer_signal_ptrs + p).to(gl.pointer_type(gl.int32))
                            gl.atomic_xchg(sig + slot, epoch, sem="release", scope="sys")

    @gluon.jit
    def _issue_load(
        job,
        tm,
        tn,
        ki,
        a_desc,
        b_desc,
        bars,
        a_bufs,
        b_bufs,
        BLOCK_M: gl.constexpr,
        BLOCK_N: gl.constexpr,
        BLOCK_K: gl.constexpr,
        NUM_BUF: gl.constexpr,
        B_KMAJOR: gl.constexpr,
        pred,
    ):
        s = job % NUM_BUF
        bar = bars.index(s)
        mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes, pred=pred)
        _tma_load(a_desc, [tm * BLOCK_M, ki * BLOCK_K], bar, a_bufs.index(s), pred)
        if B_KMAJOR:
            _tma_load(b_desc, [tn * BLOCK_N, ki * BLOCK_K], bar, b_bufs.index(s), pred)
        else:
            _tma_load(b_desc, [ki * BLOCK_K, tn * BLOCK_N], bar, b_bufs.index(s), pred)

    @gluon.jit(do_not_specialize=["epoch"])
    def gluon_producer_kernel(
        a_desc,
        b_desc,
        send_desc,
        out_desc,
        reduced_desc,
        recv_desc,
        N,
        K,
        OUT_ROW0,
        order_ptr,
        entry_chunk_ptr,
        num_entries,
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
        sa_ptr,
        sb_ptr,
        stride_sa,
        stride_sb,
        WORLD: gl.constexpr,
        ALL_REDUCE: gl.constexpr,
        B_KMAJOR: gl.constexpr,
        NUM_BUF: gl.constexpr,
        PARTIAL_LEAD: gl.constexpr,
        SCALED: gl.constexpr,
        num_warps: gl.constexpr,
    ):
        """Reduce-scatter / all-reduce producer, `producer_kernel`'s TMA-epilogue semantics (module
        docstring); K at least NUM_BUF - 1 steps. With SCALED (float8 operands, B K-major), each
        tile's sum is scaled as `producer_kernel` scales it before its partials are added."""
        BLOCK_M: gl.constexpr = send_desc.block_type.shape[0]
        BLOCK_N: gl.constexpr = send_desc.block_type.shape[1]
        BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
        dtype: gl.constexpr = a_desc.dtype
        out_dtype: gl.constexpr = send_desc.dtype
        acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0],
            warps_per_cta=[num_warps, 1],
            instr_shape=[16, BLOCK_N, 256 // dtype.primitive_bitwidth],  # K 16 (16-bit), 32 (FP8)
        )
        a_bufs = gl.allocate_shared_memory(dtype, [NUM_BUF] + a_desc.block_type.shape, a_desc.layout)
        b_bufs = gl.allocate_shared_memory(dtype, [NUM_BUF] + b_desc.block_type.shape, b_desc.layout)
        c_smem = gl.allocate_shared_memory(out_dtype, [BLOCK_M, BLOCK_N], send_desc.layout)
        bars = gl.allocate_shared_memory(gl.int64, [NUM_BUF, 1], mbarrier.MBarrierLayout())
        p_bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        for stage in gl.static_range(NUM_BUF):
            mbarrier.init(bars.index(stage), count=1)
        mbarrier.init(p_bar.index(0), count=1)

        pid = gl.program_id(0)
        num_programs = gl.num_programs(0)
        tiles_n = gl.cdiv(N, BLOCK_N)
        k_tiles = gl.cdiv(K, BLOCK_K)
        my_entries = gl.cdiv(num_entries - pid, num_programs)
        jobs = my_entries * k_tiles
        partial_at = gl.maximum(k_tiles - PARTIAL_LEAD, 0)
        # A run of tiles is counted before the program waits for anything else (as producer_kernel
        # counts it in its epilogue): ranks that each held a count while waiting for the other's
        # partial could wait for ever on a ring.
        count_at = gl.minimum(1, partial_at)

        tile = gl.load(order_ptr + pid)
        tm = tile // tiles_n
        tn = tile - tm * tiles_n
        for j in gl.static_range(NUM_BUF - 1):
            _issue_load(
                j,
                tm,
                tn,
                j,
                a_desc,
                b_desc,
                bars,
                a_bufs,
                b_bufs,
                BLOCK_M,
                BLOCK_N,
                BLOCK_K,
                NUM_BUF,
                B_KMAJOR,
                j < jobs,
            )
        job = 0
        partials = 0  # partial loads waited for so far: the phase of p_bar
        pending = 0  # stored tiles of the current chunk not yet counted
        to_count = 0  # a finished run of tiles of chunk `count_c`, counted once its stores completed
        count_c = 0
        for e in range(my_entries):
            i = pid + e * num_programs
            c = gl.load(entry_chunk_ptr + i)
            has_next = i + num_programs < num_entries
            ntile = gl.load(order_ptr + i + num_programs, mask=has_next, other=0)
            next_c = gl.load(entry_chunk_ptr + i + num_programs, mask=has_next, other=-1)
            nm = ntile // tiles_n
            nn = ntile - nm * tiles_n
            first = gl.load(inc_start_ptr + c)
            incoming = gl.load(inc_start_ptr + c + 1) - first
            keep = gl.load(keep_ptr + c) != 0
            row0 = tm * BLOCK_M
            col0 = tn * BLOCK_N
            acc = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=acc_layout)
            for ki in range(k_tiles):
                if ki == count_at:
                    if to_count > 0:
                        _stores_done()
                        _count(
                            count_c,
                            to_count,
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
                        to_count = 0
                if ki == partial_at:
                    if incoming > 0:
                        tma.store_wait(0)  # the previous tile's stores have left the staging buffer
                        _load_partial(
                            first,
                            row0,
                            col0,
                            N,
                            recv_desc,
                            recv_signal_ptr,
                            inc_slot_ptr,
                            inc_offset_ptr,
                            p_bar,
                            c_smem,
                            epoch,
                            error_ptr,
                            max_spin,
                        )
                s = job % NUM_BUF
                mbarrier.wait(bars.index(s), (job // NUM_BUF) & 1)
                if B_KMAJOR:
                    acc = warpgroup_mma(a_bufs.index(s), b_bufs.index(s).permute((1, 0)), acc, is_async=True)
                else:
                    acc = warpgroup_mma(a_bufs.index(s), b_bufs.index(s), acc, is_async=True)
                acc = warpgroup_mma_wait(1, deps=(acc,))  # the step before is done: its buffers are free
                ka = ki + NUM_BUF - 1
                here = ka < k_tiles
                _issue_load(
                    job + NUM_BUF - 1,
                    gl.where(here, tm, nm),
                    gl.where(here, tn, nn),
                    gl.where(here, ka, ka - k_tiles),
                    a_desc,
                    b_desc,
                    bars,
                    a_bufs,
                    b_bufs,
                    BLOCK_M,
                    BLOCK_N,
                    BLOCK_K,
                    NUM_BUF,
                    B_KMAJOR,
                    job + NUM_BUF - 1 < jobs,
                )
                job += 1
            acc = warpgroup_mma_wait(0, deps=(acc,))
            if SCALED:
                rows = row0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, acc_layout))
                cols = col0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, acc_layout))
                sa = gl.load(sa_ptr + rows * stride_sa)  # whole tiles: every row is A's
                sb = gl.load(sb_ptr + cols * stride_sb, mask=cols < N, other=0.0)
                acc = acc * gl.expand_dims(sa, 1) * gl.expand_dims(sb, 0)
            if incoming > 0:
                mbarrier.wait(p_bar.index(0), partials & 1)
                partials += 1
                acc = acc + c_smem.load(acc_layout).to(gl.float32)
                _cta_barrier()  # every warp has read the partial before the sum (or the next) overwrites it
                for more in range(
                    1, incoming
                ):  # other ranks' partials of the same rows (direct plans), in turn
                    _load_partial(
                        first + more,
                        row0,
                        col0,
                        N,
                        recv_desc,
                        recv_signal_ptr,
                        inc_slot_ptr,
                        inc_offset_ptr,
                        p_bar,
                        c_smem,
                        epoch,
                        error_ptr,
                        max_spin,
                    )
                    mbarrier.wait(p_bar.index(0), partials & 1)
                    partials += 1
                    acc = acc + c_smem.load(acc_layout).to(gl.float32)
                    _cta_barrier()
            else:
                tma.store_wait(0)
            c_smem.store(acc.to(out_dtype))
            fence_async_shared()
            if keep:
                _tma_store(out_desc, [row0 - OUT_ROW0, col0], c_smem)
                if ALL_REDUCE:
                    gate = 0
                    for p in gl.static_range(WORLD):
                        if p != RANK:
                            gate += _wait_word(free_ptr + p, epoch, error_ptr, max_spin)
                    _tma_store(reduced_desc, [row0 + gate, col0], c_smem)
            else:
                _tma_store(send_desc, [row0, col0], c_smem)
            if next_c != c:
                to_count = pending + 1
                count_c = c
                pending = 0
            else:
                pending += 1
            tm = nm
            tn = nn
        _stores_done()
        if to_count > 0:
            _count(
                count_c,
                to_count,
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

    @gluon.jit
    def _chunks_there(mtile_lo_ptr, mtile_hi_ptr, chunk_slot_ptr, signal_ptr, tm, epoch, error_ptr, spins):
        """Whether the chunk(s) m-tile `tm` lies in are there, from at most `spins` polls of each word
        (1: a look; a bound that runs out sets the error flag only when `spins` > 1)."""
        lo = gl.load(mtile_lo_ptr + tm)
        hi = gl.load(mtile_hi_ptr + tm)
        first = signal_ptr + gl.load(chunk_slot_ptr + lo)
        last = signal_ptr + gl.load(chunk_slot_ptr + hi - 1)
        there = (_poll(first, epoch, spins) - epoch) >= 0
        missing = first
        if hi - 1 != lo:
            there_last = (_poll(last, epoch, spins) - epoch) >= 0
            if there:
                missing = last
            there = there & there_last
        if spins != 1:
            if not there:
                _timed_out(error_ptr, missing)
        return there.to(gl.int32)

    @gluon.jit
    def _issue_ab(
        job,
        own,
        row,
        col,
        ki,
        a_desc,
        own_desc,
        b_desc,
        bars,
        a_bufs,
        b_bufs,
        BLOCK_K: gl.constexpr,
        NUM_BUF: gl.constexpr,
        B_KMAJOR: gl.constexpr,
        pred,
    ):
        """Job `job`'s TMA loads: A's rows from the shard (`own`) or the gathered buffer, B's columns."""
        s = job % NUM_BUF
        bar = bars.index(s)
        mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes, pred=pred)
        # A branch, not two predicated loads: `own` is one value for all the program's threads,
        # and the branch was the faster at small tiles (`benchmarks/gpu_single.py gluon-consumer`).
        if own != 0:
            _tma_load(own_desc, [row, ki * BLOCK_K], bar, a_bufs.index(s), pred)
        else:
            _tma_load(a_desc, [row, ki * BLOCK_K], bar, a_bufs.index(s), pred)
        if B_KMAJOR:
            _tma_load(b_desc, [col, ki * BLOCK_K], bar, b_bufs.index(s), pred)
        else:
            _tma_load(b_desc, [ki * BLOCK_K, col], bar, b_bufs.index(s), pred)

    @gluon.jit(do_not_specialize=["epoch"])
    def gluon_consumer_kernel(
        a_desc,
        own_desc,
        b_desc,
        c_desc,
        N,
        K,
        own_row0,
        num_tiles,
        own_tiles,
        order_ptr,
        mtile_lo_ptr,
        mtile_hi_ptr,
        chunk_slot_ptr,
        signal_ptr,
        epoch,
        error_ptr,
        max_spin,
        B_KMAJOR: gl.constexpr,
        NUM_BUF: gl.constexpr,
        num_warps: gl.constexpr,
    ):
        """All-gather consumer, `consumer_kernel`'s TMA semantics: out = A @ B, tiles in the order of
        `order_ptr`; the first `own_tiles` positions read A's rows from the shard (`own_desc`, output
        row `own_row0` its first) with no wait, the others from the gathered buffer (`a_desc`) once
        their chunk(s) are there (module docstring); K at least NUM_BUF - 1 steps."""
        BLOCK_M: gl.constexpr = c_desc.block_type.shape[0]
        BLOCK_N: gl.constexpr = c_desc.block_type.shape[1]
        BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
        dtype: gl.constexpr = a_desc.dtype
        acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BLOCK_N, 16]
        )
        a_bufs = gl.allocate_shared_memory(dtype, [NUM_BUF] + a_desc.block_type.shape, a_desc.layout)
        b_bufs = gl.allocate_shared_memory(dtype, [NUM_BUF] + b_desc.block_type.shape, b_desc.layout)
        c_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, BLOCK_N], c_desc.layout)
        bars = gl.allocate_shared_memory(gl.int64, [NUM_BUF, 1], mbarrier.MBarrierLayout())
        for stage in gl.static_range(NUM_BUF):
            mbarrier.init(bars.index(stage), count=1)

        pid = gl.program_id(0)
        num_programs = gl.num_programs(0)
        tiles_n = gl.cdiv(N, BLOCK_N)
        k_tiles = gl.cdiv(K, BLOCK_K)
        my_tiles = gl.cdiv(num_tiles - pid, num_programs)
        jobs = my_tiles * k_tiles
        # The K step of a tile at which loads start going to the program's next tile.
        look_at = k_tiles - (NUM_BUF - 1)

        tile = gl.load(order_ptr + pid)
        tm = tile // tiles_n
        tn = tile - tm * tiles_n
        own = (pid < own_tiles).to(gl.int32)
        if own == 0:
            _chunks_there(
                mtile_lo_ptr, mtile_hi_ptr, chunk_slot_ptr, signal_ptr, tm, epoch, error_ptr, max_spin
            )
        row = gl.where(own != 0, tm * BLOCK_M - own_row0, tm * BLOCK_M)
        for j in gl.static_range(NUM_BUF - 1):
            _issue_ab(
                j,
                own,
                row,
                tn * BLOCK_N,
                j,
                a_desc,
                own_desc,
                b_desc,
                bars,
                a_bufs,
                b_bufs,
                BLOCK_K,
                NUM_BUF,
                B_KMAJOR,
                j < jobs,
            )
        job = 0
        held = 0  # the current tile's first loads were left for its start: its chunk was not there
        for e in range(my_tiles):
            i = pid + e * num_programs
            has_next = e + 1 < my_tiles
            ntile = gl.load(order_ptr + i + num_programs, mask=has_next, other=0)
            nm = ntile // tiles_n
            nn = ntile - nm * tiles_n
            nown = (i + num_programs < own_tiles).to(gl.int32)
            nrow = gl.where(nown != 0, nm * BLOCK_M - own_row0, nm * BLOCK_M)
            if held != 0:
                _chunks_there(
                    mtile_lo_ptr, mtile_hi_ptr, chunk_slot_ptr, signal_ptr, tm, epoch, error_ptr, max_spin
                )
                for j in gl.static_range(NUM_BUF - 1):
                    _issue_ab(
                        job + j,
                        own,
                        row,
                        tn * BLOCK_N,
                        j,
                        a_desc,
                        own_desc,
                        b_desc,
                        bars,
                        a_bufs,
                        b_bufs,
                        BLOCK_K,
                        NUM_BUF,
                        B_KMAJOR,
                        job + j < jobs,
                    )
            go_next = 1
            acc = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=acc_layout)
            for ki in range(k_tiles):
                if ki == look_at:
                    if has_next:
                        if nown == 0:
                            go_next = _chunks_there(
                                mtile_lo_ptr,
                                mtile_hi_ptr,
                                chunk_slot_ptr,
                                signal_ptr,
                                nm,
                                epoch,
                                error_ptr,
                                1,
                            )
                s = job % NUM_BUF
                mbarrier.wait(bars.index(s), (job // NUM_BUF) & 1)
                if B_KMAJOR:
                    acc = warpgroup_mma(a_bufs.index(s), b_bufs.index(s).permute((1, 0)), acc, is_async=True)
                else:
                    acc = warpgroup_mma(a_bufs.index(s), b_bufs.index(s), acc, is_async=True)
                acc = warpgroup_mma_wait(1, deps=(acc,))  # the step before is done: its buffers are free
                ka = ki + NUM_BUF - 1
                here = ka < k_tiles
                _issue_ab(
                    job + NUM_BUF - 1,
                    gl.where(here, own, nown),
                    gl.where(here, row, nrow),
                    gl.where(here, tn, nn) * BLOCK_N,
                    gl.where(here, ka, ka - k_tiles),
                    a_desc,
                    own_desc,
                    b_desc,
                    bars,
                    a_bufs,
                    b_bufs,
                    BLOCK_K,
                    NUM_BUF,
                    B_KMAJOR,
                    (job + NUM_BUF - 1 < jobs) & (here | (go_next != 0)),
                )
                job += 1
            acc = warpgroup_mma_wait(0, deps=(acc,))
            tma.store_wait(0)  # the previous tile's store has left the staging buffer
            c_smem.store(acc.to(dtype))
            fence_async_shared()
            _tma_store(c_desc, [tm * BLOCK_M, tn * BLOCK_N], c_smem)
            held = 1 - go_next
            tm = nm
            tn = nn
            own = nown
            row = nrow
        tma.store_wait(0)
