"""One GPU: the fused kernels' compute path with communication emulated on the same device.

Checks (against torch in float32, outputs poisoned) and times, beside torch.matmul:
- the consumer GEMM of a two-rank all-gather, remote chunks already there, per tile config;
- the same with the remote chunks arriving from a side stream (copy-engine copies + stream writes of
  the signals) while the kernel runs, which is the copy-engine backend's protocol;
- the producer GEMM of a two-rank reduce-scatter with the peer's partial already there;
- the SM chunk copier's bandwidth.
Prints a table last; writes the details as JSON to $OUT/gpu_single.json when OUT is set.
`python benchmarks/gpu_single.py producer` runs only the producer at the suite's per-rank sizes,
`scatter` its reduce-scatter against its all-reduce, `occupancy` one program an SM against two,
`host` a few cases for their host time a launch (PROFILE_HOST=1 adds a profile), `tiles` the
consumer's tile configurations on the GEMM-bound ag_gemm shapes, `paced` the consumer with the
peer's chunks landing at the two-H200 link's pace, its own rows copied, in place or read from the shard,
`gluon` the producer in Gluon against the Triton producer, `gluon-paced` the same with the peer's
partials landing while they run, `gluon-ranks` both for rank 0 of four ranks, `gluon-consumer` the
consumer in Gluon against the Triton consumer, chunks there and paced, `waves` the consumer on
per-rank GEMMs that fill a whole number of waves or not, `small` both kernels as candidates of
kernel `triton` and `gluon` per tile configuration on the per-rank GEMMs of TP=4 layers at
2048–4096 tokens.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
import traceback

import torch
import triton
import triton.language as tl

from syncopate.kernels import launch, streamops
from syncopate.kernels.launch import launch_chunk_copy, launch_consumer, launch_producer
from syncopate.kernels.tables import (
    ENTERED_BASE,
    LOCAL_BASE,
    PAD_WORDS,
    READY_BASE,
    consumer_tables,
    plan_for,
    producer_tables,
)
from syncopate.search_space import Candidate, block_bounds

DEV = torch.device("cuda", 0)
rows = []


def bench(fn, reps=20):
    """Median µs of `fn` by events, with a device sleep first so host enqueue time is not counted."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    flush = torch.empty(256 << 20, dtype=torch.uint8, device=DEV)
    times = []
    for _ in range(reps):
        flush.zero_()
        torch.cuda._sleep(3_000_000)
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e) * 1000.0)
    return statistics.median(times)


def host_us(fn, calls=20, batches=7):
    """Host time of one call, enqueued back to back (the device is not waited for in between):
    the median over `batches` batches of `calls` calls, each batch started on an idle device."""
    fn()
    torch.cuda.synchronize()
    per_batch = []
    for _ in range(batches):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        per_batch.append((time.perf_counter() - t0) / calls * 1e6)
        torch.cuda.synchronize()
    t = statistics.median(per_batch)
    if os.environ.get("PROFILE_HOST") == "1":  # where the host time goes, to stderr
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        for _ in range(calls):
            fn()
        prof.disable()
        torch.cuda.synchronize()
        pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(25)
    return t


def stats(handle):
    try:
        return {"regs": handle.n_regs, "spills": handle.n_spills, "smem": handle.metadata.shared}
    except Exception as e:
        return {"stats_error": str(e)}


def rel(out, ref):
    o = out.double()
    if not torch.isfinite(o).all():
        return float("inf")
    return float((o - ref.double()).norm() / ref.double().norm())


@triton.jit
def _globaltimer():
    return tl.inline_asm_elementwise(
        "mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1
    )


@triton.jit
def _pace_kernel(stamp_ptr, offset_ns, STAMP: tl.constexpr):
    """STAMP: write the GPU's global time (ns) to stamp_ptr; otherwise spin until it reaches the
    stamped time plus `offset_ns`. One warp: it shares an SM with the kernel under test."""
    now = _globaltimer()
    if STAMP:
        tl.store(stamp_ptr, now)
    else:
        target = tl.load(stamp_ptr, volatile=True) + offset_ns
        while now < target:
            now = _globaltimer()


