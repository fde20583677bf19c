"""Layer: Triton interpreter on the CPU (TRITON_INTERPRET=1). The `fused` MoE template's kernels
(`syncopate.moe.kernels`) on the tile tables `syncopate.moe.fused` makes, every rank of a routing
run in turn in one process, the transfers emulated:

- dispatch: each rank's receive buffer holds what its peers' copies would put there (its own
  block poisoned with NaN: the own rows come from x, read at their tokens), the signal words raised; h is
  checked row by row against the float32 reference, for uniform and skewed routings with empty
  experts, 2 and 4 ranks, 1 to 4 chunks a source and tiles that end inside a segment; a word left
  at the previous call's epoch makes a bounded wait report an error and no other row changes; with
  the peers' rows landed once a token and rank and read through an index (`fused_dedup`), h is the
  same, where reading the same buffer plainly is not;
- combine: the "peers'" receive buffers and pads are local tensors (the kernel only sees
  pointers); every rank's kernel stores its rows there, and each rank's weighted top-k sum of its
  buffer equals the float32 reference; each piece's word is raised in its destination's pad, the
  counters are back at zero for the next call, a piece one count short raises nothing, a
  destination that has not entered makes a bounded wait report an error.

And the Triton compiler on the CPU, in a fresh process: both kernels (the dispatch also reading its
peer rows by index) compile for sm_90 with the tile configurations `moe_space` tries, their waits
acquire loads at system scope, their products on the tensor cores.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"

import pytest
import torch

from syncopate.kernels.tables import ENTERED_BASE, PAD_WORDS
from syncopate.measure.reference import moe_combine_reference, moe_dispatch_reference, moe_rows
from syncopate.moe import Routing, draw_routing, kernels
from syncopate.moe.fused import fused_tables
from syncopate.moe.kernels import launch_combine, launch_dispatch
from syncopate.moe.ops import _token_rows, token_pairs, weighted_sum
from syncopate.search_space import RoutingSpec
from syncopate.search_space.moe_workload import MOE_TILE_CONFIGS, MoeCandidate

HIDDEN, FFN, EXPERTS = 64, 32, 8
DTYPE = torch.float16
"""The kernels take bf16 or fp16; the interpreter's `tl.dot` multiplies bf16 operands as integers
(triton 3.9), so its tests run fp16 (the GPU tests run bf16)."""
CPU = torch.device("cpu")
TILES = {"block_m": 16, "block_n": 32, "block_k": 32, "num_warps": 4, "num_stages": 2}


def _config(chunks: int, order: str = "ring", **tiles) -> MoeCandidate:
    return MoeCandidate(
        template="fused", backend="copy_engine", chunks_per_source=chunks, order=order, **{**TILES, **tiles}
    )


def _routing(ws: int, kind: str, tokens: int, top_k: int, seed: int) -> Routing:
    if kind == "starved":  # the last rank's experts get no row
        gen = torch.Generator().manual_seed(seed)
        fed = EXPERTS - EXPERTS // ws
        ids = [
            torch.stack([torch.randperm(fed, generator=gen)[:top_k] for _ in range(tokens)])
            for _ in range(ws)
        ]
        weights = [torch.softmax(torch.randn(tokens, top_k, generator=gen), 1) for _ in range(ws)]
        return Routing(experts=EXPERTS, expert_ids=tuple(ids), gate_weights=tuple(weights))
    spec = RoutingSpec(distribution=kind, skew=5.0, seed=seed)
    return draw_routing(world_size=ws, tokens=tokens, experts=EXPERTS, top_k=top_k, spec=spec)


def _rand(*shape, gen, scale=1.0):
    return (torch.randn(*shape, generator=gen) * scale).to(DTYPE)


def _offsets(sizes):
    out, total = [], 0
    for n in sizes:
        out.append(total)
        total += n
    return out


class Dispatch:
    """Every rank's inputs and the buffers its peers' copies would fill."""

    def __init__(self, ws, kind, tokens, top_k, seed=0):
        self.ws, self.routing = ws, _routing(ws, kind, tokens, top_k, seed)
        self.layouts = [self.routing.layout(q) for q in range(ws)]
        gen = torch.Generator().manual_seed(100 + seed)
        el = EXPERTS // ws
        self.xs = [_rand(tokens, HIDDEN, gen=gen) for _ in range(ws)]
        self.w1s = [_rand(el, HIDDEN, 2 * FFN, gen=gen, scale=HIDDEN**-0.5) for _ in range(ws)]
        self.sends = [x[_token_rows(lay)] for x, lay in zip(self.xs, self.layouts)]
        self.ref = moe_dispatch_reference(self.xs, list(self.routing.expert_ids), self.w1s, EXPERTS)

    def received(self, r: int) -> torch.Tensor:
        """Rank r's receive buffer as the copies leave it: source s's rows at s's expert-side block;
        the own block (never copied) NaN, and NaN rows past the end."""
        lay = self.layouts[r]
        recv = torch.full((lay.rows_received + 8, HIDDEN), float("nan"), dtype=DTYPE)
        at = _offsets(lay.recv_splits)
        for s in range(self.ws):
            if s != r:
                start = _offsets(self.layouts[s].send_splits)[r]
                recv[at[s] : at[s] + lay.recv_splits[s]] = self.sends[s][start : start + lay.recv_splits[s]]
        return recv

    def run(self, r, config, *, epoch=5, pad=None, spin_limit=0, programs=3, recv=None):
        lay = self.layouts[r]
        tables = fused_tables(lay, "a2a_gemm", r, config, CPU)
        if pad is None:
            pad = self.pad(r, config, epoch)
        error = torch.zeros(1, dtype=torch.int32)
        h = torch.full((lay.rows_received, 2 * FFN), float("nan"), dtype=DTYPE)
        tiles = {k: getattr(config, k) for k in TILES}
        launch_dispatch(
            self.xs[r], _token_rows(lay), self.received(r) if recv is None else recv, self.w1s[r], h,
            tables.tiles, pad, error, epoch=epoch, programs=programs, spin_limit=spin_limit, **tiles,
        )  # fmt: skip
        return h, int(error.item()), tables

    def pad(self, r, config, epoch):
        pad = torch.zeros(PAD_WORDS, dtype=torch.int32)
        pad[: self.ws * config.chunks_per_source] = epoch
        return pad


def _check_rows(h: torch.Tensor, ref: torch.Tensor, rows) -> None:
    """h's rows `rows` against the float32 reference, one by one."""
    assert h.shape[0] == ref.shape[0]
    for i in rows:
        torch.testing.assert_close(h[i].float(), ref[i], rtol=2e-2, atol=2e-2, msg=f"row {i}")


