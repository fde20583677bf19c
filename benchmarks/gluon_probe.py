"""One GPU (Hopper): can a Gluon GEMM hide the producer's partial loads?

The reduce-scatter / all-reduce producer adds the partials it received for its kept tiles in the
epilogue; in the Triton kernel each partial load waits before the next instruction issues, and
costs 20–30 µs a call at K/ws = 1024 (benchmarks/NOTES.md, 2026-11-23). Gluon (Triton's
lower-level dialect) lets a kernel issue that TMA load asynchronously when the tile starts and wait
for it only in the epilogue, under the tile's main loop. This probe builds a persistent Gluon GEMM
(TMA operand ring, asynchronous wgmma one group deep, loads running ahead across tiles, TMA store
whose wait is deferred to the next epilogue) with and without a partial tile added, and times it
beside cuBLAS and the project's Triton kernels (the consumer as a plain GEMM, the producer with its
partials) on the producer shapes of the TP=2 suite; and a skeleton of the whole producer epilogue
(`probe_producer`: half the rows sent and counted per chunk, half kept with a polled arrival word
and the partial added). Every output is checked against float32.

Runs where Triton has Gluon's Hopper API (measured on triton 3.6.0; compiles for sm_90 with 3.9.0
too); prints a table last and writes JSON to $OUT/gluon_probe.json when OUT is set.
`python benchmarks/gluon_probe.py` (the producer shapes), `python benchmarks/gluon_probe.py
consumer` (the plain Gluon GEMM on the all-gather's per-rank GEMMs).
"""

from __future__ import annotations

import json
import os
import sys

import torch
import triton
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

# The producer's helpers, names that moved between Triton releases (TMA copies, the CTA barrier) included.
from syncopate.kernels.gluon_kernels import _cta_barrier, _issue_load, _tma_load, _tma_store

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_single  # noqa: E402  (the project's cases and timing, on the same footing)

DEV = torch.device("cuda", 0)


