"""Layer: pure CPU logic over databases. The dashboard's data functions on the fixture database of
`dashboard_data.py`, on SQLite and on PostgreSQL (the same suite), against the answers it was
built with: best configurations, speedups, the overlap bound, filters, drill-downs and sweeps."""

from __future__ import annotations

import math

import dashboard_data as fx
import pandas as pd
import pytest

from syncopate.dashboard import data
from syncopate.errors import ConfigError
from syncopate.results_db import ResultsDB


@pytest.fixture
def db(db_url):
    fx.fill(db_url)
    with ResultsDB.open(db_url, upgrade=False) as rdb:
        yield rdb


def row(frame: pd.DataFrame, **match) -> pd.Series:
    found = frame
    for k, v in match.items():
        found = found[found[k] == v]
    assert len(found) == 1, (match, found)
    return found.iloc[0]


W1, W2, W3 = fx.W1.key(), fx.W2.key(), fx.W3.key()
ENV, OTHER = fx.ENV.key(), fx.OTHER_ENV.key()


def sel(workload=W1, environment=ENV, source="measured", topology="H200x2-nvlink") -> data.Selection:
    return data.Selection(workload=workload, topology=topology, environment=environment, source=source)


# ---- overview ---------------------------------------------------------------------------------


def test_overview_best_speedups_and_bound(db):
    frame = data.overview(db)
    assert len(frame) == 7  # W1, W2, W3, W1 predicted under ENV; W1, W2 under OTHER; W2 on the H100s
    r = row(frame, workload=W1, environment=ENV, source="measured")
    assert r["best_us"] == 400.0 and r["config"] == fx.CE2.short()
    assert (r["backend"], r["num_splits"], r["tile_order"]) == ("copy_engine", 2, "arrival")
    assert (r["trials"], r["ok"], r["failed"]) == (6, 3, 3)
    assert r["speedup_seq"] == pytest.approx(1.5) and r["speedup_async_tp"] == pytest.approx(1.2)
    assert r["bound_us"] == 300.0 and r["of_bound"] == pytest.approx(0.75)
    assert r["p20_us"] == pytest.approx(396.0) and r["sweep_id"] == 1
    assert r["env_label"].startswith("torch 2.11.0+cu130 · triton 3.6.0") and r["shape"] == "8192×2048×8192"

    w2 = row(frame, workload=W2, environment=ENV, topology="H200x2-nvlink")
    assert w2["best_us"] == 330.0 and w2["bound_us"] == pytest.approx(208.0)
    assert w2["of_bound"] == pytest.approx(208.0 / 330.0)


def test_overview_never_merges_predicted_with_measured(db):
    frame = data.overview(db)
    predicted = row(frame, workload=W1, environment=ENV, source="predicted")
    assert predicted["best_us"] == 350.0  # faster than the measured 400, and kept apart from it
    assert math.isnan(predicted["speedup_seq"]) and math.isnan(
        predicted["of_bound"]
    )  # no predicted baselines
    assert row(frame, workload=W1, environment=ENV, source="measured")["best_us"] == 400.0


