"""Layer: pure CPU logic. MoE workloads and routings: the values check themselves, the draw is
deterministic and follows its distribution, and the tables derived from a routing (counts, split
sizes, permutations) are consistent with one another and with the routing written out as loops."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from syncopate.errors import ConfigError
from syncopate.moe import draw_routing, expert_layout, inverse
from syncopate.moe.bench_config import load_moe_config, moe_cases
from syncopate.moe.routing import Routing, check_ids
from syncopate.search_space import MoeWorkload, RoutingSpec, Shape, Workload


def _workload(**kw):
    base = {"kind": "a2a_gemm", "tokens": 4096, "hidden": 2048, "ffn": 768, "experts": 128, "top_k": 8}
    return MoeWorkload(**{**base, **kw})


def test_moe_workload_round_trips_and_refuses_bad_values():
    w = _workload(routing=RoutingSpec(distribution="skewed", skew=1.5, seed=3))
    assert MoeWorkload.from_dict(w.to_dict()) == w
    assert w.key() == "a2a_gemm/t4096-h2048-f768-e128-k8/skewed1.5-seed3/bf16"
    assert w.local_shapes(4) == {"x": (4096, 2048), "w": (32, 2048, 1536), "out": (32768, 1536)}
    assert _workload(kind="gemm_a2a").local_shapes(2)["w"] == (64, 768, 2048)
    for kw, words in (
        ({"kind": "ag_gemm"}, "accepted are a2a_gemm, gemm_a2a"),
        ({"top_k": 129}, "top_k=129 is more than experts=128"),
        ({"tokens": 0}, "tokens=0 must be positive"),
        ({"dtype": "fp8"}, "accepted are bf16, fp16, fp32"),
        ({"routing": {"distribution": "zipf"}}, "accepted are uniform, skewed"),
    ):
        with pytest.raises(ConfigError, match=words):
            _workload(**kw)
    with pytest.raises(ConfigError, match="experts=128 is not divisible by world size 3"):
        w.check_world_size(3)


def test_tuned_kinds_refuse_the_moe_kinds_by_name():
    with pytest.raises(ConfigError, match="'a2a_gemm' is a mixture-of-experts op, run by syncopate.moe"):
        Workload(kind="a2a_gemm", shape=Shape(m=8, n=8, k=8))
    with pytest.raises(ConfigError, match="unknown kind 'nope': accepted are ag_gemm"):
        Workload(kind="nope", shape=Shape(m=8, n=8, k=8))
    from syncopate.autotuner.sweep import parse_sweep

    with pytest.raises(ConfigError, match="workloads.0.kind: kind 'gemm_a2a' is a mixture-of-experts op"):
        parse_sweep({"name": "x", "workloads": [{"kind": "gemm_a2a", "shapes": [[8, 8, 8]]}]})


def _loop_counts(routing: Routing) -> list[list[int]]:
    table = [[0] * routing.experts for _ in range(routing.world_size)]
    for s, ids in enumerate(routing.expert_ids):
        for row in ids.tolist():
            for e in row:
                table[s][e] += 1
    return table


@pytest.mark.parametrize(
    "ws, tokens, experts, top_k, spec",
    [
        (2, 16, 8, 1, RoutingSpec()),
        (2, 16, 8, 2, RoutingSpec(seed=4)),
        (4, 9, 16, 4, RoutingSpec(distribution="skewed", skew=2.5, seed=1)),
        (4, 3, 32, 1, RoutingSpec(distribution="skewed", skew=3.0)),
        (1, 5, 4, 4, RoutingSpec()),
    ],
)
def test_tables_are_consistent(ws, tokens, experts, top_k, spec):
    routing = draw_routing(world_size=ws, tokens=tokens, experts=experts, top_k=top_k, spec=spec)
    again = draw_routing(world_size=ws, tokens=tokens, experts=experts, top_k=top_k, spec=spec)
    assert all(torch.equal(a, b) for a, b in zip(routing.expert_ids, again.expert_ids, strict=True))
    counts = routing.counts()
    assert counts.tolist() == _loop_counts(routing)
    assert int(counts.sum()) == ws * tokens * top_k
    local = experts // ws
    layouts = [routing.layout(r) for r in range(ws)]
    for r, lay in enumerate(layouts):
        ids = routing.expert_ids[r]
        n = tokens * top_k
        assert sorted(lay.order.tolist()) == list(range(n))
        assert torch.equal(lay.order[lay.order_inverse], torch.arange(n))
        # grouped by destination, then expert, then token
        sent = ids.reshape(-1)[lay.order]
        assert sent.tolist() == sorted(sent.tolist())
        assert lay.send_splits == [int(counts[r, d * local : (d + 1) * local].sum()) for d in range(ws)]
        assert lay.recv_splits == [int(counts[s, r * local : (r + 1) * local].sum()) for s in range(ws)]
        assert lay.group_sizes.tolist() == counts[:, r * local : (r + 1) * local].sum(0).tolist()
        rows = lay.rows_received
        assert sorted(lay.expert_order.tolist()) == list(range(rows))
        assert torch.equal(lay.expert_order_inverse[lay.expert_order], torch.arange(rows))
    # what rank s sends to d is what d receives from s
    for s in range(ws):
        for d in range(ws):
            assert layouts[s].send_splits[d] == layouts[d].recv_splits[s]


def test_received_rows_come_out_grouped_by_expert():
    routing = draw_routing(world_size=2, tokens=6, experts=4, top_k=2, spec=RoutingSpec(seed=7))
    layouts = [routing.layout(r) for r in range(2)]
    # each rank's sent expert ids, exchanged as the all-to-all would
    sent = [routing.expert_ids[r].reshape(-1)[layouts[r].order] for r in range(2)]
    for d in range(2):
        pieces = []
        for s in range(2):
            start = sum(layouts[s].send_splits[:d])
            pieces.append(sent[s][start : start + layouts[s].send_splits[d]])
        received = torch.cat(pieces)[layouts[d].expert_order]
        assert received.tolist() == sorted(received.tolist())
        assert set(received.tolist()) <= set(range(2 * d, 2 * d + 2))


def test_skewed_routing_leaves_experts_empty_and_uniform_spreads():
    skewed = draw_routing(
        world_size=2, tokens=8, experts=32, top_k=2, spec=RoutingSpec(distribution="skewed", skew=2.0)
    )
    counts = skewed.counts().sum(0)
    assert (counts == 0).any()  # tail experts get no token
    uniform = draw_routing(world_size=2, tokens=4096, experts=8, top_k=2, spec=RoutingSpec())
    share = uniform.counts().sum(0).double() / (2 * 4096 * 2)
    assert torch.allclose(share, torch.full((8,), 1 / 8, dtype=torch.float64), atol=0.01)
    heavy = draw_routing(
        world_size=1, tokens=4096, experts=8, top_k=1, spec=RoutingSpec(distribution="skewed", skew=1.0)
    ).counts()[0]
    assert heavy.max() > 4 * heavy.min()
    for w in skewed.gate_weights:
        assert (w > 0).all() and torch.allclose(w.sum(1), torch.ones(w.shape[0]))


def test_an_empty_rank_and_bad_ids():
    ids = torch.tensor([[0], [1], [0]])
    lay = expert_layout(ids, 4, torch.tensor([[2, 1], [0, 0]]))
    assert lay.send_splits == [3, 0] and lay.recv_splits == [3, 0]
    assert lay.group_sizes.tolist() == [2, 1] and lay.expert_order.tolist() == [0, 1, 2]
    assert inverse(torch.tensor([2, 0, 1])).tolist() == [1, 2, 0]
    with pytest.raises(ConfigError, match=r"accepted are 0 to 3 \(4 experts\)"):
        check_ids(torch.tensor([[4]]), 4)
    with pytest.raises(ConfigError, match="repeat an expert"):
        check_ids(torch.tensor([[1, 1]]), 4)
    with pytest.raises(ConfigError, match="integer tensor"):
        check_ids(torch.tensor([[1.0]]), 4)


def test_the_moe_benchmark_file_expands_into_cases(tmp_path):
    cases = load_moe_config(Path(__file__).parents[1] / "configs" / "moe_ep.yaml")
    assert len(cases) == 2 * 2 * 2 * 2 * 2  # models, EP sizes, tokens, routings, kinds
    qwen = [c for c in cases if c.model == "qwen3_30b_a3b" and c.ep == 4 and c.workload.kind == "a2a_gemm"]
    assert {c.workload.tokens for c in qwen} == {4096, 8192}
    assert qwen[0].workload.local_shapes(4)["w"] == (32, 2048, 1536)
    assert {c.workload.routing.distribution for c in cases} == {"uniform", "skewed"}
    with pytest.raises(ConfigError, match="experts=6 is not divisible by world size 4"):
        moe_cases(
            {
                "ep": [4],
                "tokens": [8],
                "routings": [{}],
                "models": {"m": {"hidden": 8, "ffn": 8, "experts": 6, "top_k": 2}},
            }
        )
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['shapes'\]"):
        moe_cases({"ep": [2], "tokens": [8], "routings": [{}], "models": {}, "shapes": []})
    bad = tmp_path / "bad.yaml"
    bad.write_text("ep: [2]\ntokens: [8]\nroutings: [{distribution: zipf}]\nmodels: {}\n")
    with pytest.raises(ConfigError, match="bad.yaml: unknown routing distribution 'zipf'"):
        load_moe_config(bad)


def test_expert_orders_and_pair_tables_equal_their_definitions():
    """The expert-side permutations made from block shifts equal the stable sort of the received
    rows by local expert; `sorted_pairs`'s counts and flags equal bincount, min, max and a row-wise
    repeat test, for routings with empty experts and ranks."""
    from syncopate.moe.routing import _expert_orders, sorted_pairs

    gen = torch.Generator().manual_seed(5)
    for ws, el in ((1, 1), (2, 3), (4, 2)):
        for _ in range(4):
            recv = torch.randint(0, 4, (ws, el), generator=gen) * (torch.rand(ws, el, generator=gen) > 0.3)
            labels = torch.arange(el).repeat(ws).repeat_interleave(recv.reshape(-1))
            want = torch.sort(labels, stable=True).indices
            got, got_inverse = _expert_orders(recv, torch.device("cpu"))
            assert got.tolist() == want.tolist(), recv
            assert got_inverse.tolist() == inverse(want).tolist(), recv
    for ids, experts in (
        (torch.tensor([[3, 0], [0, 2], [3, 1]]), 4),
        (torch.tensor([[2, 2], [0, 1]]), 3),
        (torch.tensor([[5], [-1], [0]]), 4),
        (torch.empty(0, 2, dtype=torch.int64), 4),
    ):
        order, counts, flags = sorted_pairs(ids, experts)
        flat = ids.reshape(-1)
        assert order.tolist() == torch.sort(flat, stable=True).indices.tolist()
        inside = flat[(flat >= 0) & (flat < experts)]
        assert counts.tolist() == torch.bincount(inside, minlength=experts).tolist()
        if ids.numel():
            repeats = bool((ids.sort(1).values[:, 1:] == ids.sort(1).values[:, :-1]).any())
            assert flags.tolist() == [int(flat.min()), int(flat.max()), int(repeats)]
