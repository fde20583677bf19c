"""Layer: pure CPU logic, timed. The dashboard's queries on 100,000 trials in SQLite (the database
benchmarks/dashboard_speed.py fills): the overview, filtered or not, and a drill-down answer in
well under the bounds below, because they aggregate in SQL (the frames they return are as long as
there are shapes, not trials). Run the benchmark for the numbers alone."""

from __future__ import annotations

import importlib.util
import statistics
import time
from pathlib import Path

import pytest

from syncopate.dashboard import data
from syncopate.results_db import ResultsDB

pytestmark = pytest.mark.slow

BENCHMARK = Path(__file__).resolve().parent.parent / "benchmarks" / "dashboard_speed.py"
OVERVIEW_BOUND_S = 2.0
"""Generous for a shared CI machine: about 0.1 s was measured on two idle CPU cores."""


def _benchmark():
    spec = importlib.util.spec_from_file_location("dashboard_speed", BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _median_s(fn, runs: int = 3) -> float:
    fn()
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    bench = _benchmark()
    with ResultsDB.open(tmp_path_factory.mktemp("speed") / "big.db", upgrade=True) as db:
        _, stored = bench.fill(db, 100_000)
        assert stored == 100_000
        yield db, bench


def test_overview_on_100k_trials(big, record_property):
    db, bench = big
    frame = data.overview(db)
    assert len(frame) == 25 * 2 * 2 * 2  # workloads × topologies × environments × (measured, predicted)
    assert int(frame["trials"].sum()) == 100_000
    seconds = _median_s(lambda: data.overview(db))
    filtered = _median_s(
        lambda: data.overview(db, data.Filters(topologies=("H200x2-nvlink",), sources=("measured",)))
    )
    record_property("overview_100k_s", seconds)
    record_property("overview_100k_filtered_s", filtered)
    print(f"\noverview of 100,000 trials: {seconds * 1e3:.0f} ms; filtered: {filtered * 1e3:.0f} ms")
    assert seconds < OVERVIEW_BOUND_S and filtered < OVERVIEW_BOUND_S


def test_best_is_the_fastest_ok_trial_on_100k(big):
    db, _ = big
    frame = data.overview(db, data.Filters(sources=("measured",)))
    with db.engine.connect() as conn:
        import sqlalchemy as sa

        expected = conn.execute(
            sa.text(
                "SELECT w.key, t.key, e.key, MIN(tr.median_us) FROM syncopate_trials tr "
                "JOIN syncopate_workloads w ON w.id = tr.workload_id "
                "JOIN syncopate_topologies t ON t.id = tr.topology_id "
                "JOIN syncopate_environments e ON e.id = tr.environment_id "
                "WHERE tr.status = 'ok' AND tr.source = 'measured' GROUP BY w.key, t.key, e.key"
            )
        ).all()
    found = {(r.workload, r.topology, r.environment): r.best_us for r in frame.itertuples()}
    assert found == {(w, t, e): m for w, t, e, m in expected}
    assert frame["speedup_seq"].notna().all() and frame["of_bound"].notna().all()


def test_drill_down_and_sweeps_on_100k(big):
    db, _ = big
    sel = data.Selection.of(data.overview(db).iloc[0])
    trials = data.convergence(db, sel)
    assert trials.attrs["total"] == 900 and not trials.attrs["thinned"]
    thinned = data.convergence(db, sel, max_points=100)
    assert thinned.attrs["thinned"] and 100 <= len(thinned) < 200
    assert thinned["best_so_far"].min() == trials["best_so_far"].min()
    seconds = _median_s(
        lambda: (
            data.convergence(db, sel),
            data.backend_splits(db, sel),
            data.tile_orders(db, sel),
            data.failures(db, sel),
            data.sweeps(db),
        )
    )
    assert seconds < OVERVIEW_BOUND_S
