"""One GPU (Hopper): a warp-specialized persistent Gluon GEMM against cuBLAS and the project's
non-specialized Gluon GEMM (`gluon_probe.probe_gemm`), warm and back to back.

The fused templates that still miss their targets (benchmarks/NOTES.md, 2026-11-26) need a GEMM that
waits and signals per tile at cuBLAS's rate; the non-specialized Gluon loop runs the 4096x8192x2048
block at 0.875 of cuBLAS warm. Here one warp issues the TMA loads into a ring of NUM_BUF stages
(`empty` / `ready` mbarriers), and the kernel's other warps issue the wgmma (one group in flight,
each stage released as soon as the MMA that read it is done) and store each tile, so the loads run
ahead through the epilogue. Every output is checked against float32; events around each call, 5
warm-up calls, the median of 30 back to back.

    python benchmarks/gluon_ws_probe.py

On one H200 (2026-11-26) it was right (2.0e-3 to 2.7e-3 against float32) and no faster than the
non-specialized loop: 0.84-0.87 of cuBLAS at 4096x8192x2048, 2048x4096x5504 and 8192x4096x5504
(221.9 against 190.4 µs at the first; the loop 213.6), so the loads were not what held the Gluon
GEMMs back; the MMA side is (cuBLAS's Hopper kernels also pair CTAs in clusters that share their
operand loads, and alternate two warpgroups' tiles so that one's epilogue hides under the other's
main loop).
"""

from __future__ import annotations

import os
import sys

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from syncopate.kernels.gluon_kernels import _tma_load, _tma_store
from syncopate.kernels.launch import _gl_descriptor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gemm_split  # noqa: E402  (its timing loop)
import gluon_probe  # noqa: E402  (the non-specialized GEMM)


@gluon.jit
def _schedule(M, N, K, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr):
    """This program, the programs, the tiles along M and N, the K steps and this program's tiles
    (pid, pid + P, …), as both partitions walk them."""
    pid = gl.program_id(0)
    num_programs = gl.num_programs(0)
    tiles_m = gl.cdiv(M, BLOCK_M)
    tiles_n = gl.cdiv(N, BLOCK_N)
    return (pid, num_programs, tiles_m, tiles_n, gl.cdiv(K, BLOCK_K),
            gl.cdiv(tiles_m * tiles_n - pid, num_programs))


