"""Layer: pure CPU logic (the last tests trace the real backends with torch on the CPU, no GPU).

The liveness model of one fused call (`syncopate.search_space.liveness`): it finds the deadlock of
the reduce-scatter seen on two H200s when given the kernel and schedule of that time, and the one
left by its first fix; every kind × template × splits × tile order × world size × shape × grid ×
backend that `check_candidate` accepts ends; the orders it refuses do deadlock somewhere; and what
the model puts on each side stream is what the backends enqueue.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from syncopate.errors import ConfigError
from syncopate.search_space import (
    Candidate,
    Topology,
    Workload,
    build_plan,
    check_candidate,
    producer_schedule,
    space,
)
from syncopate.search_space.liveness import check_liveness, queue_operations
from syncopate.search_space.tile_order import swizzle_group

BLOCK_M = 128
TEMPLATE_SPLITS = [
    (t, s)
    for t in ("direct", "ring", "bidirectional_ring")
    for s in (1, 2, 4, 8)
    if not (t == "bidirectional_ring" and s == 1)
]
ORDERS = ("arrival", "arrival_colmajor", "swizzle", "row_major")
WORLD_SIZES = (2, 3, 4, 8)
BACKENDS = (("copy_engine", 0), ("sm_copy", 16), ("nccl", 64))
H200_SMS = 132


def cand(**kw) -> Candidate:
    base = dict(block_m=BLOCK_M, block_n=128, block_k=64, group_m=4)
    base.update(kw)
    return Candidate(**base)


def old_schedule(n_cols: int, group_m: int, mixed_between: bool):
    """Producer schedules built as before entries: a tile with rows of two chunks is one entry,
    keyed by the smaller of its chunks' keys (the schedule that deadlocked), or, with
    `mixed_between`, placed between the sent and the kept tiles when it has rows of both (commit
    33175f5)."""

    def make(plan, rank):
        s = producer_schedule(plan, rank, n_cols, BLOCK_M, 128, group_m, "arrival")
        arrival = plan.arrival_rank(rank, "reduce")
        n_sent = sum(1 for x in s.chunk_ready if x >= 0)
        chunk_key = [x if x >= 0 else n_sent + 1 + arrival[c] for c, x in enumerate(s.chunk_ready)]

        def key(tm):
            chunks = range(s.mtile_chunk_lo[tm], s.mtile_chunk_hi[tm])
            sent = [s.chunk_ready[c] >= 0 for c in chunks]
            return (
                n_sent - 0.5
                if mixed_between and any(sent) and not all(sent)
                else min(chunk_key[c] for c in chunks)
            )

        keys = [key(tm) for tm in range(s.tiles_m)]
        pairs = [
            p
            for k in sorted(set(keys))
            for p in swizzle_group([tm for tm in range(s.tiles_m) if keys[tm] == k], s.tiles_n, group_m)
        ]
        return dataclasses.replace(s, order=tuple(tm * s.tiles_n + tn for tm, tn in pairs), entry_chunk=())

    return make


# ---- the checker can fail ----------------------------------------------------------------------


def test_the_kernel_of_the_two_h200_deadlock_deadlocks_in_the_model():
    """gemm_rs, direct, num_splits=1, M=4160 on two ranks, 132 programs: the tile holding the block
    boundary waited for the peer's partial before counting its leaving rows, ahead of tiles of the
    leaving chunk; each rank's leaving chunk waited for the other's."""
    c = cand(template="direct", num_splits=1)
    report = check_liveness(
        "gemm_rs",
        c,
        2,
        4160,
        1024,
        H200_SMS,
        epilogue="waits_first",
        schedule=old_schedule(1024, 4, mixed_between=False),
    )
    assert not report.live
    text = report.describe()
    assert "DEADLOCK" in text and "tile (16, " in text  # rows 2048..2175 hold the boundary at 2080
    assert "partial of chunk 0.0" in text and "partial of chunk 1.0" in text
    assert "ready word READY_BASE+0 on rank 0" in text and "ready word READY_BASE+0 on rank 1" in text
    assert {line.split()[1] for line in report.cycle} == {"0", "1"}, "the cycle runs through both ranks"
    assert check_liveness("gemm_rs", c, 2, 4160, 1024, H200_SMS).live


@pytest.mark.parametrize(
    "n_cols, programs, live", [(1024, H200_SMS, True), (1024, 7, False), (17920, H200_SMS, False)]
)
def test_the_first_fix_deadlocked_when_a_program_held_two_boundary_tiles(n_cols, programs, live):
    """Commit 33175f5 counted the leaving rows first and put boundary tiles after every leaving
    tile: live on two H200s with N=1024 (8 boundary tiles, 132 programs), but a program with two
    of them waits for the peer's partial before counting the second one's leaving rows, and the
    peer does the same. Entries (one per chunk of a tile) end it."""
    c = cand(template="direct", num_splits=1)
    old = check_liveness(
        "gemm_rs", c, 2, 4160, n_cols, programs, schedule=old_schedule(n_cols, 4, mixed_between=True)
    )
    assert old.live == live, old.describe()
    assert check_liveness("gemm_rs", c, 2, 4160, n_cols, programs).live


def test_a_deadlock_report_names_rank_program_tile_chunk_signal_and_stream():
    c = cand(template="direct", num_splits=1)
    report = check_liveness(
        "gemm_rs", c, 2, 4160, 1024, 7, schedule=old_schedule(1024, 4, mixed_between=True)
    )
    text = report.describe()
    for words in (
        "rank 0 program",
        "of 7",
        "tile (16, ",
        "chunk 1.0 [rows 2080, 4160)",
        "arrival word 0 on rank 0",
        "rank 1 stream 0",
        "before sending reduce chunk 0.0",
    ):
        assert words in text, (words, text)
    assert report.entries_done < report.entries_total
    assert not report


# ---- everything the space accepts ends ---------------------------------------------------------


def _rows(kind: str, ws: int, splits: int, aligned: bool) -> int:
    """Blocks of splits·BLOCK_M rows, or half a tile more; an all-reduce's M need not divide by ws."""
    rows = ws * (splits * BLOCK_M + (0 if aligned else BLOCK_M // 2))
    return rows + (1 if kind == "gemm_ar" and not aligned else 0)


def _sweep(
    kind: str,
    n_cols: int,
    world_sizes=WORLD_SIZES,
    orders=ORDERS,
    template_splits=TEMPLATE_SPLITS,
    programs=(1, 7, 64, None),
):
    """(report, candidate, ws) of every accepted case; None in `programs` is all the SMs left."""
    topologies = {ws: Topology(world_size=ws, gpu_model="H200") for ws in world_sizes}
    grid = itertools.product(template_splits, orders, world_sizes, (True, False))
    for (template, splits), order, ws, aligned in grid:
        rows = _rows(kind, ws, splits, aligned)
        workload = Workload(kind=kind, shape=(rows, n_cols * (ws if kind == "ag_gemm" else 1), 1024 * ws))
        for (backend, sms), shared in itertools.product(BACKENDS, (False, True)):
            if (
                shared and backend != "copy_engine"
            ):  # the other backends use one queue besides the own-chunk copies
                continue
            c = cand(backend=backend, comm_sms=sms, template=template, num_splits=splits, tile_order=order)
            try:
                check_candidate(c, workload, topologies[ws])
            except ConfigError:
                continue
            for p in programs:
                yield (
                    check_liveness(kind, c, ws, rows, n_cols, p or H200_SMS - sms, shared_queue=shared),
                    c,
                    ws,
                )


@pytest.mark.parametrize("kind", ["ag_gemm", "gemm_rs", "gemm_ar"])
def test_every_accepted_case_ends(kind):
    """Templates × splits {1, 2, 4, 8} × tile orders × world sizes {2, 3, 4, 8} × rows (blocks a
    multiple of BLOCK_M and not) × grids {1, 7, 64, all SMs} × backends (copy engine with its three
    streams apart or sharing one hardware queue), as `check_candidate` accepts them."""
    reports = [r for r, _, _ in _sweep(kind, n_cols=256)]
    assert len(reports) > 1500
    dead = [r.describe() for r in reports if not r.live]
    assert not dead, f"{len(dead)} deadlock(s), the first:\n" + "\n\n".join(dead[:2])


def test_producers_with_more_boundary_tiles_than_programs_end():
    """70 columns of tiles: more tiles straddle a block boundary than 7 or 64 programs."""
    for kind in ("gemm_rs", "gemm_ar"):
        for report, _, _ in _sweep(
            kind,
            n_cols=70 * 128,
            world_sizes=(2, 8),
            orders=("arrival", "arrival_colmajor"),
            programs=(7, 64),
            template_splits=[("direct", 1), ("ring", 2), ("bidirectional_ring", 2)],
        ):
            assert report.live, report.describe()


# ---- what cannot be made live is refused -------------------------------------------------------


@pytest.mark.parametrize("kind", ["gemm_rs", "gemm_ar"])
@pytest.mark.parametrize("order", ["row_major", "swizzle"])
def test_producer_orders_that_ignore_departures_are_refused_where_they_deadlock(kind, order):
    """With more than two ranks (a rank's in-order send queue waits for a chunk that a program
    blocked on partials holds) or with NCCL (a batch pairs a send with a receive of the same step)
    these orders deadlock on small grids; `check_candidate` refuses them and names what it accepts."""
    w3 = Workload(kind=kind, shape=(3 * 1024, 1024, 3 * 1024))
    c = cand(backend="copy_engine", template="direct", num_splits=2, tile_order=order)
    assert not check_liveness(kind, c, 3, 3 * 1024, 256, 1).live
    with pytest.raises(
        ConfigError,
        match=rf"tile order '{order}' can deadlock {kind} \(world size 3\).*"
        r"accepted for .* are 'arrival' and 'arrival_colmajor'",
    ):
        check_candidate(c, w3, Topology(world_size=3, gpu_model="H200"))
    w2 = Workload(kind=kind, shape=(2 * 1024, 1024, 2 * 1024))
    nccl = cand(backend="nccl", comm_sms=64, template="direct", num_splits=2, tile_order=order)
    assert not check_liveness(kind, nccl, 2, 2 * 1024, 256, 1).live
    with pytest.raises(ConfigError, match=r"backend nccl pairs each send with a receive"):
        check_candidate(nccl, w2, Topology(world_size=2, gpu_model="H200"))
    check_candidate(c, w2, Topology(world_size=2, gpu_model="H200"))  # two ranks, copy engine: accepted


def test_the_space_holds_no_refused_order():
    for key, kind in itertools.product(("H200x2-nvlink", "H200x8-nvswitch"), ("gemm_rs", "gemm_ar")):
        topo = Topology.from_key(key)
        w = Workload(kind=kind, shape=(8192, 4096, 8192))
        orders = {(c.tile_order, c.backend) for c in space(w, topo)}
        if topo.world_size > 2:
            assert {o for o, _ in orders} == {"arrival", "arrival_colmajor"}
        else:
            assert ("row_major", "copy_engine") in orders and ("row_major", "nccl") not in orders


def test_consumer_orders_are_all_accepted():
    w = Workload(kind="ag_gemm", shape=(8192, 4096, 8192))
    assert {c.tile_order for c in space(w, Topology.from_key("H200x8-nvswitch"))} == set(ORDERS)


# ---- the model is the code ---------------------------------------------------------------------


class _Trace:
    """Stands in for the CUDA driver, the SM copier and torch.distributed under the real backends:
    records, per side stream, every wait, signal write and NCCL batch they enqueue."""

    def __init__(self, rank: int, ws: int, high_word: str) -> None:
        from types import SimpleNamespace

        import torch

        self.rank, self.ws = rank, ws
        self.high_word = high_word  # what the words from READY_BASE on are: `local` (consumer) or `ready`
        self.ops: dict[int, list[tuple]] = {}
        self.streams = [SimpleNamespace(cuda_stream=i) for i in range(3)]
        self.ctx = SimpleNamespace(
            rank=rank,
            world_size=ws,
            group=None,
            write_signal=self.write_signal,
            raise_signal=lambda program, stream, r, word: program.write(stream, (r, word)),
            signal_address=lambda r, word: (r, word),
            timeline=None,
            memory="nvshmem",
            cache={},
            device=torch.device("cpu"),
        )

    def word(self, rank: int, word: int) -> tuple:
        from syncopate.kernels.tables import ARRIVAL_SLOTS, ENTERED_BASE, READY_BASE

        if word < ARRIVAL_SLOTS:
            return rank, "arrival", word
        if word < READY_BASE:
            return rank, "entered", word - ENTERED_BASE
        return rank, self.high_word, word - READY_BASE

    def write_signal(self, stream, rank, word, value) -> None:
        self.ops.setdefault(stream.cuda_stream, []).append(("raise",) + self.word(rank, word))

    def wait_value(self, stream: int, address: tuple, value: int) -> None:
        self.ops.setdefault(stream, []).append(("wait",) + self.word(*address))

    # the CUDA driver's three calls, as `streamops` makes them (addresses are (rank, word) here)
    def write(self, stream: int, address: tuple, value: int, flags: int) -> int:
        self.ops.setdefault(stream, []).append(("raise",) + self.word(*address))
        return 0

    def wait(self, stream: int, address: tuple, value: int, flags: int) -> int:
        self.wait_value(stream, address, value)
        return 0

    def copy(self, dst: int, src: int, nbytes: int, stream: int) -> int:
        return 0

    def chunk_copy(self, ctx, stream, jobs, programs, epoch, dtype, spin_limit=0) -> None:
        for _, _, _, wait, signal, peer in jobs:
            ops = self.ops.setdefault(stream.cuda_stream, [])
            ops.append(("wait", self.rank, "entered", peer))
            if wait >= 0:
                ops.append(("wait",) + self.word(self.rank, wait))
            if signal >= 0:
                ops.append(("raise",) + self.word(peer, signal))

    def batch(self, ops) -> list:
        self.ops.setdefault(0, []).append(("batch", tuple(sorted(set(ops)))))
        return []


@pytest.mark.parametrize("kind", ["ag_gemm", "gemm_rs", "gemm_ar"])
@pytest.mark.parametrize("backend", ["copy_engine", "sm_copy", "nvshmem", "nccl"])
def test_the_model_enqueues_what_the_backends_enqueue(kind, backend, monkeypatch):
    import contextlib
    from types import SimpleNamespace

    import torch

    from syncopate.kernels import backends, nvshmem_copy, streamops
    from syncopate.kernels.tables import plan_for

    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    for template, splits, ws in (("direct", 2, 3), ("ring", 1, 4), ("bidirectional_ring", 2, 3)):
        rows = _rows(kind, ws, splits, aligned=False)
        sms = 0 if backend == "copy_engine" else 16
        c = cand(backend=backend, comm_sms=sms, template=template, num_splits=splits)
        plan = plan_for(kind, template, ws, rows, splits, BLOCK_M)
        for rank in range(ws):
            trace = _Trace(rank, ws, "local" if kind == "ag_gemm" else "ready")
            monkeypatch.setattr(streamops, "_driver", lambda trace=trace: trace)
            monkeypatch.setattr(backends, "launch_chunk_copy", trace.chunk_copy)
            monkeypatch.setattr(backends, "stage_chunk_copy", lambda *args: None)
            monkeypatch.setattr(
                nvshmem_copy,
                "launch_nvshmem_copy",
                lambda ctx, stream, jobs, programs, epoch, dtype, pes, spin_limit=0, trace=trace: (
                    trace.chunk_copy(
                        ctx,
                        stream,
                        [(j[0], j[1], j[2], j[4], j[5], j[6]) for j in jobs],
                        programs,
                        epoch,
                        dtype,
                    )
                ),
            )
            monkeypatch.setattr(nvshmem_copy, "stage_nvshmem_copy", lambda *args: None)
            monkeypatch.setattr(
                backends,
                "dist",
                SimpleNamespace(
                    isend="isend",
                    irecv="irecv",
                    get_global_rank=lambda group, r: r,
                    P2POp=lambda op, tensor, peer, group: peer,
                    batch_isend_irecv=trace.batch,
                ),
            )
            buf = SimpleNamespace(peer_ptrs=[0] * ws, local=torch.zeros(rows, 4))
            impl = backends.BACKEND_IMPLS[backend]
            if kind == "ag_gemm":
                call = backends.GatherCall(
                    ctx=trace.ctx,
                    plan=plan,
                    candidate=c,
                    epoch=1,
                    main=None,
                    a_local=torch.zeros(rows, 4),
                    a_full=buf,
                    r0=0,
                    row_bytes=8,
                )
                impl.start_gather(call, trace.streams)
            else:
                call = backends.ScatterCall(
                    ctx=trace.ctx,
                    plan=plan,
                    candidate=c,
                    epoch=1,
                    main=None,
                    send=torch.zeros(rows, 4),
                    recv=buf,
                    n_cols=4,
                    elem=2,
                    out=torch.zeros(rows, 4),
                    reduced=buf if kind == "gemm_ar" else None,
                )
                impl.start_scatter(call, trace.streams)
            model = queue_operations(kind, c, ws, rows, rank)
            assert model == trace.ops, (kind, backend, template, rank)


def test_an_all_reduce_keeps_its_own_block_and_numbers_its_words_after_its_sends():
    """`ChunkPlan.kept_ready_words` (what the tables, the model and the NCCL backend use) against
    the producer's schedule: the chunks it sends nothing for are the rank's own block's, and the
    schedule's ready words are one a send."""
    for (template, splits), ws in itertools.product(TEMPLATE_SPLITS, WORLD_SIZES):
        rows = _rows("gemm_ar", ws, splits, aligned=False)
        plan = build_plan(template, "all_reduce", ws, rows, splits, align=BLOCK_M)
        for rank in range(ws):
            s = producer_schedule(plan, rank, 256, BLOCK_M, 128, 4, "arrival")
            kept = [ci for ci, word in enumerate(s.chunk_ready) if word < 0]
            sent = sorted(word for word in s.chunk_ready if word >= 0)
            words = plan.kept_ready_words(rank)
            assert sorted(words) == kept and sent == list(range(len(plan.sends(rank, "reduce"))))
            assert sorted(words.values()) == list(range(len(sent), len(sent) + splits))


def test_the_model_raises_the_words_the_producer_tables_name():
    """Ready words (kept chunks of an all-reduce after the sends) and the peers' gather words."""
    from syncopate.kernels.tables import plan_for, producer_tables
    from syncopate.search_space.liveness import _ARRIVAL, _READY, _call

    for template, splits, ws in (("direct", 2, 3), ("ring", 1, 4), ("bidirectional_ring", 2, 2)):
        rows = _rows("gemm_ar", ws, splits, aligned=False)
        c = cand(template=template, num_splits=splits)
        plan = plan_for("gemm_ar", template, ws, rows, splits, BLOCK_M)
        call = _call("gemm_ar", template, splits, "arrival", BLOCK_M, 128, 4, ws, rows, 256, "leaving_first")
        for rank in range(ws):
            t = producer_tables(plan, rank, 256, c, True, "cpu")
            for ci in range(plan.num_chunks):
                words = {
                    (sig >> 3 & 255, sig & 7, sig >> 11) for sig in call.on_done[rank * plan.num_chunks + ci]
                }
                slots = [int(t.gather_slot[ci * ws + p]) for p in range(ws)]
                gathers = {(p, _ARRIVAL, slot) for p, slot in enumerate(slots) if slot >= 0}
                assert words == {(rank, _READY, int(t.chunk_ready[ci]))} | gathers
            assert list(call.entries[rank]) and len(call.entries[rank]) == t.order.numel()


@pytest.mark.parametrize("kind", ["gemm_rs", "gemm_ar"])
def test_the_kept_interleaved_order_ends(kind):
    """The opt-in producer order that moves kept chunks up among the sent ones (direct plans)."""
    direct = [("direct", s) for s in (1, 2, 4, 8)]
    reports = [
        r for r, _, _ in _sweep(kind, n_cols=256, orders=("kept_interleaved",), template_splits=direct)
    ]
    reports += [
        r
        for r, _, _ in _sweep(
            kind,
            n_cols=70 * 128,
            world_sizes=(2, 8),
            orders=("kept_interleaved",),
            template_splits=[("direct", 1), ("direct", 4)],
            programs=(7, 64),
        )
    ]
    assert len(reports) > 500
    dead = [r.describe() for r in reports if not r.live]
    assert not dead, f"{len(dead)} deadlock(s), the first:\n" + dead[0]
