"""Layer: gloo process groups on the CPU. The `dedup` MoE template (`syncopate.moe.dedup`) against
the float32 references computed from every rank's inputs, and its gradients against the unfused
ops' on the same inputs: uniform routings, skewed ones with experts that get no token, every
expert of a rank chosen by every token (top_k = experts), one rank's experts only; outputs written
into NaN-poisoned `out=`, calls back to back; float32 through the matmul loop, bf16 through
`torch._grouped_mm`. Each rank checks that it sends a token's row once a rank. The same for the
pipelined plans of `syncopate.moe.dedup_pipelined` (a piece a source rank, in both orders), run on
the send/receive exchange that gloo moves."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from support.gloo import run_gloo

CASES = [
    # (dtype, distribution, skew, tokens, top_k, experts a rank)
    ("fp32", "uniform", 0.0, 9, 3, 2),
    ("fp32", "skewed", 3.0, 6, 2, 2),
    ("bf16", "uniform", 0.0, 12, 4, 3),
    ("fp32", "uniform", 0.0, 5, "all", 2),  # every expert: each token goes to every rank
    ("fp32", "local", 0.0, 7, 2, 2),  # every token's experts on one rank (its own)
]
HIDDEN, FFN = 16, 8
ORDERS = ("ring", "pairwise")


def _routing(ws, dist_name, skew, tokens, top_k, experts, seed):
    from syncopate.moe import Routing, draw_routing
    from syncopate.search_space import RoutingSpec

    if dist_name != "local":
        return draw_routing(
            world_size=ws,
            tokens=tokens,
            experts=experts,
            top_k=top_k,
            spec=RoutingSpec(distribution=dist_name, skew=skew, seed=seed),
        )
    el = experts // ws
    gen = torch.Generator().manual_seed(seed)
    ids = [
        torch.stack([torch.randperm(el, generator=gen)[:top_k] + r * el for _ in range(tokens)])
        for r in range(ws)
    ]
    weights = [torch.softmax(torch.randn(tokens, top_k, generator=gen), 1) for _ in range(ws)]
    return Routing(experts=experts, expert_ids=tuple(ids), gate_weights=tuple(weights))


def _worker(rank, ws, init, q):
    from syncopate.measure.reference import moe_combine_reference, moe_dispatch_reference, relative_error
    from syncopate.moe import MoeCandidate, dedup_pipelined, dispatch_gemm, exchange_layout, gemm_combine
    from syncopate.moe.dedup import dedup_tables, expert_gates

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=ws)
    g = dist.group.WORLD
    dedup = MoeCandidate(template="dedup")
    results = []
    try:
        for call, (dtype_name, dist_name, skew, tokens, top_k, el) in enumerate(CASES * 2):
            dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype_name]
            experts = el * ws
            k = experts if top_k == "all" else top_k
            routing = _routing(ws, dist_name, skew, tokens, k, experts, 100 * ws + call)
            gen = torch.Generator().manual_seed(7 * call + ws)
            xs = [torch.randn(tokens, HIDDEN, generator=gen).to(dtype) for _ in range(ws)]
            w1s = [torch.randn(el, HIDDEN, 2 * FFN, generator=gen).to(dtype) for _ in range(ws)]
            w2s = [torch.randn(el, FFN, HIDDEN, generator=gen).to(dtype) for _ in range(ws)]
            layouts = [routing.layout(r) for r in range(ws)]
            hs = [torch.randn(lay.rows_received, FFN, generator=gen).to(dtype) for lay in layouts]
            ids, weights = list(routing.expert_ids), list(routing.gate_weights)
            layout = exchange_layout(ids[rank], experts, g)

            up = torch.full((layout.rows_received, 2 * FFN), float("nan"), dtype=dtype)
            got_up = dispatch_gemm(xs[rank], w1s[rank], layout, g, out=up, config=dedup)
            down = torch.full((tokens, HIDDEN), float("nan"), dtype=dtype)
            got_down = gemm_combine(hs[rank], w2s[rank], weights[rank], layout, g, out=down, config=dedup)
            ref_up = moe_dispatch_reference(xs, ids, w1s, experts)[rank]
            ref_down = moe_combine_reference(hs, w2s, ids, weights, experts)[rank]

            # the pipelined dedup plans (syncopate.moe.dedup_pipelined) on the P2P exchange, which
            # gloo runs: the copy engine's plan, moved by send/receive pairs
            pieces = {}
            for order in ORDERS:
                plan = MoeCandidate(template="pipelined", backend="nccl", order=order)
                up2 = torch.full((layout.rows_received, 2 * FFN), float("nan"), dtype=dtype)
                dedup_pipelined.dispatch_rows(xs[rank], w1s[rank], layout, g, plan, out=up2)
                down2 = torch.full((tokens, HIDDEN), float("nan"), dtype=dtype)
                gates = expert_gates(weights[rank], layout, g)
                dedup_pipelined.combine_rows(hs[rank], w2s[rank], gates, layout, g, plan, out=down2)
                pieces[order] = (up2, down2)

            # gradients against the unfused ops' on the same inputs and output gradients
            grads = {}
            runs = [("dedup", dedup), ("unfused", None)] + [(order, order) for order in ORDERS]
            for name, config in runs:
                x = xs[rank].clone().requires_grad_(True)
                w1 = w1s[rank].clone().requires_grad_(True)
                h = hs[rank].clone().requires_grad_(True)
                w2 = w2s[rank].clone().requires_grad_(True)
                gate = weights[rank].clone().requires_grad_(True)
                if name in ORDERS:
                    plan = MoeCandidate(template="pipelined", backend="nccl", order=config)
                    a = dedup_pipelined.dispatch(x, w1, layout, g, plan)
                    b = dedup_pipelined.combine(h, w2, gate, layout, g, plan)
                else:
                    a = dispatch_gemm(x, w1, layout, g, config=config)
                    b = gemm_combine(h, w2, gate, layout, g, config=config)
                seed = torch.Generator().manual_seed(call)
                (a.float() * torch.randn(a.shape, generator=seed)).sum().backward()
                (b.float() * torch.randn(b.shape, generator=seed)).sum().backward()
                grads[name] = [t.grad for t in (x, w1, h, w2, gate)]

            tables = dedup_tables(layout, g)
            # the same tables from a layout that carries every rank's rows a rank (no second wait)
            carried = exchange_layout(ids[rank], experts, g, dedup=True)
            same = dedup_tables(carried, g)
            carried_equal = "dedup rows" in carried.cache and all(
                torch.equal(getattr(tables, name).index, getattr(same, name).index)
                and torch.equal(getattr(tables, name).starts, getattr(same, name).starts)
                for name in ("send_tokens", "pair_rows")
            )
            carried_equal &= (same.matrix, same.send_splits, same.recv_splits) == (
                tables.matrix,
                tables.send_splits,
                tables.recv_splits,
            )
            sent_pairs = torch.zeros(ws, tokens, dtype=torch.bool)
            dests = ids[rank] // el
            for t in range(tokens):
                sent_pairs[dests[t].unique(), t] = True
            results.append(
                {
                    "case": (call, dtype_name, dist_name, tokens, top_k),
                    "written": got_up is up and got_down is down,
                    "up_error": relative_error(got_up, ref_up) if ref_up.numel() else float(got_up.numel()),
                    "down_error": relative_error(got_down, ref_down),
                    "grad_errors": [
                        relative_error(d, u) if u.numel() else 0.0
                        for name in ("dedup", *ORDERS)
                        for d, u in zip(grads[name], grads["unfused"], strict=True)
                    ],
                    "pipelined_errors": [
                        err
                        for up2, down2 in pieces.values()
                        for err in (
                            relative_error(up2, ref_up) if ref_up.numel() else float(up2.numel()),
                            relative_error(down2, ref_down),
                        )
                    ],
                    "send_splits": tables.send_splits,
                    "expected_splits": sent_pairs.sum(1).tolist(),
                    "pair_splits": list(layout.send_splits),
                    "cached": dedup_tables(layout, g) is tables,
                    "carried_equal": carried_equal,
                }
            )
        q.put((rank, results))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("ws", [2, 4])
def test_dedup_moe_ops_match_the_reference_and_the_unfused_gradients(ws):
    got = run_gloo(_worker, ws, timeout=120)
    assert sorted(r for r, _ in got) == list(range(ws))
    for rank, results in got:
        assert len(results) == 2 * len(CASES)
        for res in results:
            case = res["case"]
            tolerance = 2e-2 if case[1] == "bf16" else 1e-5
            assert res["written"], (rank, case)
            assert res["up_error"] < tolerance, (rank, case, res["up_error"])
            assert res["down_error"] < tolerance, (rank, case, res["down_error"])
            assert max(res["grad_errors"]) < tolerance, (rank, case, res["grad_errors"])
            assert max(res["pipelined_errors"]) < tolerance, (rank, case, res["pipelined_errors"])
            # a token's row goes once to each rank holding one of its experts
            assert res["send_splits"] == res["expected_splits"], (rank, case, res)
            assert res["carried_equal"], (rank, case)
            assert all(s <= p for s, p in zip(res["send_splits"], res["pair_splits"], strict=True))
            assert res["cached"]
            if case[4] == "all":  # every token to every rank, once
                assert res["send_splits"] == [case[3]] * ws, (rank, case, res)
            if case[2] == "local":  # nothing leaves the rank
                assert [s for r, s in enumerate(res["send_splits"]) if r != rank] == [0] * (ws - 1)
