"""Layer: gloo process groups on the CPU. benchmarks/train_step.py with --cpu: transformers' Llama at
tiny widths trained by torch's styles and by syncopate.tp's on two ranks, its table and JSON (the
same losses within float32 rounding, the variants that need CUDA said to be impossible in their
rows), and its refusals of a world or a token count that do not split."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "benchmarks/train_step.py", *args],
        cwd=REPO,
        capture_output=True,
        check=False,
        text=True,
        timeout=280,
    )


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_cpu_run_trains_both_plans_and_reports_them(tmp_path):
    pytest.importorskip("transformers")
    out = _run(
        "--cpu",
        "--world",
        "2",
        "--tokens",
        "64",
        "--batch",
        "2",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--variants",
        "torch",
        "async-tp",
        "syncopate",
        "syncopate-graphs",
        "--json",
        str(tmp_path / "r.json"),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads((tmp_path / "r.json").read_text())
    rows = {r["variant"]: r for r in result["variants"]}
    assert (result["world"], result["tokens"], result["batch"], result["sequence"]) == (2, 64, 2, 32)
    assert (
        len(rows["torch"]["losses"]) == 3
        and rows["torch"]["step_ms"] > 0
        and rows["torch"]["tokens_per_s"] > 0
    )
    assert rows["syncopate"]["max_loss_diff_vs_torch"] < 1e-4
    assert "not possible on the CPU" in rows["async-tp"]["skipped"]
    assert "not possible on the CPU" in rows["syncopate-graphs"]["skipped"]
    lines = out.stdout.splitlines()
    assert any(line.startswith("syncopate ") for line in lines) and any(
        "async-tp" in line and "not possible" in line for line in lines
    )


@pytest.mark.parametrize(
    "args, said",
    [
        (["--cpu", "--world", "1"], "world size 1"),
        (["--cpu", "--world", "2", "--tokens", "63"], "--tokens 63 must be"),
        ([], "run it under torchrun"),
    ],
)
def test_what_does_not_split_is_refused(args, said):
    out = _run(*args)
    assert out.returncode == 2 and said in out.stderr
