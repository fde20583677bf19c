"""Layer: one GPU. The MoE experts' fused SwiGLU and its gradient at the expert widths of
configs/moe_ep.yaml, against float64, outputs poisoned, back to back (tests/support/swiglu_check.py,
in a fresh process without TRITON_INTERPRET, which the interpreter tests set in this one)."""

from __future__ import annotations

import pytest
from support.checks import run_script

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300)]


def test_the_fused_swiglu_matches_float64_on_a_gpu():
    done = run_script("swiglu_check.py", timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("ok    ") == 3, done.stdout
