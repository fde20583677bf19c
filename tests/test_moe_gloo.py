"""Layer: gloo process groups on the CPU. The unfused MoE ops (`exchange_layout`, `dispatch_gemm`,
`gemm_combine`) on 2 and 4 ranks against the float32 references computed from every rank's inputs:
fresh routings (uniform, and skewed with experts that get no token), outputs poisoned with NaN
before each call, calls back to back, bf16 through `torch._grouped_mm` and float32 through the
matmul loop. The references computed by the group together (`moe_*_group_reference`, for shapes
too large for the loops) against the loops'."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from support.gloo import run_gloo

CASES = [
    # (dtype, distribution, skew, tokens, top_k)
    ("bf16", "uniform", 0.0, 12, 2),
    ("bf16", "skewed", 2.5, 5, 2),
    ("fp32", "skewed", 3.0, 3, 1),
    ("fp32", "uniform", 0.0, 7, 4),
]
HIDDEN, FFN, EXPERTS_A_RANK = 16, 8, 2


def _worker(rank, ws, init, q):
    from syncopate.measure.reference import (
        moe_combine_group_reference,
        moe_combine_reference,
        moe_dispatch_group_reference,
        moe_dispatch_reference,
        relative_error,
    )
    from syncopate.moe import dispatch_gemm, draw_routing, exchange_layout, gemm_combine
    from syncopate.moe.ops import uses_grouped_mm
    from syncopate.search_space import RoutingSpec

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=ws)
    g = dist.group.WORLD
    experts = EXPERTS_A_RANK * ws
    results = []
    try:
        for call, (dtype_name, dist_name, skew, tokens, top_k) in enumerate(CASES * 2):  # back to back, twice
            dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype_name]
            routing = draw_routing(
                world_size=ws,
                tokens=tokens,
                experts=experts,
                top_k=top_k,
                spec=RoutingSpec(distribution=dist_name, skew=skew, seed=100 * ws + call),
            )
            gen = torch.Generator().manual_seed(7 * call + ws)
            xs = [torch.randn(tokens, HIDDEN, generator=gen).to(dtype) for _ in range(ws)]
            w1s = [torch.randn(EXPERTS_A_RANK, HIDDEN, 2 * FFN, generator=gen).to(dtype) for _ in range(ws)]
            w2s = [torch.randn(EXPERTS_A_RANK, FFN, HIDDEN, generator=gen).to(dtype) for _ in range(ws)]
            layouts = [routing.layout(r) for r in range(ws)]
            hs = [torch.randn(lay.rows_received, FFN, generator=gen).to(dtype) for lay in layouts]
            ids, weights = list(routing.expert_ids), list(routing.gate_weights)

            layout = exchange_layout(ids[rank], experts, g)
            same_tables = (
                layout.send_splits == layouts[rank].send_splits
                and layout.recv_splits == layouts[rank].recv_splits
                and torch.equal(layout.group_sizes, layouts[rank].group_sizes)
            )
            up = torch.full((layout.rows_received, 2 * FFN), float("nan"), dtype=dtype)
            got_up = dispatch_gemm(xs[rank], w1s[rank], layout, g, out=up)
            down = torch.full((tokens, HIDDEN), float("nan"), dtype=dtype)
            got_down = gemm_combine(hs[rank], w2s[rank], weights[rank], layout, g, out=down)
            ref_up = moe_dispatch_reference(xs, ids, w1s, experts)[rank]
            ref_down = moe_combine_reference(hs, w2s, ids, weights, experts)[rank]
            group_up = moe_dispatch_group_reference(xs[rank], ids[rank], w1s[rank], experts, g)
            group_down = moe_combine_group_reference(
                hs[rank], w2s[rank], ids[rank], weights[rank], experts, g
            )
            results.append(
                {
                    "case": (call, dtype_name, dist_name, tokens, top_k),
                    "same_tables": same_tables,
                    "written": got_up is up and got_down is down,
                    "grouped_mm": uses_grouped_mm(xs[rank], w1s[rank]),
                    "empty_experts": int((routing.counts().sum(0) == 0).sum()),
                    "up_error": relative_error(got_up, ref_up) if ref_up.numel() else float(got_up.numel()),
                    "down_error": relative_error(got_down, ref_down),
                    "group_up_error": relative_error(group_up, ref_up)
                    if ref_up.numel()
                    else float(group_up.numel()),
                    "group_down_error": relative_error(group_down, ref_down),
                }
            )
        q.put((rank, results))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("ws", [2, 4])
def test_unfused_moe_ops_match_the_reference(ws):
    got = run_gloo(_worker, ws, timeout=120)
    assert sorted(r for r, _ in got) == list(range(ws))
    empties = 0
    for rank, results in got:
        assert len(results) == 2 * len(CASES)
        for res in results:
            case = res["case"]
            tolerance = 1e-2 if case[1] == "bf16" else 1e-5
            assert res["same_tables"], (rank, case)
            assert res["written"], (rank, case)
            assert res["grouped_mm"] == (case[1] == "bf16"), (rank, case)
            assert res["up_error"] < tolerance, (rank, case, res["up_error"])
            assert res["down_error"] < tolerance, (rank, case, res["down_error"])
            assert res["group_up_error"] < 1e-6 and res["group_down_error"] < 1e-6, (rank, case, res)
            empties += res["empty_experts"]
    assert empties > 0  # the skewed cases route no token to some experts


def _bad_ids_worker(rank, ws, init, q):
    from syncopate.errors import ConfigError
    from syncopate.moe import exchange_layout

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=ws)
    try:
        messages = []
        for bad in (torch.tensor([[0, 9], [1, 2]]), torch.tensor([[0, 1], [3, 3]])):
            ids = bad if rank == 1 else torch.tensor([[0, 1], [2, 3]])
            try:
                exchange_layout(ids, 4, dist.group.WORLD)
                messages.append("accepted")
            except ConfigError as e:
                messages.append(str(e))
        q.put((rank, messages))
    finally:
        dist.destroy_process_group()


def test_bad_ids_on_one_rank_are_refused_on_every_rank():
    """The ids' checks travel with the counts: every rank raises, naming the rank whose ids are
    bad, and none is left waiting in the collective."""
    got = dict(run_gloo(_bad_ids_worker, 2, timeout=60))
    for rank in range(2):
        span, repeat = got[rank]
        assert "rank 1's expert ids span [0, 9]: accepted are 0 to 3 (4 experts)" in span, (rank, span)
        assert "rank 1's expert ids repeat an expert within a token" in repeat, (rank, repeat)
