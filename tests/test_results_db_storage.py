"""Layer: the results database on the CPU. One conformance suite, run against SQLite and against a
real PostgreSQL (each test gets an empty database: a SQLite file, a PostgreSQL schema)."""

from __future__ import annotations

import dataclasses
import math
from datetime import datetime, timedelta, timezone

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from db_data import CANDIDATES, ENV, OTHER_ENV, OTHER_TOPO, TOPO, W, baseline, trial, workload

from syncopate.errors import ConfigError, NotFoundError, SchemaError
from syncopate.records import TRIAL_STATUSES, BaselineRecord, CalibrationRecord
from syncopate.results_db import ResultsDB, upgrade
from syncopate.results_db.lookups import clear_cache, lookup
from syncopate.results_db.models import Base
from syncopate.results_db.schema import BEST_VIEW, HEAD, TABLES, VERSION_TABLE, include_object
from syncopate.results_db.urls import locate
from syncopate.search_space import Candidate


@pytest.fixture(autouse=True)
def fresh_lookups():
    clear_cache()
    yield
    clear_cache()


@pytest.fixture
def db(db_url):
    with ResultsDB.open(db_url, upgrade=True) as rdb:
        yield rdb


def count(db: ResultsDB, table: str) -> int:
    with db.engine.connect() as c:
        return c.execute(sa.text(f"SELECT COUNT(*) FROM {table}")).scalar()