def consumer_case(
    m,
    n,
    k,
    cfg,
    splits=4,
    live=False,
    per_sm=1,
    group_m=8,
    pace_gbps=None,
    entry_us=21.0,
    order="arrival",
    own="copied",
    kernel="triton",
):
    """Rank 0's consumer of a two-rank all-gather. `live`: chunks copied in from a side stream while
    the kernel runs; `pace_gbps`: and the peer's chunks land as they would over a link of that
    bandwidth, the first one `entry_us` after the call starts plus its transfer time (the side
    stream spins on the GPU's global timer until the chunk is due, less its local copy, then copies),
    as on two GPUs where the peer enters late and the link is the limit. `own`: how the rank's own
    rows get to the kernel: "copied" into the gathered buffer chunk by chunk when the call starts (tiles wait
    for their chunk), "in_place" (already there,
    their words raised before the call), "shard" (read from the shard by the leading own tiles;
    nothing copied, nothing raised, the buffer's own rows poisoned)."""
    live = live or pace_gbps is not None
    own_in_place = own in ("in_place", "shard")
    bm, bn, bk, w, st = cfg
    c = Candidate(
        num_splits=splits,
        block_m=bm,
        block_n=bn,
        block_k=bk,
        num_warps=w,
        num_stages=st,
        group_m=group_m,
        tile_order=order,
        kernel=kernel,
    )
    plan = plan_for("ag_gemm", "direct", 2, m, splits, bm)
    a = torch.randn(m, k, device=DEV, dtype=torch.bfloat16)
    b = (torch.randn(k, n, device=DEV) / k**0.5).to(torch.bfloat16)
    a_full = a.clone()
    signals = torch.zeros(PAD_WORDS, dtype=torch.int32, device=DEV)
    err = torch.zeros(1, dtype=torch.int32, device=DEV)
    tables = consumer_tables(plan, 0, n, c, DEV)
    out = torch.full((m, n), float("nan"), device=DEV, dtype=torch.bfloat16)
    sms = torch.cuda.get_device_properties(DEV).multi_processor_count * per_sm
    state = {"epoch": 0}
    source = a.clone()
    side = torch.cuda.Stream() if live else None
    arrivals = [(t.row_start, t.row_end, t.signal) for t in plan.recvs(0, "gather")]
    arrivals = [(lo, hi, LOCAL_BASE + j) for j, (lo, hi) in enumerate(plan.chunk_bounds[0])] + arrivals

    raised = torch.tensor([slot for _, _, slot in arrivals], device=DEV)
    relaunch = {}
    remote = len(plan.chunk_bounds[0])
    offsets = []  # ns from the call's start after which each peer chunk's copy is issued
    stamp = torch.zeros(1, dtype=torch.int64, device=DEV)
    if pace_gbps is not None:
        scratch = torch.empty_like(a_full)
        lo, hi, _ = arrivals[remote]
        for _ in range(3):
            streamops.copy_async(
                torch.cuda.current_stream().cuda_stream,
                scratch.data_ptr(),
                source.data_ptr(),
                (hi - lo) * k * 2,
            )
        s0, s1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s0.record()
        streamops.copy_async(
            torch.cuda.current_stream().cuda_stream, scratch.data_ptr(), source.data_ptr(), (hi - lo) * k * 2
        )
        s1.record()
        torch.cuda.synchronize()
        local_us = s0.elapsed_time(s1) * 1000.0 / (hi - lo)  # a row, copied on this GPU
        del scratch
        due_us = entry_us
        dues = []
        for lo, hi, _ in arrivals[remote:]:
            due_us += (hi - lo) * k * 2 / (pace_gbps * 1e3)  # when the chunk would have landed over the link
            offsets.append(int(max(0.0, due_us - local_us * (hi - lo)) * 1000))
            dues.append(round(due_us, 1))
    landed = []

    def call():
        state["epoch"] += 1
        e = state["epoch"]
        if live:
            main = torch.cuda.current_stream()
            ev = torch.cuda.Event(enable_timing=True)
            ev.record(main)
            side.wait_event(ev)
            marks = [ev]
            if own == "in_place":
                signals.index_fill_(0, raised[:remote], e)
            if offsets:
                with torch.cuda.stream(side):
                    _pace_kernel[(1,)](stamp, 0, STAMP=True, num_warps=1)
            for j, (lo, hi, slot) in enumerate(arrivals):
                if own_in_place and j < remote:
                    continue
                if offsets and j >= remote:
                    with torch.cuda.stream(side):
                        _pace_kernel[(1,)](stamp, offsets[j - remote], STAMP=False, num_warps=1)
                streamops.copy_async(
                    side.cuda_stream,
                    a_full.data_ptr() + lo * k * 2,
                    source.data_ptr() + lo * k * 2,
                    (hi - lo) * k * 2,
                )
                streamops.write_value(side.cuda_stream, signals.data_ptr() + 4 * slot, e)
                if offsets and j >= remote:
                    marks.append(torch.cuda.Event(enable_timing=True))
                    marks[-1].record(side)
            landed[:] = [marks]
        if own == "shard" and not live:
            signals.index_fill_(0, raised[remote:], e)
        elif not live:
            signals.index_fill_(0, raised, e)
        launch_consumer(
            a_full,
            b,
            out,
            tables,
            c,
            e,
            signals,
            err,
            sms,
            1 << 24 if live else 0,
            cache=relaunch,
            a_own=own_rows if own == "shard" else None,
            own_row0=arrivals[0][0],
        )
        if live:
            ev2 = torch.cuda.Event()
            ev2.record(side)
            torch.cuda.current_stream().wait_event(ev2)

    own_rows = a[arrivals[0][0] : arrivals[remote - 1][1]].clone()
    assert own != "shard" or (tables.own_tiles > 0 and not tables.own_rows_later)

    def poison():
        if own == "shard":
            a_full[arrivals[0][0] : arrivals[remote - 1][1]].fill_(float("nan"))
        if live:
            a_full[arrivals[remote][0] :].fill_(float("nan")) if own_in_place else a_full.fill_(float("nan"))

    poison()
    call()
    torch.cuda.synchronize()
    ref = a.float() @ b.float()
    e1 = rel(out, ref)
    # back-to-back calls with the gathered buffer poisoned in between must stay right
    worst = e1
    for _ in range(5):
        poison()
        out.fill_(float("nan"))
        call()
        torch.cuda.synchronize()
        worst = max(worst, rel(out, ref))
    t_ours = bench(call)
    arrived = []
    if offsets:  # when the peer's chunks landed in the last timed call, from its start
        torch.cuda.synchronize()
        arrived = [round(landed[0][0].elapsed_time(mk) * 1000.0, 1) for mk in landed[0][1:]]
    t_host = host_us(call)
    t_torch = bench(lambda: a @ b)
    mode = " live" if live else ""
    if launch.gluon_consumer(c, k, a_full, b, out, own_rows if own == "shard" else a_full):
        mode += " gluon"
    if pace_gbps is not None:
        mode = f" paced {pace_gbps:g}GB/s entry {entry_us:g}us due {dues} landed {arrived}"
    return {
        "case": f"consumer{mode} own {own} {m}x{n}x{k} {bm}x{bn}x{bk}w{w}s{st} g{group_m} sp{splits} {order} P={sms}",
        "rel_err": worst,
        "error_flag": int(err.item()),
        "ours_us": t_ours,
        "host_us": t_host,
        "torch_us": t_torch,
        "tflops": 2 * m * n * k / t_ours / 1e6,
        "tma": launch.use_tma(a_full, b, out),
        "own_tiles": tables.own_tiles,
    }


