"""Layer: Ray on the CPU. `syncopate tune` end to end on one local Ray instance with declared GPU
resources (`num_gpus=2`): gangs of actors with a gloo group, the cpu-fixture runner, the
coordinator, its watchdog and the results database (SQLite files). Planted hangs, crashes and
errors; what `syncopate best` and `lookup` serve afterwards; and one plan run both on gangs and in
this process, which must store the same."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console
from support.ray_cluster import local_ray
from support.stored import BASELINES, TRIALS, by_candidate, rows, stored_trials
from support.sweeps import fixture_sweep, planned_keys

from syncopate.autotuner.tune import TuneOptions, run_tune
from syncopate.cli import main
from syncopate.errors import RuntimeUnavailableError
from syncopate.records import Environment
from syncopate.results_db import ResultsDB
from syncopate.results_db.lookups import clear_cache, lookup
from syncopate.search_space import Topology, Workload, guard_candidates
from syncopate.workers.fixture_runner import FixtureRunner, candidate_time

# One Ray cluster for the module (most tests form gangs). The xdist group "ray" holds every test that
# starts Ray, here or in a `syncopate tune` process: one worker runs them one after another, so that
# two local clusters never run at once.
pytestmark = [pytest.mark.timeout(300), pytest.mark.slow, pytest.mark.xdist_group("ray")]

W_AG = "ag_gemm/4096x4096x4096/bf16"
W_RS = "gemm_rs/4096x8192x4096/bf16"


@pytest.fixture(scope="module", autouse=True)
def ray_cluster():
    yield from local_ray(2)


@pytest.fixture(autouse=True)
def fresh_lookups():
    clear_cache()
    yield
    clear_cache()


def url_of(db: Path) -> str:
    return f"sqlite:///{db}"


def tune(config: Path, db: Path, **options):
    return run_tune(
        TuneOptions(config=config, db=url_of(db), form_timeout_s=120, **options),
        console=Console(file=io.StringIO()),
    )


def cli(capsys, *args) -> tuple[int, str, list[str]]:
    code = main([*map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err.strip().splitlines()


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
    assert result.status == "done" and not result.resumed and not result.served
    stored = rows(url_of(db), TRIALS)
    assert len(stored) == 12 and len({(w, c) for w, c, _, _ in stored}) == 12
    assert {(w, c) for w, c, _, _ in stored} == {
        (w, k) for i, w in enumerate([W_AG, W_RS]) for k in planned_keys(config, i)
    }
    assert {s for _, _, s, _ in stored} == {"ok"} and {src for _, _, _, src in stored} == {"fixture"}
    assert rows(url_of(db), "SELECT id, name, status FROM syncopate_sweeps") == [
        (result.sweep_id, "pipeline", "done")
    ]


def test_times_are_the_fixture_model_measured_through_the_gang(pipeline):
    _, db, _ = pipeline
    for t in stored_trials(url_of(db)):
        rec = t.record
        expected = candidate_time(rec.workload, rec.candidate, 2)
        assert rec.median_us == pytest.approx(expected, rel=0.011)
        assert len(rec.samples_us) == 5 and rec.p20_us <= rec.median_us <= rec.p80_us


def test_baselines_are_stored_once_per_workload(pipeline):
    _, db, _ = pipeline
    names = [(w, n, src) for w, n, src, _ in rows(url_of(db), BASELINES)]
    assert names == [
        (w, n, "fixture")
        for w in (W_AG, W_RS)
        for n in ("comm_alone", "gemm_alone", "torch_async_tp", "torch_seq")
    ]


def test_the_summary_best_is_the_sweeps_fastest_trial_with_its_speedup(pipeline):
    _, db, result = pipeline
    for summary in result.summaries:  # the sweep ranks in mode eager: back-to-back eager time per call
        eager = rows(
            url_of(db),
            "SELECT t.candidate_hash, t.eager_us FROM syncopate_trials t "
            "JOIN syncopate_workloads w ON w.id = t.workload_id WHERE w.key = :w",
            w=summary.workload,
        )
        fastest = min(eager, key=lambda r: r[1])
        assert summary.best.candidate.key() == fastest[0] and summary.best.source == "fixture"
        assert summary.objective == "eager" and summary.best_us == fastest[1]
        seq = rows(
            url_of(db),
            "SELECT b.eager_us FROM syncopate_baselines b JOIN syncopate_workloads w "
            "ON w.id = b.workload_id WHERE w.key = :w AND b.name = 'torch_seq'",
            w=summary.workload,
        )
        assert summary.speedup == pytest.approx(seq[0][0] / fastest[1])
        assert summary.bound_us is not None and summary.bound_us <= summary.torch_seq_us


def test_fixture_trials_never_become_the_databases_best(pipeline):
    _, db, result = pipeline
    with ResultsDB.open(url_of(db)) as rdb:
        for summary in result.summaries:
            workload = Workload.from_key(summary.workload)
            assert rdb.best(workload, result.topology, result.environment) is None
        assert rdb.best_configs() == []


def test_trials_carry_provenance(pipeline):
    _, db, result = pipeline
    worker = stored_trials(url_of(db))[0].record.worker
    assert worker["runner"] == "cpu-fixture" and worker["gang"] == 0
    assert (
        len(worker["gpu_uuids"]) == 2 and len(set(worker["actor_ids"])) == 2 and len(set(worker["pids"])) == 2
    )
    assert worker["host"] and worker["git"] and worker["versions"]["torch"]
    assert worker["switches"] == {}  # no kernel switch set: the default kernels measured
    assert worker["finished_at"].endswith("+00:00")
    assert result.progress.handling_ms and result.progress.idle_gap_ms


# -- time budget, then --resume ---------------------------------------------------------------


PLANNED = 48
"""Trials of the budgeted sweep: two gangs at 0.3 s a trial measure half as many in its budget,
with room for a machine busy with other tests to measure fewer."""


def test_gangs_fill_the_gpus_until_the_time_budget_and_resume_finishes_the_sweep(tmp_path):
    config = fixture_sweep(
        tmp_path,
        name="two-gangs",
        topology="H200x1-nvlink",
        strategy="grid",
        max_trials=PLANNED,
        fixture={"delay_s": 0.3, "gpus": 2},
    )
    db = tmp_path / "trials.db"
    result = tune(config, db, time_budget_s=4.0)
    assert result.status == "stopped" and result.progress.gangs == 2
    first = stored_trials(url_of(db))
    assert 4 <= len(first) < PLANNED
    assert {t.record.worker["gang"] for t in first} == {0, 1}
    assert rows(url_of(db), "SELECT status FROM syncopate_sweeps") == [("stopped",)]

    resumed = tune(config, db, resume=True)
    assert resumed.status == "done" and resumed.resumed and resumed.sweep_id == result.sweep_id
    (summary,) = resumed.summaries
    assert (summary.stored_before, summary.measured) == (len(first), PLANNED - len(first))
    after = stored_trials(url_of(db))
    assert after[: len(first)] == first
    assert sorted(t.candidate.key() for t in after) == sorted(planned_keys(config))
    fastest = min(after, key=lambda t: t.eager_us)  # mode eager
    assert summary.best == fastest.record  # over both runs of the sweep
    assert rows(url_of(db), "SELECT id, status FROM syncopate_sweeps") == [(result.sweep_id, "done")]
    assert len(rows(url_of(db), BASELINES)) == 4


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
    stored = rows(url_of(db), TRIALS)
    assert [c for _, c, _, _ in stored] == keys
    assert [s for _, _, s, _ in stored] == [
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
    recs = {k: t.record for k, t in by_candidate(url_of(db)).items()}
    hung = recs[keys[1]]
    assert "deadline" in hung.error and hung.median_us is None and hung.status == "timeout"
    assert DEADLINE_S <= hung.worker["elapsed_s"] < DEADLINE_S + 1.5
    before, after = recs[keys[0]].worker, recs[keys[2]].worker
    assert after["build"] == before["build"] + 1
    assert set(after["actor_ids"]).isdisjoint(before["actor_ids"])
    assert recs[keys[2]].status == "ok"


def test_crash_is_stored_with_the_dead_rank_and_the_gang_rebuilt(faults):
    keys, db, _ = faults
    recs = {k: t.record for k, t in by_candidate(url_of(db)).items()}
    crashed = recs[keys[3]]
    assert crashed.status == "crash" and crashed.error.startswith("rank 1: the worker process died")
    assert recs[keys[4]].worker["build"] == crashed.worker["build"] + 1


def test_runner_exceptions_get_their_classified_status(faults):
    keys, db, result = faults
    recs = {k: t.record for k, t in by_candidate(url_of(db)).items()}
    assert recs[keys[4]].error.startswith("MemoryError: fixture")
    assert recs[keys[5]].error.startswith("RuntimeError: fixture")
    assert recs[keys[7]].error.startswith("PlantedFault: fixture")
    assert recs[keys[6]].max_rel_error == 0.5
    # an unexpected exception leaves the process untrusted: rebuilt; an oom does not
    assert recs[keys[5]].worker["build"] == recs[keys[4]].worker["build"]
    assert recs[keys[6]].worker["build"] == recs[keys[5]].worker["build"] + 1
    assert result.progress.rebuilds == 3


def test_a_wrong_result_never_becomes_best(faults):
    keys, db, result = faults
    (summary,) = result.summaries
    assert summary.best.status == "ok"
    assert summary.best.candidate.key() in {keys[0], keys[2], keys[8], keys[9]}
    assert summary.failures == {"timeout": 1, "crash": 2, "oom": 1, "wrong_result": 1, "compile_error": 1}


# -- what best and lookup serve afterwards ----------------------------------------------------

LOOKUP = ["lookup", "--m", "4096", "--n", "4096", "--k", "4096", "--topology", "H200x2-nvlink"]


def test_a_fixture_sweep_in_the_default_database_is_never_served(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    config = fixture_sweep(tmp_path, name="default-db", max_trials=4)
    code, out, err = cli(capsys, "tune", config, "--runner", "cpu-fixture")
    assert code == 0, err
    assert "sweep 'default-db' (id 1) on H200x2-nvlink: done (cpu-fixture: synthetic times" in out
    assert "these fixture times are not measurements" in " ".join(out.split())
    default = tmp_path / "xdg" / "syncopate" / "results.db"
    assert rows(url_of(default), "SELECT name, status FROM syncopate_sweeps") == [("default-db", "done")]
    assert {(s, src) for _, _, s, src in rows(url_of(default), TRIALS)} == {("ok", "fixture")}
    assert len(rows(url_of(default), TRIALS)) == 4

    code, out, _ = cli(capsys, "best")
    assert code == 0 and "no ok measured trials in" in out and "fixture trials are not measurements" in out
    code, out, _ = cli(capsys, "best", "--json")
    assert code == 0 and json.loads(out) == []
    code, out, _ = cli(capsys, *LOOKUP, "--json")
    assert code == 0
    answer = json.loads(out)
    assert (answer["match"], answer["trial_id"], answer["time_us"]) == ("cost_model", None, None)
    assert answer["database_holds"]["total"] == 0  # the fixture's trials are not measurements


def test_a_measured_sweep_is_what_best_and_lookup_serve(tmp_path, monkeypatch, capsys):
    # The fixture's trials labelled `measured`, as the gpu runner's are: the one thing changed.
    monkeypatch.setattr(FixtureRunner, "source", "measured")
    config = fixture_sweep(tmp_path, name="measured", strategy="grid", max_trials=6)
    db = tmp_path / "measured.db"
    code, out, err = cli(capsys, "tune", config, "--db", url_of(db))
    assert code == 0, err
    assert "not measurements" not in out
    workload = Workload.from_key(W_AG)
    with ResultsDB.open(url_of(db)) as rdb:
        (sweep,) = rdb.sweeps()
        environment = Environment.from_dict(sweep.config["environment"])
        trial = rdb.sweep_best(sweep.sweep_id, workload, "H200x2-nvlink", environment)  # mode eager, as tuned
        on_device = rdb.sweep_best(sweep.sweep_id, workload, "H200x2-nvlink", environment, mode="graph")
        assert trial is not None and trial.record.source == "measured"
        assert rdb.best(workload, "H200x2-nvlink", environment) == trial
        assert rdb.best(workload, "H200x2-nvlink", environment, mode="graph") == on_device
    assert f"{trial.eager_us:.1f}" in out and trial.candidate.short() in out and "mode eager" in out

    code, out, _ = cli(capsys, "best", "--db", url_of(db), "--json")  # by device time
    assert code == 0
    (row,) = json.loads(out)
    assert (row["trial_id"], row["sweep_id"]) == (on_device.trial_id, sweep.sweep_id)
    assert row["median_us"] == on_device.median_us
    seq = [m for w, n, _, m in rows(url_of(db), BASELINES) if w == W_AG and n == "torch_seq"]
    assert row["speedups"]["torch_seq"] == pytest.approx(seq[0] / on_device.median_us)

    code, out, _ = cli(capsys, *LOOKUP, "--db", url_of(db), "--json")
    assert code == 0
    answer = json.loads(out)
    # this process's fingerprint is not the gang's on a machine without GPUs: the next rung serves it
    assert answer["match"] in ("exact", "other_environment")
    assert (answer["trial_id"], answer["time_us"]) == (trial.trial_id, trial.median_us)
    exact = lookup((4096, 4096, 4096), "H200x2-nvlink", db=url_of(db), environment=trial.environment)
    assert (exact.match, exact.trial_id, exact.candidate) == ("exact", trial.trial_id, trial.candidate)

    # the guards first, and every trial's host and eager times carried from the gang to the database
    stored = stored_trials(url_of(db), sweep_id=sweep.sweep_id)
    guards = {c.key() for c in guard_candidates(workload, Topology.from_key("H200x2-nvlink")).values()}
    assert {t.candidate.key() for t in stored[:2]} == guards and len(stored) == 6
    ok = [t for t in stored if t.status == "ok"]
    assert all(t.host_us > 0 and t.eager_us >= t.host_us for t in ok)
    graph = lookup(
        (4096, 4096, 4096), "H200x2-nvlink", db=url_of(db), environment=trial.environment, mode="graph"
    )
    assert graph.time_us == min(t.median_us for t in ok) and exact.eager_us == min(t.eager_us for t in ok)


# -- bad input that needs the cluster: one line, exit 2, no database made -----------------------


def no_sweeps(db: Path) -> bool:
    """Nothing written: a run refused once the gangs are asked for makes no database at all."""
    return not db.exists()


def test_a_detected_topology_is_read_by_every_rank_of_the_gang(tmp_path):
    """`topology: detect` asks the gang; detection is a collective, so all ranks must answer."""
    result = tune(fixture_sweep(tmp_path, topology="detect", max_trials=2), tmp_path / "t.db")
    assert result.status == "done" and result.topology == "H200x2-nvlink"


def test_fewer_gpus_than_the_topology_asks(tmp_path, capsys):
    config = fixture_sweep(tmp_path, topology="H200x4-nvlink")
    code, _, err = cli(capsys, "tune", config, "--db", url_of(tmp_path / "t.db"))
    assert code == 1 and len(err) == 1, err
    assert "topology H200x4-nvlink needs 4 GPUs on one node; the cluster has 2 GPU(s)" in err[0]
    assert no_sweeps(tmp_path / "t.db")


def test_gpus_of_mixed_models(tmp_path, capsys):
    config = fixture_sweep(tmp_path, fixture={"gpu_models": ["H200", "H100"]})
    code, _, err = cli(capsys, "tune", config, "--db", url_of(tmp_path / "t.db"))
    assert code == 1 and len(err) == 1, err
    assert "GPUs of mixed models (H100, H200): gang 0 rank 0: H200 (FIXTURE-" in err[0]
    assert no_sweeps(tmp_path / "t.db")


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.skipif(_cuda(), reason="torch sees a CUDA device here: the gpu runner would bind it")
def test_gpu_runner_where_torch_has_no_cuda(tmp_path, capsys):
    config = fixture_sweep(tmp_path, runner="gpu")
    code, _, err = cli(capsys, "tune", config, "--db", url_of(tmp_path / "t.db"))
    assert code == 1 and len(err) == 1, err
    assert "gang 0 could not start" in err[0] and "sees no CUDA device" in err[0]
    assert no_sweeps(tmp_path / "t.db")


def test_run_tune_raises_the_error_classes(tmp_path):
    config = fixture_sweep(tmp_path, topology="H200x4-nvlink")
    with pytest.raises(RuntimeUnavailableError, match="needs 4 GPUs on one node"):
        tune(config, tmp_path / "t.db")


# -- one loop: a sweep on gangs and the same sweep in this process store the same ---------------

TRIAL_FIELDS = (
    "median_us",
    "p20_us",
    "p80_us",
    "samples_us",
    "eager_us",
    "host_us",
    "max_rel_error",
    "error",
)
BASELINE_FIELDS = ("median_us", "p20_us", "p80_us", "samples_us", "eager_us")
"""A stored sweep replays no baseline host time: `host_us` is the replay runner's, not the loop's."""
LOOP_WORKER_KEYS = {"runner", "host", "finished_at", "elapsed_s", "coordinator"}
"""What the loop writes into every trial's provenance, wherever the trial ran."""


