"""Layer: Triton interpreter on the CPU (TRITON_INTERPRET=1), communication already complete.

The fused kernels run on CPU tensors with every signal the plan needs already raised: each tile
order computes every tile of the right rows, producers add the received partials, store each chunk
where it goes, raise its ready signal and reset their counters, and a chunk (remote or own) that
never arrives makes a bounded wait report an error instead of hanging.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest
import torch

from syncopate.kernels.launch import launch_chunk_copy, launch_consumer, launch_producer
from syncopate.kernels.tables import (
    ENTERED_BASE,
    LOCAL_BASE,
    PAD_WORDS,
    READY_BASE,
    consumer_tables,
    plan_for,
    producer_tables,
    recv_offset,
    recv_rows,
)
from syncopate.search_space import TAIL_MAX_SPLIT, Candidate, block_bounds, tail_split

CPU = torch.device("cpu")


def cand(**kw) -> Candidate:
    base = dict(block_m=32, block_n=32, block_k=32, group_m=2, num_warps=4, num_stages=2)
    base.update(kw)
    return Candidate(**base)


def rand(*shape, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) / 4).to(torch.float16)


FP8 = torch.float8_e4m3fn


def fp8_operand(rows, cols, seed, scaled, dim):
    """(FP8 values, their float32 scale, the dequantized float32 operand): the scale per row
    (`dim=1`, [rows, 1]) or per column (`dim=0`, [1, cols]) for `scaled="row"`, one element for
    `"tensor"`; scales between 0.5 and 2, so that a scale read from the wrong row shows."""
    g = torch.Generator().manual_seed(seed)
    v = (torch.randn(rows, cols, generator=g) * 8).to(FP8)
    shape = (1,) if scaled == "tensor" else ((rows, 1) if dim == 1 else (1, cols))
    scale = torch.rand(shape, generator=g) * 1.5 + 0.5
    return v, scale, v.float() * scale


def run_consumer(
    ws,
    rank,
    m,
    n,
    k,
    c,
    epoch=3,
    missing_slot=None,
    spin_limit=0,
    b_kmajor=False,
    seed=0,
    own=False,
    programs=3,
    cache=None,
    scaled=None,
):
    """One rank's consumer with every chunk there. `own`: the rank's shard passed apart, its rows of
    the gathered buffer poisoned, and its own chunks' words raised only where a tile reads them
    from the gathered buffer (`tables.own_rows_later`). `scaled` ("row" or "tensor": B's scale):
    FP8 operands, A's scales by gathered row, a bf16 output."""
    plan = plan_for("ag_gemm", c.template, ws, m, c.num_splits, c.block_m)
    scales = None
    if scaled:
        a, sa, a_ref = fp8_operand(m, k, seed, "row", 1)
        b, sb, b_ref = fp8_operand(n, k, seed + 1, scaled, 1)
        b, sb, b_ref = (b.t(), sb.t(), b_ref.t()) if b_kmajor else (b.t().contiguous(), sb.t(), b_ref.t())
        scales = (sa, sb.contiguous())
        ref = a_ref @ b_ref
    else:
        a = rand(m, k, seed=seed)
        b = rand(n, k, seed=seed + 1).t() if b_kmajor else rand(k, n, seed=seed + 1)
        ref = a.float() @ b.float()
    a_full = a.clone()  # every chunk, own ones included, has arrived
    tables = consumer_tables(plan, rank, n, c, CPU)
    r0, r1 = plan.chunk_bounds[rank][0][0], plan.chunk_bounds[rank][-1][1]
    signals = torch.zeros(PAD_WORDS, dtype=torch.int32)
    slots = [t.signal for t in plan.recvs(rank, "gather")]
    if not own or tables.own_rows_later:
        slots += [LOCAL_BASE + j for j in range(plan.num_splits)]
    if own and not tables.own_rows_later:
        a_full[r0:r1] = float("nan")
    for slot in slots:
        signals[slot] = epoch if slot != missing_slot else epoch - 1
    error = torch.zeros(1, dtype=torch.int32)
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16 if scaled else torch.float16)
    launch_consumer(
        a_full,
        b,
        out,
        tables,
        c,
        epoch,
        signals,
        error,
        programs,
        spin_limit,
        a_own=a[r0:r1].clone() if own else None,
        own_row0=r0,
        cache=cache,
        scales=scales,
    )
    return out, ref, int(error.item())


@pytest.mark.parametrize("order", ["arrival", "arrival_colmajor", "swizzle", "row_major"])
@pytest.mark.parametrize(
    "template, ws, splits", [("direct", 2, 2), ("ring", 4, 1), ("bidirectional_ring", 3, 2)]
)
def test_consumer_computes_every_tile_from_the_right_rows(order, template, ws, splits):
    c = cand(template=template, num_splits=splits, tile_order=order)
    for rank in range(ws):
        out, ref, err = run_consumer(ws, rank, 192, 64, 64, c, seed=rank)
        assert err == 0
        assert torch.isfinite(out).all(), "a tile was not written"
        assert torch.allclose(out.float(), ref, rtol=2e-2, atol=2e-2)


TUNED_WORLDS = [(template, ws) for ws in (4, 8) for template in ("ring", "bidirectional_ring")]
"""The ring templates at the world sizes configs/llama_tp4.yaml and llama_tp8.yaml tune."""


@pytest.mark.parametrize("template, ws", TUNED_WORLDS)
def test_consumer_at_four_and_eight_ranks(template, ws):
    # Blocks of 64 rows in two chunks of one tile each: every rank's own chunks, then 2·(ws-1) arriving ones.
    c = cand(template=template, num_splits=2, tile_order="arrival")
    for rank in range(ws):
        out, ref, err = run_consumer(ws, rank, 64 * ws, 32, 32, c, seed=20 + rank)
        assert err == 0
        assert torch.isfinite(out).all(), f"rank {rank}: a tile was not written"
        assert torch.allclose(out.float(), ref, rtol=2e-2, atol=2e-2), f"rank {rank}: wrong rows"


