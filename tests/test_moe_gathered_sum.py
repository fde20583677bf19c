"""Layer: Triton interpreter on the CPU (TRITON_INTERPRET=1). The combine's gate-weighted top-k sum
read in place (`syncopate.moe.kernels.launch_gathered_sum` and its gradients, `ops._GatheredSum`):
against float32 references on fresh random rows, permutations and gates, outputs poisoned with
NaN, two calls back to back; column counts below, at and beyond one program's block, top_k 1 to 5;
own rows read from a tensor of their own (the rows' buffer poisoned there); the autograd function
against the unfused path (rows permuted into pair order, `weighted_sum`); and the row scatter
(`ops.scatter_rows`) against `index_copy_`."""

from __future__ import annotations

import os
from types import SimpleNamespace

os.environ["TRITON_INTERPRET"] = "1"

import pytest
import torch

from syncopate.moe.kernels import SUM_BLOCK, launch_gathered_sum, launch_gathered_sum_grads
from syncopate.moe.ops import (
    _GatheredSum,
    scatter_rows,
    summed_rows,
    summed_rows_grads,
    token_sum,
    weighted_sum,
)
from syncopate.moe.routing import inverse


def _case(tokens: int, top_k: int, width: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    rows = torch.randn(tokens * top_k, width, generator=gen).to(torch.bfloat16)
    order = torch.randperm(tokens * top_k, generator=gen)  # send row i is pair order[i]
    gates = torch.rand(tokens, top_k, generator=gen) + 0.1
    grad = torch.randn(tokens, width, generator=gen).to(torch.bfloat16)
    return rows, order, inverse(order), gates, grad


def _reference(rows, index, gates, grad):
    tokens, top_k = gates.shape
    pairs = rows.float()[index].view(tokens, top_k, -1)
    out = (gates.unsqueeze(-1) * pairs).sum(1)
    grad_pairs = gates.reshape(-1, 1) * grad.float().repeat_interleave(top_k, 0)
    grad_rows = torch.empty_like(grad_pairs)
    grad_rows[index] = grad_pairs
    grad_gates = (pairs * grad.float().unsqueeze(1)).sum(-1)
    return out, grad_rows, grad_gates


def _close(got: torch.Tensor, want: torch.Tensor, tol: float) -> None:
    assert not got.isnan().any()
    err = (got.float() - want).abs().max() / want.abs().max().clamp_min(1e-6)
    assert err < tol, float(err)


@pytest.mark.parametrize(
    "tokens, top_k, width", [(1, 1, 8), (5, 2, 40), (6, 3, SUM_BLOCK), (3, 5, SUM_BLOCK + 72), (0, 2, 16)]
)
def test_the_sum_and_its_gradients_match_float32_back_to_back(tokens, top_k, width):
    for seed in (1, 2):  # two calls, fresh inputs, into poisoned outputs
        rows, order, index, gates, grad = _case(tokens, top_k, width, seed)
        out = torch.full((tokens, width), float("nan"), dtype=torch.bfloat16)
        grad_rows = torch.full_like(rows, float("nan"))
        grad_gates = torch.full((tokens, top_k), float("nan"))
        launch_gathered_sum(rows, index, gates, out)
        launch_gathered_sum_grads(grad, rows, index, order, gates, grad_rows, grad_gates)
        if tokens == 0:
            assert out.numel() == 0 and grad_rows.numel() == 0
            continue
        want_out, want_rows, want_gates = _reference(rows, index, gates, grad)
        _close(out, want_out, 1e-2)
        _close(grad_rows, want_rows, 1e-2)
        _close(grad_gates, want_gates, 1e-4)


def test_the_autograd_function_matches_the_unfused_path():
    tokens, top_k, width = 7, 3, 96
    rows, order, index, gates, grad = _case(tokens, top_k, width, 3)
    layout = SimpleNamespace(tokens=tokens, top_k=top_k, order=order, order_inverse=index)

    def run(fn):
        r = rows.clone().requires_grad_()
        g = gates.clone().requires_grad_()
        out = fn(r, g)
        out.backward(grad)
        return out.detach(), r.grad, g.grad

    ours = run(lambda r, g: _GatheredSum.apply(r, g, layout))
    plain = run(lambda r, g: weighted_sum(r[index].view(tokens, top_k, -1), g))
    for got, want in zip(ours, plain, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        _close(got, want.float(), 2e-2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows_grad, gates_grad", [(True, True), (True, False), (False, True)])
def test_summed_rows_and_the_gradients_asked_for(dtype, rows_grad, gates_grad):
    """bf16 rows take the kernels, float32 rows the gather into pair order; either way the sum and
    only the gradients asked for, in send order and the gates' dtype."""
    tokens, top_k, width = 9, 4, 72
    rows, order, index, gates, grad = _case(tokens, top_k, width, 4)
    rows, grad = rows.to(dtype), grad.to(dtype)
    layout = SimpleNamespace(tokens=tokens, top_k=top_k, order=order, order_inverse=index, cache={})
    want_out, want_rows, want_gates = _reference(rows, index, gates, grad)
    _close(summed_rows(rows, gates, layout), want_out, 1e-2)
    got_rows, got_gates = summed_rows_grads(
        grad, rows if gates_grad else None, gates, layout, rows_grad=rows_grad, gates_grad=gates_grad
    )
    assert (got_rows is not None) == rows_grad and (got_gates is not None) == gates_grad
    if rows_grad:
        assert got_rows.dtype == dtype
        _close(got_rows, want_rows, 1e-2)
    if gates_grad:
        assert got_gates.dtype == gates.dtype
        _close(got_gates, want_gates, 1e-2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("lo, n", [(0, 6), (5, 7), (21, 6), (8, 0)])
def test_own_rows_kept_apart_are_read_where_they_are(dtype, lo, n):
    """`own` = (kept, lo): rows [lo, lo + n) of the send order come from kept; the rows' buffer is
    NaN there. The sum, token_sum and the gates' gradient equal those of the rows put in place;
    bf16 takes the kernels, float32 the gather (which copies the own rows into place first)."""
    tokens, top_k, width = 9, 3, SUM_BLOCK + 40
    for seed in (6, 7):  # back to back, fresh inputs, each into a fresh poisoned buffer
        rows, order, index, gates, grad = _case(tokens, top_k, width, seed)
        rows, grad = rows.to(dtype), grad.to(dtype)
        layout = SimpleNamespace(tokens=tokens, top_k=top_k, order=order, order_inverse=index, cache={})
        want_out, _, want_gates = _reference(rows, index, gates, grad)
        want_sum = rows.float()[index].view(tokens, top_k, -1).sum(1)
        apart = rows.clone()
        kept = rows[lo : lo + n].clone()
        apart[lo : lo + n] = float("nan")
        out = torch.full((tokens, width), float("nan"), dtype=dtype)
        got = summed_rows(apart.clone(), gates, layout, own=(kept, lo), out=out)
        assert got is out
        _close(out, want_out, 1e-2)
        _close(token_sum(apart.clone(), layout, own=(kept, lo)), want_sum, 1e-2)
        _, got_gates = summed_rows_grads(
            grad, apart.clone(), gates, layout, rows_grad=False, gates_grad=True, own=(kept, lo)
        )
        _close(got_gates, want_gates, 1e-2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows, width", [(1, 8), (13, 40), (7, SUM_BLOCK), (5, SUM_BLOCK + 72), (0, 16)])
def test_scatter_rows_matches_index_copy(dtype, rows, width):
    gen = torch.Generator().manual_seed(rows + width)
    for _ in range(2):  # back to back, fresh rows and places, poisoned destinations
        src = torch.randn(rows, width, generator=gen).to(dtype)
        index = torch.randperm(2 * rows + 3, generator=gen)[:rows]
        dst = torch.full((2 * rows + 3, width), float("nan"), dtype=dtype)
        want = dst.clone().index_copy_(0, index, src)
        scatter_rows(dst, index, src)
        assert torch.equal(dst.isnan(), want.isnan())
        assert torch.equal(dst.nan_to_num(), want.nan_to_num())