def filled(record, names) -> tuple[str, ...]:
    return tuple(n for n in names if getattr(record, n) not in (None, (), ""))


def stored_shape(url: str, name: str) -> dict:
    """What a sweep stored, as which fields each row fills (the values are the runner's)."""
    with ResultsDB.open(url) as rdb:
        sweeps = {s.name: s.sweep_id for s in rdb.sweeps()}
        trials = rdb.trials(sweep_id=sweeps[name])
        again = rdb.trials(sweep_id=sweeps[f"{name}+confirm"])
        baselines = rdb.baselines(sweep_id=sweeps[name])
    for t in trials + again:
        assert LOOP_WORKER_KEYS <= set(t.record.worker), sorted(t.record.worker)
    return {
        "sweeps": sorted(sweeps),
        "trials": [
            (t.workload.key(), t.candidate.key(), t.status, filled(t.record, TRIAL_FIELDS)) for t in trials
        ],
        "again": [(t.workload.key(), t.status, filled(t.record, TRIAL_FIELDS)) for t in again],
        "baselines": sorted(
            (b.record.workload.key(), b.name, filled(b.record, BASELINE_FIELDS)) for b in baselines
        ),
    }


def result_shape(result) -> dict:
    """What a TuneResult says, but for what names its runner."""
    p = result.progress
    assert len(p.trial_seconds) == p.measured and p.handling_ms and p.idle_gap_ms, (
        len(p.trial_seconds),
        p.measured,
        len(p.handling_ms),
        len(p.idle_gap_ms),
    )
    return {
        "result": (result.status, result.resumed, result.topology, result.mode, result.environment),
        "progress": (p.total, p.done, p.measured, dict(p.failures), p.rebuilds, p.stopping),
        "summaries": [
            (
                s.workload,
                s.planned,
                s.stored_before,
                s.measured,
                s.failures,
                s.objective,
                s.best is not None,
                s.verdict is not None and s.verdict.contenders,
                s.torch_seq_us is not None,
                s.bound_us is not None,
            )
            for s in result.summaries
        ],
    }


