"""Layer: two GPUs on one host (multigpu; four and eight where the host has them). The fused ops
against the float32 reference.

Every backend × plan template × num_splits {1, 2, 4, 8} × tile order, in bf16 and fp16, with M/ws
not a multiple of BLOCK_M; outputs and symmetric buffers poisoned with NaN before each call, fresh
random inputs every call, errors within what the unfused path's own rounding in that dtype gives
(`ROUNDING`), and 100 back-to-back calls with changing inputs for each backend and kind;
producers with more boundary tiles than programs. Every other all-gather call returns the gathered
A too, which must equal every rank's shard in rank order (filled on a side stream with unbounded
waits; every fourth call with bounded waits, which copy it after the call). Candidates
`check_candidate` refuses (tile orders that can deadlock) are skipped.
The cases run in one process a rank (spawning is slow); a failure names every case that failed.
"""

from __future__ import annotations

import itertools
import os
import time
from queue import Empty

import pytest

pytestmark = pytest.mark.multigpu

TOL = {"bf16": 1e-2, "fp16": 5e-3}
ROUNDING = 1.15
"""A result's error against float32 may exceed the unfused path's in the same dtype (torch's matmul,
then the collective: `reference_unfused`) by this factor at most; checked on a case's first calls."""


def comm_sms(kind: str, backend: str, sms: int) -> int:
    from syncopate.search_space.space import NCCL_MIN_SMS

    if backend == "copy_engine":
        return 0
    return max(sms, NCCL_MIN_SMS) if backend == "nccl" else sms


TOPOLOGY = {2: "H200x2-nvlink", 4: "H200x4-nvswitch", 8: "H200x8-nvswitch"}


