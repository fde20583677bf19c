"""Layer: one GPU. A fused kernel relaunched from a context's cache (`launch._Relaunch`) computes
what a launch through Triton's dispatch computes, with each call's own tensors (fresh inputs and
poisoned outputs every call, against float32), for the consumer and both producers (in Triton and
in Gluon, the Gluon consumer also with chunks landing while it runs); an output whose address changes alignment takes the full launch again. The checks
(tests/support/relaunch_check.py) run in a fresh process without TRITON_INTERPRET, which the
interpreter tests set in this one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[1]


def test_relaunched_kernels_use_each_calls_tensors():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, str(ROOT / "tests/support/relaunch_check.py")], env=env,
                          capture_output=True, text=True, timeout=540)
    if done.returncode == 3:
        pytest.skip(done.stdout.strip())
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("ok    ") == 10, done.stdout
