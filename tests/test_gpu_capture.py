"""Layer: one GPU. The fused ops under CUDA graph capture: refused with their ConfigError, before
a first call and after one, and right afterwards (tests/support/capture_check.py, run in a fresh
process without TRITON_INTERPRET, which the interpreter tests set in this one)."""

from __future__ import annotations

import pytest

from support.checks import run_script

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300)]


def test_the_ops_refuse_a_graph_capture_and_stay_right():
    done = run_script("capture_check.py", timeout=280)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("ok    ") == 6, done.stdout