def test_a_sweep_on_gangs_and_its_replay_in_this_process_store_the_same_fields(tmp_path, monkeypatch):
    """The same plan both ways a task can run: the cpu-fixture runner on gangs, then a replay of
    what it stored, in this process. The replay hands back the fixture's statuses, errors and
    times, so whatever differs in what the two runs store is the loop's doing."""
    common = dict(
        name="same",
        strategy="grid",
        max_trials=5,
        top_k_remeasure=1,
        shapes=(("ag_gemm", (4096, 4096, 4096)), ("gemm_rs", (4096, 8192, 4096))),
    )
    keys = planned_keys(fixture_sweep(tmp_path, **common))
    on_gangs = fixture_sweep(tmp_path, **common, fixture={"fail": {keys[2]: "wrong_result", keys[3]: "oom"}})
    gangs_db = tmp_path / "gangs.db"
    with monkeypatch.context() as m:  # stored as measured: a replay reads measured trials back
        m.setattr(FixtureRunner, "source", "measured")
        first = tune(on_gangs, gangs_db)
    replayed = fixture_sweep(
        tmp_path,
        **common,
        runner="replay",
        replay={"source": url_of(gangs_db), "sweep": "same", "noise": 0.01},
    )
    local_db = tmp_path / "local.db"
    second = tune(replayed, local_db)

    assert (first.runner, second.runner) == ("cpu-fixture", "replay")
    assert stored_shape(url_of(gangs_db), "same") == stored_shape(url_of(local_db), "same")
    assert result_shape(first) == result_shape(second)