def test_overview_lists_shapes_without_ok_trials_and_without_baselines(db):
    frame = data.overview(db)
    failed = row(frame, topology="H100x8-nvswitch")
    assert (failed["trials"], failed["ok"], failed["failed"]) == (2, 0, 2)
    assert pd.isna(failed["best_us"]) and pd.isna(failed["best_trial_id"]) and failed["config"] == ""
    w3 = row(frame, workload=W3)
    assert w3["best_us"] == 800.0 and math.isnan(w3["speedup_seq"])
    upgraded = row(frame, workload=W1, environment=OTHER)
    assert upgraded["speedup_seq"] == pytest.approx(610.0 / 420.0) and math.isnan(upgraded["of_bound"])


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        (data.Filters(topologies=("H100x8-nvswitch",)), {(W2, ENV, "measured")}),
        (data.Filters(environments=(OTHER,)), {(W1, OTHER, "measured"), (W2, OTHER, "measured")}),
        (data.Filters(dtypes=("fp16",)), {(W3, ENV, "measured")}),
        (
            data.Filters(kinds=("gemm_rs",), topologies=("H200x2-nvlink",)),
            {(W2, ENV, "measured"), (W2, OTHER, "measured")},
        ),
        (data.Filters(sources=("predicted",)), {(W1, ENV, "predicted")}),
        (data.Filters(topologies=("H100x2-nvlink",)), set()),
    ],
)
def test_overview_filters(db, filters, expected):
    frame = data.overview(db, filters)
    assert set(zip(frame["workload"], frame["environment"], frame["source"], strict=True)) == expected
    assert list(frame.columns) == list(data.overview(db).columns)


def test_filters_check_their_values():
    with pytest.raises(ConfigError, match="unknown source 'guessed'"):
        data.Filters(sources=("guessed",))
    with pytest.raises(ConfigError, match="tuple of strings"):
        data.Filters(topologies="H200x2-nvlink")
    assert not data.Filters().active() and data.Filters(dtypes=("bf16",)).active()


def test_filter_options_and_counts(db):
    options = data.filter_options(db)
    assert options.topologies == ("H100x8-nvswitch", "H200x2-nvlink")
    assert list(options.environments) == [ENV, OTHER]
    assert options.environments[OTHER].startswith("torch 2.12.0+cu130")
    assert options.dtypes == ("bf16", "fp16") and options.kinds == ("ag_gemm", "gemm_rs")
    assert options.sources == ("measured", "predicted")
    assert data.counts(db) == {"trials": 14, "baselines": 11, "sweeps": 3, "workloads": 3}


def test_empty_database(tmp_path):
    with ResultsDB.open(fx.build_empty(tmp_path / "empty.db"), upgrade=False) as empty:
        assert data.counts(empty) == {"trials": 0, "baselines": 0, "sweeps": 0, "workloads": 0}
        frame = data.overview(empty)
        assert frame.empty and "best_us" in frame.columns
        assert data.sweeps(empty).empty and data.filter_options(empty) == data.FilterOptions()
        assert data.compare_sweeps(empty, 1, 2).empty


# ---- drill-down -------------------------------------------------------------------------------


def test_convergence_orders_trials_per_sweep_and_strategy(db):
    trials = data.convergence(db, sel())
    assert list(trials["trial_id"]) == sorted(trials["trial_id"]) and len(trials) == 6
    grid = trials[trials["strategy"] == "grid"]
    assert list(grid["order"]) == [1, 2, 3] and list(grid["best_so_far"]) == [500.0, 400.0, 400.0]
    rand = trials[trials["strategy"] == "random"]
    assert list(rand["status"]) == ["ok", "oom", "compile_error"] and list(rand["best_so_far"]) == [450.0] * 3
    assert set(trials["series"]) == {"sweep 1 · grid", "sweep 1 · random"}
    assert list(grid["backend"]) == ["copy_engine", "copy_engine", "sm_copy"]
    assert list(grid["num_splits"]) == [4, 2, 2]
    assert not trials.attrs["thinned"] and trials.attrs["total"] == 6


def test_convergence_thins_but_keeps_every_improvement(db):
    trials = data.convergence(db, sel(), max_points=2)  # step 3: orders 1, 4, … and each new best
    assert trials.attrs["thinned"] and trials.attrs["total"] == 6
    assert set(trials["trial_id"]) == {1, 2, 4}  # grid 1 (first), grid 2 (new best), random 1 (first)
    with pytest.raises(ConfigError, match="max_points=0"):
        data.convergence(db, sel(), max_points=0)