@gluon.jit
def _loader(a_desc, b_desc, a_bufs, b_bufs, ready, empty, M, N, K, GROUP_M: gl.constexpr):
    """The load warp: every K step of the program's tiles into the ring, once its stage is empty."""
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[1]
    NUM_BUF: gl.constexpr = a_bufs.type.shape[0]
    pid, num_programs, tiles_m, tiles_n, k_tiles, my_tiles = _schedule(M, N, K, BLOCK_M, BLOCK_N, BLOCK_K)
    i = 0
    for t in range(my_tiles):
        tm, tn = gluon_probe._tile_of(t, pid, num_programs, tiles_m, tiles_n, GROUP_M)
        for ki in range(k_tiles):
            s = i % NUM_BUF
            mbarrier.wait(empty.index(s), ((i // NUM_BUF) & 1) ^ 1)  # the first pass finds every stage empty
            mbarrier.expect(ready.index(s), a_desc.block_type.nbytes + b_desc.block_type.nbytes)
            _tma_load(a_desc, [tm * BLOCK_M, ki * BLOCK_K], ready.index(s), a_bufs.index(s))
            _tma_load(b_desc, [ki * BLOCK_K, tn * BLOCK_N], ready.index(s), b_bufs.index(s))
            i += 1


@gluon.jit
def _mma(a_desc, b_desc, c_desc, a_bufs, b_bufs, c_smem, ready, empty, M, N, K, GROUP_M: gl.constexpr,
         num_warps: gl.constexpr):
    """The MMA warps: each stage's wgmma once it is ready, the stage before released once its MMA is
    done; then the tile's store, left in flight until the next tile's epilogue."""
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[1]
    NUM_BUF: gl.constexpr = a_bufs.type.shape[0]
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                         instr_shape=[16, BLOCK_N, 16])
    pid, num_programs, tiles_m, tiles_n, k_tiles, my_tiles = _schedule(M, N, K, BLOCK_M, BLOCK_N, BLOCK_K)
    i = 0
    for t in range(my_tiles):
        tm, tn = gluon_probe._tile_of(t, pid, num_programs, tiles_m, tiles_n, GROUP_M)
        acc = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=acc_layout)
        for ki in range(k_tiles):
            s = i % NUM_BUF
            mbarrier.wait(ready.index(s), (i // NUM_BUF) & 1)
            acc = warpgroup_mma(a_bufs.index(s), b_bufs.index(s), acc, is_async=True)
            acc = warpgroup_mma_wait(1, deps=(acc, ))
            mbarrier.arrive(empty.index((i + NUM_BUF - 1) % NUM_BUF), count=1, pred=ki > 0)
            i += 1
        acc = warpgroup_mma_wait(0, deps=(acc, ))
        mbarrier.arrive(empty.index((i + NUM_BUF - 1) % NUM_BUF), count=1)
        tma.store_wait(0)  # the previous tile's store has left the staging buffer
        c_smem.store(acc.to(c_desc.dtype))
        fence_async_shared()
        _tma_store(c_desc, [tm * BLOCK_M, tn * BLOCK_N], c_smem)
    tma.store_wait(0)


@gluon.jit
def ws_gemm(a_desc, b_desc, c_desc, M, N, K, GROUP_M: gl.constexpr, NUM_BUF: gl.constexpr,
            LOAD_REGS: gl.constexpr, num_warps: gl.constexpr):
    """c = a @ b, persistent, a load warp feeding `num_warps` MMA warps."""
    dtype: gl.constexpr = a_desc.dtype
    a_bufs = gl.allocate_shared_memory(dtype, [NUM_BUF] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(dtype, [NUM_BUF] + b_desc.block_type.shape, b_desc.layout)
    c_smem = gl.allocate_shared_memory(dtype, c_desc.block_type.shape, c_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [NUM_BUF, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NUM_BUF, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(NUM_BUF):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    gl.warp_specialize([
        (_mma, (a_desc, b_desc, c_desc, a_bufs, b_bufs, c_smem, ready, empty, M, N, K, GROUP_M, num_warps)),
        (_loader, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, M, N, K, GROUP_M)),
    ], [1], [LOAD_REGS])


def main() -> int:
    dev = torch.device("cuda", 0)
    bf = torch.bfloat16
    programs = torch.cuda.get_device_properties(dev).multi_processor_count
    shapes = [(4096, 8192, 2048), (8192, 8192, 1024), (2048, 4096, 5504), (8192, 4096, 5504)]
    variants = [(64, 3), (32, 6)]  # BLOCK_K, ring stages (128x256 tiles, 8 MMA warps)
    print(f"{torch.cuda.get_device_name()}, bf16, warm, µs (median of 30 back to back)")
    print(f"{'M x N x K':20s} {'cuBLAS':>8s} {'Gluon loop':>11s} " + " ".join(f"{f'WS k{bk} s{s}':>12s}"
                                                                           for bk, s in variants) + "  max rel err")
    for m, n, k in shapes:
        a = torch.randn(m, k, device=dev, dtype=bf)
        b = torch.randn(k, n, device=dev, dtype=bf)
        out = torch.empty(m, n, device=dev, dtype=bf)
        ref = a.float() @ b.float()
        tiles = -(-m // 128) * -(-n // 256)
        grid = (min(programs, tiles),)
        row = [gemm_split._time(lambda: torch.matmul(a, b, out=out), reps=30, warmup=5)]
        pd = (_gl_descriptor(a, [128, 64]), _gl_descriptor(b, [64, 256]), _gl_descriptor(out, [128, 256]))
        row.append(gemm_split._time(lambda: gluon_probe.probe_gemm[grid](*pd, pd[2], m, n, k, ADD_PARTIAL=False,
                                                                         NUM_BUF=3, GROUP_M=8, PARTIAL_AT=2,
                                                                         num_warps=8), reps=30, warmup=5))
        errs = []
        for bk, stages in variants:
            d = (_gl_descriptor(a, [128, bk]), _gl_descriptor(b, [bk, 256]), _gl_descriptor(out, [128, 256]))

            def call(d=d, stages=stages):
                ws_gemm[grid](*d, m, n, k, GROUP_M=8, NUM_BUF=stages, LOAD_REGS=24, num_warps=8, maxnreg=168)
            out.fill_(float("nan"))
            call()
            torch.cuda.synchronize()
            errs.append(((out.float() - ref).abs().max() / ref.abs().max()).item())
            row.append(gemm_split._time(call, reps=30, warmup=5))
        print(f"{f'{m}x{n}x{k}':20s} {row[0]:8.1f} {row[1]:11.1f} " + " ".join(f"{x:12.1f}" for x in row[2:])
              + f"  {max(errs):.2e}  (cuBLAS / WS: " + ", ".join(f"{row[0] / x:.3f}" for x in row[2:]) + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
