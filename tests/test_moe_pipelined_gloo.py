"""Layer: gloo process groups on the CPU. The pipelined MoE plans with the `nccl` backend (gloo's
send/receive pairs here) on 2 and 4 ranks, every chunk count and order: the results equal the
unfused ops' on the same inputs and the float32 references, for uniform and skewed routings with
experts that get no row and a rank that receives nothing, outputs poisoned with NaN, calls back to
back; the gradients of both ops equal the unfused ops'; `MoELayer` on pipelined plans against the
one-process reference; the `copy_engine` backend (and the `fused` template on it) and bad configs
are refused by name."""

from __future__ import annotations

import io

import pytest
import torch
import torch.distributed as dist
from support.gloo import run_gloo

HIDDEN, FFN, EXPERTS_A_RANK = 16, 8, 2
CASES = [
    # (dtype, routing, tokens, top_k)
    ("bf16", "uniform", 9, 2),
    ("fp32", "skewed", 5, 2),
    ("bf16", "starved", 4, 2),  # the last rank's experts get no row
    ("fp32", "uniform", 3, 3),
]


def _routing(name: str, ws: int, tokens: int, top_k: int, seed: int):
    from syncopate.moe import Routing, draw_routing
    from syncopate.search_space import RoutingSpec

    experts = EXPERTS_A_RANK * ws
    if name != "starved":
        skew = 3.0 if name == "skewed" else 1.2
        spec = RoutingSpec(distribution=name, skew=skew, seed=seed)
        return draw_routing(world_size=ws, tokens=tokens, experts=experts, top_k=top_k, spec=spec)
    gen = torch.Generator().manual_seed(seed)
    fed = experts - EXPERTS_A_RANK  # experts of every rank but the last
    ids = [
        torch.stack([torch.randperm(fed, generator=gen)[:top_k] for _ in range(tokens)]) for _ in range(ws)
    ]
    weights = [torch.softmax(torch.randn(tokens, top_k, generator=gen), 1) for _ in range(ws)]
    return Routing(experts=experts, expert_ids=tuple(ids), gate_weights=tuple(weights))


def _configs(ws: int):
    """Every chunk count of the space and, on four ranks, both orders (gloo's send/receive pairs
    take about a millisecond each here: not the whole product)."""
    from syncopate.search_space.moe_workload import MoeCandidate

    orders = ["ring", "pairwise", "ring"] if ws > 2 else ["ring"] * 3
    return [
        MoeCandidate(template="pipelined", chunks_per_source=c, order=o)
        for c, o in zip((1, 2, 4), orders, strict=True)
    ]


def _error(a: torch.Tensor, b: torch.Tensor) -> float:
    from syncopate.measure.reference import relative_error

    if b.numel() == 0:
        return float(a.numel())
    if not b.abs().max() > 0:
        return float((a.double() - b.double()).abs().max())
    return relative_error(a, b)