def matrix(quick: bool = False, world: int = 2):
    """(kind, dtype, (M, N, K), candidate dict, calls[, "kmajor"]) for every case on `world` ranks;
    "kmajor": B is given as the transpose of a row-major [N, K] matrix."""
    from syncopate.errors import ConfigError
    from syncopate.search_space import (
        Candidate,
        Topology,
        Workload,
        a_stationary_candidate,
        c_stationary_candidate,
        check_candidate,
        decomposed_candidate,
        gather_splits_refusal,
        unfused_candidate,
    )

    topology = Topology.from_key(TOPOLOGY[world])
    cases = []
    orders = (
        ["arrival"] if quick else ["arrival", "arrival_colmajor", "swizzle", "row_major", "kept_interleaved"]
    )
    splits = [2] if quick else [1, 2, 4, 8]
    templates = ["direct"] if quick else ["direct", "ring", "bidirectional_ring"]
    dtypes = ["bf16"] if quick else ["bf16", "fp16"]
    shapes = {"ag_gemm": (4160, 1536, 1024), "gemm_rs": (4160, 1024, 1536), "gemm_ar": (4160, 1024, 1536)}
    only = os.environ.get("SYNCOPATE_GPU_TEST_KINDS")  # e.g. gemm_rs,gemm_ar: re-run part of the matrix
    if only:
        shapes = {k: v for k, v in shapes.items() if k in only.split(",")}
    for kind, backend, template, s, order, dtype in itertools.product(
        shapes, ["copy_engine", "sm_copy", "nccl"], templates, splits, orders, dtypes
    ):
        if template == "bidirectional_ring" and s < 2:
            continue
        c = Candidate(
            backend=backend,
            template=template,
            num_splits=s,
            tile_order=order,
            comm_sms=comm_sms(kind, backend, 32),
            block_m=128,
            block_n=128,
            block_k=64,
            group_m=4,
            num_warps=8,
            num_stages=3,
        )
        try:
            check_candidate(c, Workload(kind=kind, shape=shapes[kind], dtype=dtype), topology)
        except ConfigError:
            continue
        cases.append((kind, dtype, shapes[kind], c.to_dict(), 1))
    if "ag_gemm" in shapes:  # B and the products moved instead of A
        for s in [2] if quick else [1, 2, 4]:
            for dtype in dtypes:
                cases.append(("ag_gemm", dtype, shapes["ag_gemm"], a_stationary_candidate(s).to_dict(), 1))
        cases.append(
            ("ag_gemm", "bf16", shapes["ag_gemm"], a_stationary_candidate(2).to_dict(), 10 if quick else 100)
        )
    for kind, s in (("gemm_rs", 1), ("gemm_ar", 2)):  # A's rows and B moved instead of partial products
        if kind in shapes:
            for dtype in dtypes:
                cases.append((kind, dtype, shapes[kind], c_stationary_candidate(s).to_dict(), 1))
            cases.append(
                (kind, "bf16", shapes[kind], c_stationary_candidate(s).to_dict(), 10 if quick else 100)
            )
    for kind in ("gemm_rs", "gemm_ar"):  # cuBLAS row chunks, each chunk's partial pushed once computed
        if kind in shapes:
            for s, dtype in itertools.product([2] if quick else [1, 2, 4], dtypes):
                cases.append((kind, dtype, shapes[kind], decomposed_candidate(s).to_dict(), 1))
            cases.append(
                (kind, "bf16", shapes[kind], decomposed_candidate(4).to_dict(), 10 if quick else 100)
            )
    if "ag_gemm" in shapes:  # cuBLAS GEMMs over the peers' shards as they land
        m_local = shapes["ag_gemm"][0] // world
        gather = sorted(
            {
                s
                for s in (1, 2, world - 1, 2 * (world - 1), 4)
                if gather_splits_refusal(world, s, m_local) is None
            }
        )
        for s, dtype in itertools.product(gather[:1] if quick else gather, dtypes):
            cases.append(("ag_gemm", dtype, shapes["ag_gemm"], decomposed_candidate(s).to_dict(), 1))
        cases.append(
            (
                "ag_gemm",
                "bf16",
                shapes["ag_gemm"],
                decomposed_candidate(gather[-1]).to_dict(),
                10 if quick else 100,
            )
        )
        cases.append(
            (
                "ag_gemm",
                "bf16",
                shapes["ag_gemm"],
                decomposed_candidate(1).to_dict(),
                10 if quick else 20,
                "kmajor",
            )
        )
    for kind, c in (
        ("ag_gemm", a_stationary_candidate(2)),
        ("gemm_rs", c_stationary_candidate(1)),
        ("gemm_ar", c_stationary_candidate(2)),
        ("gemm_ar", decomposed_candidate(2)),
    ):
        if kind in shapes:  # B as an nn.Linear weight's transpose (K-major), moved as it is laid out
            cases.append((kind, "bf16", shapes[kind], c.to_dict(), 10 if quick else 20, "kmajor"))
    if "gemm_ar" in shapes:  # an all-reduce's M need not divide by the ranks: blocks of unequal rows
        for c in (c_stationary_candidate(2), decomposed_candidate(2)):
            cases.append(("gemm_ar", "bf16", (4161, 1024, 1536), c.to_dict(), 3))
    for kind, backend in itertools.product(shapes, ["copy_engine", "sm_copy", "nccl"]):
        c = Candidate(
            backend=backend,
            num_splits=4,
            comm_sms=comm_sms(kind, backend, 16),
            block_m=128,
            block_n=128,
            block_k=64,
            group_m=8,
            num_warps=8,
            num_stages=3,
        )
        cases.append((kind, "bf16", shapes[kind], c.to_dict(), 10 if quick else 100))
    # More tiles straddling the block boundary (140 columns of tiles) than programs: the liveness
    # model finds that the producer of commit 33175f5 deadlocked here (a program held two of them).
    for kind, backend in itertools.product(
        [k for k in shapes if k != "ag_gemm"], ["copy_engine", "sm_copy", "nccl"]
    ):
        c = Candidate(
            backend=backend,
            num_splits=1,
            comm_sms=comm_sms(kind, backend, 32),
            block_m=128,
            block_n=128,
            block_k=64,
            group_m=4,
            num_warps=8,
            num_stages=3,
        )
        cases.append((kind, "bf16", (4160, 17920, 512), c.to_dict(), 2))
    # Whole tiles (M/ws and every chunk a multiple of the tile's rows): the producer's TMA epilogue
    # takes these, and with SYNCOPATE_GLUON=1 the Gluon producer (which takes no tile of two chunks).
    whole = {kind: (4096, 1024, 1536) for kind in ("gemm_rs", "gemm_ar") if kind in shapes}
    tiles = [(128, 256, 3)] if quick else [(128, 256, 3), (128, 128, 4)]
    for kind, backend, s, (bm, bn, st) in itertools.product(
        whole, ["copy_engine", "sm_copy", "nccl"], splits[-2:], tiles
    ):
        c = Candidate(
            backend=backend,
            num_splits=s,
            comm_sms=comm_sms(kind, backend, 32),
            block_m=bm,
            block_n=bn,
            block_k=64,
            group_m=8,
            num_warps=8,
            num_stages=st,
        )
        try:
            check_candidate(c, Workload(kind=kind, shape=whole[kind], dtype="bf16"), topology)
        except ConfigError:
            continue
        cases.append((kind, "bf16", whole[kind], c.to_dict(), 10 if quick else 20))
    # The consumer's last wave cut in K (the default): 5632 rows in 128×256 tiles leave 44
    # of 176 tiles (two ranks) for a last wave of 132 programs, each cut in three. (The 128×128 cases
    # of `shapes` above leave 66 of 198 on two ranks, each cut in two, with the copy engine.)
    if "ag_gemm" in shapes:
        for dtype, order in itertools.product(dtypes, ["arrival", "swizzle"]):
            c = Candidate(
                backend="copy_engine",
                num_splits=2,
                tile_order=order,
                block_m=128,
                block_n=256,
                block_k=64,
                group_m=8,
                num_warps=8,
                num_stages=3,
            )
            cases.append(("ag_gemm", dtype, (5632, 2048, 1024), c.to_dict(), 20))
    # Short GEMMs with the default's tiles for them (SHORT_TILES: 64 and 128 rows, 4 warps), M/ws
    # not a multiple of 64.
    short = {"ag_gemm": (776, 1536, 1024), "gemm_rs": (776, 1024, 1536), "gemm_ar": (776, 1024, 1536)}
    tiles = [(64, 128)] if quick else [(64, 128), (128, 128)]
    for kind, backend, (bm, bn), dtype in itertools.product(
        shapes, ["copy_engine", "sm_copy", "nccl"], tiles, dtypes
    ):
        c = Candidate(
            backend=backend,
            num_splits=2 if bm == 64 else 1,
            comm_sms=comm_sms(kind, backend, 16),
            block_m=bm,
            block_n=bn,
            block_k=64,
            group_m=8,
            num_warps=4,
            num_stages=4,
        )
        try:
            check_candidate(c, Workload(kind=kind, shape=short[kind], dtype=dtype), topology)
        except ConfigError:
            continue
        cases.append((kind, dtype, short[kind], c.to_dict(), 3))
    # The unfused template (torch's collective and matmul), also at 8 rows a rank, under every tile.
    for kind in shapes:
        m, n, k = shapes[kind]
        for shape in ((m, n, k), (8 * world, n, k)):
            cases.append((kind, "bf16", shape, unfused_candidate().to_dict(), 3))
    # Back-to-back cases first, then the producers: a run stopped by its time limit has covered those.
    first = {"gemm_rs": 0, "gemm_ar": 1, "ag_gemm": 2}
    return sorted(cases, key=lambda case: (-case[4], first[case[0]]))