def test_consumer_with_shards_not_a_multiple_of_block_m_and_kmajor_b():
    # 3 ranks of 40 rows, tiles of 32: tiles straddle own and remote rows.
    c = cand(template="direct", num_splits=1, tile_order="arrival", block_m=32)
    for rank in range(3):
        out, ref, err = run_consumer(3, rank, 120, 48, 40, c, b_kmajor=True, seed=10 + rank)
        assert err == 0 and torch.isfinite(out).all()
        assert torch.allclose(out.float(), ref, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("order", ["arrival", "arrival_colmajor", "swizzle"])
@pytest.mark.parametrize(
    "template, ws, m, splits", [("direct", 2, 192, 2), ("ring", 3, 288, 1), ("direct", 3, 120, 1)]
)
def test_consumer_reads_own_rows_from_the_shard_without_waiting(order, template, ws, m, splits):
    # With the shard passed apart, the leading tiles of the own block read it and wait for nothing:
    # its rows of the gathered buffer are NaN and its words never raised (a wait would time out).
    # 120 rows on 3 ranks: blocks of 40, tiles of 32 across their edges read the (then copied) buffer.
    c = cand(template=template, num_splits=splits, tile_order=order)
    for rank in range(ws):
        plan = plan_for("ag_gemm", template, ws, m, splits, c.block_m)
        tables = consumer_tables(plan, rank, 64, c, CPU)
        if order != "swizzle" and m // ws % c.block_m == 0:
            assert tables.own_tiles == (m // ws // c.block_m) * 2 and not tables.own_rows_later
        out, ref, err = run_consumer(ws, rank, m, 64, 48, c, seed=30 + rank, own=True, spin_limit=50)
        assert err == 0, f"rank {rank} waited for its own rows"
        assert torch.isfinite(out).all(), f"rank {rank}: a tile was not written or read the poisoned rows"
        assert torch.allclose(out.float(), ref, rtol=2e-2, atol=2e-2), f"rank {rank}: wrong rows"


@pytest.mark.parametrize("which", ["remote", "own"])
def test_a_chunk_that_never_arrives_times_out_instead_of_hanging(which):
    c = cand(template="direct", num_splits=2, tile_order="arrival")
    plan = plan_for("ag_gemm", "direct", 2, 128, 2, 32)
    slot = plan.recvs(0, "gather")[-1].signal if which == "remote" else LOCAL_BASE + 1
    _, _, err = run_consumer(2, 0, 128, 32, 32, c, missing_slot=slot, spin_limit=20)
    assert err & 1  # the waited-for word's address, its lowest bit set (`_timed_out`)
    _, _, err = run_consumer(2, 0, 128, 32, 32, c, spin_limit=20)
    assert err == 0


def test_tail_split_cuts_a_last_wave_of_at_most_half_the_programs():
    assert tail_split(704, 132, 64) == 3  # AG+GEMM 8192×11008×4096 at TP=4, 128×256 tiles: 44 left over
    assert tail_split(660, 132, 64) == 0  # whole waves
    assert tail_split(1408, 132, 64) == 0  # 88 left over: more than half the programs
    assert tail_split(100, 132, 64) == 0  # less than one wave
    assert tail_split(661, 132, 64) == TAIL_MAX_SPLIT  # one tile left over, cut as far as it goes
    assert tail_split(704, 132, 2) == 2  # no part without a K step
    assert tail_split(704, 132, 1) == 0
    assert tail_split(704, 132, 64, own_tiles=661) == 0  # the rank's own tiles reach into the tail


@pytest.mark.parametrize("programs, k, split", [(5, 96, 2), (10, 96, 3), (10, 160, 4)])
@pytest.mark.parametrize("own", [False, True])
def test_consumer_cuts_the_tiles_of_its_last_wave_in_k(programs, k, split, own):
    # 192×64 in 32×32 tiles: 12 tiles, 2 left over for the last wave of 5 or 10 programs.
    c = cand(template="direct", num_splits=2, tile_order="arrival")
    assert tail_split(12, programs, k // 32) == split
    cache = {}
    for epoch in (3, 4, 5):  # back to back: each call's last parts clear the words the next waits on
        for rank in range(2):
            out, ref, err = run_consumer(
                2,
                rank,
                192,
                64,
                k,
                c,
                epoch=epoch,
                seed=40 + epoch + rank,
                programs=programs,
                cache=cache,
                own=own,
                spin_limit=200,
            )
            assert err == 0
            assert torch.isfinite(out).all(), "a tile was not written"
            assert torch.allclose(out.float(), ref, rtol=2e-2, atol=2e-2), f"rank {rank}: wrong tiles"
            ((parts, flags),) = [v for key, v in cache.items() if key[0] == "tail"]
            assert flags.numel() == 2 * split and not flags.any(), "a part's word was left raised"


def test_a_tail_tile_whose_chunk_never_arrives_times_out():
    c = cand(template="direct", num_splits=2, tile_order="arrival")
    plan = plan_for("ag_gemm", "direct", 2, 192, 2, 32)
    slot = plan.recvs(0, "gather")[-1].signal  # the last chunk to arrive: the tail's tiles read it
    _, _, err = run_consumer(2, 0, 192, 64, 96, c, missing_slot=slot, spin_limit=20, programs=5)
    assert err & 1


def _guarded(rows, n, dtype=torch.float16):
    """A NaN-filled [rows, n] tensor with a guard row of 7s before and after it in memory."""
    block = torch.full((rows + 2, n), 7.0, dtype=dtype)
    block[1:-1] = float("nan")
    return block[1:-1], block


def run_producer(
    kind,
    template,
    ws,
    m,
    n,
    k,
    splits,
    order="arrival",
    epoch=5,
    withheld=None,
    spin_limit=0,
    programs=4,
    block_n=32,
    scaled=None,
):
    """Run every rank's producer with the partials it would receive already in place (but for rank
    0's last one with `withheld`: its signal stays at the previous call's epoch; `withheld="entered"`:
    rank 0's peers have not entered the call, so its all-reduce's buffer is not free). The output,
    send and all-reduce buffers have guard rows around them (`results[r]["guards"]`). `scaled`
    ("row" or "tensor"): FP8 operands with scales of that kind, bf16 partials."""
    c = cand(template=template, num_splits=splits, tile_order=order, block_n=block_n)
    plan = plan_for(kind, template, ws, m, splits, c.block_m)
    all_reduce = kind == "gemm_ar"
    scales = [None] * ws
    dtype = torch.bfloat16 if scaled else torch.float16
    if scaled:
        ops = [
            (fp8_operand(m, k, 100 + r, scaled, 1), fp8_operand(n, k, 200 + r, scaled, 1)) for r in range(ws)
        ]
        a = [x[0] for x, _ in ops]
        b = [w[0].t() for _, w in ops]  # K-major, as the fused programs pass an FP8 B
        scales = [(x[1], w[1].reshape(1, -1).contiguous() if scaled == "row" else w[1]) for x, w in ops]
        partial = [x[2] @ w[2].t() for x, w in ops]
    else:
        a = [rand(m, k, seed=100 + r) for r in range(ws)]
        b = [rand(k, n, seed=200 + r) for r in range(ws)]
        partial = [(a[r].float() @ b[r].float()) for r in range(ws)]
    total = sum(partial)
    pads = [torch.zeros(PAD_WORDS, dtype=torch.int32) for _ in range(ws)]
    peer_ptrs = torch.tensor([p.data_ptr() for p in pads], dtype=torch.int64)
    results = []
    for r in range(ws):
        # What rank r receives: for a ring, the running sum of the ranks before it; for direct, each partial.
        recv = torch.full((recv_rows(plan), n), float("nan"), dtype=dtype)
        held = {(q, ci): {q} for q in range(ws) for ci in range(plan.num_chunks)}
        for step in range(1, plan.num_steps + 1):
            moves = [t for t in plan.transfers if t.phase == "reduce" and t.step == step]
            payloads = [(t, set(held[(t.src, plan.chunk_index(*t.chunk))])) for t in moves]
            for t, contributors in payloads:
                held[(t.dst, plan.chunk_index(*t.chunk))] |= contributors
                if t.dst == r:
                    rows = slice(t.row_start, t.row_end)
                    flat = recv.view(-1)
                    off = recv_offset(plan, t.src, t.block, n) + t.row_start * n
                    flat[off : off + t.rows * n] = (
                        sum(partial[q][rows] for q in contributors).to(dtype).reshape(-1)
                    )
        pad = pads[r]
        for t in plan.recvs(r, "reduce"):
            pad[t.signal] = epoch
        if withheld and withheld != "entered" and r == 0:
            pad[plan.recvs(r, "reduce")[-1].signal] = epoch - 1
        pad[ENTERED_BASE : ENTERED_BASE + ws] = epoch
        if withheld == "entered" and r == 0:
            pad[ENTERED_BASE : ENTERED_BASE + ws] = epoch - 1
            pad[ENTERED_BASE + r] = epoch
        tables = producer_tables(plan, r, n, c, all_reduce, CPU)
        lo, hi = block_bounds(m, ws, r)
        out, out_block = _guarded(m if all_reduce else hi - lo, n, dtype)
        send, send_block = _guarded(m, n, dtype)
        reduced, reduced_block = _guarded(m, n, dtype) if all_reduce else (None, None)
        blocks = [block for block in (out_block, send_block, reduced_block) if block is not None]
        counters = torch.zeros(4096, dtype=torch.int64)
        error = torch.zeros(1, dtype=torch.int32)
        launch_producer(
            a[r],
            b[r],
            send,
            out,
            reduced,
            recv,
            0 if all_reduce else lo,
            tables,
            c,
            epoch,
            pad,
            counters,
            peer_ptrs,
            ws,
            r,
            error,
            programs,
            spin_limit,
            scales=scales[r],
        )
        results.append(
            dict(
                plan=plan,
                tables=tables,
                out=out,
                send=send,
                reduced=reduced,
                counters=counters,
                error=int(error.item()),
                lo=lo,
                hi=hi,
                held=held,
                guards=[block[[0, -1]] for block in blocks],
            )
        )
    return results, partial, total, pads, plan


@pytest.mark.parametrize(
    "template, ws, splits", [("direct", 2, 2), ("direct", 3, 1), ("ring", 4, 1), ("bidirectional_ring", 3, 2)]
)
@pytest.mark.parametrize("order", ["arrival", "swizzle"])
def test_reduce_scatter_producer(template, ws, splits, order):
    _check_reduce_scatter(*run_producer("gemm_rs", template, ws, 64 * ws, 48, 32, splits, order))


@pytest.mark.parametrize(
    "template, ws, splits, order",
    [
        ("direct", 3, 1, "arrival"),
        ("ring", 3, 1, "arrival_colmajor"),
        ("bidirectional_ring", 2, 2, "row_major"),
    ],
)
def test_reduce_scatter_producer_with_blocks_not_a_multiple_of_block_m(template, ws, splits, order):
    """Blocks of 48 rows, tiles of 32: a tile with rows of two chunks is two entries, each storing
    its chunk's rows (with that chunk's partials) and counting the tile in that chunk only."""
    results, partial, total, pads, plan = run_producer(
        "gemm_rs", template, ws, 48 * ws, 40, 32, splits, order
    )
    assert len(results[0]["tables"].order) > -(-48 * ws // 32) * 2, "the boundary tiles are two entries"
    _check_reduce_scatter(results, partial, total, pads, plan)


def _check_reduce_scatter(results, partial, total, pads, plan):
    for r, res in enumerate(results):
        assert res["error"] == 0
        lo, hi = res["lo"], res["hi"]
        assert torch.allclose(res["out"].float(), total[lo:hi], rtol=3e-2, atol=3e-2), (
            "own rows hold the full sum"
        )
        sends = plan.sends(r, "reduce")
        for i, t in enumerate(sends):
            rows = slice(t.row_start, t.row_end)
            # What r sends at step s is its own partial plus what it received for those rows before.
            expected = sum(partial[q][rows] for q in _received_before(plan, r, t))
            assert torch.allclose(res["send"][rows].float(), expected, rtol=3e-2, atol=3e-2)
            assert pads[r][READY_BASE + i] == 5, "ready signal raised for every chunk that leaves"
        assert int(res["counters"].abs().sum()) == 0, "counters are reset for the next call"


def _received_before(plan, r, t):
    """Contributors of the partial rank r holds for chunk t.chunk just before step t.step."""
    held = {(q, ci): {q} for q in range(plan.world_size) for ci in range(plan.num_chunks)}
    for step in range(1, t.step):
        moves = [x for x in plan.transfers if x.phase == "reduce" and x.step == step]
        payloads = [(x, set(held[(x.src, plan.chunk_index(*x.chunk))])) for x in moves]
        for x, contributors in payloads:
            held[(x.dst, plan.chunk_index(*x.chunk))] |= contributors
    return held[(r, plan.chunk_index(*t.chunk))]


@pytest.mark.parametrize("template, ws", TUNED_WORLDS + [("direct", 8)])
def test_reduce_scatter_producer_at_four_and_eight_ranks(template, ws):
    results, partial, total, pads, plan = run_producer("gemm_rs", template, ws, 64 * ws, 32, 32, 2)
    for r, res in enumerate(results):
        assert res["error"] == 0, f"rank {r}: a wait timed out"
        assert torch.allclose(res["out"].float(), total[res["lo"] : res["hi"]], rtol=3e-2, atol=3e-2), (
            f"rank {r}: own rows do not hold the sum of all {ws} partials"
        )
        for i, t in enumerate(plan.sends(r, "reduce")):
            rows = slice(t.row_start, t.row_end)
            expected = sum(partial[q][rows] for q in _received_before(plan, r, t))
            assert torch.allclose(res["send"][rows].float(), expected, rtol=3e-2, atol=3e-2), (
                f"rank {r}: chunk {t.chunk} leaving at step {t.step} does not carry what reached it before"
            )
            assert pads[r][READY_BASE + i] == 5
        assert int(res["counters"].abs().sum()) == 0


def _check_all_reduce(results, total, pads, plan, ws):
    for r, res in enumerate(results):
        assert res["error"] == 0, f"rank {r}: a wait timed out"
        lo, hi = res["lo"], res["hi"]
        assert torch.allclose(res["out"][lo:hi].float(), total[lo:hi], rtol=3e-2, atol=3e-2)
        assert torch.equal(res["reduced"][lo:hi], res["out"][lo:hi])
        told = [t for p in range(ws) if p != r for t in plan.recvs(p, "gather") if t.src == r]
        assert len(told) == (ws - 1) * plan.num_splits
        for t in told:
            assert pads[t.dst][t.signal] == 5, (
                f"rank {t.dst} is not told chunk {t.chunk} of rank {r} is reduced"
            )
        assert res["tables"].num_ready == len(plan.sends(r, "reduce")) + plan.num_splits


def _check_producer(kind, results, partial, total, pads, plan, ws):
    """`_check_reduce_scatter` or `_check_all_reduce`, as `kind` is."""
    if kind == "gemm_rs":
        _check_reduce_scatter(results, partial, total, pads, plan)
    else:
        _check_all_reduce(results, total, pads, plan, ws)


@pytest.mark.parametrize("ws, m, splits", [(2, 128, 2), (3, 144, 1)], ids=["aligned", "blocks-of-48-rows"])
def test_all_reduce_producer_stores_reduced_rows_and_raises_peer_signals(ws, m, splits):
    results, partial, total, pads, plan = run_producer("gemm_ar", "direct", ws, m, 64, 32, splits)
    _check_all_reduce(results, total, pads, plan, ws)


@pytest.mark.parametrize("kind", ["gemm_rs", "gemm_ar"])
def test_producers_with_kept_chunks_interleaved(kind):
    """The opt-in order: same sums, same chunks sent, kept chunks finished among the sent ones."""
    results, partial, total, pads, plan = run_producer(
        kind, "direct", 2, 2 * (4 * 32 + 16), 48, 32, 4, "kept_interleaved"
    )
    _check_producer(kind, results, partial, total, pads, plan, 2)


@pytest.mark.parametrize("template, ws", [("direct", 2)] + TUNED_WORLDS + [("direct", 4)])
def test_all_reduce_producer_at_four_and_eight_ranks(template, ws):
    results, partial, total, pads, plan = run_producer("gemm_ar", template, ws, 64 * ws, 32, 32, 2)
    _check_all_reduce(results, total, pads, plan, ws)


def test_chunk_copy_moves_each_job_and_raises_its_signal():
    from types import SimpleNamespace

    src = [torch.arange(1000, dtype=torch.float16) + 1000 * i for i in range(3)]
    dst = [torch.zeros(1000, dtype=torch.float16) for _ in range(3)]
    pads = [torch.zeros(PAD_WORDS, dtype=torch.int32) for _ in range(2)]
    for p in pads:
        p[ENTERED_BASE : ENTERED_BASE + 2] = 7
    pads[0][11] = 7  # job 1 waits for local slot 11
    ctx = SimpleNamespace(
        device=CPU,
        signals=SimpleNamespace(local=pads[0]),
        peer_signal_ptrs=torch.tensor([p.data_ptr() for p in pads]),
        counters=torch.zeros(4096, dtype=torch.int64),
        error=torch.zeros(1, dtype=torch.int32),
    )
    elem = 2
    jobs = [
        (src[0].data_ptr(), dst[0].data_ptr(), 1000, -1, 3, 1),
        (src[1].data_ptr() + 10 * elem, dst[1].data_ptr(), 500, 11, 4, 1),
        (src[2].data_ptr(), dst[2].data_ptr(), 999, -1, -1, 0),
    ]
    launch_chunk_copy(ctx, None, jobs, 3, 7, torch.float16)
    assert torch.equal(dst[0], src[0])
    assert torch.equal(dst[1][:500], src[1][10:510]) and int(dst[1][500:].abs().sum()) == 0
    assert torch.equal(dst[2][:999], src[2][:999]) and dst[2][999] == 0
    assert pads[1][3] == 7 and pads[1][4] == 7
    assert int(ctx.counters.abs().sum()) == 0 and int(ctx.error.item()) == 0


def _pull_context():
    from types import SimpleNamespace

    pad = torch.zeros(PAD_WORDS, dtype=torch.int32)
    return SimpleNamespace(
        device=CPU, signals=SimpleNamespace(local=pad), cache={}, error=torch.zeros(1, dtype=torch.int32)
    )


@pytest.mark.parametrize(
    "rows, n, dtype",
    [(7, 24, torch.bfloat16), (64, 4096, torch.float16), (3, 4, torch.float32), (9, 4100, torch.float32)],
)
def test_pull_copies_once_its_word_is_up(rows, n, dtype):
    """`pull_kernel` (the decomposed all-reduce's last pull): its word being up, the chunk copied
    whole (more than one program's block where it is large), nothing past its end written."""
    from syncopate.kernels.launch import launch_pull, pull_fits

    ctx = _pull_context()
    ctx.signals.local[40] = 5
    src = torch.randn(rows, n).to(dtype)
    out = torch.full((rows + 1, n), float("nan"), dtype=dtype)
    assert pull_fits(src, out[:rows])
    launch_pull(ctx, None, src, out[:rows], 40, 5)
    assert torch.equal(out[:rows], src) and out[rows].isnan().all()
    assert int(ctx.error.item()) == 0


def test_a_pull_whose_word_never_comes_up_times_out_instead_of_hanging():
    from syncopate.kernels.launch import launch_pull

    ctx = _pull_context()
    ctx.signals.local[40] = 4  # the call before's
    src, dst = torch.randn(4, 8), torch.zeros(4, 8)
    launch_pull(ctx, None, src, dst, 40, 5, spin_limit=50)
    code = int(ctx.error.item())
    assert code & 1 and (code & 0xFFFFFFFE) == (ctx.signals.local.data_ptr() + 4 * 40) & 0xFFFFFFFF


def test_a_timeout_names_the_word_it_waited_for():
    """The error word holds the waited-for word's address (low 32 bits, lowest bit set); the context
    names the pad, the word, what it holds and reads now, and the rank's epoch."""
    from types import SimpleNamespace

    from syncopate.errors import CandidateTimeoutError
    from syncopate.kernels.context import OverlapContext
    from syncopate.kernels.launch import launch_pull

    pads = [torch.zeros(PAD_WORDS, dtype=torch.int32) for _ in range(2)]
    ctx = _pull_context()
    ctx.signals = SimpleNamespace(
        local=pads[0], peer_ptrs=[p.data_ptr() for p in pads], peer_view=lambda r: pads[r]
    )
    ctx.rank, ctx.epoch = 0, 5
    for word, name in (
        (ENTERED_BASE + 1, "rank 1's entry into the call"),
        (7, "the arrival of the chunk of slot 7"),
    ):
        pads[1][word] = 4  # still the call before's
        launch_pull(ctx, None, torch.ones(4, 8), torch.zeros(4, 8), word, 5, spin_limit=50)
        code = int(ctx.error.item())
        ctx.error.zero_()
        # a pull waits on its own pad; the code names whichever pad holds the word
        assert "rank 0's signal pad" in OverlapContext.waited_for(ctx, code)
        peer = (pads[1].data_ptr() + 4 * word) & 0xFFFFFFFF | 1
        said = OverlapContext.waited_for(ctx, peer)
        assert f"word {word} of rank 1's signal pad ({name}" in said and "reads 4 now" in said
        assert "against rank 0's epoch 5 (its writer has not reached this call)" in said
    assert "in no signal pad" in OverlapContext.waited_for(ctx, (pads[0].data_ptr() - 64) & 0xFFFFFFFF | 1)
    assert OverlapContext.waited_for(ctx, 1) == "a chunk that never arrived"
    code = ((pads[1].data_ptr() + 4 * 7) & 0xFFFFFFFF) | 1
    ctx.error.fill_(code - (1 << 32) if code >= 1 << 31 else code)  # as the int32 word holds it
    ctx.check_error = OverlapContext.check_error.__get__(ctx)
    ctx.waited_for = OverlapContext.waited_for.__get__(ctx)
    with pytest.raises(CandidateTimeoutError, match="spin limit for word 7 of rank 1's signal pad"):
        ctx.check_error()
    assert int(ctx.error.item()) == 0


def test_pull_takes_whole_aligned_16_byte_words_only():
    from syncopate.kernels.launch import pull_fits

    x = torch.zeros(8, 8)
    assert pull_fits(x[2:4], x[4:6])
    assert not pull_fits(x[:, :4], x[:4, :4].contiguous())  # not contiguous
    assert not pull_fits(x.view(-1)[1:5], x.view(-1)[8:12])  # not 16-byte aligned
    assert not pull_fits(x.view(-1)[:3], x.view(-1)[8:11])  # not whole words
    assert not pull_fits(x[:2], x[:3])


@pytest.mark.parametrize("block_n", [16, 32], ids=["whole-tile", "column-halves"])
@pytest.mark.parametrize("kind", ["gemm_rs", "gemm_ar"])
def test_producer_epilogue_on_whole_tiles_and_in_column_halves(monkeypatch, kind, block_n):
    """Tiles of 16 columns finish whole, of 32 and more in column halves (`epilogue_split`)."""
    from syncopate.kernels import launch

    splits, real = [], launch.epilogue_split
    monkeypatch.setattr(launch, "epilogue_split", lambda c: splits.append(real(c)) or splits[-1])
    results, partial, total, pads, plan = run_producer(kind, "direct", 2, 128, 64, 32, 2, block_n=block_n)
    assert splits and set(splits) == {1 if block_n < 32 else 2}
    _check_producer(kind, results, partial, total, pads, plan, 2)


def test_producer_epilogue_split_default():
    from syncopate.kernels.launch import epilogue_split

    assert epilogue_split(cand(block_n=128, num_warps=8)) == 2
    assert epilogue_split(cand(block_n=256, num_warps=8)) == 2
    assert epilogue_split(cand(block_n=16)) == 1


def test_the_copier_is_staged_before_the_kernel_and_enqueued_without_allocating(monkeypatch):
    """An allocation between the fused kernel's launch and its communication is an implicit
    synchronization point (the side streams would wait for the kernel that waits for them): the
    SM copier's job tables are made when the call is staged, and enqueueing allocates nothing."""
    import ctypes
    from types import SimpleNamespace

    from syncopate.kernels import launch, streamops
    from syncopate.kernels.backends import BACKEND_IMPLS, ScatterCall

    ws, m, n = 2, 128, 16
    plan = plan_for("gemm_rs", "direct", ws, m, 2, 32)
    pads = [torch.zeros(PAD_WORDS, dtype=torch.int32) for _ in range(ws)]
    recv = [torch.zeros(recv_rows(plan), n, dtype=torch.float16) for _ in range(ws)]
    send = (torch.arange(m * n) % 97).to(torch.float16).reshape(m, n)
    rank, epoch = 0, 4

    class HostDriver:
        """The driver's stream write, made at once in host memory (the pads are CPU tensors)."""

        def write(self, stream, address, value, flags):
            ctypes.c_uint32.from_address(address).value = value
            return 0

    monkeypatch.setattr(streamops, "_driver", HostDriver)
    ctx = SimpleNamespace(
        device=CPU,
        rank=rank,
        world_size=ws,
        cache={},
        raise_signal=lambda program, stream, peer, word: program.write(
            stream, pads[peer].data_ptr() + 4 * word
        ),
        signals=SimpleNamespace(local=pads[rank]),
        peer_signal_ptrs=torch.tensor([p.data_ptr() for p in pads]),
        counters=torch.zeros(4096, dtype=torch.int64),
        error=torch.zeros(1, dtype=torch.int32),
    )
    call = ScatterCall(
        ctx=ctx,
        plan=plan,
        candidate=cand(backend="sm_copy", comm_sms=3, num_splits=2),
        epoch=epoch,
        main=None,
        send=send,
        recv=SimpleNamespace(peer_ptrs=[r.data_ptr() for r in recv]),
        n_cols=n,
        elem=2,
        spin_limit=1 << 16,
    )
    enqueue = BACKEND_IMPLS["sm_copy"].stage_scatter(call, [SimpleNamespace(cuda_stream=i) for i in range(3)])
    pads[rank][READY_BASE : READY_BASE + 8] = epoch  # the kernel has made every leaving chunk ready
    pads[rank][ENTERED_BASE + 1] = epoch  # and the peer has entered the call

    def no_allocation(*args, **kwargs):
        raise AssertionError("enqueueing the copier allocated")

    monkeypatch.setattr(launch.torch, "tensor", no_allocation)
    enqueue()
    assert int(ctx.error.item()) == 0
    for t in plan.sends(rank, "reduce"):
        off = recv_offset(plan, rank, t.block, n) + t.row_start * n
        assert torch.equal(
            recv[t.dst].view(-1)[off : off + t.rows * n], send[t.row_start : t.row_end].reshape(-1)
        )
        assert pads[t.dst][t.signal] == epoch


@pytest.mark.parametrize("jobs", range(1, 10))
def test_copy_job_table_rows_start_16_byte_aligned_whatever_the_job_count(jobs):
    """Triton specializes the copier on its pointers' 16-byte alignment; rows whose start moved
    with the job count made a variant that was compiled (an implicit synchronization) after the
    fused kernel's launch, and that call's waits ran out on the GPUs."""
    from types import SimpleNamespace

    from syncopate.kernels.launch import copy_job_tables

    ctx = SimpleNamespace(device=CPU, cache={})
    table, small = copy_job_tables(ctx, [(1, 2, 3, 4, 5, 6)] * jobs, None)
    for t in (table, small):
        assert all(t[i].data_ptr() % 16 == 0 for i in range(3)), (jobs, t.stride())
        assert t[:, :jobs].tolist() == [[v] * jobs for v in ((1, 2, 3) if t is table else (4, 5, 6))]


def test_job_tables_a_captured_call_uses_outlive_the_cache(monkeypatch):
    """A CUDA graph's copier reads its job tables (and their pinned source) at every replay: tables
    made or found under a capture stay referenced after later calls with other addresses have pushed
    them out of the context's cache, so a replay never reads freed memory; tables of calls not
    captured are let go."""
    import gc
    import weakref
    from types import SimpleNamespace

    from syncopate.kernels import launch

    ctx = SimpleNamespace(device=CPU, cache={})
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    monkeypatch.setattr(launch, "_hold_if_captured", _held_on_cpu(launch._hold_if_captured))
    captured = launch.copy_job_tables(ctx, [(1, 2, 3, 4, 5, 6)], None)
    found = launch.copy_job_tables(ctx, [(1, 2, 3, 4, 5, 6)], None)  # found in the cache, captured again
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    direct = launch.copy_job_tables(ctx, [(7, 8, 9, 10, 11, 12)], None)
    refs = [weakref.ref(t) for t in (*captured, *direct)]
    assert found is captured
    del captured, found, direct
    for i in range(launch.COPY_TABLES_CACHED + 1):  # other addresses: the first tables leave the cache
        launch.copy_job_tables(ctx, [(100 + i, 2, 3, 4, 5, 6)], None)
    gc.collect()
    assert ("copy_jobs", 3, ((1, 2, 3, 4, 5, 6),)) not in ctx.cache
    assert [r() is not None for r in refs] == [True, True, False, False]
    assert len(ctx.cache[launch.CAPTURED_TABLES]) == 2


def _held_on_cpu(hold):
    """`_hold_if_captured` as on a GPU: its CPU test's tables live on the CPU."""
    return lambda cache, device, tables, host: hold(cache, torch.device("cuda"), tables, host)


def test_a_timeline_reports_each_chunk_from_the_events_of_its_pool():
    """The copy-engine backend's diagnostics: events come from a pool made beforehand (none is
    created during a call); a chunk whose events the spent pool could not give is left out."""
    from types import SimpleNamespace

    from syncopate.kernels.context import Timeline

    class Event:
        def __init__(self, ms):
            self.ms, self.stream = ms, None

        def record(self, stream):
            self.stream = stream

        def elapsed_time(self, other):
            return other.ms - self.ms

    start = Event(1.0)
    timeline = Timeline(pool=[Event(1.050), Event(1.020), Event(1.010)])  # popped from the end
    side = SimpleNamespace(name="side")
    ready = timeline.record(side)
    timeline.mark("partial to 1", (0, 0), 512, ready, timeline.record(side))
    late = timeline.record(side)
    timeline.mark("partial to 1", (0, 1), 512, late, timeline.record(side))  # the pool is spent
    assert ready.stream is side and timeline.pool == []
    got = timeline.times_us(start)
    assert [(label, chunk, rows) for label, chunk, rows, _, _ in got] == [("partial to 1", (0, 0), 512)]
    assert got[0][3] == pytest.approx(10.0) and got[0][4] == pytest.approx(20.0)


@pytest.mark.parametrize("kind", ["gemm_rs", "gemm_ar"])
@pytest.mark.parametrize(
    "template, ws, splits, m, n, order, block_n",
    [
        ("direct", 2, 2, 128, 40, "arrival", 16),
        ("direct", 2, 4, 256, 48, "kept_interleaved", 32),
        ("ring", 4, 1, 256, 40, "arrival", 16),
        ("bidirectional_ring", 3, 2, 192, 48, "swizzle", 32),
    ],
)
def test_producers_with_the_tma_epilogue(monkeypatch, kind, template, ws, splits, m, n, order, block_n):
    """Chunks of whole tiles: partials read and rows written through TMA descriptors (N not a
    multiple of BLOCK_N, so the descriptors clip the last column block), on whole tiles of 16
    columns and in column halves of 32; the same sums, chunks sent, signals and counters as the
    pointer epilogue."""
    from syncopate.kernels import launch

    monkeypatch.setattr(launch, "use_tma", lambda *tensors: True)
    chosen = []
    real = launch.tma_epilogue
    monkeypatch.setattr(launch, "tma_epilogue", lambda *a: chosen.append(real(*a)) or chosen[-1])
    results, partial, total, pads, plan = run_producer(
        kind, template, ws, m, n, 32, splits, order, block_n=block_n
    )
    assert chosen and all(chosen), "every rank's producer took the TMA epilogue"
    _check_producer(kind, results, partial, total, pads, plan, ws)


@pytest.mark.parametrize("kind", ["gemm_rs", "gemm_ar"])
@pytest.mark.parametrize(
    "template, ws, programs",
    [("direct", 2, 1), ("direct", 3, 2), ("ring", 4, 3), ("bidirectional_ring", 2, 1)],
)
def test_tma_epilogue_counts_a_program_s_run_of_tiles_of_one_chunk_at_once(
    monkeypatch, kind, template, ws, programs
):
    """Few programs, so each finishes several tiles of a chunk in a row and counts them together
    when its next tile is of another chunk: every chunk is still signalled once complete, the
    counters end at zero, the sums are right."""
    from syncopate.kernels import launch

    monkeypatch.setattr(launch, "use_tma", lambda *tensors: True)
    results, partial, total, pads, plan = run_producer(
        kind, template, ws, 64 * ws, 64, 32, 2, programs=programs
    )
    _check_producer(kind, results, partial, total, pads, plan, ws)


def test_the_gluon_producer_is_taken_only_where_it_applies(monkeypatch):
    """The Gluon producer (GPU only: its results are checked by tests/support/relaunch_check.py and
    the two-GPU matrix) is opt-in, and needs the TMA epilogue, tiles its wgmma layout takes, its
    buffers in shared memory and enough K steps to fill them; several partials a chunk are fine."""
    from syncopate.kernels import gluon_kernels, launch

    c = cand(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3, num_splits=2)
    tables = producer_tables(plan_for("gemm_rs", "direct", 2, 512, 2, 128), 0, 256, c, False, CPU)
    a, b = torch.empty(512, 1024, dtype=torch.bfloat16), torch.empty(1024, 256, dtype=torch.bfloat16)
    buffers = [torch.empty(512, 256, dtype=torch.bfloat16)] * 4
    monkeypatch.setattr(launch, "use_tma", lambda *tensors: True)
    monkeypatch.setattr(launch, "compiled_for_gpu", lambda t: True)
    monkeypatch.setattr(gluon_kernels, "AVAILABLE", True)

    def taken(cc=c, tt=tables, k=1024, aa=a):
        return launch.gluon_producer(cc, tt, k, aa, b, *buffers)

    monkeypatch.delenv("SYNCOPATE_GLUON", raising=False)
    assert not taken(), "opt-in"
    monkeypatch.setenv("SYNCOPATE_GLUON", "1")
    assert taken()
    assert not taken(k=64), "one K step, two buffers to fill ahead"
    assert not taken(cc=c.replace(num_stages=5)), "5 x 48 KB of operands and the 64 KB tile: over 227 KB"
    assert not taken(cc=c.replace(block_m=64)), "64 rows for 8 warps"
    assert not taken(aa=a.float()), "16-bit operands only"
    three = producer_tables(
        plan_for("gemm_rs", "direct", 3, 768, 1, 128), 0, 256, c.replace(num_splits=1), False, CPU
    )
    assert three.inc_max == 2 and taken(tt=three), "two partials a chunk"
    across = producer_tables(plan_for("gemm_rs", "direct", 2, 640, 2, 128), 0, 256, c, False, CPU)
    assert not across.whole_tiles and not taken(tt=across), "a tile with rows of two chunks: no TMA epilogue"
    monkeypatch.setattr(gluon_kernels, "AVAILABLE", False)
    assert not taken(), "a Triton without Gluon's Hopper API"


def test_the_gluon_consumer_is_taken_only_where_it_applies(monkeypatch):
    """The Gluon consumer (GPU only, like the producer) is opt-in through the same switch and needs
    the TMA path for every operand (the shard too), 16-bit operands, tiles its wgmma layout takes,
    its buffers in shared memory and enough K steps to fill them; the Triton consumer takes the rest,
    and the launch goes to whichever was chosen."""
    from syncopate.kernels import gluon_kernels, launch

    c = cand(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3, num_splits=2)
    a, b, out = (
        torch.empty(512, 1024, dtype=torch.bfloat16),
        torch.empty(1024, 256, dtype=torch.bfloat16),
        torch.empty(512, 256, dtype=torch.bfloat16),
    )
    tma = {"on": True}
    monkeypatch.setattr(launch, "use_tma", lambda *tensors: tma["on"])
    monkeypatch.setattr(launch, "compiled_for_gpu", lambda t: True)
    monkeypatch.setattr(gluon_kernels, "AVAILABLE", True)

    def taken(cc=c, k=1024, aa=a):
        return launch.gluon_consumer(cc, k, aa, b, out, aa[:256])

    monkeypatch.delenv("SYNCOPATE_GLUON", raising=False)
    assert not taken(), "opt-in"
    monkeypatch.setenv("SYNCOPATE_GLUON", "1")
    assert taken()
    assert not taken(k=64), "one K step, two buffers to fill ahead"
    assert not taken(cc=c.replace(num_stages=5)), "over 227 KB of shared memory"
    assert not taken(cc=c.replace(block_m=64)), "64 rows for 8 warps"
    assert not taken(aa=a.float()), "16-bit operands only"
    tma["on"] = False
    assert not taken(), "an operand off the TMA path"
    tma["on"] = True

    launched = []

    class Recorder:
        def __init__(self, name):
            self.name = name

        def __getitem__(self, grid):
            return lambda *args, **kwargs: launched.append(self.name)

    monkeypatch.setattr(gluon_kernels, "gluon_consumer_kernel", Recorder("gluon"), raising=False)
    monkeypatch.setattr(launch, "consumer_kernel", Recorder("triton"))
    monkeypatch.setattr(launch, "_gl_descriptor", lambda t, block: None)
    monkeypatch.setattr(launch, "_descriptor", lambda t, block: None)
    tables = consumer_tables(plan_for("ag_gemm", "direct", 2, 512, 2, 128), 0, 256, c, CPU)
    pad, err = torch.zeros(PAD_WORDS, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    launch.launch_consumer(a, b, out, tables, c, 1, pad, err, 132, a_own=a[:256], own_row0=0)
    monkeypatch.setenv("SYNCOPATE_GLUON", "0")
    launch.launch_consumer(a, b, out, tables, c, 1, pad, err, 132)
    assert launched == ["gluon", "triton"]


def test_a_gluon_producer_that_does_not_compile_says_how_to_go_on(monkeypatch):
    """A Triton whose Gluon the producer does not compile with (its API moves between releases):
    one error that names the version and the switch to unset, not a compiler traceback alone."""
    import ast

    import triton.compiler.errors

    from syncopate.errors import RuntimeUnavailableError
    from syncopate.kernels import launch

    class Broken:
        def __getitem__(self, grid):
            def compile_and_launch(*args, **kwargs):
                raise triton.compiler.errors.CompilationError("k", ast.parse("x").body[0], "no such name")

            return compile_and_launch

    monkeypatch.setattr(launch.gluon_kernels, "gluon_producer_kernel", Broken())
    monkeypatch.setattr(launch, "_gl_descriptor", lambda t, block: None)
    c = cand(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3, num_splits=2)
    tables = producer_tables(plan_for("gemm_rs", "direct", 2, 512, 2, 128), 0, 256, c, False, CPU)
    a, b = torch.empty(512, 1024, dtype=torch.bfloat16), torch.empty(1024, 256, dtype=torch.bfloat16)
    send = out = recv = torch.empty(512, 256, dtype=torch.bfloat16)
    with pytest.raises(RuntimeUnavailableError, match="unset SYNCOPATE_GLUON"):
        launch._launch_gluon_producer(
            a,
            b,
            False,
            send,
            out,
            None,
            recv,
            0,
            tables,
            c,
            1,
            torch.zeros(PAD_WORDS, dtype=torch.int32),
            torch.zeros(64, dtype=torch.int64),
            torch.zeros(2, dtype=torch.int64),
            2,
            0,
            torch.zeros(1, dtype=torch.int32),
            (4,),
            0,
            None,
            None,
        )


def test_producer_with_a_tile_across_two_chunks_keeps_the_pointer_epilogue(monkeypatch):
    """Blocks of 48 rows and tiles of 32: some tiles hold rows of two chunks, which a TMA box cannot
    split, so the producer stays on its masked pointer epilogue, and is still right."""
    from syncopate.kernels import launch

    monkeypatch.setattr(launch, "use_tma", lambda *tensors: True)
    chosen = []
    real = launch.tma_epilogue
    monkeypatch.setattr(launch, "tma_epilogue", lambda *a: chosen.append(real(*a)) or chosen[-1])
    results, partial, total, pads, plan = run_producer("gemm_rs", "direct", 3, 144, 40, 32, 1)
    assert chosen and not any(chosen)
    _check_reduce_scatter(results, partial, total, pads, plan)


@pytest.mark.parametrize("tma", [False, True], ids=["pointer-epilogue", "tma-epilogue"])
@pytest.mark.parametrize("kind", ["gemm_rs", "gemm_ar"])
def test_a_partial_that_never_arrives_ends_the_wait_with_an_error_not_a_hang(monkeypatch, kind, tma):
    from syncopate.kernels import launch

    monkeypatch.setattr(launch, "use_tma", lambda *tensors: tma)
    results, *_ = run_producer(kind, "direct", 2, 128, 32, 32, 2, withheld=True, spin_limit=20)
    assert results[0]["error"] & 1, "rank 0 reports the partial it waited for in vain"
    assert results[1]["error"] == 0
    for r in results:
        assert all((g == 7).all() for g in r["guards"]), "a wait that gave up wrote outside its buffers"


@pytest.mark.parametrize("tma", [False, True], ids=["pointer-epilogue", "tma-epilogue"])
def test_an_all_reduce_whose_peers_never_enter_stays_inside_its_buffers(monkeypatch, tma):
    """The all-reduce waits for every peer to have entered the call before it overwrites its reduced
    block (they may still read the last one). When that bounded wait gives up, the error is set and
    the stores stay where they belong: a wait once returned -1, added to the store's coordinates,
    and the first tile's partial landed one element before the buffer."""
    from syncopate.kernels import launch

    monkeypatch.setattr(launch, "use_tma", lambda *tensors: tma)
    results, _, _, pads, _ = run_producer(
        "gemm_ar", "direct", 2, 128, 32, 32, 2, withheld="entered", spin_limit=20
    )
    entered = (pads[0].data_ptr() + 4 * (ENTERED_BASE + 1)) & 0xFFFFFFFF | 1
    assert results[0]["error"] & 0xFFFFFFFF == entered, "rank 0 names the peer's entry it waited for in vain"
    assert results[1]["error"] == 0
    for r, res in enumerate(results):
        assert all((g == 7).all() for g in res["guards"]), f"rank {r} wrote outside its buffers"


def test_the_interpreter_takes_the_full_launch_every_time():
    """Relaunching a compiled kernel (launch._Relaunch) is for GPUs: interpreted launches, given a
    cache, neither use nor fill it (tests/test_gpu_relaunch.py checks the relaunch on a GPU)."""
    c = cand(template="direct", num_splits=2, tile_order="arrival")
    plan = plan_for("ag_gemm", "direct", 2, 128, 2, 32)
    tables = consumer_tables(plan, 0, 32, c, CPU)
    signals = torch.zeros(PAD_WORDS, dtype=torch.int32)
    for slot in [t.signal for t in plan.recvs(0, "gather")] + [LOCAL_BASE, LOCAL_BASE + 1]:
        signals[slot] = 1
    cache = {}
    a, b = rand(128, 32, seed=1), rand(32, 32, seed=2)
    out = torch.full((128, 32), float("nan"), dtype=torch.float16)
    launch_consumer(a, b, out, tables, c, 1, signals, torch.zeros(1, dtype=torch.int32), 3, 100, cache=cache)
    assert torch.allclose(out.float(), a.float() @ b.float(), rtol=2e-2, atol=2e-2)
    assert cache == {}


@pytest.mark.parametrize(
    "ws, m, order, rank, own_tiles, later",
    [
        (2, 192, "arrival", 0, 3 * 2, False),  # blocks of 96 rows = 3 tiles of 32, 2 column tiles each
        (2, 192, "arrival", 1, 3 * 2, False),
        (2, 192, "arrival_colmajor", 1, 3 * 2, False),
        (3, 120, "arrival", 0, 1 * 2, True),  # blocks of 40 rows: the tile at rows 32-63 straddles 0 and 1
        (3, 120, "arrival", 1, 0, True),  # rows 40-79 hold no whole tile
        (2, 192, "row_major", 1, 0, True),  # rank 1's own rows come after rank 0's in row order
    ],
)
def test_consumer_tables_say_which_tiles_read_the_shard_and_whether_the_copy_is_needed(
    ws, m, order, rank, own_tiles, later
):
    c = cand(template="direct", num_splits=1, tile_order=order)
    plan = plan_for("ag_gemm", "direct", ws, m, 1, c.block_m)
    tables = consumer_tables(plan, rank, 64, c, CPU)
    assert (tables.own_tiles, tables.own_rows_later) == (own_tiles, later)


# FP8 operands: every tile's sum scaled as torch._scaled_mm scales it ------------------------------


@pytest.mark.parametrize("scaled", ["row", "tensor"])
@pytest.mark.parametrize(
    "template, ws, m, splits, own, b_kmajor",
    [
        ("direct", 2, 192, 2, False, True),
        ("ring", 3, 288, 1, True, True),
        ("direct", 3, 120, 1, True, False),  # tiles across the shards' edges
    ],
)
def test_fp8_consumer_scales_each_row_by_its_gathered_scale(scaled, template, ws, m, splits, own, b_kmajor):
    c = cand(template=template, num_splits=splits, tile_order="arrival")
    for rank in range(ws):
        out, ref, err = run_consumer(
            ws, rank, m, 64, 64, c, seed=50 + rank, own=own, b_kmajor=b_kmajor, scaled=scaled, spin_limit=200
        )
        assert err == 0 and out.dtype == torch.bfloat16
        assert torch.isfinite(out).all(), f"rank {rank}: a tile was not written"
        assert torch.allclose(out.float(), ref, rtol=2e-2, atol=2e-2 * ref.abs().max().item()), (
            f"rank {rank}: {(out.float() - ref).abs().max().item()} off"
        )


@pytest.mark.parametrize("tma", [False, True])
def test_fp8_consumer_scales_the_parts_of_its_last_wave_and_its_tma_loads(monkeypatch, tma):
    from syncopate.kernels import launch

    if tma:
        monkeypatch.setattr(launch, "use_tma", lambda *tensors: True)
    c = cand(template="direct", num_splits=2, tile_order="arrival")
    assert tail_split(12, 5, 96 // 32) == 2
    cache = {}
    for epoch in (3, 4):  # back to back
        out, ref, err = run_consumer(
            2, 1, 192, 64, 96, c, epoch=epoch, seed=60 + epoch, programs=5, cache=cache, scaled="row",
            b_kmajor=True, spin_limit=200,
        )  # fmt: skip
        assert err == 0 and torch.isfinite(out).all()
        assert torch.allclose(out.float(), ref, rtol=2e-2, atol=2e-2 * ref.abs().max().item())


def _check_fp8_producer(kind, results, partial, total, pads, plan, ws):
    """`_check_producer` on FP8 products measured against their size (the largest partial's):
    the checks' tolerances are for values of about one."""
    scale = max(p.abs().max().item() for p in partial)
    measured = [dict(r) for r in results]
    for r in measured:
        for name in ("out", "send", "reduced"):
            if r[name] is not None:
                r[name] = r[name].float() / scale
    _check_producer(kind, measured, [p / scale for p in partial], total / scale, pads, plan, ws)


@pytest.mark.parametrize("scaled", ["row", "tensor"])
@pytest.mark.parametrize("kind", ["gemm_rs", "gemm_ar"])
@pytest.mark.parametrize(
    "template, ws, splits, m, order",
    [
        ("direct", 2, 2, 128, "arrival"),
        ("ring", 4, 1, 256, "swizzle"),
        ("bidirectional_ring", 3, 2, 144, "arrival"),
    ],
)
def test_fp8_producers_send_scaled_bf16_partials(scaled, kind, template, ws, splits, m, order):
    results, partial, total, pads, plan = run_producer(
        kind, template, ws, m, 48, 64, splits, order, scaled=scaled
    )
    assert all(r["send"].dtype == torch.bfloat16 for r in results)
    _check_fp8_producer(kind, results, partial, total, pads, plan, ws)


@pytest.mark.parametrize("kind", ["gemm_rs", "gemm_ar"])
def test_fp8_producers_with_the_tma_epilogue(monkeypatch, kind):
    from syncopate.kernels import launch

    monkeypatch.setattr(launch, "use_tma", lambda *tensors: True)
    results, partial, total, pads, plan = run_producer(kind, "direct", 2, 128, 48, 64, 2, scaled="row")
    _check_fp8_producer(kind, results, partial, total, pads, plan, 2)
