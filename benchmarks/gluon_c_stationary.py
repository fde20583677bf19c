"""One GPU (Hopper): a c_stationary reduce-scatter block in one persistent Gluon GEMM, against the
template's two cuBLAS GEMMs.

c_stationary's block of rank r is A_r[r's rows] @ B_r + A_q[r's rows] @ B_q, the peer q's operands
landing while the first term runs; cuBLAS computes it as two GEMMs, the second reading back the
first's output (gemm_rs 8192x8192x2048 on two ranks: 4096x8192x1024 each, 64 MiB read back). The
kernel here computes each program's tiles before `early` from the own term alone, the tiles after it
over both terms side by side in K (nothing read back), then adds the peer's term to its early tiles;
the peer's operands are waited for once a program, on a pad word a side stream raises after copying
them in (after a device sleep: the transfer's time). Every variant is checked against float32 with
the output and the receive buffers poisoned; events around each call, 5 warm-up calls, the median
of 30 back to back (as a call runs in the op).

    python benchmarks/gluon_c_stationary.py [--delays -1,0,60]   # -1: operands there before the call

The K-joint block is timed as one cuBLAS GEMM and as `gluon_probe.py`'s plain GEMM too. The cuBLAS
two-GEMM row includes, as the op does, the pad word's write and the stream wait between the GEMMs
(on two H200s, 2026-11-26: 258.3 µs here against 217-223 for the two GEMMs back to back in
`gemm_split.py rs`). There, warm, the plain Gluon GEMM ran the joint block at 0.875 of cuBLAS's rate
(218.8 against 191.5 µs) and this kernel's joint schedule at 0.71-0.80; its best three-phase time,
248.6 µs, is slower than the two cuBLAS GEMMs: the schedule does not pay without a GEMM at cuBLAS's
rate (a load warp of its own alone does not make one: `gluon_ws_probe.py`).
"""

from __future__ import annotations

import argparse
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

from syncopate.kernels import streamops
from syncopate.kernels.gluon_kernels import _cta_barrier, _tma_load, _tma_store, _wait_word
from syncopate.kernels.launch import _gl_descriptor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gemm_split  # noqa: E402  (its timing loop)
import gluon_probe  # noqa: E402  (its plain persistent GEMM)


@gluon.jit
def _job(j, pid, num_programs, tiles_m, tiles_n, early, GROUP_M: gl.constexpr):
    """(m-tile, n-tile, mode) of a program's j-th job: its tiles pid, pid + P, … of a GROUP_M-swizzled
    order, then again those of them before `early`. Mode 0: the own term alone; 1: both terms; 2: the
    peer's term onto the own term this program stored earlier."""
    first_pass = gl.cdiv(tiles_m * tiles_n - pid, num_programs)
    again = j >= first_pass
    t = gl.where(again, j - first_pass, j)
    mode = gl.where(again, 2, gl.where(pid + t * num_programs < early, 0, 1))
    tm, tn = gluon_probe._tile_of(t, pid, num_programs, tiles_m, tiles_n, GROUP_M)
    return tm, tn, mode


@gluon.jit
def _load(job, tm, tn, mode, s, k_tiles, gate, a_desc, b_desc, ra_desc, rb_desc, peer, slot_rows, k_local, bars,
          a_bufs, b_bufs, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, NUM_BUF: gl.constexpr,
          pred):
    """K step `s` of a job: the own term's operands, or the peer's received ones (`gate`, 0, the poll's
    result, orders the load after it). No wait and no memory read on this path: with the poll here
    (behind a flag tested each step) the kernel ran 10 % slower still."""
    term = s // k_tiles + (mode == 2).to(gl.int32)
    kk = s % k_tiles
    stage = job % NUM_BUF
    bar = bars.index(stage)
    mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes, pred=pred)
    if term == 0:
        _tma_load(a_desc, [tm * BLOCK_M, kk * BLOCK_K], bar, a_bufs.index(stage), pred)
        _tma_load(b_desc, [kk * BLOCK_K, tn * BLOCK_N], bar, b_bufs.index(stage), pred)
    else:
        _tma_load(ra_desc, [peer * slot_rows + tm * BLOCK_M + gate, kk * BLOCK_K], bar, a_bufs.index(stage), pred)
        _tma_load(rb_desc, [peer * k_local + kk * BLOCK_K, tn * BLOCK_N], bar, b_bufs.index(stage), pred)