def producer_case(
    m, n, k, cfg, splits=4, all_reduce=False, per_sm=1, pace_gbps=None, entry_us=30.0, ws=2, kernel="triton"
):
    """Rank 0's producer of a `ws`-rank direct reduce-scatter (or all-reduce, its reduced rows stored
    to a second buffer too), the peers' entry already there and their partials too, or, with `pace_gbps`,
    landing while the kernel runs: chunk j copied in from a side stream `entry_us` + (j + 1) chunk
    transfers at that bandwidth after the call starts (global-timer paced, as `consumer_case`), then
    its word raised; the receive buffer is poisoned before every checked call, so a tile that read
    its partial before the word said it was there comes out NaN."""
    bm, bn, bk, w, st = cfg
    c = Candidate(
        num_splits=splits, block_m=bm, block_n=bn, block_k=bk, num_warps=w, num_stages=st, kernel=kernel
    )
    kind = "gemm_ar" if all_reduce else "gemm_rs"
    plan = plan_for(kind, "direct", ws, m, splits, bm)
    a = torch.randn(m, k, device=DEV, dtype=torch.bfloat16)
    b = (torch.randn(k, n, device=DEV) / k**0.5).to(torch.bfloat16)
    partials = [torch.randn(m, n, device=DEV).to(torch.bfloat16) for _ in range(ws - 1)]  # from ranks 1 …
    peer_partial = sum(p.float() for p in partials)
    recv = torch.full((m, n), float("nan"), device=DEV, dtype=torch.bfloat16)
    lo, hi = block_bounds(m, ws, 0)
    from syncopate.kernels.tables import recv_offset

    for src, part in enumerate(partials, start=1):
        off = recv_offset(plan, src, 0, n)
        recv.view(-1)[off + lo * n : off + hi * n] = part[lo:hi].reshape(-1)
    source = recv.clone()  # where the paced copies take the partials from
    incoming = plan.recvs(0, "reduce")
    send = torch.empty(m, n, device=DEV, dtype=torch.bfloat16)
    out = torch.full((m if all_reduce else hi - lo, n), float("nan"), device=DEV, dtype=torch.bfloat16)
    reduced = torch.full((m, n), float("nan"), device=DEV, dtype=torch.bfloat16) if all_reduce else None
    row0 = 0 if all_reduce else lo
    pad = torch.zeros(PAD_WORDS, dtype=torch.int32, device=DEV)
    counters = torch.zeros(4096, dtype=torch.int64, device=DEV)
    err = torch.zeros(1, dtype=torch.int32, device=DEV)
    peer_ptrs = torch.tensor([pad.data_ptr()] * ws, dtype=torch.int64, device=DEV)
    tables = producer_tables(plan, 0, n, c, all_reduce, DEV)
    sms = torch.cuda.get_device_properties(DEV).multi_processor_count * per_sm
    state = {"epoch": 0}

    paced = pace_gbps is not None
    raised = torch.tensor(
        ([] if paced else [t.signal for t in incoming]) + [ENTERED_BASE + r for r in range(ws)], device=DEV
    )
    relaunch = {}
    side = torch.cuda.Stream() if paced else None
    stamp = torch.zeros(1, dtype=torch.int64, device=DEV)
    copies, due = [], 0.0  # (recv element offset, elements, signal, ns after the call's start)
    for t in incoming:
        start = recv_offset(plan, t.src, t.block, n) + t.row_start * n
        due += (t.row_end - t.row_start) * n * 2 / (pace_gbps * 1e3) if paced else 0.0
        copies.append((start, (t.row_end - t.row_start) * n, t.signal, int((entry_us + due) * 1000)))

    def call():
        state["epoch"] += 1
        e = state["epoch"]
        pad.index_fill_(0, raised, e)  # the peer has entered (and its partials are there): one small kernel
        if paced:
            ev = torch.cuda.Event()
            ev.record()
            side.wait_event(ev)
            with torch.cuda.stream(side):
                _pace_kernel[(1,)](stamp, 0, STAMP=True, num_warps=1)
                for start, elems, slot, ns in copies:
                    _pace_kernel[(1,)](stamp, ns, STAMP=False, num_warps=1)
                    streamops.copy_async(
                        side.cuda_stream,
                        recv.data_ptr() + start * 2,
                        source.data_ptr() + start * 2,
                        elems * 2,
                    )
                    streamops.write_value(side.cuda_stream, pad.data_ptr() + 4 * slot, e)
        launch_producer(
            a,
            b,
            send,
            out,
            reduced,
            recv,
            row0,
            tables,
            c,
            e,
            pad,
            counters,
            peer_ptrs,
            ws,
            0,
            err,
            sms,
            1 << 24 if paced else 0,
            cache=relaunch,
        )
        if paced:
            done = torch.cuda.Event()
            done.record(side)
            torch.cuda.current_stream().wait_event(done)

    full = a.float() @ b.float()
    ready = [READY_BASE + x for x in tables.chunk_ready.tolist() if x >= 0]

    def check():
        """Call once with the outputs poisoned; the errors of the kept and sent rows, their NaNs, and
        whether every chunk that leaves had its ready word raised to the call's epoch."""
        out.fill_(float("nan"))
        send.fill_(float("nan"))
        if reduced is not None:
            reduced.fill_(float("nan"))
        if paced:
            recv.fill_(float("nan"))
        call()
        torch.cuda.synchronize()
        mine = out[lo - row0 : hi - row0]
        e_out = rel(mine, full[lo:hi] + peer_partial[lo:hi].float())
        if all_reduce and not torch.equal(reduced[lo:hi], mine):
            e_out = float("inf")
        e_send = rel(send[hi:], full[hi:])
        ok = all(int(pad[w].item()) == state["epoch"] for w in ready)
        return e_out, e_send, int((~torch.isfinite(mine)).sum()), int((~torch.isfinite(send[hi:])).sum()), ok

    e_out, e_send, nan_out, nan_send, ready_ok = check()
    t_ours = bench(call)
    again = check()  # relaunched from the cache, after the timed calls
    e_out, e_send = max(e_out, again[0]), max(e_send, again[1])
    nan_out, nan_send, ready_ok = nan_out + again[2], nan_send + again[3], ready_ok and again[4]
    t_host = host_us(call)
    t_torch = bench(lambda: a @ b)
    from syncopate.kernels.launch import epilogue_split, gluon_producer, tma_epilogue

    split = epilogue_split(c)
    epi = "tma-epi" if tma_epilogue(c, tables, split, send, out, out, recv) else "ptr-epi"
    if gluon_producer(c, tables, k, a, b, send, out, out if reduced is None else reduced, recv):
        epi = "gluon"
    if paced:
        epi += f" paced {pace_gbps:g}GB/s entry {entry_us:g}us"
    if ws != 2:
        epi += f" ws{ws}"
    return {
        "case": f"producer {kind} {m}x{n}x{k} {bm}x{bn}x{bk}w{w}s{st} sp{splits} {epi} split{split} P={sms}"
        f"{' ptr' if not launch.use_tma(a, b) else ''}",
        "rel_err": max(e_out, e_send),
        "err_out": e_out,
        "err_send": e_send,
        "nan_out": nan_out,
        "nan_send": nan_send,
        "error_flag": int(err.item()),
        "ours_us": t_ours,
        "host_us": t_host,
        "torch_us": t_torch,
        "tflops": 2 * m * n * k / t_ours / 1e6,
        "counters_zero": int(counters.abs().sum().item()) == 0,
        "ready_raised": ready_ok,
        "tma": launch.use_tma(a, b),
        "gluon": os.environ.get("SYNCOPATE_GLUON") == "1",
    }