def _ops_worker(rank, ws, init, q):
    from syncopate.measure.reference import moe_combine_reference, moe_dispatch_reference
    from syncopate.moe import dispatch_gemm, exchange_layout, gemm_combine

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=ws)
    g = dist.group.WORLD
    results = []
    try:
        for call, (dtype_name, name, tokens, top_k) in enumerate(CASES):
            dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype_name]
            routing = _routing(name, ws, tokens, top_k, seed=31 * ws + call)
            ids, weights = list(routing.expert_ids), list(routing.gate_weights)
            layout = exchange_layout(ids[rank], routing.experts, g)
            layouts = [routing.layout(r) for r in range(ws)]
            runs = {}
            for again in range(2):  # back to back, fresh inputs each
                gen = torch.Generator().manual_seed(1000 * call + 10 * again + 7)
                xs = [torch.randn(tokens, HIDDEN, generator=gen).to(dtype) for _ in range(ws)]
                w1s = [
                    torch.randn(EXPERTS_A_RANK, HIDDEN, 2 * FFN, generator=gen).to(dtype) for _ in range(ws)
                ]
                w2s = [torch.randn(EXPERTS_A_RANK, FFN, HIDDEN, generator=gen).to(dtype) for _ in range(ws)]
                hs = [torch.randn(lay.rows_received, FFN, generator=gen).to(dtype) for lay in layouts]
                ref_up = moe_dispatch_reference(xs, ids, w1s, routing.experts)[rank]
                ref_down = moe_combine_reference(hs, w2s, ids, weights, routing.experts)[rank]
                seed = int(torch.randint(1 << 30, (1,), generator=gen))
                for config in [None, *_configs(ws)]:
                    up = torch.full((layout.rows_received, 2 * FFN), float("nan"), dtype=dtype)
                    down = torch.full((tokens, HIDDEN), float("nan"), dtype=dtype)
                    got_up = dispatch_gemm(xs[rank], w1s[rank], layout, g, out=up, config=config)
                    got_down = gemm_combine(
                        hs[rank], w2s[rank], weights[rank], layout, g, out=down, config=config
                    )
                    assert got_up is up and got_down is down
                    # gradients, against the unfused ops' on the same inputs and output gradients
                    grads = None
                    if again == 0:
                        grads = _grads(
                            xs[rank], w1s[rank], hs[rank], w2s[rank], weights[rank], layout, g, config, seed
                        )
                    label = None if config is None else config.short()
                    runs.setdefault(label, {})[again] = (
                        _error(up, ref_up),
                        _error(down, ref_down),
                        up,
                        down,
                        grads,
                    )
            for label, errors in runs.items():
                results.append(((call, dtype_name, name), label, layout.rows_received, errors))
        data = io.BytesIO()
        torch.save(results, data)
        q.put((rank, data.getvalue()))
    finally:
        dist.destroy_process_group()


def _grads(x, w1, h, w2, weights, layout, group, config, seed: int):
    from syncopate.moe import dispatch_gemm, gemm_combine

    gen = torch.Generator().manual_seed(seed)
    leaves = [t.clone().requires_grad_() for t in (x, w1, h, w2, weights)]
    xl, w1l, hl, w2l, gl = leaves
    up = dispatch_gemm(xl, w1l, layout, group, config=config)
    down = gemm_combine(hl, w2l, gl, layout, group, config=config)
    g_up = torch.randn(up.shape, generator=gen).to(up.dtype)
    g_down = torch.randn(down.shape, generator=gen).to(down.dtype)
    torch.autograd.backward([up, down], [g_up, g_down])
    return [t.grad.clone() for t in leaves]


def _check(got, ws):
    by_rank = {rank: torch.load(io.BytesIO(data)) for rank, data in got}
    fused_runs, empties = 0, 0
    for rank, results in by_rank.items():
        unfused = {}
        for case, config, rows, errors in results:
            tolerance = 1e-2 if case[1] == "bf16" else 1e-5
            empties += rows == 0
            for again, (e_up, e_down, up, down, grads) in errors.items():
                assert e_up < tolerance and e_down < tolerance, (rank, case, config, again, e_up, e_down)
                if config is None:
                    unfused[case, again] = (up, down, grads)
                    continue
                fused_runs += 1
                ref_up, ref_down, ref_grads = unfused[case, again]
                # the same sums in the same order on the CPU: equal to the unfused ops' results
                torch.testing.assert_close(up, ref_up, rtol=1e-6, atol=1e-6, msg=f"{rank} {case} {config}")
                torch.testing.assert_close(
                    down, ref_down, rtol=1e-6, atol=1e-6, msg=f"{rank} {case} {config}"
                )
                # gradients: float32 sums where the unfused autograd rounds each term to bf16
                gtol = 2e-2 if case[1] == "bf16" else 1e-5
                assert (grads is not None) == (again == 0)
                if grads is None:
                    continue
                for name, a, b in zip(("x", "w1", "h", "w2", "gates"), grads, ref_grads, strict=True):
                    assert _error(a, b) < gtol, (rank, case, config, again, name, _error(a, b))
    assert fused_runs == ws * len(CASES) * len(_configs(ws)) * 2
    assert empties >= 1 + len(_configs(ws))  # the starved rank received nothing, in every config