def test_backend_splits_tile_orders_and_failures(db):
    cells = data.backend_splits(db, sel())
    found = {
        (b, s): (best, n)
        for b, s, best, n in zip(
            cells["backend"], cells["num_splits"], cells["best_us"], cells["trials"], strict=True
        )
    }
    assert found[("copy_engine", 2)] == (400.0, 1) and found[("copy_engine", 4)] == (500.0, 1)
    assert found[("nccl", 2)] == (450.0, 1) and math.isnan(found[("nccl", 4)][0])
    assert (
        math.isnan(found[("sm_copy", 2)][0]) and ("sm_copy", 4) not in found
    )  # predicted: another selection
    orders = data.tile_orders(db, sel())
    arrival = row(orders, tile_order="arrival")
    assert (arrival["best_us"], arrival["trials"], arrival["ok"], arrival["failed"]) == (400.0, 3, 1, 2)
    assert row(orders, tile_order="swizzle")["mean_us"] == 500.0
    failed = data.failures(db, sel())
    assert list(zip(failed["status"], failed["error"], failed["trials"], strict=True)) == [
        ("oom", fx.OOM_ERROR, 2),
        ("compile_error", fx.COMPILE_ERROR, 1),
    ]
    assert list(failed["first_trial"]) == [3, 6]


def test_drill_down_of_the_predicted_row_and_of_unknown_keys(db):
    predicted = data.convergence(db, sel(source="predicted"))
    assert list(predicted["median_us"]) == [350.0] and list(predicted["strategy"]) == ["cost_model"]
    unknown = sel(workload="ag_gemm/1x1x1/bf16")
    assert data.convergence(db, unknown).empty and data.backend_splits(db, unknown).empty
    assert data.failures(db, unknown).empty and data.tile_orders(db, unknown).empty


# ---- sweeps and environments ------------------------------------------------------------------


def test_sweeps(db):
    frame = data.sweeps(db)
    assert list(frame["sweep_id"]) == [3, 2, 1]
    s1 = row(frame, sweep_id=1)
    assert (s1["name"], s1["status"], s1["host"]) == ("llama", "done", "gpu-a")
    assert (s1["trials"], s1["ok"], s1["failed"], s1["workloads"]) == (10, 7, 3, 3)
    assert s1["duration_s"] == 600.0 and s1["sources"] == "measured, predicted"
    assert s1["environments"].startswith(ENV[:8] + ": torch 2.11.0+cu130")
    assert row(frame, sweep_id=3)["topologies"] == "H100x8-nvswitch"
    filtered = data.sweeps(db, data.Filters(topologies=("H100x8-nvswitch",)))
    assert list(filtered["sweep_id"]) == [3]


def test_compare_two_sweeps(db):
    compared = data.compare_sweeps(db, 1, 2)
    w1 = row(compared, workload=W1, source="measured")
    assert (w1["best_us_a"], w1["best_us_b"]) == (400.0, 420.0) and w1["ratio"] == pytest.approx(1.05)
    assert (w1["torch_seq_us_a"], w1["torch_seq_us_b"]) == (600.0, 610.0)
    assert w1["env_a"].startswith(ENV[:8]) and w1["env_b"].startswith(OTHER[:8])
    assert row(compared, workload=W2)["ratio"] == pytest.approx(320.0 / 330.0)
    only_a = row(compared, workload=W3)
    assert only_a["best_us_a"] == 800.0 and math.isnan(only_a["best_us_b"]) and math.isnan(only_a["ratio"])
    assert len(data.compare_sweeps(db, 1, 2, data.Filters(sources=("measured",), dtypes=("bf16",)))) == 2

    diff = data.environment_diff(db, 1, 2)
    changed = dict(zip(diff["field"], diff["changed"], strict=True))
    assert changed["torch"] and changed["triton"] and not changed["cuda"] and not changed["gpu_model"]
    assert list(diff.columns) == ["field", "A: sweep 1", "B: sweep 2", "changed"]


