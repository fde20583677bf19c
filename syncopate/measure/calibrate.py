"""`syncopate calibrate`: the microbenchmarks behind the cost model, on the GPUs at hand.

One process per GPU (spawned here, NCCL process group), every measurement by the one method of
:mod:`syncopate.measure.timing` (warm-up, L2 flush, barrier, max over ranks, median). Rank r talks
to rank (r + 1) mod ws, every rank at once, as the chunk plans do.

| what                               | how                                                              | calibration record           |
|------------------------------------|------------------------------------------------------------------|------------------------------|
| copy engine, per chunk size        | `chunks` back-to-back copy-engine copies into the peer's symmetric buffer (`streamops.copy_async`) | `transfer` `copy_engine/intra` |
| SM-driven copier, per size and SMs | the chunk-copy kernel (`launch_chunk_copy`) with `comm_sms` programs, `chunks` jobs | `transfer` `sm_copy/intra`     |
| NVSHMEM copier, per size and SMs   | `launch_nvshmem_copy` with `comm_sms` programs, `chunks` jobs (only where `nvshmem` is among the backends: every rank's symmetric memory is then NVSHMEM's) | `transfer` `nvshmem/intra` |
| NCCL, per size                     | `chunks` batched send/receive pairs                              | `transfer` `nccl/intra`        |
| fixed cost per call                | one call's entry handshake, fork and join with one small chunk, less that chunk's time | `call_us` of each          |
| GEMM per tile configuration and SMs| the consumer kernel with every signal raised beforehand, on M×N×K and M×N×K/4: the slope gives the rate, the intercept the cost per tile | `gemm` TILE |
| local copy, HBM, launch            | a copy-engine copy and a `copy_` of 256 MiB; a one-tile consumer | `op_costs` `op` (signal wait and the slowdown while communicating stay the defaults) |

Rank 0 returns everything as :class:`~syncopate.records.CalibrationRecord` rows for the detected
topology and this environment.
"""

from __future__ import annotations

import logging
import socket
import statistics
from dataclasses import dataclass
from typing import Any

from syncopate.search_space import DEFAULT_BACKENDS, TILE_CONFIGS, Candidate, TileConfig

__all__ = ["CalibrateOptions", "run_calibration"]

log = logging.getLogger(__name__)

MiB = 1 << 20


@dataclass
class CalibrateOptions:
    sizes: tuple[int, ...] = tuple(64 * 1024 * 4**i for i in range(7))
    """Chunk sizes, bytes (64 KiB … 256 MiB)."""
    chunks: int = 8
    """Back-to-back transfers per timed repetition (their mean is the per-chunk time)."""
    comm_sms: tuple[int, ...] = (8, 16, 32, 64)
    """Programs of the SM-driven copier."""
    backends: tuple[str, ...] = DEFAULT_BACKENDS
    """Backends whose transfers are measured; with `nvshmem`, every rank opts into NVSHMEM symmetric
    memory first (`syncopate.use_nvshmem`)."""
    tile_configs: tuple[TileConfig, ...] = TILE_CONFIGS
    gemm_shape: tuple[int, int, int] = (8192, 8192, 4096)
    """M, N, K of the GEMM calibration (K/4 is measured too)."""
    program_fractions: tuple[float, ...] = (1.0, 0.75, 0.5)
    """SM counts of the GEMM calibration, as fractions of the GPU's."""
    warmup: int = 5
    repetitions: int = 20


def _median_us(fn, group, options: CalibrateOptions) -> float:
    from syncopate.measure.timing import time_collective

    return statistics.median(
        time_collective(fn, group, warmup=options.warmup, repetitions=options.repetitions).samples_us
    )