@gluon.jit
def _tile_of(t, pid, num_programs, tiles_m, tiles_n, GROUP_M: gl.constexpr):
    """(m-tile, n-tile) of the program's t-th tile: tiles pid, pid + P, … of a GROUP_M-swizzled order."""
    tile = pid + t * num_programs
    per_group = GROUP_M * tiles_n
    first_m = (tile // per_group) * GROUP_M
    rows = gl.minimum(tiles_m - first_m, GROUP_M)
    return first_m + (tile % per_group) % rows, (tile % per_group) // rows


@gluon.jit
def probe_gemm(a_desc, b_desc, c_desc, p_desc, M, N, K, ADD_PARTIAL: gl.constexpr, NUM_BUF: gl.constexpr,
               GROUP_M: gl.constexpr, PARTIAL_AT: gl.constexpr, num_warps: gl.constexpr):
    """c = a @ b (+ p with ADD_PARTIAL: p's tile loaded by TMA into the output's staging buffer at K
    step PARTIAL_AT of the tile, once the previous tile's store has left it, and waited for only
    in the epilogue)."""
    BLOCK_M: gl.constexpr = c_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = c_desc.block_type.shape[1]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    dtype: gl.constexpr = a_desc.dtype
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                         instr_shape=[16, BLOCK_N, 16])
    a_bufs = gl.allocate_shared_memory(dtype, [NUM_BUF, BLOCK_M, BLOCK_K], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(dtype, [NUM_BUF, BLOCK_K, BLOCK_N], b_desc.layout)
    c_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, BLOCK_N], c_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [NUM_BUF, 1], mbarrier.MBarrierLayout())
    p_bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_BUF):
        mbarrier.init(bars.index(i), count=1)
    mbarrier.init(p_bar.index(0), count=1)

    pid = gl.program_id(0)
    num_programs = gl.num_programs(0)
    tiles_m = gl.cdiv(M, BLOCK_M)
    tiles_n = gl.cdiv(N, BLOCK_N)
    k_tiles = gl.cdiv(K, BLOCK_K)
    my_tiles = gl.cdiv(tiles_m * tiles_n - pid, num_programs)
    jobs = my_tiles * k_tiles

    # Loads run NUM_BUF - 1 steps ahead of the MMAs, into the next tile near a tile's end.
    tm, tn = _tile_of(0, pid, num_programs, tiles_m, tiles_n, GROUP_M)
    for j in gl.static_range(NUM_BUF - 1):
        _issue_load(j, tm, tn, j, a_desc, b_desc, bars, a_bufs, b_bufs, BLOCK_M, BLOCK_N, BLOCK_K, NUM_BUF, False,
                    j < k_tiles)
    job = 0
    for t in range(my_tiles):
        nm, nn = _tile_of(t + 1, pid, num_programs, tiles_m, tiles_n, GROUP_M)
        acc = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=acc_layout)
        for ki in range(k_tiles):
            if ADD_PARTIAL:
                if ki == gl.minimum(PARTIAL_AT, k_tiles - 1):
                    # The partial lands in c_smem once the previous tile's store has left it.
                    tma.store_wait(pendings=0)
                    mbarrier.expect(p_bar.index(0), p_desc.block_type.nbytes)
                    _tma_load(p_desc, [tm * BLOCK_M, tn * BLOCK_N], p_bar.index(0), c_smem)
            s = job % NUM_BUF
            mbarrier.wait(bars.index(s), (job // NUM_BUF) & 1)
            acc = warpgroup_mma(a_bufs.index(s), b_bufs.index(s), acc, is_async=True)
            acc = warpgroup_mma_wait(1, deps=(acc, ))  # the step before is done: its buffer is free
            ka = ki + NUM_BUF - 1
            here = ka < k_tiles
            _issue_load(job + NUM_BUF - 1, gl.where(here, tm, nm), gl.where(here, tn, nn),
                        gl.where(here, ka, ka - k_tiles), a_desc, b_desc, bars, a_bufs, b_bufs, BLOCK_M, BLOCK_N,
                        BLOCK_K, NUM_BUF, False, job + NUM_BUF - 1 < jobs)
            job += 1
        acc = warpgroup_mma_wait(0, deps=(acc, ))
        if ADD_PARTIAL:
            mbarrier.wait(p_bar.index(0), t & 1)
            acc = acc + c_smem.load(acc_layout).to(gl.float32)
            _cta_barrier()  # every warp has read the partial before the sum overwrites it
        else:
            tma.store_wait(pendings=0)  # the previous tile's store has left c_smem
        c_smem.store(acc.to(dtype))
        fence_async_shared()
        _tma_store(c_desc, [tm * BLOCK_M, tn * BLOCK_N], c_smem)
        tm = nm
        tn = nn
    tma.store_wait(pendings=0)


@gluon.jit
def _half_tile(t, pid, num_programs, half_m, tiles_n, GROUP_M: gl.constexpr):
    """(m-tile, n-tile, kept) of the program's t-th tile: the sent half's tiles (rows [0, half_m)
    tiles) first, then the kept half's, each GROUP_M-swizzled."""
    tile = pid + t * num_programs
    half = half_m * tiles_n
    kept = tile >= half
    tile = gl.where(kept, tile - half, tile)
    per_group = GROUP_M * tiles_n
    first_m = (tile // per_group) * GROUP_M
    rows = gl.minimum(half_m - first_m, GROUP_M)
    return first_m + (tile % per_group) % rows + gl.where(kept, half_m, 0), (tile % per_group) // rows, kept


@gluon.jit
def probe_producer(a_desc, b_desc, send_desc, out_desc, p_desc, counter_ptr, signal_ptr, epoch, M, N, K, CHUNKS,
                   NUM_BUF: gl.constexpr, GROUP_M: gl.constexpr, PARTIAL_AT: gl.constexpr, num_warps: gl.constexpr):
    """The duties of a two-rank reduce-scatter producer's epilogue on a Gluon GEMM: rows [0, M/2) are
    the peer's (stored to `send`, each stored tile counted on its chunk's word with release
    semantics once its store has completed, one tile late so that nothing waits for it), rows
    [M/2, M) are kept (their chunk's arrival word polled with acquire when the tile starts, the
    partial loaded into the staging buffer by TMA at K step PARTIAL_AT, added in the epilogue,
    stored to `out`); kept tiles come last, as in the arrival order."""
    BLOCK_M: gl.constexpr = send_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = send_desc.block_type.shape[1]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    dtype: gl.constexpr = a_desc.dtype
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                         instr_shape=[16, BLOCK_N, 16])
    a_bufs = gl.allocate_shared_memory(dtype, [NUM_BUF, BLOCK_M, BLOCK_K], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(dtype, [NUM_BUF, BLOCK_K, BLOCK_N], b_desc.layout)
    c_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, BLOCK_N], send_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [NUM_BUF, 1], mbarrier.MBarrierLayout())
    p_bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_BUF):
        mbarrier.init(bars.index(i), count=1)
    mbarrier.init(p_bar.index(0), count=1)

    pid = gl.program_id(0)
    num_programs = gl.num_programs(0)
    half_m = gl.cdiv(M, 2 * BLOCK_M)
    tiles_n = gl.cdiv(N, BLOCK_N)
    k_tiles = gl.cdiv(K, BLOCK_K)
    my_tiles = gl.cdiv(2 * half_m * tiles_n - pid, num_programs)
    jobs = my_tiles * k_tiles
    rows_per_chunk = gl.cdiv(half_m, CHUNKS)

    tm, tn, kept = _half_tile(0, pid, num_programs, half_m, tiles_n, GROUP_M)
    for j in gl.static_range(NUM_BUF - 1):
        _issue_load(j, tm, tn, j, a_desc, b_desc, bars, a_bufs, b_bufs, BLOCK_M, BLOCK_N, BLOCK_K, NUM_BUF, False,
                    j < k_tiles)
    job = 0
    n_kept = 0
    pending = -1  # the chunk of the sent tile whose store is in flight, to count once it completes
    for t in range(my_tiles):
        nm, nn, nkept = _half_tile(t + 1, pid, num_programs, half_m, tiles_n, GROUP_M)
        chunk = gl.where(kept, tm - half_m, tm) // rows_per_chunk
        arrived = epoch
        if kept:
            arrived = gl.atomic_add(signal_ptr + chunk, 0, sem="acquire", scope="sys")
        acc = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=acc_layout)
        for ki in range(k_tiles):
            if kept:
                if ki == gl.minimum(PARTIAL_AT, k_tiles - 1):
                    tma.store_wait(pendings=0)
                    # (a partial that had not arrived, arrived < epoch, would be polled again here)
                    mbarrier.expect(p_bar.index(0), p_desc.block_type.nbytes)
                    gate = (arrived - epoch) >> 31  # 0 once arrived: the load's coordinate depends on the poll
                    _tma_load(p_desc, [(tm - half_m) * BLOCK_M + gate, tn * BLOCK_N], p_bar.index(0), c_smem)
            s = job % NUM_BUF
            mbarrier.wait(bars.index(s), (job // NUM_BUF) & 1)
            acc = warpgroup_mma(a_bufs.index(s), b_bufs.index(s), acc, is_async=True)
            acc = warpgroup_mma_wait(1, deps=(acc, ))
            ka = ki + NUM_BUF - 1
            here = ka < k_tiles
            _issue_load(job + NUM_BUF - 1, gl.where(here, tm, nm), gl.where(here, tn, nn),
                        gl.where(here, ka, ka - k_tiles), a_desc, b_desc, bars, a_bufs, b_bufs, BLOCK_M, BLOCK_N,
                        BLOCK_K, NUM_BUF, False, job + NUM_BUF - 1 < jobs)
            job += 1
        acc = warpgroup_mma_wait(0, deps=(acc, ))
        if kept:
            mbarrier.wait(p_bar.index(0), n_kept & 1)
            n_kept += 1
            acc = acc + c_smem.load(acc_layout).to(gl.float32)
            _cta_barrier()
        else:
            tma.store_wait(pendings=0)
        if pending >= 0:  # the previous sent tile's store has completed: count it
            gl.atomic_add(counter_ptr + pending, 1, sem="release", scope="sys")
            pending = -1
        c_smem.store(acc.to(dtype))
        fence_async_shared()
        if kept:
            _tma_store(out_desc, [(tm - half_m) * BLOCK_M, tn * BLOCK_N], c_smem)
        else:
            _tma_store(send_desc, [tm * BLOCK_M, tn * BLOCK_N], c_smem)
            pending = chunk
        tm = nm
        tn = nn
        kept = nkept
    tma.store_wait(pendings=0)
    if pending >= 0:
        gl.atomic_add(counter_ptr + pending, 1, sem="release", scope="sys")


def producer_probe_case(m, n, k, chunks=4, block=(128, 256, 64), num_buf=3, group_m=8, warps=8, partial_at=8):
    bm, bn, bk = block
    a = torch.randn(m, k, device=DEV, dtype=torch.bfloat16)
    b = (torch.randn(k, n, device=DEV) / k**0.5).to(torch.bfloat16)
    p = torch.randn(m // 2, n, device=DEV, dtype=torch.bfloat16)
    send = torch.full((m // 2, n), float("nan"), device=DEV, dtype=torch.bfloat16)
    out = torch.full((m // 2, n), float("nan"), device=DEV, dtype=torch.bfloat16)
    counters = torch.zeros(chunks, dtype=torch.int32, device=DEV)
    signals = torch.zeros(chunks, dtype=torch.int32, device=DEV)
    lay = lambda shape: gl.NVMMASharedLayout.get_default_for(shape, gl.bfloat16)  # noqa: E731
    descs = (TensorDescriptor.from_tensor(a, [bm, bk], lay([bm, bk])),
             TensorDescriptor.from_tensor(b, [bk, bn], lay([bk, bn])),
             TensorDescriptor.from_tensor(send, [bm, bn], lay([bm, bn])),
             TensorDescriptor.from_tensor(out, [bm, bn], lay([bm, bn])),
             TensorDescriptor.from_tensor(p, [bm, bn], lay([bm, bn])))
    sms = torch.cuda.get_device_properties(DEV).multi_processor_count
    tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    grid = (min(sms, tiles),)
    state = {"epoch": 0}

    def call():
        state["epoch"] += 1
        signals.fill_(state["epoch"])  # every partial there: what the poll costs, not what it waits for
        probe_producer[grid](*descs, counters, signals, state["epoch"], m, n, k, chunks, num_buf, group_m,
                             partial_at, num_warps=warps)

    full = a.float() @ b.float()
    worst = 0.0
    for _ in range(3):
        send.fill_(float("nan"))
        out.fill_(float("nan"))
        before = counters.clone()
        call()
        torch.cuda.synchronize()
        worst = max(worst, gpu_single.rel(send, full[: m // 2]), gpu_single.rel(out, full[m // 2:] + p.float()))
        assert int((counters - before).sum()) == tiles // 2, "every sent tile counted once"
    t = gpu_single.bench(call)
    t_torch = gpu_single.bench(lambda: a @ b)
    return {"case": f"gluon producer {m}x{n}x{k} {bm}x{bn}x{bk} buf{num_buf} g{group_m} chunks{chunks} at k{partial_at}",
            "rel_err": worst, "ours_us": t, "torch_us": t_torch, "tflops": 2 * m * n * k / t / 1e6}


def gluon_case(m, n, k, add_partial, block=(128, 256, 64), num_buf=3, group_m=8, warps=8, partial_at=2):
    bm, bn, bk = block
    a = torch.randn(m, k, device=DEV, dtype=torch.bfloat16)
    b = (torch.randn(k, n, device=DEV) / k**0.5).to(torch.bfloat16)
    p = torch.randn(m, n, device=DEV, dtype=torch.bfloat16)
    c = torch.full((m, n), float("nan"), device=DEV, dtype=torch.bfloat16)
    lay = lambda shape: gl.NVMMASharedLayout.get_default_for(shape, gl.bfloat16)  # noqa: E731
    descs = (TensorDescriptor.from_tensor(a, [bm, bk], lay([bm, bk])),
             TensorDescriptor.from_tensor(b, [bk, bn], lay([bk, bn])),
             TensorDescriptor.from_tensor(c, [bm, bn], lay([bm, bn])),
             TensorDescriptor.from_tensor(p, [bm, bn], lay([bm, bn])))
    sms = torch.cuda.get_device_properties(DEV).multi_processor_count
    grid = (min(sms, triton.cdiv(m, bm) * triton.cdiv(n, bn)),)

    def call():
        probe_gemm[grid](*descs, m, n, k, add_partial, num_buf, group_m, partial_at, num_warps=warps)

    ref = a.float() @ b.float() + (p.float() if add_partial else 0)
    worst = 0.0
    for _ in range(3):  # back to back, the output poisoned in between
        c.fill_(float("nan"))
        call()
        torch.cuda.synchronize()
        worst = max(worst, gpu_single.rel(c, ref))
    t = gpu_single.bench(call)
    t_torch = gpu_single.bench(lambda: a @ b)
    at = f" at k{partial_at}" if add_partial else ""
    return {"case": f"gluon{' +partial' if add_partial else ''}{at} {m}x{n}x{k} {bm}x{bn}x{bk} buf{num_buf} g{group_m}",
            "rel_err": worst, "ours_us": t, "torch_us": t_torch, "tflops": 2 * m * n * k / t / 1e6}


def consumer_cases():
    """`python benchmarks/gluon_probe.py consumer`: the plain Gluon GEMM on the all-gather's per-rank
    GEMMs of the TP=2 suite, beside the Triton consumer with every chunk there, and cuBLAS."""
    cases = []
    for (m, n, k), tiles in [((8192, 7168, 4096), ((128, 256, 64), 3, (128, 256, 64, 8, 3))),
                             ((8192, 5504, 4096), ((128, 256, 64), 3, (128, 256, 64, 8, 3))),
                             ((8192, 2048, 8192), ((128, 256, 64), 3, (128, 256, 64, 8, 3))),
                             ((8192, 1024, 8192), ((128, 128, 64), 4, (128, 128, 64, 8, 4)))]:
        block, buffers, cfg = tiles
        for _ in range(2):  # twice, in turn: cuBLAS's readings move between cases
            cases.append(lambda m=m, n=n, k=k, block=block, nb=buffers: gluon_case(m, n, k, False, block=block,
                                                                                     num_buf=nb))
            cases.append(lambda m=m, n=n, k=k, cfg=cfg: gpu_single.consumer_case(m, n, k, cfg, 2))
    return cases


def main():
    rows = []
    shapes = [(8192, 8192, 1024), (8192, 4096, 5504), (8192, 8192, 2048)]
    cases = []
    for m, n, k in ([] if sys.argv[1:] == ["consumer"] else shapes):
        cases.append(lambda m=m, n=n, k=k: gluon_case(m, n, k, False))
        for at in (0, 2, 8):
            cases.append(lambda m=m, n=n, k=k, at=at: gluon_case(m, n, k, True, partial_at=at))
        cases.append(lambda m=m, n=n, k=k: gluon_case(m, n, k, False, block=(128, 256, 32), num_buf=6))
        cases.append(lambda m=m, n=n, k=k: gluon_case(m, n, k, True, block=(128, 256, 32), num_buf=6, partial_at=8))
        cases.append(lambda m=m, n=n, k=k: producer_probe_case(m, n, k))
        cases.append(lambda m=m, n=n, k=k: producer_probe_case(m, n, k, block=(128, 256, 32), num_buf=6))
        cfg = (128, 256, 64, 8, 3)
        cases.append(lambda m=m, n=n, k=k: gpu_single.consumer_case(m, n, k, cfg, 2))  # our plain Triton loop
        cases.append(lambda m=m, n=n, k=k: gpu_single.producer_case(m, n, k, cfg, 4))  # with its partials
    if sys.argv[1:] == ["consumer"]:
        cases = consumer_cases()
    for case in cases:
        try:
            r = case()
        except Exception as e:  # a case that fails is reported, the others still run
            r = {"case": "failed", "error": f"{type(e).__name__}: {e}"[:2000]}
        rows.append(r)
        print(json.dumps(r), flush=True)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "gluon_probe.json"), "w") as f:
            json.dump(rows, f, indent=1)
    print("\ncase | rel_err | ours_us | torch_us | torch/ours")
    for r in rows:
        if "ours_us" in r:
            print(f"{r['case']} | {r['rel_err']:.2e} | {r['ours_us']:.1f} | {r['torch_us']:.1f} | "
                  f"{r['torch_us'] / r['ours_us']:.3f}")
        else:
            print(f"{r['case']} | {r.get('error')}")


if __name__ == "__main__":
    main()
