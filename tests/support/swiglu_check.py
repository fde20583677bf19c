"""Check on one GPU the MoE experts' fused SwiGLU (`syncopate.moe.ops.swiglu`) at the Qwen3 and
DeepSeek-like expert widths: forward and backward against float64 on fresh rows, outputs poisoned,
three calls back to back. Run in a fresh process without TRITON_INTERPRET (tests/test_gpu_moe_swiglu.py
does): one line per check, exit 1 if one fails, 3 without a GPU.

    python tests/support/swiglu_check.py
"""

from __future__ import annotations

import os
import sys

if os.environ.get("TRITON_INTERPRET", "0") == "1":
    sys.exit("swiglu_check: unset TRITON_INTERPRET; it launches compiled kernels")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from checks import run_checks  # noqa: E402

from syncopate.measure.reference import relative_error  # noqa: E402
from syncopate.moe.kernels import launch_swiglu, launch_swiglu_grad  # noqa: E402
from syncopate.moe.ops import swiglu  # noqa: E402


def check(rows: int, ffn: int) -> None:
    dev = torch.device("cuda")
    for call in range(3):
        gen = torch.Generator(device=dev).manual_seed(call)
        h = (2 * torch.randn(rows, 2 * ffn, generator=gen, device=dev)).to(torch.bfloat16)
        grad = torch.randn(rows, ffn, generator=gen, device=dev).to(torch.bfloat16)
        out = torch.full((rows, ffn), float("nan"), dtype=torch.bfloat16, device=dev)
        grad_h = torch.full_like(h, float("nan"))
        launch_swiglu(h, out)
        launch_swiglu_grad(grad, h, grad_h)
        x = h.double().requires_grad_()
        want = F.silu(x[:, :ffn]) * x[:, ffn:]
        want.backward(grad.double())
        for name, got, ref in (("output", out, want.detach()), ("gradient", grad_h, x.grad)):
            err = relative_error(got.double(), ref)
            assert err < 1e-2, f"call {call}: the {name} is off by {err:.2e}"
        y = swiglu(h.requires_grad_(), ffn)  # through autograd
        y.backward(grad)
        assert (
            relative_error(y.double(), want.detach()) < 1e-2
            and relative_error(h.grad.double(), x.grad) < 1e-2
        )


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA GPU")
        return 3
    return run_checks(
        [
            ("SwiGLU at Qwen3-30B-A3B's expert width (768)", lambda: check(33000, 768)),
            ("SwiGLU at the DeepSeek-like expert width (2048)", lambda: check(9000, 2048)),
            ("SwiGLU, an odd width beyond a block (1100)", lambda: check(513, 1100)),
        ]
    )


if __name__ == "__main__":
    sys.exit(main())
