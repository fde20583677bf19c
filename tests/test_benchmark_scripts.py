"""Layer: the maintainer tools under benchmarks/ on a machine without a GPU: every script answers
`--help`, and those that need a GPU say so in one line and exit 1 instead of a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p.name for p in (REPO / "benchmarks").glob("*.py"))
GPU_ONLY = ("first_call.py", "gpu_single.py", "graph_calls.py", "moe_kernel.py")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=120, env=_env()
    )


def _env() -> dict:
    import os

    return {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(REPO)}


def test_the_scripts_are_the_ones_this_test_knows():
    assert set(GPU_ONLY) <= set(SCRIPTS) and len(SCRIPTS) >= 10


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_benchmark_script_answers_help(script):
    done = _run(f"benchmarks/{script}", "--help")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage" in done.stdout.lower() and "Traceback" not in done.stderr


@pytest.mark.parametrize("script", GPU_ONLY)
def test_a_script_that_needs_a_gpu_says_so_in_one_line(script):
    done = _run(f"benchmarks/{script}")
    err = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(err) == 1 and "needs a CUDA GPU" in err[0], done.stderr[-2000:]


def test_graph_calls_refuses_a_bad_config_before_looking_for_a_gpu():
    done = _run("benchmarks/graph_calls.py", "--config", '{"template": "spiral"}')
    err = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(err) == 1, done.stderr[-2000:]
    assert "--config" in err[0] and "'spiral'" in err[0] and "direct" in err[0]
