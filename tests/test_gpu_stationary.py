"""Layer: one GPU. The real enqueued work (driver stream waits and writes, copy-engine copies,
cuBLAS) of the a_stationary all-gather matmul and the c_stationary matmul reduce-scatter and
all-reduce with every rank of a 2-, 3- and 4-rank group on one device, calls enqueued back to back
with fresh inputs and poisoned outputs (tests/support/stationary_check.py, in a fresh process: it
sets CUDA_DEVICE_MAX_CONNECTIONS before CUDA starts)."""

from __future__ import annotations

import pytest
from support.checks import run_script

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300)]


def test_every_rank_on_one_gpu_gets_its_output():
    done = run_script("stationary_check.py", timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("ok    ") == 12, done.stdout
