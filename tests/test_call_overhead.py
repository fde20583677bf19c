"""Layer: CPU, a subprocess. `benchmarks/call_overhead.py` runs on a machine without a GPU in a
gloo group of one rank (where it also checks that our calls give torch's results) and prints one
row a case; this is a smoke run of a few calls, not a timing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_call_overhead_benchmark_runs_on_the_cpu():
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "benchmarks/call_overhead.py", "--group", "gloo", "--calls", "2", "--rounds", "2"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert "cpu, gloo group of 1 rank" in lines[0]
    rows = {line.split("  ")[0] for line in lines[3:]}
    assert {
        "all_gather_matmul",
        "all_gather_matmul, return_gathered",
        "matmul_reduce_scatter",
        "matmul_all_reduce",
        "ColumnParallelLinear, fwd+bwd",
        "RowParallelLinear(sp=False), fwd+bwd",
        "ColumnParallelLinear 3-D, no grad",
        "ColwiseParallel, no grad",
        "RowwiseParallel, no grad",
    } <= rows, done.stdout