@gluon.jit(do_not_specialize=["epoch"])
def c_stationary_block(a_desc, b_desc, ra_desc, rb_desc, c_desc, M, N, k_local, slot_rows, early, peer, signal_ptr,
                       epoch, error_ptr, max_spin, GROUP_M: gl.constexpr, NUM_BUF: gl.constexpr,
                       PARTIAL_LEAD: gl.constexpr, num_warps: gl.constexpr):
    """out [M, N] = a @ b + ra[peer] @ rb[peer] on two ranks, the peer's operands waited for on
    `signal_ptr[peer]`; the schedule of the module docstring. The operand ring, asynchronous wgmma and
    deferred stores of `gluon_probe.probe_gemm`; k_local a whole number of BLOCK_K steps."""
    BLOCK_M: gl.constexpr = c_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = c_desc.block_type.shape[1]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    dtype: gl.constexpr = a_desc.dtype
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                         instr_shape=[16, BLOCK_N, 16])
    a_bufs = gl.allocate_shared_memory(dtype, [NUM_BUF] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(dtype, [NUM_BUF] + b_desc.block_type.shape, b_desc.layout)
    c_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, BLOCK_N], c_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [NUM_BUF, 1], mbarrier.MBarrierLayout())
    p_bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    for stage in gl.static_range(NUM_BUF):
        mbarrier.init(bars.index(stage), count=1)
    mbarrier.init(p_bar.index(0), count=1)

    pid = gl.program_id(0)
    num_programs = gl.num_programs(0)
    tiles_m = gl.cdiv(M, BLOCK_M)
    tiles_n = gl.cdiv(N, BLOCK_N)
    k_tiles = k_local // BLOCK_K
    my_jobs = gl.cdiv(tiles_m * tiles_n - pid, num_programs) + gl.cdiv(gl.maximum(early - pid, 0), num_programs)

    # The peer's operands are waited for once, at the start of the first job whose loads (its own, or
    # the next job's issued ahead in its last steps) read them; a program's first steps are its own term's.
    waited = 0
    gate = 0
    tm, tn, mode = _job(0, pid, num_programs, tiles_m, tiles_n, early, GROUP_M)
    for j in gl.static_range(NUM_BUF - 1):
        _load(j, tm, tn, mode, j, k_tiles, gate, a_desc, b_desc, ra_desc, rb_desc, peer, slot_rows, k_local, bars,
              a_bufs, b_bufs, BLOCK_M, BLOCK_N, BLOCK_K, NUM_BUF, j < my_jobs)
    job = 0
    backs = 0  # read-backs waited for: the phase of p_bar
    for t in range(my_jobs):
        nm, nn, nmode = _job(t + 1, pid, num_programs, tiles_m, tiles_n, early, GROUP_M)
        if waited == 0:
            if (mode != 0) | ((nmode != 0) & (t + 1 < my_jobs)):
                gate = _wait_word(signal_ptr + peer, epoch, error_ptr, max_spin)
                waited = 1
        steps = k_tiles * gl.where(mode == 1, 2, 1)
        back_at = gl.maximum(steps - PARTIAL_LEAD, 0)
        acc = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=acc_layout)
        for ki in range(steps):
            if mode == 2:
                if ki == back_at:
                    tma.store_wait(0)  # this program's stores, its own term of this tile among them, are written
                    mbarrier.expect(p_bar.index(0), c_desc.block_type.nbytes)
                    _tma_load(c_desc, [tm * BLOCK_M, tn * BLOCK_N], p_bar.index(0), c_smem)
            s = job % NUM_BUF
            mbarrier.wait(bars.index(s), (job // NUM_BUF) & 1)
            acc = warpgroup_mma(a_bufs.index(s), b_bufs.index(s), acc, is_async=True)
            acc = warpgroup_mma_wait(1, deps=(acc, ))
            ka = ki + NUM_BUF - 1
            here = ka < steps
            _load(job + NUM_BUF - 1, gl.where(here, tm, nm), gl.where(here, tn, nn), gl.where(here, mode, nmode),
                  gl.where(here, ka, ka - steps), k_tiles, gate, a_desc, b_desc, ra_desc, rb_desc, peer, slot_rows,
                  k_local, bars, a_bufs, b_bufs, BLOCK_M, BLOCK_N, BLOCK_K, NUM_BUF, here | (t + 1 < my_jobs))
            job += 1
        acc = warpgroup_mma_wait(0, deps=(acc, ))
        if mode == 2:
            mbarrier.wait(p_bar.index(0), backs & 1)
            backs += 1
            acc = acc + c_smem.load(acc_layout).to(gl.float32)
            _cta_barrier()
        else:
            tma.store_wait(0)
        c_smem.store(acc.to(dtype))
        fence_async_shared()
        _tma_store(c_desc, [tm * BLOCK_M, tn * BLOCK_N], c_smem)
        tm = nm
        tn = nn
        mode = nmode
    tma.store_wait(0)


def _timed(fn) -> float:
    return gemm_split._time(fn, reps=30, warmup=5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=4096, help="the block's rows (M / ranks)")
    parser.add_argument("--n", type=int, default=8192)
    parser.add_argument("--k-local", type=int, default=1024)
    parser.add_argument("--delays", default="-1,0,60", help="µs the side stream sleeps before its copy; -1: none")
    args = parser.parse_args(argv)
    dev = torch.device("cuda", 0)
    bf = torch.bfloat16
    rows, n, kl = args.rows, args.n, args.k_local
    bm, bn, bk = 128, 256, 64
    programs = torch.cuda.get_device_properties(dev).multi_processor_count
    a = torch.randn(rows, kl, device=dev, dtype=bf)
    b = torch.randn(kl, n, device=dev, dtype=bf)
    src_a, src_b = torch.randn(rows, kl, device=dev, dtype=bf), torch.randn(kl, n, device=dev, dtype=bf)
    ra, rb = torch.empty(2, rows, kl, device=dev, dtype=bf), torch.empty(2, kl, n, device=dev, dtype=bf)
    out = torch.empty(rows, n, device=dev, dtype=bf)
    sig = torch.zeros(64, device=dev, dtype=torch.int32)
    err = torch.zeros(1, device=dev, dtype=torch.int32)
    descs = (_gl_descriptor(a, [bm, bk]), _gl_descriptor(b, [bk, bn]), _gl_descriptor(ra.view(-1, kl), [bm, bk]),
             _gl_descriptor(rb.view(-1, n), [bk, bn]), _gl_descriptor(out, [bm, bn]))
    tiles = -(-rows // bm) * -(-n // bn)
    side = torch.cuda.Stream()
    epoch = [0]
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(1_000_000)
    end.record()
    end.synchronize()
    cycles_per_us = 1_000_000 / (start.elapsed_time(end) * 1000.0)

    def arrive(delay_us):
        """The peer's operands: copied into slot 1 on a side stream after `delay_us`, then its word raised."""
        epoch[0] += 1
        main = torch.cuda.current_stream()
        if delay_us < 0:
            streamops.write_value(main.cuda_stream, sig.data_ptr() + 4, epoch[0])
            return
        side.wait_stream(main)
        with torch.cuda.stream(side):
            if delay_us:
                torch.cuda._sleep(int(delay_us * cycles_per_us))
            streamops.copy_async(side.cuda_stream, ra[1].data_ptr(), src_a.data_ptr(), src_a.numel() * 2)
            streamops.copy_async(side.cuda_stream, rb[1].data_ptr(), src_b.data_ptr(), src_b.numel() * 2)
            streamops.write_value(side.cuda_stream, sig.data_ptr() + 4, epoch[0])

    def gluon_call(early, delay_us):
        arrive(delay_us)
        c_stationary_block[(min(programs, tiles),)](*descs, rows, n, kl, rows, early, 1, sig, epoch[0], err, 1 << 30,
                                                    GROUP_M=8, NUM_BUF=3, PARTIAL_LEAD=4, num_warps=8)
        torch.cuda.current_stream().wait_stream(side)

    def cublas_call(delay_us):
        arrive(delay_us)
        torch.matmul(a, b, out=out)
        streamops.wait_value(torch.cuda.current_stream().cuda_stream, sig.data_ptr() + 4, epoch[0])
        out.addmm_(ra[1], rb[1])
        torch.cuda.current_stream().wait_stream(side)

    def error(fn, delay_us):
        worst = 0.0
        for _ in range(3):
            for t in (src_a, src_b, a, b):
                t.normal_()
            for t in (out, ra, rb):
                t.fill_(float("nan"))
            if delay_us < 0:
                ra[1].copy_(src_a)
                rb[1].copy_(src_b)
            fn()
            torch.cuda.synchronize()
            ref = a.float() @ b.float() + src_a.float() @ src_b.float()
            e = ((out.float() - ref).abs().max() / ref.abs().max()).item()
            worst = max(worst, e if e == e else float("inf"))
        return worst

    print(f"{torch.cuda.get_device_name()}, block {rows}x{n}, K {kl} a rank, two ranks, bf16")
    rows_out = []
    for delay in (int(x) for x in args.delays.split(",")):
        rows_out.append((f"cuBLAS, two GEMMs, delay {delay}", error(lambda: cublas_call(delay), delay),
                         _timed(lambda: cublas_call(delay))))
        if delay < 0:
            joint_a = torch.randn(rows, 2 * kl, device=dev, dtype=bf)
            joint_b = torch.randn(2 * kl, n, device=dev, dtype=bf)
            rows_out.append(("cuBLAS, one GEMM over both terms (K side by side)", 0.0,
                             _timed(lambda: torch.matmul(joint_a, joint_b, out=out))))
            jd = (_gl_descriptor(joint_a, [bm, bk]), _gl_descriptor(joint_b, [bk, bn]), _gl_descriptor(out, [bm, bn]))
            rows_out.append(("gluon_probe's GEMM, the same", 0.0, _timed(lambda: gluon_probe.probe_gemm[
                (min(programs, tiles),)](*jd, jd[2], rows, n, 2 * kl, ADD_PARTIAL=False, NUM_BUF=3, GROUP_M=8,
                                         PARTIAL_AT=2, num_warps=8))))
        for waves in (tiles // programs + 1, 6, 4, 0):
            early = min(tiles, waves * programs)
            rows_out.append((f"Gluon, {early} early tiles ({waves} waves), delay {delay}",
                             error(lambda: gluon_call(early, delay), delay), _timed(lambda: gluon_call(early, delay))))
    print(f"error flag {int(err.item())} (1: a bounded wait gave up)")
    print(f"{'variant':58s} {'max err':>9s} {'us':>8s}")
    for name, e, us in rows_out:
        print(f"{name:58s} {e:9.2e} {us:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