def _worker(rank, world, port, cases, shared_gpu, queue):
    from syncopate.measure.local_ranks import join_group

    dev = join_group(rank, world, port, shared_gpu)
    import torch
    import torch.distributed as dist

    from syncopate.kernels import ops
    from syncopate.measure.reference import gathered_rows, reference, reference_unfused, relative_error
    from syncopate.measure.timing import barrier
    from syncopate.search_space import Candidate, Workload

    g = dist.group.WORLD
    gen = torch.Generator(device=dev)
    gen.manual_seed(7 + rank)
    failures = []
    ratios: dict[tuple, list[float]] = {}  # (kind, dtype, backend, template): error / the unfused path's
    fused = {
        "ag_gemm": ops.all_gather_matmul,
        "gemm_rs": ops.matmul_reduce_scatter,
        "gemm_ar": ops.matmul_all_reduce,
    }
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16}
    for index, (kind, dtype, (m, n, k), cand, calls, *layout) in enumerate(cases):
        c = Candidate.from_dict(cand)
        kmajor = layout == ["kmajor"]
        if rank == 0:
            print(
                f"[{index + 1}/{len(cases)}] {kind} {dtype} {c.short()} x{calls}{' B k-major' * kmajor}",
                flush=True,
            )
        w = Workload(kind=kind, shape=(m, n, k), dtype=dtype)
        shapes = w.local_shapes(world)
        dt = dtypes[dtype]
        try:
            worst, worst_ratio = 0.0, 0.0
            bad_calls = []  # calls that timed out or came out wrong, to tell a first-call fault from a race
            for i in range(calls):
                a = torch.randn(shapes["a"], generator=gen, device=dev).to(dt)
                b = (
                    torch.randn(shapes["b"][::-1] if kmajor else shapes["b"], generator=gen, device=dev)
                    / k**0.5
                ).to(dt)
                b = b.t() if kmajor else b
                if i == 0:
                    ctx_shape = (m, k) if kind == "ag_gemm" else (m, n)
                    ctx = ops.get_context(kind, g, ctx_shape, dt)
                    for buf in ctx.buffers.values():
                        buf.local.fill_(float("nan"))
                    barrier(g, dev)
                own = ops.call_context(kind, a, b, g, c) if i == 1 else None
                if (
                    own is not None and own is not ctx
                ):  # a template's own context (the cuBLAS ones), made by call 0
                    for buf in own.buffers.values():
                        buf.local.fill_(float("nan"))
                    barrier(g, dev)
                out = torch.full(shapes["out"], float("nan"), dtype=dt, device=dev)
                if kind == "ag_gemm" and i % 2:  # every other call returns the gathered A: filled on a side
                    # stream (unbounded waits), or every fourth with bounded waits, copied after the call
                    _, gathered = fused[kind](
                        a, b, g, c, out=out, return_gathered=True, spin_limit=1 << 24 if i % 4 == 3 else 0
                    )
                    if not torch.equal(gathered, gathered_rows(a, g)):
                        bad_calls.append(i)
                else:
                    fused[kind](a, b, g, c, out=out, spin_limit=1 << 24)
                ref = reference(kind, a, b, g)
                err = relative_error(out, ref)
                if int(ctx.error.item()) or not err <= TOL[dtype]:
                    bad_calls.append(i)
                    ctx.error.zero_()
                worst = max(worst, err)
                if i < 2:  # the rounding: against what the unfused path gives in this dtype
                    worst_ratio = max(
                        worst_ratio, err / max(relative_error(reference_unfused(kind, a, b, g), ref), 1e-12)
                    )
            if bad_calls or not worst <= TOL[dtype] or not worst_ratio <= ROUNDING:
                failures.append(
                    f"{kind} {dtype} {c.short()}{' B k-major' * kmajor} calls={calls}: rel err {worst:.3g} "
                    f"({worst_ratio:.2f}x the unfused path's), "
                    f"calls timed out or wrong: {bad_calls[:10]}{'…' if len(bad_calls) > 10 else ''}"
                )
            ratios.setdefault((kind, dtype, c.backend, c.template), []).append(worst_ratio)
        except Exception as e:
            failures.append(f"{kind} {dtype} {c.short()}: {type(e).__name__}: {e}")
            torch.cuda.synchronize()
        if failures and failures[-1].startswith(f"{kind} {dtype} {c.short()}"):
            print(f"rank {rank} FAILED {failures[-1]}", flush=True)
    if rank == 0:
        for key, rs in sorted(ratios.items()):
            print(
                f"rounding {' '.join(key)}: error / the unfused path's, {len(rs)} cases: "
                f"max {max(rs):.2f}, median {sorted(rs)[len(rs) // 2]:.2f}",
                flush=True,
            )
    ops.close_contexts()
    queue.put((rank, (failures, compiled_kernels())))
    dist.destroy_process_group()


