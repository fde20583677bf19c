"""Layer: gloo process groups on the CPU, and multi-GPU. benchmarks/moe_unfused.py: with --cpu on a
shrunk case, both paths agree and the table and JSON come out; a bad file is refused with exit 2;
on two GPUs (skipped here), the file's Qwen3 layer at EP=2 with fewer tokens."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _run(tmp_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "benchmarks/moe_unfused.py", *args],
        cwd=REPO,
        capture_output=True,
        check=False,
        text=True,
        timeout=240,
        env={**os.environ, "OUT": str(tmp_path)},
    )


def _check(tmp_path, out, cases: int) -> None:
    assert out.returncode == 0, out.stderr[-3000:]
    rows = json.loads((tmp_path / "moe_unfused.json").read_text())
    assert len(rows) == cases
    assert {r["kind"] for r in rows} == {"a2a_gemm", "gemm_a2a"}
    for r in rows:
        assert r["rel_error"] < 1e-2
        assert r["times"]["syncopate_unfused"]["median_us"] > 0 and r["times"]["torch_plain"]["median_us"] > 0
    assert "qwen3_30b_a3b" in out.stdout


def test_the_cpu_run_checks_and_times_both_paths(tmp_path):
    args = ("--cpu", "--models", "qwen3_30b_a3b", "--ep", "2", "--shrink", "64", "--tokens", "16")
    _check(tmp_path, _run(tmp_path, *args, "--repetitions", "2"), cases=4)


def test_a_bad_file_is_refused(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "ep: [3]\ntokens: [8]\nroutings: [{}]\nmodels: {m: {hidden: 8, ffn: 8, experts: 8, top_k: 2}}\n"
    )
    out = _run(tmp_path, "--cpu", "--config", str(bad))
    assert out.returncode == 2
    assert "experts=8 is not divisible by world size 3" in out.stderr


@pytest.mark.multigpu
def test_two_gpus_run_the_qwen_layer(tmp_path):
    args = ("--models", "qwen3_30b_a3b", "--ep", "2", "--tokens", "1024", "--repetitions", "5")
    _check(tmp_path, _run(tmp_path, *args), cases=4)