def copy_case(nbytes=256 << 20, programs=32):
    from types import SimpleNamespace

    src = torch.randn(nbytes // 2, device=DEV).to(torch.bfloat16)
    dst = torch.zeros_like(src)
    pad = torch.zeros(PAD_WORDS, dtype=torch.int32, device=DEV)
    ctx = SimpleNamespace(
        device=DEV,
        signals=SimpleNamespace(local=pad),
        peer_signal_ptrs=torch.tensor([pad.data_ptr()], dtype=torch.int64, device=DEV),
        counters=torch.zeros(4096, dtype=torch.int64, device=DEV),
        error=torch.zeros(1, dtype=torch.int32, device=DEV),
    )
    state = {"epoch": 0}
    chunks = 8
    per = src.numel() // chunks

    def call():
        state["epoch"] += 1
        pad[ENTERED_BASE] = state["epoch"]
        jobs = [
            (src.data_ptr() + i * per * 2, dst.data_ptr() + i * per * 2, per, -1, i, 0) for i in range(chunks)
        ]
        launch_chunk_copy(ctx, torch.cuda.current_stream(), jobs, programs, state["epoch"], torch.bfloat16)

    call()
    torch.cuda.synchronize()
    ok = torch.equal(dst, src) and all(int(pad[i]) == state["epoch"] for i in range(chunks))
    t = bench(call)
    return {
        "case": f"chunk copy {nbytes >> 20} MiB, {programs} programs",
        "ok": ok,
        "ours_us": t,
        "GBps": 2 * nbytes / t / 1e3,
    }


def kernel_stats():
    """Registers, spills and shared memory of the most recently compiled consumer/producer."""
    from syncopate.kernels import gluon_kernels
    from syncopate.kernels.triton_kernels import consumer_kernel, producer_kernel

    out = {}
    kernels = [("consumer", consumer_kernel), ("producer", producer_kernel)]
    if gluon_kernels.AVAILABLE:
        kernels += [
            ("gluon consumer", gluon_kernels.gluon_consumer_kernel),
            ("gluon producer", gluon_kernels.gluon_producer_kernel),
        ]
    for name, k in kernels:
        try:
            caches = k.device_caches if hasattr(k, "device_caches") else None
            kernels = (
                list(caches[0][0].values()) if caches else list(getattr(k, "cache", {}).get(0, {}).values())
            )
            if kernels:
                h = kernels[-1]
                out[name] = {
                    "regs": h.n_regs,
                    "spills": h.n_spills,
                    "smem": h.metadata.shared,
                    "count": len(kernels),
                }
        except Exception as e:
            out[name] = {"error": str(e)[:200]}
    return {"kernels": out}


def with_env(name, value, fn):
    def run():
        old = os.environ.get(name)
        os.environ[name] = value
        try:
            r = fn()
            r["case"] += f" {name}={value}"
            return r
        finally:
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old

    return run


def scatter_matrix():
    """Reduce-scatter against all-reduce producers on the shapes where the fused all-reduce lags."""
    cases = []
    for m, n, k in [(8192, 4096, 5504), (8192, 8192, 2048)]:
        for splits in (4, 8):
            for ar in (False, True):
                cases.append(
                    lambda m=m, n=n, k=k, s=splits, ar=ar: producer_case(m, n, k, (128, 256, 64, 8, 3), s, ar)
                )
    return cases


def occupancy_matrix():
    """Two persistent programs an SM, for tile configurations small enough to fit twice (shared
    memory and registers), against one an SM and the 128x256 tiles: does a second program hide
    the other's epilogue?"""
    cases = []
    for m, n, k in [(8192, 8192, 1024), (8192, 8192, 2048), (8192, 4096, 5504)]:
        for cfg, per in [
            ((128, 256, 64, 8, 3), 1),
            ((128, 128, 64, 4, 2), 1),
            ((128, 128, 64, 4, 2), 2),
            ((128, 128, 32, 4, 4), 1),
            ((128, 128, 32, 4, 4), 2),
            ((128, 128, 64, 8, 2), 2),
        ]:
            cases.append(lambda m=m, n=n, k=k, cfg=cfg, per=per: producer_case(m, n, k, cfg, per_sm=per))
            cases.append(lambda m=m, n=n, k=k, cfg=cfg, per=per: consumer_case(m, n, k, cfg, per_sm=per))
    return cases


def producer_matrix():
    """The producer at the K/ws of the gemm_rs / gemm_ar suite, with the epilogue its launcher
    picks, beside the consumer kernel (TMA stores, no waits) as a plain GEMM."""
    cases = []
    for m, n, k in [(8192, 8192, 1024), (8192, 8192, 2048), (8192, 4096, 5504)]:
        for cfg in [(128, 256, 64, 8, 3), (128, 128, 64, 8, 4), (128, 128, 64, 4, 4)]:
            cases.append(lambda m=m, n=n, k=k, cfg=cfg: consumer_case(m, n, k, cfg))
            cases.append(lambda m=m, n=n, k=k, cfg=cfg: producer_case(m, n, k, cfg))
    return cases


def host_matrix():
    """Host time of a launch, back to back, beside the device time: the consumer and the
    reduce-scatter and all-reduce producers at the suite's per-rank sizes."""
    return [
        lambda: consumer_case(8192, 5504, 4096, (128, 256, 64, 8, 3), 2),
        lambda: consumer_case(8192, 1024, 8192, (128, 128, 64, 8, 4), 2),
        lambda: producer_case(8192, 8192, 2048, (128, 256, 64, 8, 3), 4),
        lambda: producer_case(8192, 8192, 2048, (128, 256, 64, 8, 3), 4, True),
        lambda: producer_case(8192, 4096, 5504, (128, 256, 64, 8, 3), 8, True),
    ]


def paced_matrix():
    """The consumer with the peer's chunks landing at the pace of the two-H200 link (351 GB/s inside
    a fused call, the peer's first chunk 21 µs late, as `benchmarks/timeline.py` shows there), its own rows
    copied into the gathered buffer at the call's start, already there, or read from the shard,
    beside the chunks already there, on the per-rank GEMMs of ag_gemm N=4096, 2048 (two and eight
    splits), 14336, 11008."""
    cases = []
    for (m, n, k), cfg, splits in [
        ((8192, 2048, 8192), (128, 256, 64, 8, 3), 2),
        ((8192, 1024, 8192), (128, 128, 64, 8, 4), 2),
        ((8192, 1024, 8192), (128, 128, 64, 8, 4), 8),
        ((8192, 7168, 4096), (128, 256, 64, 8, 3), 2),
        ((8192, 5504, 4096), (128, 256, 64, 8, 3), 2),
    ]:
        for pace, own in (
            (None, "copied"),
            (None, "shard"),
            (351.0, "copied"),
            (351.0, "in_place"),
            (351.0, "shard"),
        ):
            cases.append(
                lambda m=m, n=n, k=k, cfg=cfg, s=splits, p=pace, o=own: consumer_case(
                    m, n, k, cfg, s, pace_gbps=p, own=o
                )
            )
    return cases


def gluon_matrix():
    """The producer in Gluon (SYNCOPATE_GLUON=1) against the Triton producer, in turn, on the
    reduce-scatter and all-reduce shapes of the TP=2 suite, both tile configurations."""
    cases = []
    for (m, n, k), splits in [
        ((8192, 8192, 1024), 4),
        ((8192, 8192, 2048), 4),
        ((8192, 4096, 5504), 8),
        ((8192, 4096, 7168), 4),
    ]:
        for cfg in ((128, 256, 64, 8, 3), (128, 128, 64, 8, 4)):
            for ar in (False, True):
                for g in ("0", "1"):
                    cases.append(
                        with_env(
                            "SYNCOPATE_GLUON",
                            g,
                            lambda m=m, n=n, k=k, cfg=cfg, s=splits, ar=ar: producer_case(
                                m, n, k, cfg, s, all_reduce=ar
                            ),
                        )
                    )
    return cases


def gluon_ranks_matrix():
    """The producers in Triton and in Gluon for rank 0 of four ranks (direct plans: three partials a
    kept chunk), the TP=4 suite's reduce-scatter and all-reduce shapes."""
    cases = []
    for (m, n, k), splits in [((8192, 8192, 1024), 2), ((8192, 4096, 2752), 2), ((8192, 8192, 512), 2)]:
        for ar in (False, True):
            for g in ("0", "1"):
                cases.append(
                    with_env(
                        "SYNCOPATE_GLUON",
                        g,
                        lambda m=m, n=n, k=k, s=splits, ar=ar: producer_case(
                            m, n, k, (128, 256, 64, 8, 3), s, all_reduce=ar, ws=4
                        ),
                    )
                )
    return cases


def gluon_paced_matrix():
    """The producers in Triton and in Gluon with the peer's partials landing while they run (351 GB/s,
    the first 30 µs after the call starts plus its transfer), the receive buffer poisoned: the
    partials' waits, and what the tail after the last partial costs each."""
    cases = []
    for (m, n, k), splits in [((8192, 8192, 1024), 4), ((8192, 4096, 5504), 8)]:
        for ar in (False, True):
            for g in ("0", "1"):
                cases.append(
                    with_env(
                        "SYNCOPATE_GLUON",
                        g,
                        lambda m=m, n=n, k=k, s=splits, ar=ar: producer_case(
                            m, n, k, (128, 256, 64, 8, 3), s, all_reduce=ar, pace_gbps=351.0
                        ),
                    )
                )
    return cases


def gluon_consumer_matrix():
    """The all-gather's consumer in Gluon (SYNCOPATE_GLUON=1) against the Triton consumer, in turn, on
    the per-rank GEMMs of the TP=2 suite's ag_gemm shapes (N=14336, 11008, 4096, 2048, 28672), own
    rows read from the shard, the peer's chunks there before the call and landing at the link's
    pace (351 GB/s, the first 21 µs late)."""
    cases = []
    big, small = (128, 256, 64, 8, 3), (128, 128, 64, 8, 4)
    for (m, n, k), cfg, splits in [
        ((8192, 7168, 4096), big, 2),
        ((8192, 5504, 4096), big, 2),
        ((8192, 2048, 8192), big, 2),
        ((8192, 1024, 8192), small, 8),
        ((8192, 14336, 8192), big, 2),
    ]:
        for pace in (None, 351.0):
            for g in ("0", "1"):
                cases.append(
                    with_env(
                        "SYNCOPATE_GLUON",
                        g,
                        lambda m=m, n=n, k=k, cfg=cfg, s=splits, p=pace: consumer_case(
                            m, n, k, cfg, s, pace_gbps=p, own="shard"
                        ),
                    )
                )
    return cases


def tiles_matrix():
    """The consumer's tile configurations and L2 groupings on the per-rank GEMMs of the GEMM-bound
    ag_gemm shapes, beside cuBLAS."""
    cases = []
    for m, n, k in [(8192, 7168, 4096), (8192, 2048, 8192)]:
        for cfg, g in [
            ((128, 256, 64, 8, 3), 8),
            ((128, 256, 64, 8, 3), 4),
            ((128, 256, 64, 8, 3), 16),
            ((128, 256, 64, 8, 3), 1),
            ((256, 128, 64, 8, 3), 8),
            ((128, 256, 32, 8, 5), 8),
            ((128, 256, 32, 8, 6), 8),
            ((256, 128, 32, 8, 5), 8),
            ((128, 128, 64, 8, 5), 8),
            ((128, 128, 128, 8, 3), 8),
        ]:
            cases.append(lambda m=m, n=n, k=k, cfg=cfg, g=g: consumer_case(m, n, k, cfg, 2, group_m=g))
    return cases


def waves_matrix():
    """The consumer on per-rank GEMMs whose 128×256 tiles fill a whole number of waves of the GPU's
    programs or not (M=8192, K=4096: N=2560 is 640 tiles, 4.85 waves of 132; 2752, TP=4's
    AG+GEMM 8192×11008×4096, is 704, 5.33; 2816 is 704 too; 3072, 768, 5.82), chunks there, beside
    cuBLAS; and with 128×128 tiles; then N=2752 with the peer's chunks landing at 351 GB/s. A last
    wave of at most half the programs is cut in K (`search_space.tail_split`)."""
    cases = []
    for n in (2560, 2752, 2816, 3072):
        for cfg in ((128, 256, 64, 8, 3), (128, 128, 64, 8, 4)):
            cases.append(lambda n=n, cfg=cfg: consumer_case(8192, n, 4096, cfg, 2, own="shard"))
    cases.append(
        lambda: consumer_case(  # the peer's chunks landing while it runs, at the link's pace
            8192, 2752, 4096, (128, 256, 64, 8, 3), 2, own="shard", pace_gbps=351.0
        )
    )
    return cases


def small_matrix():
    """The consumer (two-rank all-gather, own rows read from the shard, the peer's chunks there) and
    the producer (rank 0 of a four-rank direct reduce-scatter, the partials there), each candidate
    of kernel `triton` and of kernel `gluon`, per tile configuration, beside cuBLAS, on the per-rank
    GEMMs of TP=4 MLP layers at few tokens a rank, where one wave of 128x256 tiles is most of the
    GEMM: hidden 4096 / ffn 14336 at 2048 tokens (forward and the backward's all-gather and
    reduce-scatter), 5120/17408 at 4096, and 6144/16384 at 3072 (a shape no suite holds)."""
    cfgs = [(128, 256, 64, 8, 3), (128, 128, 64, 8, 4), (128, 128, 64, 4, 4), (256, 128, 64, 8, 3)]
    consumer = [(2048, 7168, 4096), (2048, 3584, 4096), (4096, 8704, 5120), (3072, 8192, 6144)]
    producer = [(2048, 4096, 3584), (2048, 4096, 7168), (4096, 5120, 4352), (3072, 6144, 4096)]
    cases = []
    for make, shapes in (
        (lambda m, n, k, cfg, kernel: consumer_case(m, n, k, cfg, 2, own="shard", kernel=kernel), consumer),
        (lambda m, n, k, cfg, kernel: producer_case(m, n, k, cfg, 2, ws=4, kernel=kernel), producer),
    ):
        for m, n, k in shapes:
            for cfg in cfgs:
                for kernel in ("triton", "gluon"):
                    cases.append(
                        with_env(
                            "SYNCOPATE_GLUON",
                            "0",  # the candidate's field alone chooses
                            lambda make=make, m=m, n=n, k=k, cfg=cfg, kernel=kernel: make(
                                m, n, k, cfg, kernel
                            ),
                        )
                    )
    return cases


def main():
    cfgs = [
        (128, 256, 64, 8, 3),
        (128, 128, 64, 8, 4),
        (256, 128, 64, 8, 3),
        (128, 256, 64, 8, 2),
        (128, 128, 64, 4, 4),
    ]
    cases = []
    modes = {
        "producer": producer_matrix,
        "scatter": scatter_matrix,
        "occupancy": occupancy_matrix,
        "tiles": tiles_matrix,
        "host": host_matrix,
        "paced": paced_matrix,
        "gluon": gluon_matrix,
        "gluon-paced": gluon_paced_matrix,
        "gluon-ranks": gluon_ranks_matrix,
        "gluon-consumer": gluon_consumer_matrix,
        "waves": waves_matrix,
        "small": small_matrix,
    }
    if sys.argv[1:] in (["-h"], ["--help"]):
        print(f"usage: python benchmarks/gpu_single.py [{'|'.join(modes)}]\n\n{__doc__.strip()}")
        return None
    if len(sys.argv) > 2 or (len(sys.argv) == 2 and sys.argv[1] not in modes):
        print(
            f"gpu_single: unknown arguments {sys.argv[1:]}: give none or one of {', '.join(modes)}",
            file=sys.stderr,
        )
        sys.exit(2)
    if not torch.cuda.is_available():
        print("gpu_single: needs a CUDA GPU; none is visible", file=sys.stderr)
        sys.exit(1)
    if len(sys.argv) == 2:
        return report(modes[sys.argv[1]]())
    for m, n, k in [(8192, 5504, 4096), (8192, 14336, 8192), (8192, 1024, 8192), (8192, 2048, 8192)]:
        for cfg in cfgs:
            cases.append(lambda m=m, n=n, k=k, cfg=cfg: consumer_case(m, n, k, cfg))
    for m, n, k in [(8192, 5504, 4096), (8192, 1024, 8192)]:
        cases.append(lambda m=m, n=n, k=k: consumer_case(m, n, k, (128, 256, 64, 8, 3), splits=8, live=True))
    for m, n, k in [(8192, 4096, 5504), (8192, 8192, 14336), (8192, 8192, 1024)]:
        for cfg in [cfgs[0], cfgs[1], cfgs[3]]:
            cases.append(lambda m=m, n=n, k=k, cfg=cfg: producer_case(m, n, k, cfg))

    def pointer_producer():
        """The producer on the pointer path, which unaligned tensors and pre-Hopper GPUs take."""
        saved = launch.use_tma
        launch.use_tma = lambda *tensors: False
        try:
            return producer_case(2048, 1024, 512, (128, 128, 64, 8, 3))
        finally:
            launch.use_tma = saved

    cases.append(pointer_producer)
    for p in (16, 32, 64):
        cases.append(lambda p=p: copy_case(programs=p))
    report(cases)


def report(cases):
    for case in cases:
        try:
            r = case()
            r.update(kernel_stats())
        except Exception as e:
            r = {
                "case": "failed",
                "error": f"{type(e).__name__}: {e}",
                "trace": traceback.format_exc()[-3000:],
            }
            print(r["trace"], file=sys.stderr)
        rows.append(r)
        print(json.dumps(r), flush=True)
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "gpu_single.json"), "w") as f:
            json.dump(rows, f, indent=1)
    print("\ncase | rel_err | ours_us | host_us | torch_us | torch/ours | TFLOP/s | tma")
    for r in rows:
        if "torch_us" in r:
            extra = (
                (
                    f" | out {r['err_out']:.1e} send {r['err_send']:.1e} nan {r['nan_out']}/{r['nan_send']}"
                    f" counters0 {r['counters_zero']} ready {r['ready_raised']}"
                )
                if "err_out" in r
                else ""
            )
            role = "producer" if r["case"].startswith("producer") else "consumer"
            if r["case"].endswith("SYNCOPATE_GLUON=1"):
                role = "gluon " + role
            ks = r.get("kernels", {}).get(role, {})
            print(
                f"{r['case']} | {r['rel_err']:.2e} | {r['ours_us']:.1f} | {r.get('host_us', float('nan')):.1f} | "
                f"{r['torch_us']:.1f} | "
                f"{r['torch_us'] / r['ours_us']:.3f} | {r['tflops']:.0f} | {r['tma']} | "
                f"flag {r['error_flag']}{extra} | "
                f"regs {ks.get('regs')} spills {ks.get('spills')} smem {ks.get('smem')}"
            )
        elif "GBps" in r:
            print(f"{r['case']} | ok={r['ok']} | {r['ours_us']:.1f} us | {r['GBps']:.0f} GB/s")
        else:
            print(f"{r['case']} | {r.get('error')}")


if __name__ == "__main__":
    main()
