"""Layer: pure Python. benchmarks/ce_streams.py's pieces that run without a GPU: which side stream
each peer's copies take, the option lists it refuses, its table; and the script refuses to start
outside torchrun, saying how to run it."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location("ce_streams", REPO / "benchmarks" / "ce_streams.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_peers_are_dealt_round_robin_over_the_streams_in_the_direct_plans_order():
    b = _bench()
    assert b.stream_of_peers(0, 4, 1) == {1: 0, 2: 0, 3: 0}
    assert b.stream_of_peers(1, 4, 2) == {2: 0, 3: 1, 0: 0}
    assert b.stream_of_peers(3, 4, 3) == {0: 0, 1: 1, 2: 2}
    assert b.stream_of_peers(0, 2, 3) == {1: 0}
    with pytest.raises(ValueError, match="streams=0"):
        b.stream_of_peers(0, 4, 0)


def test_option_lists_and_the_table():
    b = _bench()
    assert b.parse_list("16, 48", "--mib") == [16, 48]
    for bad in ("", "0", "a,2", "-1"):
        with pytest.raises(SystemExit, match="positive integers"):
            b.parse_list(bad, "--streams")
    rows = [{"what": "copy engine, 2 stream(s)", "mib": 16, "us": 100.0, "landed": True}]
    rows[0]["gb_per_s"] = 3 * (16 << 20) / 100.0 / 1e3
    text = b.table(rows, 4, "GPU")
    assert "4 × GPU" in text and "503.3" in text and "copy engine, 2 stream(s)" in text


def test_outside_torchrun_it_says_how_to_run_it():
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("WORLD_SIZE", "RANK")}
    out = subprocess.run(
        [sys.executable, "benchmarks/ce_streams.py"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert out.returncode == 2 and "torchrun" in out.stderr
