"""Layer: the command line as a new process starts it (subprocesses, CPU only, a few seconds).

The read-only commands (`lookup`, `best`, `export`, `report`, `validate`, `space` without
`--predict`) must start without importing torch or Ray: torch alone takes seconds to import, and a
job that looks its configuration up, or a person who asks for `--help`, should not wait for it.
The assertions are on the modules a process ends up with; the time is checked only loosely, so a
loaded machine does not fail the test.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import db_data as dd
import pytest

from syncopate.results_db import ResultsDB

REPO = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "ray", "triton")
NVIDIA_DRIVER = Path("/proc/driver/nvidia/version").exists() or Path("/dev/nvidiactl").exists()

_SCRIPT = """
import contextlib, io, json, sys
sys.modules["vl_convert"] = None  # the report's charts as specs: no SVG rendering, which is slow
from syncopate.cli import main

codes = []
for argv in json.loads(sys.argv[1]):
    with contextlib.redirect_stdout(io.StringIO()):
        codes.append(main(argv))
print(json.dumps({"codes": codes, "loaded": [m for m in HEAVY if m in sys.modules]}))
""".replace("HEAVY", repr(HEAVY))


def _fill(path: Path) -> str:
    url = f"sqlite:///{path}"
    with ResultsDB.open(url, upgrade=True) as db:
        sweep = db.start_sweep("small")
        db.record_trials(sweep, [dd.trial(i, median_us=900.0 + i) for i in range(3)])
        db.record_baseline(sweep, dd.baseline("torch_seq", 1200.0))
    return url


def test_lookup_help_starts_fast():
    """`syncopate lookup --help` in a new process: under 2 s on its best of three tries (it takes
    about half a second on an idle machine; importing torch alone would take two or more)."""
    times = []
    for _ in range(3):
        start = time.perf_counter()
        r = subprocess.run(
            [sys.executable, "-m", "syncopate", "lookup", "--help"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
        times.append(time.perf_counter() - start)
        assert r.returncode == 0 and "--topology" in r.stdout, r.stderr
        if times[-1] < 2.0:
            break
    assert min(times) < 2.0, f"syncopate lookup --help took {', '.join(f'{t:.2f} s' for t in times)}"


def test_read_only_commands_import_neither_torch_nor_ray(tmp_path):
    url = _fill(tmp_path / "small.db")
    w = dd.W.shape
    shape = ["--m", str(w.m), "--n", str(w.n), "--k", str(w.k)]
    commands = [
        ["lookup", *shape, "--topology", dd.TOPO.key(), "--db", url],
        ["best", "--db", url],
        ["best", "--db", url, "--json"],
        ["export", "--db", url, "--out", str(tmp_path / "best.json")],
        ["validate", str(REPO / "configs" / "quickstart.yaml")],
        ["space", "--m", "4096", "--n", "4096", "--k", "4096", "--topology", "H200x2-nvlink"],
        ["report", "--db", url, "--out", str(tmp_path / "report.html"), "--drill-down", "1"],
    ]
    codes = [0] * len(commands)
    if not NVIDIA_DRIVER:  # no GPU to detect here: saying so must not need torch either
        commands.append(["lookup", *shape, "--db", url])
        codes.append(1)
    r = subprocess.run(
        [sys.executable, "-c", _SCRIPT, json.dumps(commands)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result["codes"] == codes, r.stderr
    assert result["loaded"] == [], f"a read-only command imported {', '.join(result['loaded'])}"
    if not NVIDIA_DRIVER:
        assert "no CUDA GPU is visible" in r.stderr


def test_the_fingerprint_read_without_torch_is_torchs():
    """Where torch can see no GPU, its version file says all the fingerprint holds: the same
    fingerprint as torch itself gives, so a lookup matches the same stored rows either way."""
    from syncopate.environment import _environment_from_torch, _environment_without_torch

    light = _environment_without_torch()
    if light is None:
        pytest.skip("torch may see a GPU here: only torch can say which")
    assert light == _environment_from_torch()