def compiled_kernels() -> dict[str, int]:
    """How many variants of each fused kernel this process compiled (which kernels the cases took)."""
    from syncopate.kernels import gluon_kernels
    from syncopate.kernels.triton_kernels import consumer_kernel, producer_kernel

    kernels = {"consumer": consumer_kernel, "producer": producer_kernel}
    if gluon_kernels.AVAILABLE:
        kernels.update(
            {
                "gluon consumer": gluon_kernels.gluon_consumer_kernel,
                "gluon producer": gluon_kernels.gluon_producer_kernel,
            }
        )
    counts = {}
    for name, kernel in kernels.items():
        caches = getattr(kernel, "device_caches", None)
        counts[name] = sum(len(c[0]) for c in caches.values()) if caches else 0
    return counts


def needs_gpus(world: int) -> None:
    """Skip, saying why, where fewer than `world` GPUs are present."""
    import torch

    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} CUDA GPUs on one host; {torch.cuda.device_count()} present")


def run_ranks(target, world: int, args: tuple = (), timeout: float = 1800) -> dict:
    """{rank: report} of `target(rank, world, port, *args, queue)` on `world` spawned processes, each
    putting `(rank, report)` on the queue; fails at once, naming them, where ranks exit without
    reporting, and after `timeout` seconds."""
    import torch.multiprocessing as mp

    from syncopate.measure.local_ranks import free_port

    port = free_port()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=target, args=(r, world, port, *args, q)) for r in range(world)]
    for p in procs:
        p.start()
    results = {}
    deadline = time.monotonic() + timeout
    while len(results) < world:
        try:
            rank, outcome = q.get(timeout=5)
            results[rank] = outcome
        except Empty:
            dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in results]
            if dead or time.monotonic() > deadline:
                for p in procs:
                    p.kill()
                what = (
                    f"rank(s) {dead} exited with {[procs[r].exitcode for r in dead]}"
                    if dead
                    else f"{timeout:.0f} s"
                )
                raise AssertionError(
                    f"the ranks did not all report: {what}; reported: {sorted(results)}"
                ) from None
    for p in procs:
        p.join(timeout=120)
        if p.is_alive():
            p.kill()
    return results


def run_cases(cases, world=2, shared_gpu=False):
    """{rank: failures} of `cases` run on `world` ranks, one GPU each (or all on GPU 0: `shared_gpu`),
    and how many variants of each fused kernel rank 0 compiled."""
    results = run_ranks(_worker, world, (cases, shared_gpu))
    print(f"kernel variants compiled on rank 0: {results[0][1]}")
    return {rank: failures for rank, (failures, _) in results.items()}, results[0][1]


@pytest.mark.parametrize("quick", [True, False], ids=["smoke", "full"])
def test_fused_ops_match_the_reference_on_two_gpus(quick):
    results, _ = run_cases(matrix(quick))
    failures = sorted(set(results[0]) | set(results[1]))
    assert not failures, f"{len(failures)} failing case(s):\n" + "\n".join(failures)


@pytest.mark.parametrize("world", [4, 8])
def test_fused_ops_match_the_reference_on_four_and_eight_gpus(world):
    needs_gpus(world)
    results, _ = run_cases(matrix(False, world), world=world)
    failures = sorted(set().union(*results.values()))
    assert not failures, f"{len(failures)} failing case(s):\n" + "\n".join(failures)