def test_a_comparison_carries_the_runs_noise_band(db):
    """Each best trial's p20 and p80 (the fixture's are 0.99 and 1.02 of its median) bound the
    ratio: W1 is slower in B beyond noise (400 against 420), W2 faster (330 against 320)."""
    compared = data.compare_sweeps(db, 1, 2)
    w1 = row(compared, workload=W1, source="measured")
    assert (w1["p20_us_a"], w1["p80_us_a"]) == (pytest.approx(396.0), pytest.approx(408.0))
    assert w1["ratio_lo"] == pytest.approx(420 * 0.99 / (400 * 1.02))
    assert w1["ratio_hi"] == pytest.approx(420 * 1.02 / (400 * 0.99))
    assert row(compared, workload=W2)["ratio_hi"] == pytest.approx(320 * 1.02 / (330 * 0.99))
    assert math.isnan(row(compared, workload=W3)["ratio_lo"])


def test_the_tables_say_yes_and_no_never_true_and_false(db):
    """What the report and the app show: no column of booleans, no cell reading True or False."""
    from syncopate.dashboard import views

    tables = [
        views.environment_diff_table(data.environment_diff(db, 1, 2)),
        views.compare_table(data.compare_sweeps(db, 1, 2)),
        views.overview_table(data.overview(db)),
        views.sweeps_table(data.sweeps(db)),
        views.environments_table(data.environments(db)),
        views.tile_orders_table(data.tile_orders(db, sel())),
        views.failures_table(data.failures(db, sel())),
    ]
    for table in tables:
        assert not [c for c in table.columns if pd.api.types.is_bool_dtype(table[c])], table.dtypes
        cells = {str(v) for v in table.astype(str).to_numpy().ravel()}
        assert not cells & {"True", "False"}, table
    diff = dict(zip(tables[0]["field"], tables[0]["changed"]))
    assert (diff["torch"], diff["cuda"]) == ("yes", "no")
    compared = tables[1].set_index(["kind", "dtype", "source"])
    assert compared.loc[("ag_gemm", "bf16", "measured"), "verdict"] == "B slower"
    assert compared.loc[("gemm_rs", "bf16", "measured"), "verdict"] == "B faster"
    assert compared.loc[("ag_gemm", "bf16", "measured"), "B / A noise band"] == "1.019–1.082"


def test_environments(db):
    frame = data.environments(db)
    assert list(frame["environment"]) == [ENV, OTHER] and list(frame["trials"]) == [12, 2]
    assert list(frame["torch"]) == ["2.11.0+cu130", "2.12.0+cu130"]


def test_the_unfused_template_is_a_backend_of_its_own(db_url):
    """Charts by backend keep the unfused candidate (backend `nccl` in its fields) apart from NCCL's
    fused candidates."""
    from syncopate.search_space import Candidate, unfused_candidate

    fused_nccl = Candidate(backend="nccl", num_splits=1, comm_sms=64)
    with ResultsDB.open(db_url, upgrade=True) as rdb:
        s = rdb.start_sweep("short", {}, host="gpu-a", started_at=fx.T0)
        rdb.record_trials(
            s,
            [
                fx._trial(fx.W1, unfused_candidate(), median=390.0, minute=1),
                fx._trial(fx.W1, fused_nccl, median=450.0, minute=2),
                fx._trial(fx.W1, fx.CE2, median=400.0, minute=3),
            ],
        )
        cells = data.backend_splits(rdb, sel())
        found = {
            (b, n): best
            for b, n, best in zip(cells["backend"], cells["num_splits"], cells["best_us"], strict=True)
        }
        assert found == {("copy_engine", 2): 400.0, ("nccl", 1): 450.0, ("unfused", 1): 390.0}
        trials = data.convergence(rdb, sel())
        assert list(trials["backend"]) == ["unfused", "nccl", "copy_engine"]
        assert list(trials["best_so_far"]) == [390.0, 390.0, 390.0]
