"""Layer: the Triton compiler on the CPU. The fused kernels compile for an H100/H200 (sm_90).

The interpreter tests run the kernels' logic; this one runs what only the compiler sees (TMA
descriptors, the PTX acquire waits, the producer's pointer and TMA epilogues, in column halves and
on whole tiles, on FP8 tiles, the consumer and producer in Gluon, which no interpreter runs, the
copier, the last pull) in a fresh process, so that a kernel Triton cannot compile fails here rather than at the
start of a GPU run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parent / "support" / "compile_sm90.py"


def test_every_launched_kernel_variant_compiles_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(SCRIPT.parents[2]), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=600)
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    ok = [line for line in lines if line.startswith("ok ")]
    assert len(ok) == 35, done.stdout
    assert sum("tail cut in K" in line for line in ok) == 3, done.stdout
    assert sum("tma epilogue" in line for line in ok) == 5, done.stdout
    fused_fp8 = [line for line in ok if " fp8" in line and "quantize" not in line]
    assert len(fused_fp8) == 9, done.stdout  # the fused kernels on FP8 tiles
    assert sum("whole-tile" in line for line in ok) == 2, done.stdout  # tiles of 16 columns: no column halves
    # In Gluon: the producer (both kinds, four ranks, FP8 tiles) and the consumer (its shard, a K-major B).
    assert sum(" gluon " in line for line in ok) == 7, done.stdout
    assert all("acquire loads" in line for line in ok)
    # The consumer's last-wave parts add up in slices: the kernel keeps its main loop's registers (a
    # whole second tile had taken it to 255 and spills, leaving no room on an SM for a copy beside it).
    consumers = [line for line in ok if line.startswith("ok    consumer") and " gluon " not in line]
    assert consumers and all(", 0 stack bytes" in line for line in consumers), done.stdout
    assert all(int(line.split(" registers")[0].rsplit(" ", 1)[1]) <= 232 for line in consumers), done.stdout
    # Every wait the consumer and producer compile is an acquire load (the copier, a captured call's
    # entry and the decomposed all-reduce's last pull poll with atomics).
    assert all(
        " 0 acquire loads" not in line
        for line in ok
        if not any(word in line for word in ("copier", "entry", "last pull", "fp8 quantize"))
    ), done.stdout
