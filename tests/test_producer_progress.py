"""Layer: pure CPU logic. A reduce-scatter's waits as the producer kernel and the three backends
run them (tests/support/progress.py), stepped until nothing moves: every producer candidate the
search space offers on 2, 4 and 8 GPUs completes, for persistent grids smaller than the tile count;
and what `stall_risk` keeps out does deadlock there. The all-reduce's reduce phase is the same."""

from __future__ import annotations

import itertools

import pytest
from support.progress import stalled

from syncopate.errors import ConfigError
from syncopate.search_space import (
    PRODUCER_ORDERS,
    TEMPLATES,
    Candidate,
    Topology,
    Workload,
    build_plan,
    check_candidate,
    stall_risk,
)

BACKENDS = ("copy_engine", "nvshmem", "nccl")
N_COLS = 512
"""Four column tiles of 128: fewer than the grid, as on the GPUs."""


def cases(ws: int):
    """Blocks of 512 rows (a multiple of every BLOCK_M), plans of every template and 1, 2, 4
    splits, grids of 10 and 26 programs (fewer than the 4·4·ws to 8·4·ws tiles)."""
    for template, splits, (bm, bn), programs, group_m in itertools.product(
        TEMPLATES, (1, 2, 4), ((128, 128), (64, 128)), (10, 26), (1, 4, 8)
    ):
        if template == "bidirectional_ring" and splits < 2 or ws == 2 and template == "ring":
            continue
        yield build_plan(template, "reduce_scatter", ws, 512 * ws, splits, align=bm), bm, bn, programs, group_m


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("ws", [2, 4, 8])
def test_producer_orders_complete_exactly_where_the_space_offers_them(ws, backend):
    for order in PRODUCER_ORDERS:
        risk = stall_risk("gemm_rs", order, backend, ws)
        stalls = []
        for plan, bm, bn, programs, group_m in cases(ws):
            left = stalled(plan, N_COLS, bm, bn, group_m, order, programs, backend)
            if left:
                stalls.append((plan.template, plan.num_splits, bm, programs, group_m, len(left)))
        if risk:
            assert stalls, f"{order} on {ws} GPUs with {backend} is kept out ({risk}) but never stalls"
        else:
            assert not stalls, f"{order} on {ws} GPUs with {backend} stalls: (template, splits, bm, programs, " \
                               f"group_m, programs left) {stalls[:4]}"


def test_check_candidate_refuses_what_can_deadlock():
    w = Workload(kind="gemm_rs", shape=(8192, 8192, 8192))
    row_major = Candidate(tile_order="row_major", group_m=1)
    check_candidate(row_major, w, Topology.from_key("H200x2-nvlink"))
    check_candidate(row_major, Workload(kind="ag_gemm", shape=(8192, 8192, 8192)), Topology.from_key("H200x8-nvswitch"))
    with pytest.raises(ConfigError, match="tile order 'row_major' can deadlock gemm_rs with backend copy_engine on 8"):
        check_candidate(row_major, w, Topology.from_key("H200x8-nvswitch"))
    with pytest.raises(ConfigError, match="backend nccl on 2 GPUs: a batch's receives wait for its sends"):
        check_candidate(row_major.replace(backend="nccl", comm_sms=16), w, Topology.from_key("H200x2-nvlink"))
    with pytest.raises(ConfigError, match="'swizzle' can deadlock gemm_ar .* use arrival or arrival_colmajor"):
        check_candidate(Candidate(tile_order="swizzle"), Workload(kind="gemm_ar", shape=(8192, 8192, 8192)),
                        Topology.from_key("H200x4-nvswitch"))


@pytest.mark.xfail(strict=True, reason=(
    "syncopate/search_space/tile_order.py (being changed elsewhere): on 3 or more GPUs, where M/ws is "
    "not a multiple of BLOCK_M, the producer's arrival orders place a tile with rows of two chunks "
    "behind tiles that wait for partials, though a peer waits for the chunk it completes"))
@pytest.mark.parametrize("ws, template", [(4, "ring"), (8, "bidirectional_ring")])
def test_arrival_order_with_tiles_across_two_blocks_completes(ws, template):
    # tests/test_gpu_ops.py's M=4160: 1040 or 520 rows a rank, 128-row tiles straddle blocks.
    plan = build_plan(template, "reduce_scatter", ws, 4160, 2, align=128)
    assert not stalled(plan, 1024, 128, 128, 8, "arrival", 132, "copy_engine")