def _transfers(ctx, group, options: CalibrateOptions) -> dict[str, dict[str, Any]]:
    """Per backend, the payload of its `transfer` record."""
    import torch
    import torch.distributed as dist

    from syncopate.kernels import streamops
    from syncopate.kernels.backends import announce_entry
    from syncopate.kernels.launch import launch_chunk_copy
    from syncopate.kernels.tables import ENTERED_BASE
    from syncopate.measure.harness import SPIN_LIMIT

    rank, ws = ctx.rank, ctx.world_size
    peer = (rank + 1) % ws
    src_peer = (rank - 1) % ws
    buf = ctx.buffers["buf"]
    half = buf.local.numel() // 2
    local = buf.peer_ptrs[rank]
    remote = buf.peer_ptrs[peer] + half
    out: dict[str, dict[str, Any]] = {}

    def ce(size: int, n: int):
        def fn():
            s = torch.cuda.current_stream().cuda_stream
            for i in range(n):
                off = (i * size) % max(half - size + 1, 1)
                streamops.copy_async(s, remote + off, local + off, size)

        return fn

    def ce_call(size: int, n: int):
        """One call as the copy-engine backend makes it: fork, announce entry, wait for the peer's,
        `n` chunks each followed by its signal, join."""

        def fn():
            main = torch.cuda.current_stream()
            streams = ctx.fork(main, 1)
            s = streams[0]
            epoch = ctx.begin_call()
            announce_entry(s, ctx, epoch)
            streamops.wait_value(s.cuda_stream, ctx.signal_address(rank, ENTERED_BASE + peer), epoch)
            for i in range(n):
                streamops.copy_async(s.cuda_stream, remote, local, size)
                ctx.write_signal(s, peer, i, epoch)
            ctx.join(main, streams)

        return fn

    def sm(size: int, n: int, programs: int):
        elems = size // 2

        def fn():
            main = torch.cuda.current_stream()
            streams = ctx.fork(main, 1)
            epoch = ctx.begin_call()
            announce_entry(streams[0], ctx, epoch)
            jobs = [(local, remote, elems, -1, i, peer) for i in range(n)]
            launch_chunk_copy(ctx, streams[0], jobs, programs, epoch, torch.bfloat16, SPIN_LIMIT)
            ctx.join(main, streams)

        return fn

    def nv(size: int, n: int, programs: int):
        """`n` jobs of the NVSHMEM copier as its backend makes them: puts into the peer's buffer."""
        from syncopate.kernels.backends import CopyJob, nvshmem_pes
        from syncopate.kernels.nvshmem_copy import launch_nvshmem_copy, stage_nvshmem_copy

        pes, pe_table = nvshmem_pes(ctx)
        jobs = [
            CopyJob(local, remote, size // 2, -1, i, peer, peer, False, buf).nvshmem(rank, pes)
            for i in range(n)
        ]
        stage_nvshmem_copy(ctx, jobs, None, programs, torch.bfloat16, pe_table, SPIN_LIMIT)

        def fn():
            main = torch.cuda.current_stream()
            streams = ctx.fork(main, 1)
            epoch = ctx.begin_call()
            announce_entry(streams[0], ctx, epoch)
            launch_nvshmem_copy(ctx, streams[0], jobs, programs, epoch, torch.bfloat16, pe_table, SPIN_LIMIT)
            ctx.join(main, streams)

        return fn

    def nccl(size: int, n: int):
        send = buf.local[:size]
        recv = buf.local[half : half + size]

        def fn():
            for _ in range(n):
                ops = [
                    dist.P2POp(dist.isend, send, dist.get_global_rank(group, peer), group),
                    dist.P2POp(dist.irecv, recv, dist.get_global_rank(group, src_peer), group),
                ]
                for work in dist.batch_isend_irecv(ops):
                    work.wait()

        return fn

    def curve(make) -> dict[str, Any]:
        sizes, times = [], []
        for size in options.sizes:
            if size > half:
                break
            many = _median_us(make(size, options.chunks), group, options)
            sizes.append(size)
            times.append(many / options.chunks)
            if rank == 0:
                log.info(
                    "  %8.0f KiB: %8.2f µs a chunk (%.0f GB/s)",
                    size / 1024,
                    times[-1],
                    size / times[-1] / 1e3,
                )
        return {"sizes": sizes, "us": times}

    def call_cost(make, small_us: float) -> float:
        return max(0.0, _median_us(make(options.sizes[0], 1), group, options) - small_us)

    if "copy_engine" in options.backends and streamops.available():
        c = curve(ce)
        out["copy_engine/intra"] = {"curves": {"0": c}, "call_us": call_cost(ce_call, c["us"][0])}
    if "sm_copy" in options.backends:
        curves = {}
        for programs in options.comm_sms:
            curves[str(programs)] = curve(lambda size, n, p=programs: sm(size, n, p))
        first = curves[str(options.comm_sms[-1])]
        out["sm_copy/intra"] = {
            "curves": curves,
            "call_us": call_cost(lambda size, n: sm(size, n, options.comm_sms[-1]), first["us"][0]),
        }
    if "nvshmem" in options.backends:
        curves = {}
        for programs in options.comm_sms:
            curves[str(programs)] = curve(lambda size, n, p=programs: nv(size, n, p))
        first = curves[str(options.comm_sms[-1])]
        out["nvshmem/intra"] = {
            "curves": curves,
            "call_us": call_cost(lambda size, n: nv(size, n, options.comm_sms[-1]), first["us"][0]),
        }
    if "nccl" in options.backends:
        c = curve(nccl)
        out["nccl/intra"] = {"curves": {"0": c}, "call_us": call_cost(nccl, c["us"][0])}
    return out


def _gemm(group, options: CalibrateOptions, sm_count: int, smem_kb: int) -> dict[str, dict[str, Any]]:
    """Per tile configuration, the payload of its `gemm` record."""
    import torch

    from syncopate.kernels.launch import launch_consumer
    from syncopate.kernels.tables import PAD_WORDS, consumer_tables, plan_for

    device = torch.device("cuda", torch.cuda.current_device())
    m, n, k = options.gemm_shape
    a = torch.randn((m, k), device=device).to(torch.bfloat16)
    b = (torch.randn((k, n), device=device) / k**0.5).to(torch.bfloat16)
    out = torch.empty((m, n), dtype=torch.bfloat16, device=device)
    signals = torch.ones(PAD_WORDS, dtype=torch.int32, device=device)
    error = torch.zeros(1, dtype=torch.int32, device=device)
    k_small = k // 4
    a_small = a[:, :k_small].contiguous()
    b_small = b[:k_small].contiguous()
    result = {}
    for tc in options.tile_configs:
        smem = tc.num_stages * (tc.block_m + tc.block_n) * tc.block_k * 2 + tc.block_m * tc.block_n * 2
        if smem > smem_kb * 1024:
            continue
        cand = Candidate(
            backend="copy_engine",
            template="direct",
            num_splits=1,
            tile_order="arrival",
            block_m=tc.block_m,
            block_n=tc.block_n,
            block_k=tc.block_k,
            group_m=8,
            num_warps=tc.num_warps,
            num_stages=tc.num_stages,
        )
        plan = plan_for("ag_gemm", "direct", 1, m, 1, tc.block_m)
        tables = consumer_tables(plan, 0, n, cand, device)
        tiles = -(-m // tc.block_m) * -(-n // tc.block_n)
        points, overheads = {}, []
        for fraction in options.program_fractions:
            programs = max(1, int(sm_count * fraction))
            waves = -(-tiles // programs)
            try:
                t_big = _median_us(
                    lambda: launch_consumer(a, b, out, tables, cand, 1, signals, error, programs),
                    group,
                    options,
                )
                t_small = _median_us(
                    lambda: launch_consumer(a_small, b_small, out, tables, cand, 1, signals, error, programs),
                    group,
                    options,
                )
            except Exception as e:  # a tile configuration this GPU cannot compile is left out
                log.warning("tile %s with %d programs: %s: %s", tc.key(), programs, type(e).__name__, e)
                break
            per_tile_k = (t_big - t_small) / waves / (k - k_small)
            overhead = max(0.0, t_small / waves - per_tile_k * k_small)
            rate = 2.0 * tc.block_m * tc.block_n / per_tile_k * 1e-6 * programs
            points[str(programs)] = rate
            overheads.append(overhead)
        if points:
            result[tc.key()] = {
                "tflops_by_sms": points,
                "tile_overhead_us": statistics.median(overheads),
                "shape": [m, n, k],
            }
    return result


def _op_costs(group, options: CalibrateOptions, defaults: dict[str, Any]) -> dict[str, Any]:
    import torch

    from syncopate.kernels import streamops

    device = torch.device("cuda", torch.cuda.current_device())
    size = 256 * MiB
    x = torch.empty(size, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    payload = dict(defaults)
    payload["hbm_gbps"] = 2 * size / _median_us(lambda: y.copy_(x), group, options) / 1e3
    if streamops.available():
        payload["local_copy_gbps"] = (
            size
            / _median_us(
                lambda: streamops.copy_async(
                    torch.cuda.current_stream().cuda_stream, y.data_ptr(), x.data_ptr(), size
                ),
                group,
                options,
            )
            / 1e3
        )
    payload["defaults_for"] = ["wait_us", "launch_us", "overlap_slowdown", "chunk_us"]
    return payload


def _worker(rank: int, world: int, port: int, options: CalibrateOptions, queue) -> None:
    from syncopate.measure.local_ranks import join_group

    join_group(rank, world, port)
    import torch
    import torch.distributed as dist

    from syncopate.cost_model.calibration_defaults import default_calibration
    from syncopate.environment import current_environment
    from syncopate.kernels.context import OverlapContext
    from syncopate.platform import detect_topology
    from syncopate.search_space import GPUS

    group = dist.group.WORLD
    try:
        topology = detect_topology(group)
        sm_count = torch.cuda.get_device_properties(rank).multi_processor_count
        smem_kb = GPUS[topology.gpu_model].smem_per_block_kb if topology.gpu_model in GPUS else 99
        transfers: dict[str, Any] = {}
        if "nvshmem" in options.backends:
            from syncopate.kernels.symmetric_memory import use_nvshmem

            use_nvshmem()  # before the context's symmetric allocations
        if world > 1:
            ctx = OverlapContext.create(group, {"buf": ((2 * max(options.sizes) + 2 * MiB,), torch.uint8)})
            try:
                transfers = _transfers(ctx, group, options)
            finally:
                ctx.close()
        gemm = _gemm(group, options, sm_count, smem_kb)
        try:
            defaults = default_calibration(topology).costs.to_payload()
        except Exception:
            defaults = {
                "launch_us": 6.0,
                "wait_us": 0.8,
                "local_copy_gbps": 1000.0,
                "hbm_gbps": 1000.0,
                "overlap_slowdown": {},
                "chunk_us": {},
            }
        costs = _op_costs(group, options, defaults)
        if rank == 0:
            queue.put(
                {
                    "topology": topology.to_dict(),
                    "environment": current_environment().to_dict(),
                    "transfer": transfers,
                    "gemm": gemm,
                    "op_costs": costs,
                    "host": socket.gethostname(),
                }
            )
    finally:
        dist.destroy_process_group()


def run_calibration(options: CalibrateOptions, world_size: int) -> dict[str, Any]:
    """Spawn one process per GPU, run every microbenchmark, return rank 0's payloads."""
    from syncopate.measure.local_ranks import spawn_ranks

    result = spawn_ranks(_worker, world_size, (options,), "calibration")
    return result
