"""Layer: Ray on the CPU. `syncopate tune` end to end on one local Ray instance with declared GPU
resources (`num_gpus=2`): gangs of actors with a gloo group, the cpu-fixture runner, the
coordinator, its watchdog and the tests' SQLite store. Planted hangs, crashes and errors."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest
from rich.console import Console
from support.sqlite_store import SqliteTrialStore
from support.sweeps import fixture_sweep, planned_keys

from syncopate.autotuner import store as store_module
from syncopate.autotuner.tune import TuneOptions, run_tune
from syncopate.cli import main
from syncopate.errors import RuntimeUnavailableError
from syncopate.search_space import Candidate, Workload
from syncopate.workers.fixture_runner import candidate_time

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module", autouse=True)
def ray_cluster():
    import ray

    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield
    ray.shutdown()


def tune(config: Path, db: Path, **options):
    return run_tune(
        TuneOptions(config=config, db=f"sqlite:///{db}", form_timeout_s=120, **options),
        open_store=SqliteTrialStore.open,
        console=Console(file=io.StringIO()),
    )


def rows(db: Path, sql: str, *args):
    store = SqliteTrialStore(str(db))
    try:
        return store.rows(sql, args)
    finally:
        store.close()


def trials(db: Path) -> dict[str, dict]:
    return {k: json.loads(r) for k, r in rows(db, "SELECT candidate_key, record FROM trials ORDER BY id")}


# -- the pipeline -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pipeline")
    config = fixture_sweep(
        tmp,
        name="pipeline",
        strategy="grid",
        max_trials=6,
        shapes=(("ag_gemm", (4096, 4096, 4096)), ("gemm_rs", (4096, 8192, 4096))),
    )
    db = tmp / "trials.db"
    return config, db, tune(config, db)


def test_every_planned_trial_is_stored_once_as_fixture(pipeline):
    config, db, result = pipeline
    assert result.status == "done" and not result.resumed
    stored = rows(db, "SELECT workload_key, candidate_key, status, source FROM trials")
    assert len(stored) == 12 and len({(w, c) for w, c, _, _ in stored}) == 12
    assert {(w, c) for w, c, _, _ in stored} == {
        (w, k)
        for i, w in enumerate(["ag_gemm/4096x4096x4096/bf16", "gemm_rs/4096x8192x4096/bf16"])
        for k in planned_keys(config, i)
    }
    assert {s for _, _, s, _ in stored} == {"ok"} and {src for _, _, _, src in stored} == {"fixture"}
    assert rows(db, "SELECT status FROM sweeps") == [("done",)]


def test_times_are_the_fixture_model_measured_through_the_gang(pipeline):
    _, db, _ = pipeline
    for rec in trials(db).values():
        workload = Workload.from_dict(rec["workload"])
        expected = candidate_time(workload, Candidate.from_dict(rec["candidate"]), 2)
        assert rec["median_us"] == pytest.approx(expected, rel=0.011)
        assert len(rec["samples_us"]) == 5 and rec["p20_us"] <= rec["median_us"] <= rec["p80_us"]


def test_baselines_are_stored_once_per_workload(pipeline):
    _, db, _ = pipeline
    names = rows(db, "SELECT workload_key, name, source FROM baselines ORDER BY workload_key, name")
    assert names == [
        (w, n, "fixture")
        for w in ("ag_gemm/4096x4096x4096/bf16", "gemm_rs/4096x8192x4096/bf16")
        for n in ("comm_alone", "gemm_alone", "torch_async_tp", "torch_seq")
    ]


def test_best_is_the_fastest_stored_trial_with_its_speedup(pipeline):
    _, db, result = pipeline
    for summary in result.summaries:
        medians = rows(
            db, "SELECT candidate_key, median_us FROM trials WHERE workload_key = ?", summary.workload
        )
        fastest = min(medians, key=lambda r: r[1])
        assert summary.best.candidate.key() == fastest[0]
        seq = rows(
            db,
            "SELECT median_us FROM baselines WHERE workload_key = ? AND name = 'torch_seq'",
            summary.workload,
        )
        assert summary.speedup == pytest.approx(seq[0][0] / fastest[1])
        assert summary.bound_us is not None and summary.bound_us <= summary.torch_seq_us


def test_trials_carry_provenance(pipeline):
    _, db, result = pipeline
    worker = next(iter(trials(db).values()))["worker"]
    assert worker["runner"] == "cpu-fixture" and worker["gang"] == 0
    assert (
        len(worker["gpu_uuids"]) == 2 and len(set(worker["actor_ids"])) == 2 and len(set(worker["pids"])) == 2
    )
    assert worker["host"] and worker["git"] and worker["versions"]["torch"]
    assert worker["finished_at"].endswith("+00:00")
    assert result.progress.handling_ms and result.progress.idle_gap_ms


def test_as_many_gangs_as_the_gpus_allow_until_the_time_budget(tmp_path):
    config = fixture_sweep(
        tmp_path,
        name="two-gangs",
        topology="H200x1-nvlink",
        strategy="grid",
        max_trials=40,
        fixture={"delay_s": 0.3, "gpus": 2},
    )
    db = tmp_path / "trials.db"
    result = tune(config, db, time_budget_s=2.0)
    assert result.status == "stopped" and result.progress.gangs == 2
    stored = trials(db)
    assert 4 <= len(stored) < 40
    assert {rec["worker"]["gang"] for rec in stored.values()} == {0, 1}
    assert rows(db, "SELECT status FROM sweeps") == [("stopped",)]


# -- faults -----------------------------------------------------------------------------------

DEADLINE_S = 4.0


@pytest.fixture(scope="module")
def faults(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("faults")
    probe = fixture_sweep(tmp, name="faults", max_trials=10)
    keys = planned_keys(probe)
    planted = {
        "hang": [keys[1]],
        "crash": [keys[3]],
        "fail": {keys[4]: "oom", keys[5]: "error", keys[6]: "wrong_result", keys[7]: "compile_error"},
    }
    config = fixture_sweep(tmp, name="faults", max_trials=10, deadline_s=DEADLINE_S, fixture=planted)
    db = tmp / "trials.db"
    return keys, db, tune(config, db)


def test_faulty_sweep_completes_with_every_trial_stored(faults):
    keys, db, result = faults
    assert result.status == "done"
    assert [k for k, _ in rows(db, "SELECT candidate_key, status FROM trials ORDER BY id")] == keys
    statuses = dict(rows(db, "SELECT candidate_key, status FROM trials"))
    assert [statuses[k] for k in keys] == [
        "ok",
        "timeout",
        "ok",
        "crash",
        "oom",
        "crash",
        "wrong_result",
        "compile_error",
        "ok",
        "ok",
    ]


def test_hang_is_stopped_at_its_deadline_and_the_gang_rebuilt(faults):
    keys, db, result = faults
    recs = trials(db)
    hung = recs[keys[1]]
    assert "deadline" in hung["error"] and hung["median_us"] is None
    assert DEADLINE_S <= hung["worker"]["elapsed_s"] < DEADLINE_S + 1.5
    before, after = recs[keys[0]]["worker"], recs[keys[2]]["worker"]
    assert after["build"] == before["build"] + 1
    assert set(after["actor_ids"]).isdisjoint(before["actor_ids"])
    assert recs[keys[2]]["status"] == "ok"


def test_crash_is_stored_with_the_dead_rank_and_the_gang_rebuilt(faults):
    keys, db, _ = faults
    recs = trials(db)
    crashed = recs[keys[3]]
    assert crashed["error"].startswith("rank 1: the worker process died")
    assert recs[keys[4]]["worker"]["build"] == crashed["worker"]["build"] + 1


def test_runner_exceptions_get_their_classified_status(faults):
    keys, db, result = faults
    recs = trials(db)
    assert recs[keys[4]]["error"].startswith("MemoryError: fixture")
    assert recs[keys[5]]["error"].startswith("RuntimeError: fixture")
    assert recs[keys[7]]["error"].startswith("PlantedFault: fixture")
    assert recs[keys[6]]["max_rel_error"] == 0.5
    # an unexpected exception leaves the process untrusted: rebuilt; an oom does not
    assert recs[keys[5]]["worker"]["build"] == recs[keys[4]]["worker"]["build"]
    assert recs[keys[6]]["worker"]["build"] == recs[keys[5]]["worker"]["build"] + 1
    assert result.progress.rebuilds == 3


def test_a_wrong_result_never_becomes_best(faults):
    keys, db, result = faults
    (summary,) = result.summaries
    assert summary.best.status == "ok"
    assert summary.best.candidate.key() in {keys[0], keys[2], keys[8], keys[9]}
    assert summary.failures == {"timeout": 1, "crash": 2, "oom": 1, "wrong_result": 1, "compile_error": 1}


# -- bad input that needs the cluster: one line, exit 2, nothing written -------------------------


def run_cli(monkeypatch, capsys, *args) -> tuple[int, list[str]]:
    monkeypatch.setattr(store_module, "open_store", SqliteTrialStore.open)
    code = main(["tune", *map(str, args)])
    return code, capsys.readouterr().err.strip().splitlines()


def test_fewer_gpus_than_the_topology_asks(tmp_path, monkeypatch, capsys):
    config = fixture_sweep(tmp_path, topology="H200x4-nvlink")
    code, err = run_cli(monkeypatch, capsys, config, "--db", f"sqlite:///{tmp_path / 't.db'}")
    assert code == 2 and len(err) == 1, err
    assert "topology H200x4-nvlink needs 4 GPUs on one node; the cluster has 2 GPU(s)" in err[0]
    assert rows(tmp_path / "t.db", "SELECT count(*) FROM sweeps") == [(0,)]


def test_gpus_of_mixed_models(tmp_path, monkeypatch, capsys):
    config = fixture_sweep(tmp_path, fixture={"gpu_models": ["H200", "H100"]})
    code, err = run_cli(monkeypatch, capsys, config, "--db", f"sqlite:///{tmp_path / 't.db'}")
    assert code == 2 and len(err) == 1, err
    assert "GPUs of mixed models (H100, H200): gang 0 rank 0: H200 (FIXTURE-" in err[0]
    assert rows(tmp_path / "t.db", "SELECT count(*) FROM sweeps") == [(0,)]


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.skipif(_cuda(), reason="torch sees a CUDA device here: the gpu runner would bind it")
def test_gpu_runner_where_torch_has_no_cuda(tmp_path, monkeypatch, capsys):
    config = fixture_sweep(tmp_path, runner="gpu")
    code, err = run_cli(monkeypatch, capsys, config, "--db", f"sqlite:///{tmp_path / 't.db'}")
    assert code == 2 and len(err) == 1, err
    assert "gang 0 could not start" in err[0] and "sees no CUDA device" in err[0]
    assert rows(tmp_path / "t.db", "SELECT count(*) FROM sweeps") == [(0,)]


def test_run_tune_raises_the_error_classes(tmp_path):
    config = fixture_sweep(tmp_path, topology="H200x4-nvlink")
    with pytest.raises(RuntimeUnavailableError, match="needs 4 GPUs on one node"):
        tune(config, tmp_path / "t.db")