class TestStorageConformance:
    """What every database must do, SQLite and PostgreSQL alike."""

    def test_upgrade_creates_the_schema_the_models_describe(self, db):
        with db.engine.connect() as c:
            names = set(sa.inspect(c).get_table_names())
            assert set(TABLES) | {VERSION_TABLE} <= names
            assert BEST_VIEW in sa.inspect(c).get_view_names()
            mc = MigrationContext.configure(c, opts={"include_object": include_object, "compare_type": True})
            assert compare_metadata(mc, Base.metadata) == []

    def test_upgrade_twice_is_a_no_op(self, db_url):
        assert upgrade(locate(db_url)) == (None, HEAD)
        assert upgrade(locate(db_url)) == (HEAD, HEAD)

    def test_recording_the_same_trial_twice_keeps_one_row(self, db):
        sweep = db.start_sweep("s")
        first = db.record_trial(sweep, trial(0))
        again = db.record_trial(sweep, trial(0, median_us=1.0))  # same identity, other numbers
        assert first == again
        assert count(db, "syncopate_trials") == 1
        assert db.trial(first).median_us == 1000.0  # the first write is kept
        ids = db.record_trials(sweep, [trial(1), trial(0), trial(1), trial(2)])
        assert ids[1] == first and ids[0] == ids[2] and len(set(ids)) == 3
        assert count(db, "syncopate_trials") == 3

    def test_the_same_candidate_in_another_sweep_environment_or_workload_is_another_row(self, db):
        s1, s2 = db.start_sweep("a"), db.start_sweep("b")
        ids = {
            db.record_trial(s1, trial(0)),
            db.record_trial(s2, trial(0)),
            db.record_trial(s1, trial(0, env=OTHER_ENV)),
            db.record_trial(s1, trial(0, w=workload(n=2048))),
        }
        assert len(ids) == 4

    def test_failed_trials_are_stored_with_their_error(self, db):
        sweep = db.start_sweep("s")
        for i, status in enumerate(TRIAL_STATUSES):
            db.record_trial(sweep, trial(i, status=status, error="" if status == "ok" else f"{status} here"))
        stored = {t.status: t for t in db.trials(sweep_id=sweep)}
        assert set(stored) == set(TRIAL_STATUSES)
        assert stored["oom"].record.error == "oom here"
        assert stored["timeout"].median_us is None
        assert [t.status for t in db.trials(status=["oom", "crash"])] == ["oom", "crash"]
        with pytest.raises(ConfigError, match="unknown status 'okay'"):
            db.trials(status="okay")
        with pytest.raises(ConfigError, match="unknown kind 'mm'"):
            db.best_configs(kind="mm")

    def test_a_trial_round_trips_every_field(self, db):
        sweep = db.start_sweep("s")
        when = datetime(2026, 11, 21, 12, 0, 1, 250000, tzinfo=timezone(timedelta(hours=2)))
        record = trial(
            3,
            p20_us=990.5,
            p80_us=1010.25,
            samples_us=(1000.0, 1001.5),
            max_rel_error=3e-3,
            worker={"host": "gpu7", "gpus": ["GPU-a", "GPU-b"], "rank": 0},
            strategy="grid",
            created_at=when,
        )
        stored = db.trial(db.record_trial(sweep, record))
        assert stored.record == record
        assert stored.record.created_at.tzinfo is not None
        assert stored.record.created_at == when and stored.record.created_at.utcoffset() == timedelta(0)
        assert stored.sweep_id == sweep

    def test_non_finite_numbers_are_stored_as_themselves(self, db):
        sweep = db.start_sweep("s", {"budget": math.inf})
        tid = db.record_trial(
            sweep,
            trial(
                0,
                status="wrong_result",
                median_us=math.inf,
                max_rel_error=math.nan,
                samples_us=(math.inf, -math.inf, math.nan, 1.5),
                worker={"score": -math.inf},
            ),
        )
        t = db.trial(tid).record
        assert t.median_us == math.inf and math.isnan(t.max_rel_error)
        assert (
            t.samples_us[:2] == (math.inf, -math.inf)
            and math.isnan(t.samples_us[2])
            and t.samples_us[3] == 1.5
        )
        assert t.worker == {"score": -math.inf}
        assert db.sweep(sweep).config == {"budget": math.inf}
        with db.engine.connect() as c:  # never NULL in the table
            row = c.execute(sa.text("SELECT median_us, max_rel_error FROM syncopate_trials")).one()
        assert row[0] is not None and row[1] is not None

    def test_best_comes_only_from_ok_measured_trials(self, db):
        sweep = db.start_sweep("s")
        db.record_trials(
            sweep,
            [
                trial(0, median_us=500.0),
                trial(1, median_us=1.0, source="predicted"),
                trial(2, median_us=2.0, source="fixture"),
                trial(3, status="wrong_result", median_us=3.0),
                trial(4, status="timeout"),
                trial(5, median_us=400.0, status="ok"),
            ],
        )
        best = db.best(W, TOPO, ENV)
        assert best.candidate == CANDIDATES[5] and best.median_us == 400.0
        assert [b.trial_id for b in db.best_configs()] == [best.trial_id]
        assert db.best(W, TOPO, OTHER_ENV) is None
        assert db.best(workload(n=1024), TOPO, ENV) is None

    def test_sweep_best_is_what_one_sweep_found_whatever_its_source(self, db):
        fixture, measured = db.start_sweep("fixture"), db.start_sweep("measured")
        db.record_trials(
            fixture,
            [
                trial(0, median_us=500.0, source="fixture"),
                trial(1, median_us=2.0, status="wrong_result", source="fixture"),
                trial(2, median_us=300.0, source="fixture"),
                trial(3, median_us=1.0, env=OTHER_ENV, source="fixture"),
            ],
        )
        db.record_trial(measured, trial(4, median_us=400.0))
        found = db.sweep_best(fixture, W, TOPO, ENV)
        assert (found.candidate, found.record.source, found.sweep_id) == (CANDIDATES[2], "fixture", fixture)
        assert db.sweep_best(measured, W, TOPO, ENV).candidate == CANDIDATES[4]
        assert db.best(W, TOPO, ENV).candidate == CANDIDATES[4]  # what lookup serves: measured only
        assert db.sweep_best(measured, W, TOPO, OTHER_ENV) is None
        assert db.sweep_best(fixture, workload(n=1024), TOPO, ENV) is None

    def test_best_breaks_ties_by_the_earliest_trial(self, db):
        sweep = db.start_sweep("s")
        ids = db.record_trials(sweep, [trial(7, median_us=5.0), trial(3, median_us=5.0)])
        assert db.best(W, TOPO, ENV).trial_id == ids[0]

    def test_best_configs_agrees_with_best_per_workload_topology_environment(self, db):
        sweep = db.start_sweep("s")
        combos = [(W, ENV, TOPO), (workload(n=2048), ENV, TOPO), (W, OTHER_ENV, TOPO), (W, ENV, OTHER_TOPO)]
        for j, (w, env, topo) in enumerate(combos):
            db.record_trials(
                sweep,
                [trial(i, w=w, env=env, topo=topo, median_us=100.0 + (i * 7 + j) % 11) for i in range(8)],
            )
        best = db.best_configs()
        assert len(best) == len(combos)
        for b in best:
            assert db.best(b.workload, b.topology, b.environment).trial_id == b.trial_id
        assert {b.topology.key() for b in db.best_configs(topology="H100x8-nvswitch")} == {"H100x8-nvswitch"}
        assert db.best_configs(kind="gemm_rs") == []
        assert len(db.best_configs(environment=OTHER_ENV)) == 1

    def test_measured_keys_says_what_a_resumed_sweep_can_skip(self, db):
        s1, s2 = db.start_sweep("a"), db.start_sweep("b")
        db.record_trials(s1, [trial(0), trial(1, status="crash"), trial(2, source="predicted")])
        db.record_trial(s2, trial(3))
        assert db.measured_keys(W, TOPO, ENV, sweep_id=s1) == {CANDIDATES[0].key(), CANDIDATES[1].key()}
        assert db.measured_keys(W, TOPO, ENV) == {CANDIDATES[i].key() for i in (0, 1, 3)}
        assert db.measured_keys(W, TOPO, ENV, source=None) == {CANDIDATES[i].key() for i in range(4)}
        assert db.measured_keys(W, TOPO, OTHER_ENV) == frozenset()

    def test_baselines_are_kept_once_per_sweep_and_name(self, db):
        sweep = db.start_sweep("s")
        first = db.record_baseline(sweep, baseline("torch_seq", 1770.0))
        assert db.record_baseline(sweep, baseline("torch_seq", 1.0)) == first
        db.record_baseline(sweep, baseline("gemm_alone", 1531.0))
        got = {b.name: b.median_us for b in db.baselines(workload=W, topology=TOPO, environment=ENV)}
        assert got == {"torch_seq": 1770.0, "gemm_alone": 1531.0}
        assert db.baselines(sweep_id=sweep, name="gemm_alone")[0].record.median_us == 1531.0

    def test_baselines_of_a_workload_are_stored_all_or_none(self, db):
        sweep = db.start_sweep("s")
        ids = db.record_baselines(sweep, [baseline("torch_seq", 1770.0), baseline("gemm_alone", 1531.0)])
        assert db.record_baselines(sweep, [baseline("torch_seq", 1.0)]) == ids[:1]
        with pytest.raises(
            ConfigError, match="baseline 1 is the text 'torch_async_tp', not a BaselineRecord"
        ):
            db.record_baselines(sweep, [baseline("comm_alone", 336.0), "torch_async_tp"])
        with pytest.raises(NotFoundError, match="sweep 999 does not exist"):
            db.record_baselines(999, [baseline("comm_alone", 336.0)])
        assert [b.name for b in db.baselines(sweep_id=sweep)] == ["torch_seq", "gemm_alone"]
        assert count(db, "syncopate_baselines") == 2

    def test_a_calibration_is_replaced_by_a_newer_one(self, db):
        curve = {"bytes": [1 << 20, 1 << 28], "gbps": [120.0, math.inf]}
        first = db.record_calibration(
            CalibrationRecord(
                kind="bandwidth", topology=TOPO, environment=ENV, key="copy_engine", payload=curve
            )
        )
        again = db.record_calibration(
            CalibrationRecord(
                kind="bandwidth", topology=TOPO, environment=ENV, key="copy_engine", payload={"gbps": [380.0]}
            )
        )
        assert first == again
        assert db.calibration("bandwidth", TOPO, ENV, "copy_engine").payload == {"gbps": [380.0]}
        db.record_calibration(
            CalibrationRecord(kind="bandwidth", topology=TOPO, environment=ENV, key="nccl", payload=curve)
        )
        assert db.calibration("bandwidth", TOPO, ENV, "nccl").payload["gbps"][1] == math.inf
        assert [c.record.key for c in db.calibrations(kind="bandwidth")] == ["copy_engine", "nccl"]
        assert db.calibration("bandwidth", TOPO, OTHER_ENV, "nccl") is None

    def test_sweeps_start_finish_and_resume(self, db):
        sweep = db.start_sweep("llama_tp2", {"strategy": {"name": "grid"}}, host="node3")
        info = db.sweep(sweep)
        assert (info.status, info.host, info.finished_at) == ("running", "node3", None)
        db.finish_sweep(sweep, "interrupted")
        assert db.sweep(sweep).status == "interrupted" and db.sweep(sweep).finished_at is not None
        assert db.resume_sweep(sweep).status == "running"
        later = db.start_sweep("llama_tp2")
        assert db.latest_sweep("llama_tp2").sweep_id == later
        assert [s.sweep_id for s in db.sweeps(name="llama_tp2", status="running")] == [sweep, later]
        with pytest.raises(ConfigError, match="'running' cannot finish"):
            db.finish_sweep(sweep, "running")

    def test_an_unknown_sweep_is_named_and_nothing_is_written(self, db):
        with pytest.raises(NotFoundError, match="sweep 4242 does not exist"):
            db.record_trial(4242, trial(0))
        with pytest.raises(NotFoundError, match="sweep 4242"):
            db.finish_sweep(4242)
        with pytest.raises(NotFoundError, match="trial 99"):
            db.trial(99)
        assert count(db, "syncopate_trials") == 0
        assert count(db, "syncopate_workloads") == 0

    def test_bad_records_are_refused_before_the_database(self, db):
        sweep = db.start_sweep("s")
        with pytest.raises(ConfigError, match="not a TrialRecord"):
            db.record_trials(sweep, [trial(0), {"candidate": "x"}])
        with pytest.raises(ConfigError, match=r"trial worker\.when"):
            db.record_trial(sweep, trial(0, worker={"when": datetime.now()}))
        assert count(db, "syncopate_trials") == 0

    def test_export_and_import_round_trip(self, db, db_url, tmp_path):
        sweep = db.start_sweep("s")
        db.record_trials(sweep, [trial(i, median_us=100.0 - i) for i in range(4)])
        db.record_trial(sweep, trial(0, w=workload(n=2048), median_us=50.0))
        path = tmp_path / "best.json"
        assert db.export_best(path) == 2
        other = tmp_path / "other.db"
        with ResultsDB.open(other, upgrade=True) as copy:
            assert copy.import_best(path) == 2
            assert copy.import_best(path) == 2  # again: nothing added
            assert len(copy.trials()) == 2
            assert {(b.workload.key(), b.candidate, b.median_us) for b in copy.best_configs()} == {
                (b.workload.key(), b.candidate, b.median_us) for b in db.best_configs()
            }

    def test_the_ladder_answers_from_the_database(self, db, db_url):
        sweep = db.start_sweep("s")
        db.record_trials(sweep, [trial(0, median_us=300.0), trial(1, median_us=200.0)])
        db.record_trial(sweep, trial(2, w=workload(m=16384), env=OTHER_ENV, median_us=10.0))
        exact = lookup(W.shape, TOPO, db=db_url, environment=ENV)
        assert (exact.match, exact.candidate, exact.time_us) == ("exact", CANDIDATES[1], 200.0)
        near = lookup((8192, 4096, 4096), "H200x2-nvlink", db=db_url, environment=ENV)
        assert (near.match, near.trial_id, near.measured_on) == ("nearest_shape", exact.trial_id, W)
        other = lookup((16384, 4096, 8192), TOPO, db=db_url, environment=ENV)
        assert other.match == "nearest_shape"  # this environment's nearest shape beats another environment
        elsewhere = lookup(
            (16384, 4096, 8192),
            TOPO,
            db=db_url,
            environment=OTHER_ENV.__class__(**{**OTHER_ENV.to_dict(), "torch": "9.9"}),
        )
        assert elsewhere.match == "other_environment" and elsewhere.candidate == CANDIDATES[2]
        assert lookup(W.shape, "H100x2-nvlink", db=db_url, environment=ENV).match == "other_topology"
        assert lookup(W.shape, OTHER_TOPO, db=db_url, environment=ENV).match == "cost_model"
        assert lookup(W.shape, TOPO, kind="gemm_rs", db=db_url, environment=ENV).match == "cost_model"

    def test_eager_and_host_times_round_trip_and_each_mode_serves_its_own(self, db, db_url):
        sweep = db.start_sweep("s")
        host_bound, quick, unfused = 0, 1, 8  # CANDIDATES[8] is the unfused template
        ids = db.record_trials(
            sweep,
            [
                trial(host_bound, median_us=100.0, eager_us=400.0, host_us=390.0),
                trial(quick, median_us=150.0, eager_us=160.0, host_us=120.0),
            ],
        )
        db.record_baseline(
            sweep,
            BaselineRecord(
                workload=W,
                topology=TOPO,
                environment=ENV,
                name="torch_seq",
                median_us=300.0,
                eager_us=310.0,
                host_us=130.0,
            ),
        )
        assert {t.trial_id: (t.eager_us, t.host_us) for t in db.trials()} == {
            ids[0]: (400.0, 390.0),
            ids[1]: (160.0, 120.0),
        }
        assert [(b.record.eager_us, b.record.host_us) for b in db.baselines()] == [(310.0, 130.0)]
        assert db.best(W, TOPO, ENV, mode="graph").trial_id == ids[0]
        assert db.best(W, TOPO, ENV, mode="eager").trial_id == ids[1]
        assert db.sweep_best(sweep, W, TOPO, ENV, mode="eager").trial_id == ids[1]
        for mode, expected in (("graph", ids[0]), ("eager", ids[1])):
            found = lookup(W.shape, TOPO, db=db_url, environment=ENV, mode=mode)
            assert (found.match, found.trial_id, found.guard) == ("exact", expected, "")
        guard = db.record_trial(sweep, trial(unfused, median_us=200.0, eager_us=150.0, host_us=110.0))
        assert {p.mode: (p.trial.trial_id, p.guard) for p in db.picks()} == {
            "eager": (guard, "unfused"),
            "graph": (ids[0], ""),
        }
        clear_cache()
        served = lookup(W.shape, TOPO, db=db_url, environment=ENV)
        assert (served.trial_id, served.guard, served.candidate) == (guard, "unfused", CANDIDATES[unfused])

    def test_graph_mode_serves_only_what_replays_from_a_cuda_graph(self, db, db_url, tmp_path):
        """The nccl backend's chunk plans stall when replayed from a CUDA graph: mode graph passes
        over them (to the fastest tuned trial that replays), mode eager does not."""
        nccl = Candidate(backend="nccl", template="direct", comm_sms=64, num_splits=1)
        assert not nccl.replays_in_graph and CANDIDATES[8].replays_in_graph  # unfused replays
        sweep = db.start_sweep("s")
        ids = db.record_trials(
            sweep,
            [
                dataclasses.replace(trial(0, median_us=90.0, eager_us=100.0), candidate=nccl),
                trial(1, median_us=120.0, eager_us=130.0),
                trial(2, median_us=140.0, eager_us=150.0),
            ],
        )
        for mode, expected in (("graph", ids[1]), ("eager", ids[0])):
            clear_cache()
            found = lookup(W.shape, TOPO, db=db_url, environment=ENV, mode=mode)
            assert (found.match, found.trial_id, found.guard) == ("exact", expected, ""), mode
        assert {p.mode: p.trial.trial_id for p in db.picks()} == {"eager": ids[0], "graph": ids[1]}
        path = tmp_path / "best.json"
        db.export_best(path)
        clear_cache()
        assert lookup(W.shape, TOPO, db=path, environment=ENV, mode="graph").trial_id == ids[1]
        only = tmp_path / "only.db"  # nothing else measured: graph mode answers from the next rung
        with ResultsDB.open(only, upgrade=True) as alone:
            alone.record_trial(
                alone.start_sweep("s"), dataclasses.replace(trial(0, median_us=90.0), candidate=nccl)
            )
        clear_cache()
        answer = lookup(W.shape, TOPO, db=only, environment=ENV, mode="graph")
        assert answer.match != "exact" and answer.candidate.replays_in_graph

    def test_a_database_at_revision_0001_is_read_as_it_is_and_upgraded_with_its_data(self, db, db_url):
        """Its rows name backend `sm_copy` by its earlier name `nvshmem` (migration 0003 renamed it):
        read as it is, they say `sm_copy`; a write asks for the upgrade."""
        from alembic import command

        from syncopate.results_db.engine import make_engine
        from syncopate.results_db.migrate import alembic_config

        sm = Candidate(backend="sm_copy", comm_sms=16, num_splits=2)
        sweep = db.start_sweep("s")
        ids = db.record_trials(
            sweep,
            [
                trial(0, median_us=120.0, eager_us=130.0),
                dataclasses.replace(trial(1, median_us=100.0), candidate=sm),
            ],
        )
        engine = make_engine(locate(db_url))
        with engine.begin() as connection:
            command.downgrade(alembic_config(connection), "0001")
        engine.dispose()
        with ResultsDB.open(db_url, read_only=True) as old:
            assert old.revision == "0001"
            assert {t.trial_id: (t.median_us, t.eager_us) for t in old.trials()} == {
                ids[0]: (120.0, None),
                ids[1]: (100.0, None),
            }
            assert [t.record.candidate for t in old.trials()] == [CANDIDATES[0], sm]
            assert old.measured_keys(W, TOPO, ENV) == {CANDIDATES[0].key(), sm.key()}
            with pytest.raises(SchemaError, match="revision 0001, older .*syncopate db upgrade"):
                old.start_sweep("more")
        found = lookup(W.shape, TOPO, db=db_url, environment=ENV)
        assert (found.trial_id, found.objective, found.candidate) == (
            ids[1],
            "device (no eager measurement)",
            sm,
        )
        assert upgrade(locate(db_url)) == ("0001", HEAD)
        with ResultsDB.open(db_url) as new:
            assert [(t.trial_id, t.median_us, t.eager_us, t.record.candidate) for t in new.trials()] == [
                (ids[0], 120.0, None, CANDIDATES[0]),
                (ids[1], 100.0, None, sm),
            ]
            assert len(new.sweeps()) == 1


