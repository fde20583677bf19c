"""Layer: pure CPU, over committed files. The measured sweeps under results/ hold what their configs
enumerate, every trial measured, with the baselines of every workload; the tables beside them are
exactly what benchmarks/sweep_report.py prints from them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from support.stored import rows

from syncopate.autotuner.sweep import load_sweep
from syncopate.search_space import space
from syncopate.workers.replay_runner import load_sweep_db

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "results"
BASELINES = {"torch_seq", "torch_async_tp", "gemm_alone", "comm_alone"}

SWEEPS = {
    # database: (config, sweep name)
    "llama_tp2-sweep.db": ("configs/llama_tp2_sweep.yaml", "llama_tp2_sweep"),
    "llama_tp4-sweep.db": ("configs/llama_tp4_sweep.yaml", "llama_tp4_sweep"),
    "llama_tp2-tune.db": ("configs/llama_tp2.yaml", "llama_tp2"),
    "llama_tp4-tune.db": ("configs/llama_tp4.yaml", "llama_tp4"),
}


@pytest.mark.parametrize("db", sorted(SWEEPS))
def test_a_measured_sweep_holds_every_candidate_its_config_enumerates(db):
    config, name = SWEEPS[db]
    url = f"sqlite:///{RESULTS / db}"
    assert (RESULTS / db).stat().st_size < 5_000_000
    cfg = load_sweep(config)
    topology = cfg.topology()
    stored = load_sweep_db(url, name, topology)
    assert rows(url, "SELECT DISTINCT source FROM syncopate_trials") == [("measured",)]
    # the sweep, and the re-measurement of each workload's top candidates before its winner was stored
    assert rows(url, "SELECT name, status FROM syncopate_sweeps ORDER BY id") == [
        (name, "done"),
        (f"{name}+confirm", "done"),
    ]
    assert [w.key() for w in cfg.workloads] == list(stored.trials)
    for w in cfg.workloads:
        trials = stored.trials[w.key()]
        wanted = {c.key() for c in space(w, topology, cfg.space)}
        if cfg.strategy.max_trials is None:  # exhaustive: every candidate, each verified and timed
            assert wanted <= set(trials), w.key()
        else:
            assert len(trials) == cfg.strategy.max_trials and set(trials) <= wanted, w.key()
        assert all(trials[k].status == "ok" and trials[k].median_us > 0 for k in wanted & set(trials)), (
            w.key()
        )
        assert BASELINES <= set(stored.baselines[w.key()]), w.key()


@pytest.mark.parametrize("db", sorted(SWEEPS))
def test_a_measured_sweep_holds_nothing_its_config_does_not_enumerate(db):
    """Every sweep under results/ ran with the space as it is now (the TP=4 sweep was measured again
    after the space stopped offering kept_interleaved on ring plans, which the ops refuse)."""
    config, name = SWEEPS[db]
    cfg = load_sweep(config)
    topology = cfg.topology()
    stored = load_sweep_db(f"sqlite:///{RESULTS / db}", name, topology)
    for w in cfg.workloads:
        wanted = {c.key() for c in space(w, topology, cfg.space)}
        assert set(stored.trials[w.key()]) <= wanted, w.key()


@pytest.mark.parametrize(
    "db, topology", [("llama_tp2-sweep.db", "H200x2-nvlink"), ("llama_tp4-tune.db", "H200x4-nvswitch")]
)
def test_a_sweep_stores_the_calibrations_measured_beside_it(db, topology):
    url = f"sqlite:///{RESULTS / db}"
    got = rows(
        url,
        "SELECT c.kind, c.key, c.source, t.key FROM syncopate_calibrations c "
        "JOIN syncopate_topologies t ON t.id = c.topology_id ORDER BY c.kind, c.key",
    )
    assert got == [
        ("gemm", "128x128x64w8s4", "measured", topology),
        ("gemm", "128x256x64w8s3", "measured", topology),
        ("op_costs", "op", "measured", topology),
        ("transfer", "copy_engine/intra", "measured", topology),
        ("transfer", "nccl/intra", "measured", topology),
        ("transfer", "sm_copy/intra", "measured", topology),
    ]


REPORTS = {
    "llama_tp2-sweep.md": [
        "--config",
        "configs/llama_tp2_sweep.yaml",
        "--sweep",
        "sqlite:///results/llama_tp2-sweep.db",
        "--calibration-db",
        "sqlite:///results/llama_tp2-sweep.db",
    ],
    "llama_tp2-tune.md": [
        "--config",
        "configs/llama_tp2.yaml",
        "--sweep",
        "sqlite:///results/llama_tp2-tune.db",
        "--calibration-db",
        "sqlite:///results/llama_tp2-sweep.db",
        "--predicted",
        "sqlite:///results/predicted-h200-tp2-tp4-tp8.db",
        "--predicted-sweep",
        "llama_tp2",
    ],
    "llama_tp4-sweep.md": [
        "--config",
        "configs/llama_tp4_sweep.yaml",
        "--sweep",
        "sqlite:///results/llama_tp4-sweep.db",
        "--predicted",
        "sqlite:///results/predicted-h200-tp2-tp4-tp8.db",
        "--predicted-sweep",
        "llama_tp4",
    ],
    "llama_tp4-tune.md": [
        "--config",
        "configs/llama_tp4.yaml",
        "--sweep",
        "sqlite:///results/llama_tp4-tune.db",
        "--calibration-db",
        "sqlite:///results/llama_tp4-tune.db",
        "--predicted",
        "sqlite:///results/predicted-h200-tp2-tp4-tp8.db",
        "--predicted-sweep",
        "llama_tp4",
    ],
}


@pytest.mark.slow
@pytest.mark.parametrize("table", sorted(REPORTS))
def test_each_table_is_what_the_report_prints_from_its_sweep(table):
    out = subprocess.run(
        [sys.executable, "benchmarks/sweep_report.py", *REPORTS[table]],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out == (RESULTS / table).read_text() + "\n"
    assert out.startswith("Measured sweep")