@pytest.mark.parametrize("ws", [2, 4])
def test_pipelined_ops_equal_the_unfused_ones(ws):
    _check(run_gloo(_ops_worker, ws, timeout=240), ws)


def _layer_worker(rank, ws, init, q):
    from syncopate.moe import pipelined
    from syncopate.moe.layer import MoELayer
    from syncopate.search_space.moe_workload import MoeCandidate

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=ws)
    unfused_calls = []  # which backward ran: the unfused rows' helpers count their calls
    for name in ("unfused_combine_rows", "unfused_dispatch_rows"):
        real = getattr(pipelined, name)
        setattr(
            pipelined,
            name,
            lambda *a, _real=real, _name=name, **k: unfused_calls.append(_name) or _real(*a, **k),
        )
    try:
        out = {}
        configs = {
            "both": (MoeCandidate(template="pipelined", chunks_per_source=2),) * 2,
            "dispatch only": (MoeCandidate(template="pipelined", chunks_per_source=4, order="ring"), None),
            "both, unfused backward": (MoeCandidate(template="pipelined", chunks_per_source=2),) * 2,
        }
        for label, (dispatch_config, combine_config) in configs.items():
            for dtype in (torch.float32, torch.bfloat16):
                x, gate, w1, w2, grad = _parameters(ws)
                layer = MoELayer(
                    hidden=HIDDEN,
                    ffn=FFN,
                    experts=4,
                    top_k=2,
                    group=dist.group.WORLD,
                    dtype=dtype,
                    config=dispatch_config,
                    backward="unfused" if "unfused backward" in label else "plan",
                )
                layer.combine_config = combine_config
                local = 4 // ws
                with torch.no_grad():
                    layer.gate.copy_(gate)
                    layer.w1.copy_(w1[rank * local : (rank + 1) * local])
                    layer.w2.copy_(w2[rank * local : (rank + 1) * local])
                rows = slice(rank * 6, (rank + 1) * 6)
                xr = x[rows].to(dtype).requires_grad_()
                unfused_calls.clear()
                y = layer(xr)
                y.backward(grad[rows].to(dtype))
                out[label, str(dtype)] = {
                    "unfused calls": sorted(unfused_calls),
                    "y": y.detach().float(),
                    "x": xr.grad.float(),
                    "w1": layer.w1.grad.float(),
                    "w2": layer.w2.grad.float(),
                    "gate": layer.gate.grad.float(),
                }
        data = io.BytesIO()
        torch.save(out, data)
        q.put((rank, data.getvalue()))
    finally:
        dist.destroy_process_group()


def _parameters(ws: int):
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(ws * 6, HIDDEN, generator=gen)
    gate = torch.randn(4, HIDDEN, generator=gen)
    w1 = torch.randn(4, HIDDEN, 2 * FFN, generator=gen) / 4
    w2 = torch.randn(4, FFN, HIDDEN, generator=gen) / 3
    grad = torch.randn(ws * 6, HIDDEN, generator=gen)
    return x, gate, w1, w2, grad


