"""Layer: Triton interpreter on the CPU (TRITON_INTERPRET=1). The experts' fused SwiGLU
(`syncopate.moe.kernels.launch_swiglu` and its gradient, `ops.swiglu`): against float64 references
on fresh random rows, outputs poisoned with NaN, two calls back to back, widths below, at and beyond
one program's block; the autograd function against torch's ops; float32 rows on torch's ops."""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest
import torch
import torch.nn.functional as F

from syncopate.errors import ConfigError
from syncopate.moe.kernels import SWIGLU_BLOCK, launch_swiglu, launch_swiglu_grad
from syncopate.moe.ops import swiglu


def _reference(h: torch.Tensor, grad: torch.Tensor, ffn: int):
    x = h.double().requires_grad_()
    y = F.silu(x[:, :ffn]) * x[:, ffn:]
    y.backward(grad.double())
    return y.detach(), x.grad


def _close(got: torch.Tensor, want: torch.Tensor, tol: float) -> None:
    assert not got.isnan().any()
    err = (got.double() - want).abs().max() / want.abs().max().clamp_min(1e-12)
    assert err < tol, float(err)


@pytest.mark.parametrize("rows, ffn", [(3, 5), (4, 96), (2, SWIGLU_BLOCK), (3, SWIGLU_BLOCK + 40), (0, 8)])
def test_the_kernels_match_float64_back_to_back(rows, ffn):
    for seed in (1, 2):  # two calls, fresh inputs, into poisoned outputs
        gen = torch.Generator().manual_seed(seed)
        h = (3 * torch.randn(rows, 2 * ffn, generator=gen)).to(torch.bfloat16)
        grad = torch.randn(rows, ffn, generator=gen).to(torch.bfloat16)
        out = torch.full((rows, ffn), float("nan"), dtype=torch.bfloat16)
        grad_h = torch.full_like(h, float("nan"))
        launch_swiglu(h, out)
        launch_swiglu_grad(grad, h, grad_h)
        if rows == 0:
            continue
        want, want_grad = _reference(h, grad, ffn)
        _close(out, want, 1e-2)
        _close(grad_h, want_grad, 1e-2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_swiglu_with_autograd_matches_torchs_ops(dtype):
    """bf16 rows take the kernels, float32 rows torch's ops; a non-contiguous output gradient too."""
    ffn = 48
    gen = torch.Generator().manual_seed(3)
    h = torch.randn(7, 2 * ffn, generator=gen).to(dtype)
    grad = torch.randn(ffn, 7, generator=gen).to(dtype).t()  # column stride 7

    def run(fn):
        x = h.clone().requires_grad_()
        y = fn(x)
        y.backward(grad)
        return y.detach(), x.grad

    ours = run(lambda x: swiglu(x, ffn))
    plain = run(lambda x: F.silu(x[:, :ffn]) * x[:, ffn:])
    for got, want in zip(ours, plain, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        _close(got, want.double(), 2e-2)


def test_swiglu_refuses_rows_of_another_width():
    with pytest.raises(ConfigError, match=r"h has shape \(2, 10\): expected \[rows, 12\]"):
        swiglu(torch.zeros(2, 10, dtype=torch.bfloat16), 6)
