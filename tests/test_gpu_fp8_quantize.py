"""Layer: one GPU. FP8 quantization's Triton kernels (`syncopate.kernels.fp8_cast`) against torch's
reduction and division of the same operands: scales and bytes at an FP8 layer's operand shapes,
row-wise and column-wise, every layout, outputs poisoned, back to back (tests/support/quantize_check.py,
in a fresh process without TRITON_INTERPRET, which the interpreter tests set in this one)."""

from __future__ import annotations

import pytest
from support.checks import run_script

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300)]


def test_the_quantize_kernels_give_torchs_scales_and_bytes_on_a_gpu():
    done = run_script("quantize_check.py", timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("ok    ") == 12, done.stdout
