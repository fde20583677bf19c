"""Layer: one GPU. The fused ops under CUDA graph capture: refused with their ConfigError, before
a first call and after one, and right afterwards (tests/support/capture_check.py, run in a fresh
process without TRITON_INTERPRET, which the interpreter tests set in this one)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[1]


def test_the_ops_refuse_a_graph_capture_and_stay_right():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, str(ROOT / "tests/support/capture_check.py")], env=env,
                          capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("ok    ") == 6, done.stdout
