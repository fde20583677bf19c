"""Layer: Triton interpreter on the CPU (TRITON_INTERPRET=1). The `dedup` template's sums by segment
(`syncopate.moe.kernels.launch_segment_sum` through `syncopate.moe.dedup.segment_sum`, and the
autograd of its sums and gathers) against float32 references on fresh random rows, segments and
weights: empty segments, one row, column counts below, at and beyond one program's block; outputs
poisoned with NaN, two calls back to back; the same results as torch's `index_add_` path."""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest
import torch

from syncopate.moe import dedup
from syncopate.moe.kernels import SUM_BLOCK, launch_segment_sum


def _case(rows: int, n: int, width: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, width, generator=gen).to(torch.bfloat16)
    index = torch.randint(0, max(n, 1), (rows,), generator=gen) if n else torch.zeros(0, dtype=torch.int64)
    weights = torch.rand(rows, generator=gen) + 0.1
    return x, index, weights


def _reference(x, index, weights, n):
    terms = x.float() if weights is None else x.float() * weights.unsqueeze(1)
    return torch.zeros(n, x.shape[1]).index_add_(0, index, terms)


@pytest.mark.parametrize(
    "rows, n, width", [(1, 1, 8), (12, 5, 40), (30, 9, SUM_BLOCK), (7, 11, SUM_BLOCK + 72), (0, 3, 16)]
)
@pytest.mark.parametrize("weighted", [True, False])
def test_segment_sums_match_float32_back_to_back(rows, n, width, weighted):
    for seed in (0, 1):  # back to back, fresh rows
        x, index, weights = _case(rows, n, width, seed)
        w = weights if weighted else None
        seg = dedup.segments(index, n, int(torch.bincount(index, minlength=n).max()) if rows else 1)
        out = torch.full((n, width), float("nan"), dtype=torch.bfloat16)
        launch_segment_sum(x, seg.order, seg.starts, seg.most, w, out)
        want = _reference(x, index, w, n)
        assert not out.isnan().any()
        assert (out.float() - want).abs().max() <= 1e-2 * want.abs().max().clamp_min(1e-6)
        got = dedup.segment_sum(x, w, seg)
        assert (got.float() - want).abs().max() <= 1e-2 * want.abs().max().clamp_min(1e-6)


def test_empty_segments_are_zero():
    x = torch.randn(4, 24).to(torch.bfloat16)
    seg = dedup.segments(torch.tensor([3, 3, 0, 3]), 5, 3)
    got = dedup.segment_sum(x, None, seg).float()
    assert got[1].abs().max() == 0 and got[2].abs().max() == 0 and got[4].abs().max() == 0
    torch.testing.assert_close(got[3], x[[0, 1, 3]].float().sum(0), rtol=1e-2, atol=1e-2)


def test_sums_and_gathers_have_the_gradients_of_the_torch_path(monkeypatch):
    """`_SumRows` and `_GatherRows` on the kernel against the same functions on torch's
    `index_add_` (the interpreter switched off for them), outputs and every gradient."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(20, 48, generator=gen).to(torch.bfloat16)
    index = torch.randint(0, 7, (20,), generator=gen)
    weights = torch.rand(20, generator=gen) + 0.1
    grad = torch.randn(7, 48, generator=gen).to(torch.bfloat16)
    seg = dedup.segments(index, 7, int(torch.bincount(index).max()))
    got = {}
    for path in ("kernel", "torch"):
        if path == "torch":
            monkeypatch.setattr(dedup, "_row_kernels_run", lambda *a: False)
        xs, ws = x.clone().requires_grad_(), weights.clone().requires_grad_()
        summed = dedup._SumRows.apply(xs, ws, seg)
        summed.backward(grad)
        xg = x.clone().requires_grad_()
        gathered = dedup._GatherRows.apply(xg[:7], dedup.segments(torch.tensor([0, 6, 6, 2, 0, 6]), 7, 3))
        gathered.backward(grad[:6])
        got[path] = [summed.float(), xs.grad.float(), ws.grad, gathered.float(), xg.grad.float()]
    for a, b in zip(got["kernel"], got["torch"], strict=True):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2)
    # the gather's gradient sums a row's reads: row 6 was read three times
    torch.testing.assert_close(
        got["kernel"][4][6], grad[1:3].float().sum(0) + grad[5].float(), rtol=2e-2, atol=2e-2
    )
