"""Layer: gloo process groups on the CPU. `MoELayer` on 2 ranks against the same layer in float32 on
one process (`moe_layer_reference`): outputs, and the gradients of the inputs, the experts' weights
and the router (the gate's, summed over the ranks; or the given scores'); on the unfused ops and on
the `dedup` template's."""

from __future__ import annotations

import io

import torch
import torch.distributed as dist
from support.gloo import run_gloo

WS, TOKENS, HIDDEN, FFN, EXPERTS, TOP_K = 2, 6, 16, 8, 4, 2


def _parameters(seed: int):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(WS * TOKENS, HIDDEN, generator=gen)
    gate = torch.randn(EXPERTS, HIDDEN, generator=gen)
    w1 = torch.randn(EXPERTS, HIDDEN, 2 * FFN, generator=gen) / 4
    w2 = torch.randn(EXPERTS, FFN, HIDDEN, generator=gen) / 3
    scores = torch.randn(WS * TOKENS, EXPERTS, generator=gen)
    grad = torch.randn(WS * TOKENS, HIDDEN, generator=gen)
    return x, gate, w1, w2, scores, grad


CASES = (
    (False, torch.float32, None),
    (True, torch.float32, None),
    (False, torch.bfloat16, None),
    (False, torch.float32, "dedup"),
    (True, torch.bfloat16, "dedup"),
)


def _worker(rank, ws, init, q):
    from syncopate.moe import MoeCandidate
    from syncopate.moe.layer import MoELayer

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=ws)
    try:
        out = {}
        for given_scores, dtype, template in CASES:
            x, gate, w1, w2, scores, grad = _parameters(3)
            layer = MoELayer(
                hidden=HIDDEN,
                ffn=FFN,
                experts=EXPERTS,
                top_k=TOP_K,
                group=dist.group.WORLD,
                dtype=dtype,
                config=MoeCandidate(template=template) if template else None,
            )
            local = EXPERTS // ws
            with torch.no_grad():
                layer.gate.copy_(gate)
                layer.w1.copy_(w1[rank * local : (rank + 1) * local])
                layer.w2.copy_(w2[rank * local : (rank + 1) * local])
            rows = slice(rank * TOKENS, (rank + 1) * TOKENS)
            xr = x[rows].to(dtype).requires_grad_()
            sr = scores[rows].clone().requires_grad_() if given_scores else None
            y = layer(xr, scores=sr)
            y.backward(grad[rows].to(dtype))
            out[(given_scores, str(dtype), template)] = {
                "y": y.detach().float(),
                "x": xr.grad.float(),
                "w1": layer.w1.grad.float(),
                "w2": layer.w2.grad.float(),
                "gate": None if given_scores else layer.gate.grad.float(),
                "scores": sr.grad if given_scores else None,
            }
        # by value: a tensor put on the queue as it is travels as a shared file descriptor, which a
        # rank that has already ended can no longer hand over
        data = io.BytesIO()
        torch.save(out, data)
        q.put((rank, data.getvalue()))
    finally:
        dist.destroy_process_group()


def test_moe_layer_matches_one_process_reference():
    from syncopate.measure.reference import moe_layer_reference

    got = {rank: torch.load(io.BytesIO(data)) for rank, data in run_gloo(_worker, WS, timeout=120)}
    local = EXPERTS // WS
    for given_scores, torch_dtype, template in CASES:
        dtype = str(torch_dtype)
        tol = 5e-2 if torch_dtype == torch.bfloat16 else 1e-5
        x, gate, w1, w2, scores, grad = _parameters(3)
        if dtype == "torch.bfloat16":  # the reference of the same rounded operands
            x, gate, w1, w2 = (t.bfloat16().float() for t in (x, gate, w1, w2))
        leaves = [t.clone().requires_grad_() for t in (x, gate, w1, w2, scores)]
        xl, gl, w1l, w2l, sl = leaves
        ref = moe_layer_reference(xl, w1l, w2l, TOP_K, gate=gl, scores=sl if given_scores else None)
        ref.backward(grad)
        for rank in range(WS):
            res = got[rank][(given_scores, dtype, template)]
            rows = slice(rank * TOKENS, (rank + 1) * TOKENS)
            experts = slice(rank * local, (rank + 1) * local)
            torch.testing.assert_close(res["y"], ref[rows].detach(), rtol=tol, atol=tol)
            torch.testing.assert_close(res["x"], xl.grad[rows], rtol=tol, atol=tol)
            torch.testing.assert_close(res["w1"], w1l.grad[experts], rtol=tol, atol=tol)
            torch.testing.assert_close(res["w2"], w2l.grad[experts], rtol=tol, atol=tol)
            if given_scores:
                torch.testing.assert_close(res["scores"], sl.grad[rows], rtol=tol, atol=tol)
        if not given_scores:
            summed = sum(got[rank][(given_scores, dtype, template)]["gate"] for rank in range(WS))
            torch.testing.assert_close(summed, gl.grad, rtol=tol, atol=tol)
            assert gl.grad.abs().max() > 0


def _refusals(rank, ws, init, q):
    from syncopate.errors import ConfigError
    from syncopate.moe.layer import MoELayer

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=ws)
    messages = []
    try:
        g = dist.group.WORLD
        # every case is refused before it communicates: without one collective a rank could finish
        # and close its connections while its peer is still completing the group's
        dist.barrier(g)
        for make, call in (
            (lambda: MoELayer(hidden=8, ffn=8, experts=3, top_k=1, group=g), None),
            (lambda: MoELayer(hidden=8, ffn=8, experts=4, top_k=5, group=g), None),
            (lambda: MoELayer(hidden=8, ffn=8, experts=4, top_k=1, group=g), lambda m: m(torch.ones(2, 6))),
            (
                lambda: MoELayer(hidden=8, ffn=8, experts=4, top_k=1, group=g, router=False),
                lambda m: m(torch.ones(2, 8, dtype=torch.bfloat16)),
            ),
            (
                lambda: MoELayer(hidden=8, ffn=8, experts=4, top_k=1, group=g),
                lambda m: m(torch.ones(2, 8, dtype=torch.bfloat16), scores=torch.ones(2, 3)),
            ),
        ):
            try:
                layer = make()
                if call is not None:
                    call(layer)
                messages.append("accepted")
            except ConfigError as e:
                messages.append(str(e))
        q.put(messages)
    finally:
        dist.destroy_process_group()


def test_moe_layer_refuses_bad_values_by_name():
    (messages, again) = run_gloo(_refusals, 2, timeout=60)
    assert messages == again
    for message, words in zip(
        messages,
        (
            "experts=3 is not divisible by the group's 2 ranks",
            "top_k=5 must be between 1 and experts=4",
            "x has shape (2, 6): expected [tokens, 8]",
            "no router (router=False): pass scores=",
            "scores have shape (2, 3): expected [2, 4]",
        ),
        strict=True,
    ):
        assert words in message