@pytest.mark.parametrize(
    "ws, kind, tokens, top_k, chunks, order",
    [
        (2, "uniform", 24, 2, 1, "ring"),
        (2, "skewed", 20, 3, 2, "ring"),
        (4, "skewed", 12, 2, 4, "pairwise"),
        (4, "starved", 10, 2, 2, "ring"),
    ],
)
@pytest.mark.parametrize("group_m", [1, 3, 4])
def test_dispatch_computes_every_row_of_h_in_the_unfused_layout(
    ws, kind, tokens, top_k, chunks, order, group_m, monkeypatch
):
    monkeypatch.setattr(
        kernels, "DISPATCH_GROUP_M", group_m
    )  # row tiles taken together (3: a group cut short)
    case = Dispatch(ws, kind, tokens, top_k, seed=ws + chunks)
    config = _config(chunks, order)
    sizes, split_tiles = [], 0
    for r in range(ws):
        h, error, tables = case.run(r, config)
        assert error == 0
        _check_rows(h, case.ref[r], range(h.shape[0]))
        # the table: the tiles of no wait first, BLOCK_M rows at most, every row of h once
        t = tables.tiles.tolist()
        waits = [row[4] >= 0 for row in t]
        assert waits == sorted(waits)
        assert all(0 < row[3] <= config.block_m and 0 < row[6] <= row[3] for row in t)
        covered = sorted(i for row in t for i in range(row[5], row[5] + row[3]))
        assert covered == list(range(case.layouts[r].rows_received))
        split_tiles += sum(row[6] < row[3] for row in t)
        sizes += case.layouts[r].group_sizes.tolist()
    # the routing had experts of several sizes, and (skewed, starved) empty ones
    assert len(set(sizes)) > 2
    if kind != "uniform":
        assert 0 in sizes
    assert split_tiles > 0  # tiles that read the own rows' edge from x and the partner's from the buffer


