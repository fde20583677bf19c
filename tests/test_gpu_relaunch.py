"""Layer: one GPU. A fused kernel relaunched from a context's cache (`launch._Relaunch`) computes
what a launch through Triton's dispatch computes, with each call's own tensors (fresh inputs and
poisoned outputs every call, against float32), for the consumer and both producers (in Triton and
in Gluon, the Gluon consumer also with chunks landing while it runs) and the MoE gathered sum
(two-dimensional grids); an output whose address changes alignment takes the full launch again.
The checks (tests/support/relaunch_check.py) run in a fresh process without TRITON_INTERPRET,
which the interpreter tests set in this one."""

from __future__ import annotations

import pytest
from support.checks import run_script

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]


def test_relaunched_kernels_use_each_calls_tensors():
    done = run_script("relaunch_check.py", timeout=540)
    if done.returncode == 3:
        pytest.skip(done.stdout.strip())
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("ok    ") == 11, done.stdout