class TestSchemaGuards:
    """Opening a database that is not ready, or is from the future."""

    def test_a_database_without_tables_says_what_to_run(self, db_url):
        shown = locate(db_url).shown()
        if db_url.startswith("sqlite"):
            with pytest.raises(SchemaError, match="syncopate db upgrade --db"):
                ResultsDB.open(db_url)
            assert not locate(db_url).sqlite_path.exists()  # nothing created
            locate(db_url).sqlite_path.touch()
        with pytest.raises(SchemaError) as e:
            ResultsDB.open(db_url)
        assert (
            str(e.value)
            == f"database {shown} has no Syncopate tables: run `syncopate db upgrade --db {shown}`"
        )

    def test_a_newer_schema_is_refused_and_left_untouched(self, db_url):
        upgrade(locate(db_url))
        engine = sa.create_engine(db_url)
        with engine.begin() as c:
            c.execute(sa.text(f"UPDATE {VERSION_TABLE} SET version_num = '9999'"))
        with pytest.raises(SchemaError, match="revision '9999', newer than this version of Syncopate"):
            ResultsDB.open(db_url)
        with pytest.raises(SchemaError, match="left untouched"):
            upgrade(locate(db_url))
        with pytest.raises(SchemaError, match="newer"):
            lookup(W.shape, TOPO, db=db_url, environment=ENV)
        with engine.connect() as c:
            assert c.execute(sa.text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar() == "9999"
        engine.dispose()


class TestOptunaInTheSameDatabase:
    """Optuna's RDB storage and our tables share one URL, in either order."""

    def _study(self, url: str) -> None:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        storage = optuna.storages.RDBStorage(url)
        study = optuna.create_study(
            study_name="tune", storage=storage, direction="minimize", load_if_exists=True
        )
        study.optimize(lambda t: (t.suggest_int("x", 0, 4) - 2) ** 2, n_trials=3)
        assert len(optuna.load_study(study_name="tune", storage=url).trials) >= 3
        storage.engine.dispose()

    def test_optuna_after_our_upgrade(self, db_url):
        upgrade(locate(db_url))
        self._study(db_url)
        with ResultsDB.open(db_url) as db:
            db.record_trial(db.start_sweep("s"), trial(0))
            assert len(db.trials()) == 1

    def test_our_upgrade_after_optuna(self, db_url):
        self._study(db_url)
        assert upgrade(locate(db_url)) == (None, HEAD)
        self._study(db_url)
        with ResultsDB.open(db_url) as db:
            assert db.trials() == []
