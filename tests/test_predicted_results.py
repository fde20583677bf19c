"""Layer: pure CPU, over committed files. results/predicted-h200-tp2-tp4-tp8.db holds only
predictions (the cost model's, source `predicted`) of the llama_tp2, llama_tp4 and llama_tp8
sweeps, and results/predicted-tp4-tp8.md is exactly what benchmarks/predict_tp.py prints from it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from support.stored import rows

REPO = Path(__file__).resolve().parents[1]
DB = REPO / "results" / "predicted-h200-tp2-tp4-tp8.db"
TABLE = REPO / "results" / "predicted-tp4-tp8.md"


def test_the_database_holds_predictions_of_the_three_suites_only():
    url = f"sqlite:///{DB}"
    assert DB.stat().st_size < 5_000_000
    sweeps = rows(
        url,
        "SELECT s.name, s.status, t.key, count(*), min(tr.source), max(tr.source) "
        "FROM syncopate_trials tr JOIN syncopate_sweeps s ON s.id = tr.sweep_id "
        "JOIN syncopate_topologies t ON t.id = tr.topology_id GROUP BY s.id ORDER BY s.id",
    )
    assert sweeps == [
        ("llama_tp2", "done", "H200x2-nvlink", 18 * 64, "predicted", "predicted"),
        ("llama_tp4", "done", "H200x4-nvswitch", 18 * 64, "predicted", "predicted"),
        ("llama_tp8", "done", "H200x8-nvswitch", 18 * 64, "predicted", "predicted"),
    ]
    assert rows(url, "SELECT DISTINCT source FROM syncopate_baselines") == [("predicted",)]


def test_the_table_is_what_the_script_prints_from_the_database():
    out = subprocess.run(
        [sys.executable, "benchmarks/predict_tp.py", "--db", str(DB)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out == TABLE.read_text()
    first = out.splitlines()[0]
    assert first.startswith("PREDICTIONS of Syncopate's cost model under its DEFAULT calibration")
    assert "NOT measurements" in first