def test_layer_gradients_through_pipelined_plans_match_the_reference():
    from syncopate.measure.reference import moe_layer_reference

    ws = 2
    got = {rank: torch.load(io.BytesIO(data)) for rank, data in run_gloo(_layer_worker, ws, timeout=120)}
    local = 4 // ws
    for label in ("both", "dispatch only", "both, unfused backward"):
        for dtype, tol in (("torch.float32", 1e-5), ("torch.bfloat16", 5e-2)):
            x, gate, w1, w2, grad = _parameters(ws)
            if dtype == "torch.bfloat16":
                x, gate, w1, w2 = (t.bfloat16().float() for t in (x, gate, w1, w2))
            xl, gl, w1l, w2l = (t.clone().requires_grad_() for t in (x, gate, w1, w2))
            ref = moe_layer_reference(xl, w1l, w2l, 2, gate=gl)
            ref.backward(grad)
            for rank in range(ws):
                res = got[rank][label, dtype]
                unfused = ["unfused_combine_rows", "unfused_dispatch_rows"] if "unfused" in label else []
                assert res["unfused calls"] == unfused, (label, res["unfused calls"])
                rows = slice(rank * 6, (rank + 1) * 6)
                experts = slice(rank * local, (rank + 1) * local)
                torch.testing.assert_close(res["y"], ref[rows].detach(), rtol=tol, atol=tol)
                torch.testing.assert_close(res["x"], xl.grad[rows], rtol=tol, atol=tol)
                torch.testing.assert_close(res["w1"], w1l.grad[experts], rtol=tol, atol=tol)
                torch.testing.assert_close(res["w2"], w2l.grad[experts], rtol=tol, atol=tol)
            summed = sum(got[rank][label, dtype]["gate"] for rank in range(ws))
            torch.testing.assert_close(summed, gl.grad, rtol=tol, atol=tol)


def _refusals(rank, ws, init, q):
    from syncopate.errors import ConfigError
    from syncopate.moe import dispatch_gemm, draw_routing, gemm_combine
    from syncopate.search_space import RoutingSpec
    from syncopate.search_space.moe_workload import MoeCandidate

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=ws)
    g = dist.group.WORLD
    messages = []
    try:
        # every call below is refused before it communicates: without one collective a rank could
        # finish and close its connections while its peer is still completing the group's
        dist.barrier(g)
        routing = draw_routing(world_size=ws, tokens=4, experts=4, top_k=2, spec=RoutingSpec())
        layout = routing.layout(rank)
        x, w1 = torch.randn(4, 8), torch.randn(2, 8, 8)
        h, w2 = torch.randn(layout.rows_received, 8), torch.randn(2, 8, 8)
        copy_engine = MoeCandidate(template="pipelined", backend="copy_engine")
        for call in (
            lambda: dispatch_gemm(x, w1, layout, g, config=copy_engine),
            lambda: gemm_combine(h, w2, routing.gate_weights[rank], layout, g, config=copy_engine),
            lambda: dispatch_gemm(x, w1, layout, g, config={"template": "pipelined"}),
            lambda: dispatch_gemm(
                x, w1, layout, g, out=torch.empty(1, 8), config=MoeCandidate(template="pipelined")
            ),
            lambda: gemm_combine(
                h,
                w2,
                routing.gate_weights[rank],
                layout,
                g,
                config=MoeCandidate(template="fused", backend="copy_engine"),
            ),
            lambda: dispatch_gemm(
                x, w1, layout, g, config=MoeCandidate(template="pipelined"), backward="fused"
            ),
        ):
            try:
                call()
                messages.append("accepted")
            except ConfigError as e:
                messages.append(str(e))
        q.put(messages)
    finally:
        dist.destroy_process_group()


def test_the_copy_engine_backend_and_bad_configs_are_refused_on_the_cpu():
    (messages, again) = run_gloo(_refusals, 2, timeout=60)
    assert messages[:3] == again[:3]
    for message, words in zip(
        messages,
        (
            "backend copy_engine copies rows into CUDA symmetric memory: it needs CUDA tensors, got "
            "tensors on cpu; use backend 'nccl' there",
            "backend copy_engine copies rows into CUDA symmetric memory",
            "config= takes a MoeCandidate (or None for unfused), got a mapping",
            "out= is (1, 8) torch.float32 on cpu: expected (",
            "backend copy_engine copies rows into CUDA symmetric memory: it needs CUDA tensors",
            "backward='fused': accepted are 'plan', 'unfused'",
        ),
        strict=True,
    ):
        assert words in message, message