def _deduplicated(case: Dispatch, r: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank r's receive buffer as `dedup`'s copies leave it (source s's tokens that chose one of r's
    experts, once each, by source then token; NaN rows past the end) and the row there of each
    expert-side row (what `fused_dedup` passes the kernel as `recv_index`)."""
    lay = case.layouts[r]
    at = _offsets(lay.recv_splits)
    rows, index = [], torch.empty(lay.rows_received, dtype=torch.int32)
    base = 0
    for s in range(case.ws):
        start = _offsets(case.layouts[s].send_splits)[r]
        pairs = _token_rows(case.layouts[s])[start : start + lay.recv_splits[s]]  # each pair's token
        tokens = torch.unique(pairs)
        if s != r:
            rows.append(case.xs[s][tokens])
        else:
            rows.append(torch.full((tokens.numel(), HIDDEN), float("nan"), dtype=DTYPE))  # read from x
        index[at[s] : at[s] + pairs.numel()] = base + torch.searchsorted(tokens, pairs).to(torch.int32)
        base += tokens.numel()
    rows.append(torch.full((8, HIDDEN), float("nan"), dtype=DTYPE))
    return torch.cat(rows), index


@pytest.mark.parametrize(
    "ws, kind, order", [(2, "uniform", "ring"), (4, "skewed", "pairwise"), (4, "starved", "ring")]
)
def test_dispatch_reads_deduplicated_rows_through_the_index(ws, kind, order):
    """`fused_dedup`'s dispatch: the peers' rows land once a token and rank, and each expert-side
    row is read through `recv_index`; h is the same. Without the index the same buffer gives wrong
    rows (the test can fail)."""
    case = Dispatch(ws, kind, 20, 3, seed=ws + 11)
    config = _config(1, order)
    for r in range(ws):
        lay = case.layouts[r]
        recv, index = _deduplicated(case, r)
        tables = fused_tables(lay, "a2a_gemm", r, config, CPU)
        h = torch.full((lay.rows_received, 2 * FFN), float("nan"), dtype=DTYPE)
        error = torch.zeros(1, dtype=torch.int32)
        tiles = {k: getattr(config, k) for k in TILES}
        run = dict(epoch=5, programs=3, **tiles)
        launch_dispatch(
            case.xs[r], _token_rows(lay), recv, case.w1s[r], h, tables.tiles, case.pad(r, config, 5), error,
            recv_index=index, **run,
        )  # fmt: skip
        assert int(error.item()) == 0
        _check_rows(h, case.ref[r], range(h.shape[0]))
        if recv.shape[0] - 8 < lay.rows_received:  # fewer rows than pairs: read plainly, some are wrong
            plain = torch.full_like(h, float("nan"))
            launch_dispatch(
                case.xs[r], _token_rows(lay), recv, case.w1s[r], plain, tables.tiles, case.pad(r, config, 5),
                error, **run,
            )  # fmt: skip
            assert not torch.allclose(plain.float(), case.ref[r], rtol=2e-2, atol=2e-2, equal_nan=False)


def test_dispatch_tiles_follow_the_pieces_in_arrival_order():
    case = Dispatch(4, "uniform", 128, 2, seed=3)  # ~32 rows a source an expert: the own rows fill tiles
    config = _config(2, "ring", block_m=16)
    r = 1
    tables = fused_tables(case.layouts[r], "a2a_gemm", r, config, CPU)
    words = [row[4] for row in tables.tiles.tolist()]
    plan = tables.prep.plan
    expected = [-1] + [
        p.source * 2 + p.chunk for p in plan.pieces if p.exchange is not None
    ]  # no wait first, then sources in exchange order: ring steps 1, 2, 3 receive from ranks 0, 3, 2
    seen = [w for i, w in enumerate(words) if i == 0 or w != words[i - 1]]
    assert seen == expected
    assert [p.source for p in plan.pieces[1:]][::2] == [0, 3, 2]


def _h_rows(layout, source: int, rows: tuple[int, int]) -> set[int]:
    """The rows of h that expert-side rows [lo, hi) of `source` become (h: by expert, then source)."""
    counts = layout.host_recv_counts()
    ws, el = len(counts), len(counts[0])
    side = sum(sum(counts[s]) for s in range(source))
    out, at = set(), 0
    for e in range(el):
        for s in range(ws):
            if s == source:
                for i in range(counts[s][e]):
                    if rows[0] <= side + i < rows[1]:
                        out.add(at + i)
                side += counts[s][e]
            at += counts[s][e]
    return out


def test_a_word_below_the_epoch_keeps_its_tiles_waiting_and_reports_it():
    case = Dispatch(2, "uniform", 24, 2, seed=7)
    config = _config(2)
    r, epoch = 0, 9
    lay = case.layouts[r]
    pad = case.pad(r, config, epoch)
    late = 1 * 2 + 1  # source 1, chunk 1: still the previous call's epoch
    pad[late] = epoch - 1
    tables = fused_tables(lay, "a2a_gemm", r, config, CPU)
    piece = next(p for p in tables.prep.plan.pieces if (p.source, p.chunk) == (1, 1))
    recv = case.received(r)
    recv[piece.rows[0] : piece.rows[1]] = float("nan")  # the late chunk's rows have not landed
    h, error, tables = case.run(r, config, epoch=epoch, pad=pad, spin_limit=50, recv=recv)
    assert error & 1  # the waited-for word named (`_timed_out`)
    late_rows = _h_rows(lay, 1, piece.rows)
    assert late_rows, "the late chunk has rows"
    _check_rows(h, case.ref[r], [i for i in range(lay.rows_received) if i not in late_rows])
    # the late rows were read after the bounded wait gave up: the poisoned buffer, not the data
    assert all(torch.isnan(h[i]).all() for i in late_rows)
    pad[late] = epoch
    h, error, _ = case.run(r, config, epoch=epoch, pad=pad, spin_limit=50)
    assert error == 0
    _check_rows(h, case.ref[r], range(lay.rows_received))


class Combine:
    """Every rank's h and W2, and every rank's receive buffer and pad as local tensors."""

    def __init__(self, ws, kind, tokens, top_k, seed=0):
        self.ws, self.routing = ws, _routing(ws, kind, tokens, top_k, seed)
        self.layouts = [self.routing.layout(q) for q in range(ws)]
        gen = torch.Generator().manual_seed(200 + seed)
        el = EXPERTS // ws
        self.hs = [_rand(lay.rows_received, FFN, gen=gen) for lay in self.layouts]
        self.w2s = [_rand(el, FFN, HIDDEN, gen=gen, scale=FFN**-0.5) for _ in range(ws)]
        rows = max(lay.tokens * lay.top_k for lay in self.layouts) + 8
        self.buffers = [torch.full((rows, HIDDEN), float("nan"), dtype=DTYPE) for _ in range(ws)]
        self.pads = [torch.zeros(PAD_WORDS, dtype=torch.int32) for _ in range(ws)]
        self.counters = torch.zeros(64, dtype=torch.int64)
        self.dest = torch.tensor([b.data_ptr() for b in self.buffers], dtype=torch.int64)
        self.pad_ptrs = torch.tensor([p.data_ptr() for p in self.pads], dtype=torch.int64)

    def enter(self, epoch, skip=()):
        """Every rank has entered call `epoch` (but those of `skip`): the words in every pad."""
        for pad in self.pads:
            for q in range(self.ws):
                if q not in skip:
                    pad[ENTERED_BASE + q] = epoch

    def run(self, r, config, *, epoch, spin_limit=0, programs=3, counters=None):
        lay = self.layouts[r]
        tables = fused_tables(lay, "gemm_a2a", r, config, CPU)
        error = torch.zeros(1, dtype=torch.int32)
        tiles = {k: getattr(config, k) for k in TILES}
        launch_combine(
            self.hs[r], self.w2s[r], self.dest, HIDDEN, tables.tiles, tables.piece_tiles,
            self.counters if counters is None else counters, self.pads[r], self.pad_ptrs, error,
            epoch=epoch, programs=programs, spin_limit=spin_limit, **tiles,
        )  # fmt: skip
        return int(error.item()), tables

    def sums(self, q):
        lay = self.layouts[q]
        back = self.buffers[q][: lay.tokens * lay.top_k]
        return weighted_sum(token_pairs(back, lay), self.routing.gate_weights[q]).float()

    def reference(self):
        return moe_combine_reference(
            self.hs, self.w2s, list(self.routing.expert_ids), list(self.routing.gate_weights), EXPERTS
        )


def _sent_words(tables, r, chunks):
    """(destination, word) of every piece rank r's plan sends."""
    plan = tables.prep.plan
    return {(p.source, r * chunks + p.chunk) for p in plan.pieces if p.exchange is not None}


@pytest.mark.parametrize(
    "ws, kind, tokens, top_k, chunks, order",
    [
        (2, "uniform", 24, 2, 1, "ring"),
        (2, "skewed", 20, 3, 4, "ring"),
        (4, "starved", 10, 2, 2, "pairwise"),
    ],
)
def test_combine_stores_every_row_where_its_token_s_rank_sums_it(ws, kind, tokens, top_k, chunks, order):
    case = Combine(ws, kind, tokens, top_k, seed=ws * chunks)
    config = _config(chunks, order)
    ref = case.reference()
    for epoch in (3, 4):  # back to back: counters start at zero again, words take the new epoch
        for b in case.buffers:
            b.fill_(float("nan"))
        case.enter(epoch)
        sent, split_tiles = set(), 0
        for r in range(ws):
            error, tables = case.run(r, config, epoch=epoch)
            assert error == 0
            assert int(case.counters.abs().sum()) == 0
            sent |= {(q, w) for q, w in _sent_words(tables, r, chunks)}
            split_tiles += int((tables.tiles[:, 8] < tables.tiles[:, 2]).sum())
        assert split_tiles > 0  # tiles that store to two ranks
        for q in range(ws):
            raised = {(q, w) for w in range(ws * chunks) if int(case.pads[q][w]) == epoch}
            assert raised == {(d, w) for d, w in sent if d == q}
            assert all(int(case.pads[q][w]) == 0 for w in range(ws * chunks) if (q, w) not in sent)
            torch.testing.assert_close(case.sums(q), ref[q], rtol=2e-2, atol=2e-2, msg=f"rank {q}")


@pytest.mark.parametrize("block_k", [64, 128])
def test_tiles_that_overhang_k_and_n_mask_their_loads_and_give_the_same_rows(block_k):
    """Tiles 128 columns wide over W's 64 (dispatch) and 64 rows deep over its 32 (combine), or
    128 deep over either: the kernels' loads masked along K (and N), the rows as with tiles that
    fit. (A column past N is dropped at the store whatever its load read: only a GPU's memory
    checker would see a missing N mask.)"""
    config = _config(2, block_n=128, block_k=block_k)
    case = Dispatch(2, "skewed", 20, 3, seed=7)
    for r in range(2):
        h, error, _ = case.run(r, config)
        assert error == 0
        _check_rows(h, case.ref[r], range(h.shape[0]))
    case = Combine(2, "skewed", 20, 3, seed=7)
    ref = case.reference()
    case.enter(3)
    for r in range(2):
        error, _ = case.run(r, config, epoch=3)
        assert error == 0
    for q in range(2):
        torch.testing.assert_close(case.sums(q), ref[q], rtol=2e-2, atol=2e-2, msg=f"rank {q}")


def test_combine_rows_land_where_the_destination_keeps_them():
    """Row by row: rank r's row i of h (by expert, source, token) times its expert's W2 at the row
    of its source's token side that holds that (token, expert) pair."""
    ws = 2
    case = Combine(ws, "skewed", 16, 3, seed=11)
    config = _config(2, block_m=16)
    case.enter(1)
    r = 1
    error, _ = case.run(r, config, epoch=1)
    assert error == 0
    ids = list(case.routing.expert_ids)
    local = EXPERTS // ws
    for i, (s, t, k) in enumerate(moe_rows(ids, EXPERTS, r)):
        e = ids[s][t, k].item() - r * local
        expected = case.hs[r][i].float() @ case.w2s[r][e].float()
        lay = case.layouts[s]
        pair = t * lay.top_k + k
        at = int(lay.order_inverse[pair])  # the pair's row in s's send order
        torch.testing.assert_close(case.buffers[s][at].float(), expected, rtol=2e-2, atol=2e-2)


def test_a_piece_one_count_short_raises_nothing():
    case = Combine(2, "uniform", 24, 2, seed=5)
    config = _config(2)
    case.enter(2)
    counters = torch.zeros(64, dtype=torch.int64)
    counters[0] = -1  # as if a tile of the first piece had not been counted yet
    error, tables = case.run(0, config, epoch=2, counters=counters)
    assert error == 0
    plan = tables.prep.plan
    first = next(p for p in plan.pieces if p.exchange is not None)
    assert int(case.pads[first.source][first.chunk]) == 0  # word 0 · chunks + chunk, not raised
    total = int(tables.piece_tiles[0]) * (HIDDEN // TILES["block_n"])
    assert int(counters[0]) == total - 1  # counted, not reset
    others = [p for p in plan.pieces if p.exchange is not None and p is not first]
    assert others and all(int(case.pads[p.source][p.chunk]) == 2 for p in others)
    assert all(int(c) == 0 for c in counters[1 : tables.piece_tiles.shape[0]])


def test_a_destination_that_has_not_entered_makes_the_wait_report_it():
    case = Combine(2, "uniform", 24, 2, seed=6)
    config = _config(1)
    case.enter(7, skip=(1,))
    for pad in case.pads:
        pad[ENTERED_BASE + 1] = 6  # rank 1 is still in the previous call
    error, _ = case.run(0, config, epoch=7, spin_limit=50)
    assert error & 1  # the waited-for word named (`_timed_out`)
    case.enter(7)
    error, _ = case.run(0, config, epoch=7, spin_limit=50)
    assert error == 0


@pytest.mark.parametrize("tokens, top_k, experts", [(1, 1, 3), (300, 4, 12), (700, 3, 128)])
def test_pair_stats_equal_the_torch_steps(tokens, top_k, experts):
    """`launch_pair_stats` (the CUDA path of `routing.pair_stats`) against the torch steps of the
    CPU path, on routings drawn distinct a token, with a repeat planted, and with ids outside
    [0, experts); more keys than one program's block."""
    from syncopate.moe.kernels import launch_pair_stats
    from syncopate.moe.routing import pair_stats

    gen = torch.Generator().manual_seed(tokens)
    distinct = torch.stack([torch.randperm(experts, generator=gen)[:top_k] for _ in range(tokens)])
    repeated = distinct.clone()
    if top_k > 1:
        repeated[tokens // 2, 1] = repeated[tokens // 2, 0]
    outside = distinct.clone()
    outside[0, 0], outside[-1, -1] = -2, experts + 1
    for ids in (distinct, repeated, outside):
        order, want = pair_stats(ids, experts)  # on the CPU: torch's steps
        keys = ids.reshape(-1)[order]
        got = launch_pair_stats(keys, order, top_k, experts)
        assert got.tolist() == want.tolist()
    assert int(pair_stats(repeated, experts)[1][-1]) == int(top_k > 1)


def test_expert_orders_equal_the_torch_steps():
    """`launch_expert_orders` (the CUDA path of the layout's expert-side permutations) against the
    CPU path's repeat_interleave, on receive counts with empty blocks, empty experts and ranks, and
    more rows than one program's block."""
    from syncopate.moe.kernels import launch_expert_orders
    from syncopate.moe.routing import _expert_orders, _order_blocks

    gen = torch.Generator().manual_seed(9)
    for ws, el, most in ((1, 1, 5), (2, 3, 7), (2, 64, 60), (4, 5, 300)):
        recv = torch.randint(0, most, (ws, el), generator=gen) * (torch.rand(ws, el, generator=gen) > 0.25)
        rows, blocks = _order_blocks(recv)
        got = launch_expert_orders(torch.from_numpy(blocks[[0, 1, 3, 4]]), rows)
        want = _expert_orders(recv, CPU)
        assert [g.tolist() for g in got] == [w.tolist() for w in want], recv


def test_the_kernels_compile_for_sm90():
    script = Path(__file__).parent / "support" / "compile_moe_sm90.py"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(script.parents[2]), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    ok = [line for line in done.stdout.splitlines() if line.startswith("ok ")]
    # the gathered sum's three, the row scatter, the segment sum's two, the pair stats, the expert
    # orders, the SwiGLU's two, the NVSHMEM put and copier
    row_kernels = 3 + 1 + 2 + 1 + 1 + 2 + 2
    assert len(ok) == 3 * len(MOE_TILE_CONFIGS) + row_kernels, done.stdout  # dispatch, gathered, combine
    copiers = [line for line in ok if line.split()[1] == "nvshmem"]
    assert len(copiers) == 2 and all(" 0 acquire loads" not in line for line in copiers), done.stdout
    gemms = [line for line in ok if line.split()[1] in ("dispatch", "combine")]
    assert len(gemms) == 3 * len(MOE_TILE_CONFIGS), done.stdout
    assert all(" 0 acquire loads" not in line and " 0 wgmma" not in line for line in gemms), done.stdout