def stored_values(url: str) -> dict:
    """Everything a sweep stored but who measured it and when."""
    with ResultsDB.open(url) as rdb:
        trials = rdb.trials()
        baselines = rdb.baselines()
    return {
        "trials": [
            (
                t.workload.key(),
                t.candidate.key(),
                t.record.source,
                t.record.strategy,
                t.record.environment,
                *(getattr(t.record, n) for n in (*TRIAL_FIELDS, "status")),
                {k: v for k, v in t.record.worker.items() if k in ("prediction", "calibration")},
            )
            for t in trials
        ],
        "baselines": [
            (
                b.record.workload.key(),
                b.name,
                b.record.source,
                b.record.detail,
                *(getattr(b.record, n) for n in BASELINE_FIELDS),
                b.record.host_us,
            )
            for b in baselines
        ],
    }


def test_the_model_runner_on_gangs_stores_what_it_stores_in_this_process(tmp_path, monkeypatch):
    """One runner, one plan, both executors: the predictions are deterministic, so everything the
    two sweeps store and sum up is equal, but who measured it and when."""
    import syncopate.autotuner.tune as tune_module

    config = fixture_sweep(
        tmp_path,
        name="predicted",
        runner="model",
        strategy="grid",
        max_trials=4,
        shapes=(("ag_gemm", (4096, 4096, 4096)), ("gemm_rs", (4096, 8192, 4096))),
    )
    here = tune(config, tmp_path / "here.db")
    monkeypatch.setattr(tune_module, "IN_PROCESS_RUNNERS", ())  # the same runner, on the gangs
    there = tune(config, tmp_path / "there.db")

    assert here.progress.where and not there.progress.where and there.progress.gangs == 1
    assert stored_values(url_of(tmp_path / "here.db")) == stored_values(url_of(tmp_path / "there.db"))
    assert result_shape(here) == result_shape(there)
    assert [(s.best.candidate, s.best_us, s.speedup, s.bound_us) for s in here.summaries] == [
        (s.best.candidate, s.best_us, s.speedup, s.bound_us) for s in there.summaries
    ]
    workers = [t.record.worker for t in stored_trials(url_of(tmp_path / "there.db"))]
    assert {(w["runner"], w["gang"], len(w["actor_ids"])) for w in workers} == {("model", 0, 2)}
