"""Layer: gloo process groups on the CPU. `examples/tp_block.py` (a transformer block under tensor
and sequence parallelism on `syncopate.tp`) runs as its docstring says with `--cpu`, and at every
step its split block's loss and gradients are the whole block's, at 2 and 4 ranks."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "tp_block.py"


@pytest.mark.parametrize("world", [2, 4])
def test_the_tensor_parallel_block_example_trains_as_the_whole_block(world, tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            str(EXAMPLE),
            "--cpu",
            "--world",
            str(world),
            "--seq",
            "16",
            "--hidden",
            "16",
            "--heads",
            "4",
            "--ffn",
            "32",
            "--steps",
            "3",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = re.findall(
        r"relative difference (\S+)\); gradients' largest relative difference (\S+)", proc.stdout
    )
    assert len(steps) == 3, proc.stdout
    for loss_diff, grad_diff in steps:
        assert float(loss_diff) < 1e-10 and float(grad_diff) < 1e-10, proc.stdout
