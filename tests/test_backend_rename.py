"""Layer: pure CPU logic, over SQLite and PostgreSQL. The SM-copy backend is named `sm_copy`, and
`nvshmem` now names the NVSHMEM backend; migration 0003 rewrote stored rows (candidates and their
keys, sweep configs, calibrations) from the old name to the new and its downgrade rewrites them
back; migration 0004 marks that `nvshmem` has its new meaning and refuses to go below it while rows
name it; the committed databases are at the head revision and name `sm_copy` the new way. A
database at revision 0001 or 0002 is read as it is, the old name as the new one (lookup, the
repository's reads, the export, the cost model's calibrations, the dashboard), and refuses writes;
a head database's `nvshmem` row reads as `nvshmem`."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sqlite3
from datetime import datetime, timezone
from pathlib import Path

import pytest
import sqlalchemy as sa
from db_data import ENV, TOPO, W, trial

from syncopate.cli import main
from syncopate.errors import ConfigError, SchemaError
from syncopate.records import CalibrationRecord
from syncopate.results_db import ResultsDB, upgrade
from syncopate.results_db.lookups import clear_cache, lookup
from syncopate.results_db.migrate import alembic_config
from syncopate.results_db.schema import HEAD, NAMES_REVISION, READ_COMPATIBLE
from syncopate.results_db.urls import locate
from syncopate.search_space import (
    BACKENDS,
    Candidate,
    SpaceOptions,
    Topology,
    check_candidate,
    guard_candidates,
    space,
)

REPO = Path(__file__).resolve().parents[1]


def test_nvshmem_is_the_nvshmem_backend_now_and_the_rename_applies_only_to_stored_data():
    assert {"sm_copy", "nvshmem"} <= set(BACKENDS)
    assert Candidate(backend="nvshmem", comm_sms=16).backend == "nvshmem"
    assert Candidate.from_json('{"backend": "nvshmem", "comm_sms": 16, "num_splits": 2}').backend == "nvshmem"
    assert (
        SpaceOptions(backends=("copy_engine", "nvshmem"), comm_sms={"nvshmem": (32,)}).backends[1]
        == "nvshmem"
    )
    with pytest.raises(
        ConfigError, match="^unknown backend 'nvshmemx': accepted are copy_engine, sm_copy, nvshmem, nccl$"
    ):
        Candidate(backend="nvshmemx", comm_sms=16)


def test_a_sweep_config_naming_nvshmem_validates(tmp_path, capsys):
    config = tmp_path / "nv.yaml"
    config.write_text(
        "name: nv\ntopology: H200x2-nvlink\nworkloads:\n  - kind: ag_gemm\n    shapes: [[8192, 4096, 8192]]\n"
        "space:\n  backends: [copy_engine, nvshmem]\n  comm_sms: {nvshmem: [32]}\n"
    )
    assert main(["validate", str(config)]) == 0, capsys.readouterr().err


# -- migration 0003 --------------------------------------------------------------------------------

_TRIALS = sa.table(
    "syncopate_trials",
    sa.column("id", sa.Integer),
    sa.column("candidate_hash", sa.String),
    sa.column("candidate", sa.JSON),
)
_SWEEPS = sa.table("syncopate_sweeps", sa.column("id", sa.Integer), sa.column("config", sa.JSON))
_CALIBRATIONS = sa.table(
    "syncopate_calibrations",
    sa.column("id", sa.Integer),
    sa.column("key", sa.String),
    sa.column("payload", sa.JSON),
)


def _stored(url: str) -> tuple[list, list, list]:
    """Trials (id, hash, candidate), sweep configs and calibrations (id, key, payload) as stored."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as c:
            return (
                [tuple(r) for r in c.execute(sa.select(_TRIALS).order_by(_TRIALS.c.id))],
                [tuple(r) for r in c.execute(sa.select(_SWEEPS).order_by(_SWEEPS.c.id))],
                [tuple(r) for r in c.execute(sa.select(_CALIBRATIONS).order_by(_CALIBRATIONS.c.id))],
            )
    finally:
        engine.dispose()


def _downgrade(url: str, revision: str) -> None:
    from alembic import command

    from syncopate.results_db.engine import make_engine

    engine = make_engine(locate(url))
    with engine.begin() as connection:
        command.downgrade(alembic_config(connection), revision)
    engine.dispose()


def _key(doc: dict) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def test_migration_0003_renames_the_backend_in_stored_rows_and_back(db_url):
    sm = [Candidate(backend="sm_copy", comm_sms=16, num_splits=2), Candidate(backend="sm_copy", comm_sms=32)]
    other = Candidate(backend="nccl", comm_sms=64, num_splits=2)
    space = {"backends": ["copy_engine", "sm_copy"], "comm_sms": {"sm_copy": [16, 32], "nccl": [64]}}
    curve = {"16": {"sizes": [65536, 1048576], "us": [6.5, 18.6]}}
    costs = {"launch_us": 6.0, "overlap_slowdown": {"copy_engine": 0.03, "sm_copy": 0.02}, "chunk_us": {}}
    with ResultsDB.open(db_url, upgrade=True) as db:
        sweep = db.start_sweep("s", {"name": "s", "space": space, "budget": float("inf")})
        db.record_trials(sweep, [dataclasses.replace(trial(0), candidate=c) for c in (*sm, other)])
        for kind, key, payload in (
            ("transfer", "sm_copy/intra", {"curves": curve, "call_us": 5.0}),
            ("transfer", "nccl/intra", {"curves": {"0": curve["16"]}, "call_us": 9.0}),
            ("op_costs", "op", costs),
        ):
            db.record_calibration(
                CalibrationRecord(kind=kind, topology=TOPO, environment=ENV, key=key, payload=payload)
            )
    head = _stored(db_url)
    assert [h for _, h, _ in head[0]] == [c.key() for c in (*sm, other)]

    _downgrade(db_url, "0002")
    trials, sweeps, calibrations = _stored(db_url)
    assert [d["backend"] for _, _, d in trials] == ["nvshmem", "nvshmem", "nccl"]
    assert [h for _, h, _ in trials] == [_key(d) for _, _, d in trials]  # the key as the old code made it
    assert trials[0][1] != sm[0].key() and trials[2] == head[0][2]
    assert sweeps[0][1]["space"] == {
        "backends": ["copy_engine", "nvshmem"],
        "comm_sms": {"nvshmem": [16, 32], "nccl": [64]},
    }
    assert sweeps[0][1]["budget"] == head[1][0][1]["budget"]  # the rest of the config as it was
    assert [k for _, k, _ in calibrations] == ["nvshmem/intra", "nccl/intra", "op"]
    assert calibrations[2][2]["overlap_slowdown"] == {"copy_engine": 0.03, "nvshmem": 0.02}
    assert calibrations[0][2] == head[2][0][2]

    assert upgrade(locate(db_url)) == ("0002", HEAD)
    assert _stored(db_url) == head
    with ResultsDB.open(db_url, read_only=True) as db:
        assert [t.record.candidate for t in db.trials()] == [*sm, other]
        assert {c.record.key for c in db.calibrations()} == {"sm_copy/intra", "nccl/intra", "op"}


def test_the_committed_databases_are_read_as_they_are_and_name_the_backend_sm_copy():
    """Every committed database is at the head or a revision from the rename on (read as it is:
    no row of it names the NVSHMEM backend), and none names the SM copier by its old name."""
    for path in sorted((REPO / "results").glob("*.db")):
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as c:
            ((revision,),) = c.execute("SELECT version_num FROM syncopate_alembic_version").fetchall()
            assert revision == HEAD or (revision in READ_COMPATIBLE and revision >= NAMES_REVISION), (
                path,
                revision,
            )
            for table, column in (
                ("syncopate_trials", "candidate"),
                ("syncopate_sweeps", "config"),
                ("syncopate_calibrations", "key"),
                ("syncopate_calibrations", "payload"),
            ):
                found = c.execute(f"SELECT COUNT(*) FROM {table} WHERE {column} LIKE '%nvshmem%'").fetchone()
                assert found == (0,), (path, table, column)
            bad = [
                h
                for h, doc in c.execute("SELECT candidate_hash, candidate FROM syncopate_trials")
                if Candidate.from_json(doc).key() != h
            ]
            assert not bad, path


# -- an older revision read as it is: the old name reads as the new one ----------------------------

SM = next(c for c in space(W, TOPO) if c.backend == "sm_copy" and c.template == "direct")
CE = next(
    c
    for c in space(W, TOPO)
    if c.backend == "copy_engine" and c.template == "direct" and c not in guard_candidates(W, TOPO).values()
)
CURVE = {"curves": {"16": {"sizes": [65536, 1048576], "us": [6.5, 18.6]}}, "call_us": 5.0}
COSTS = {
    "launch_us": 6.0,
    "wait_us": 1.0,
    "local_copy_gbps": 2000.0,
    "hbm_gbps": 4000.0,
    "overlap_slowdown": {"copy_engine": 0.03, "sm_copy": 0.02},
    "chunk_us": {"copy_engine": 5.0},
}


def test_a_candidate_stored_before_the_rename_reads_the_old_name_as_the_new_one_and_only_then():
    doc = {**SM.to_dict(), "backend": "nvshmem"}
    assert Candidate.from_stored(doc, renamed=True) == SM
    assert Candidate.from_stored(CE.to_dict(), renamed=True) == CE
    assert Candidate.from_stored(doc, renamed=False) == SM.replace(backend="nvshmem")
    assert Candidate.from_dict(doc).backend == "nvshmem"
    with pytest.raises(ConfigError, match="^unknown backend 'nvshmemx'"):
        Candidate.from_stored({**doc, "backend": "nvshmemx"}, renamed=True)


def _old_database(db_url: str) -> list[int]:
    """A database at revision 0002 whose fastest trial, a transfer curve and the op costs name
    backend `sm_copy` the old way; the trials' ids (SM's, then CE's)."""
    with ResultsDB.open(db_url, upgrade=True) as db:
        sweep = db.start_sweep("s", {"name": "s", "space": {"backends": ["copy_engine", "sm_copy"]}})
        ids = db.record_trials(
            sweep,
            [
                dataclasses.replace(trial(0), candidate=SM, median_us=90.0, eager_us=95.0),
                dataclasses.replace(trial(0), candidate=CE, median_us=120.0, eager_us=125.0),
            ],
        )
        for kind, key, payload in (("transfer", "sm_copy/intra", CURVE), ("op_costs", "op", COSTS)):
            db.record_calibration(
                CalibrationRecord(kind=kind, topology=TOPO, environment=ENV, key=key, payload=payload)
            )
    _downgrade(db_url, "0002")
    trials, _, calibrations = _stored(db_url)
    assert [d["backend"] for _, _, d in trials] == ["nvshmem", "copy_engine"]
    assert [k for _, k, _ in calibrations] == ["nvshmem/intra", "op"]
    assert calibrations[1][2]["overlap_slowdown"] == {"copy_engine": 0.03, "nvshmem": 0.02}
    return ids


def test_a_database_at_revision_0002_serves_its_nvshmem_trial_as_sm_copy_and_refuses_writes(db_url):
    ids = _old_database(db_url)
    stored = _stored(db_url)
    clear_cache()
    served = lookup(W.shape, TOPO, db=db_url, environment=ENV)
    assert (served.match, served.trial_id, served.candidate) == ("exact", ids[0], SM)
    check_candidate(served.candidate, W, TOPO)
    with ResultsDB.open(db_url, read_only=True) as db:
        assert db.revision == "0002"
        assert [t.record.candidate for t in db.trials()] == [SM, CE]
        assert db.trial(ids[0]).record.candidate == SM
        assert db.best(W, TOPO, ENV).record.candidate == SM
        assert {(p.mode, p.trial.record.candidate) for p in db.picks()} == {("eager", SM), ("graph", SM)}
        assert db.measured_keys(W, TOPO, ENV) == {SM.key(), CE.key()}
        assert [(c.record.kind, c.record.key) for c in db.calibrations()] == [
            ("op_costs", "op"),
            ("transfer", "sm_copy/intra"),
        ]
        assert db.calibration("transfer", TOPO, ENV, "sm_copy/intra").record.payload == CURVE
        assert db.calibration("transfer", TOPO, ENV, "nvshmem/intra") is None
        assert db.calibration("op_costs", TOPO, ENV, "op").record.payload == COSTS
    with ResultsDB.open(db_url) as db:
        for write in (
            lambda: db.start_sweep("more"),
            lambda: db.record_calibration(
                CalibrationRecord(
                    kind="transfer", topology=TOPO, environment=ENV, key="sm_copy/intra", payload=CURVE
                )
            ),
        ):
            with pytest.raises(
                SchemaError,
                match=r"revision 0002, older than this Syncopate's \d+: run `syncopate db upgrade",
            ):
                write()
    assert _stored(db_url) == stored  # read, refused: nothing written


def test_an_export_of_a_database_at_revision_0002_and_its_lookup_name_sm_copy(tmp_path):
    db_url = f"sqlite:///{tmp_path / 'old.db'}"
    ids = _old_database(db_url)
    out = tmp_path / "best.json"
    with ResultsDB.open(db_url, read_only=True) as db:
        assert db.export_best(out) == 1
    entry = json.loads(out.read_text())["entries"][0]
    assert (entry["trial_id"], entry["candidate"]) == (ids[0], SM.to_dict())
    # an export file written before the rename (version 2) names the old backend: it reads as the new one
    old = tmp_path / "old.json"
    doc = json.loads(out.read_text())
    doc["version"] = 2
    doc["entries"][0]["candidate"]["backend"] = "nvshmem"
    old.write_text(json.dumps(doc))
    clear_cache()
    assert lookup(W.shape, TOPO, db=old, environment=ENV).candidate == SM


def test_the_cost_model_reads_an_nvshmem_calibration_of_a_database_at_revision_0002(tmp_path):
    """A measured calibration stored before the rename: its `nvshmem/intra` curve and op costs are
    the cost model's, as after the upgrade, not the defaults'."""
    from syncopate.cost_model.calibration_defaults import default_calibration

    topo = Topology.from_key("H200x4-nvswitch")
    shape, kind = (8192, 4096, 4096), "gemm_ar"
    records = []
    for r in default_calibration(topo).records(topo, ENV):
        if "nvshmem" in r.key:  # a calibration stored before the rename knows no NVSHMEM backend
            continue
        if r.kind == "op_costs":
            maps = {
                m: {b: v for b, v in r.payload[m].items() if b != "nvshmem"}
                for m in ("overlap_slowdown", "chunk_us")
            }
            r = dataclasses.replace(r, payload={**r.payload, **maps})
        if r.key == "sm_copy/intra":  # SM copies five times the documented speed: the model's pick
            curves = {s: {**c, "us": [u / 5 for u in c["us"]]} for s, c in r.payload["curves"].items()}
            r = dataclasses.replace(r, payload={**r.payload, "curves": curves})
        records.append(r)
    path = tmp_path / "cal.db"
    with ResultsDB.open(path, upgrade=True) as db:
        for r in records:
            db.record_calibration(r)
    clear_cache()
    head = lookup(shape, topo, kind=kind, db=path, environment=ENV)
    assert head.match == "cost_model" and head.candidate.backend == "sm_copy", (head.candidate, head.reason)
    _downgrade(f"sqlite:///{path}", "0002")
    assert "nvshmem/intra" in {k for _, k, _ in _stored(f"sqlite:///{path}")[2]}
    clear_cache()
    old = lookup(shape, topo, kind=kind, db=path, environment=ENV)
    assert (old.match, old.candidate, old.predicted_us, old.reason) == (
        head.match,
        head.candidate,
        head.predicted_us,
        head.reason,
    )
    assert f"from the measured calibration for {topo.key()}" in old.reason


def test_the_dashboard_shows_the_backend_of_a_database_at_revision_0002_as_sm_copy(tmp_path):
    from syncopate.dashboard import data

    db_url = f"sqlite:///{tmp_path / 'old.db'}"
    ids = _old_database(db_url)
    with ResultsDB.open(db_url, read_only=True) as db:
        overview = data.overview(db)
        assert list(overview["best_trial_id"]) == [ids[0]]
        assert list(overview["backend"]) == ["sm_copy"] and list(overview["config"]) == [SM.short()]
        selection = data.Selection.of(overview.iloc[0])
        assert list(data.convergence(db, selection)["backend"]) == ["sm_copy", "copy_engine"]
        splits = data.backend_splits(db, selection)
        assert sorted(splits["backend"]) == ["copy_engine", "sm_copy"]
        assert splits.loc[splits["backend"] == "sm_copy", "best_us"].tolist() == [90.0]


# -- the NVSHMEM backend's rows: read as nvshmem at the head, and migration 0004 ----------------------

NV = SM.replace(backend="nvshmem")


def _head_database_with_nvshmem(db_url: str) -> list[int]:
    """A head database whose fastest trial, a transfer curve and the op costs name the NVSHMEM
    backend beside sm_copy; the trials' ids (NV's, then SM's)."""
    nv_costs = {**COSTS, "overlap_slowdown": {**COSTS["overlap_slowdown"], "nvshmem": 0.02}}
    with ResultsDB.open(db_url, upgrade=True) as db:
        sweep = db.start_sweep("s", {"name": "s", "space": {"backends": ["sm_copy", "nvshmem"]}})
        ids = db.record_trials(
            sweep,
            [
                dataclasses.replace(trial(0), candidate=NV, median_us=80.0, eager_us=85.0),
                dataclasses.replace(trial(0), candidate=SM, median_us=90.0, eager_us=95.0),
            ],
        )
        for kind, key, payload in (
            ("transfer", "nvshmem/intra", CURVE),
            ("transfer", "sm_copy/intra", CURVE),
            ("op_costs", "op", nv_costs),
        ):
            db.record_calibration(
                CalibrationRecord(kind=kind, topology=TOPO, environment=ENV, key=key, payload=payload)
            )
    return ids


def test_a_head_database_reads_its_nvshmem_rows_as_the_nvshmem_backend(db_url, tmp_path):
    ids = _head_database_with_nvshmem(db_url)
    with ResultsDB.open(db_url, read_only=True) as db:
        assert db.revision == HEAD
        assert [t.record.candidate for t in db.trials()] == [NV, SM]
        assert db.best(W, TOPO, ENV).record.candidate == NV
        assert db.measured_keys(W, TOPO, ENV) == {NV.key(), SM.key()}
        assert db.calibration("transfer", TOPO, ENV, "nvshmem/intra").record.key == "nvshmem/intra"
        assert db.calibration("transfer", TOPO, ENV, "sm_copy/intra").record.payload == CURVE
        costs = db.calibration("op_costs", TOPO, ENV, "op").record.payload
        assert costs["overlap_slowdown"] == {"copy_engine": 0.03, "sm_copy": 0.02, "nvshmem": 0.02}
        out = tmp_path / "best.json"
        assert db.export_best(out) == 1
    exported = json.loads(out.read_text())
    assert exported["version"] == 4 and exported["entries"][0]["candidate"] == NV.to_dict()
    clear_cache()
    assert lookup(W.shape, TOPO, db=db_url, environment=ENV).candidate == NV
    clear_cache()
    assert lookup(W.shape, TOPO, db=out, environment=ENV).candidate == NV
    # the same file at version 2 was written before the rename: its nvshmem is sm_copy
    exported["version"] = 2
    old = tmp_path / "old.json"
    old.write_text(json.dumps(exported))
    clear_cache()
    served = lookup(W.shape, TOPO, db=old, environment=ENV)
    assert (served.trial_id, served.candidate) == (ids[0], SM)


def test_a_database_at_revision_0003_is_read_as_it_is_and_refuses_writes(db_url):
    with ResultsDB.open(db_url, upgrade=True) as db:
        sweep = db.start_sweep("s", {"name": "s"})
        db.record_trials(sweep, [dataclasses.replace(trial(0), candidate=SM)])
    _downgrade(db_url, "0003")
    with ResultsDB.open(db_url, read_only=True) as db:
        assert db.revision == "0003"
        assert [t.record.candidate for t in db.trials()] == [SM]
    with ResultsDB.open(db_url) as db, pytest.raises(SchemaError, match="revision 0003, older than"):
        db.start_sweep("more")


def test_migration_0004_refuses_to_go_below_it_while_rows_name_nvshmem(db_url):
    ids = _head_database_with_nvshmem(db_url)
    stored = _stored(db_url)
    with pytest.raises(Exception, match="cannot downgrade below revision 0004") as info:
        _downgrade(db_url, "0003")
    message = str(info.value)
    assert f"syncopate_trials ids {ids[0]};" in message
    assert "syncopate_sweeps ids 1;" in message and "syncopate_calibrations ids 1, 3)" in message
    assert "delete those rows first" in message
    assert _stored(db_url) == stored
    with ResultsDB.open(db_url, read_only=True) as db:
        assert db.revision == HEAD
    # without them it goes down to 0003 and up again, nothing else touched
    engine = sa.create_engine(db_url)
    with engine.begin() as c:
        c.execute(sa.delete(_TRIALS).where(_TRIALS.c.id == ids[0]))
        c.execute(sa.delete(_SWEEPS).where(_SWEEPS.c.id == 1))
        c.execute(sa.delete(_CALIBRATIONS).where(_CALIBRATIONS.c.id.in_((1, 3))))
    engine.dispose()
    left = _stored(db_url)
    _downgrade(db_url, "0003")
    assert _stored(db_url) == left
    assert upgrade(locate(db_url)) == ("0003", HEAD)


def test_a_bench_file_names_backends_the_current_way_only_where_it_says_so(tmp_path):
    from syncopate.results_db.bench_import import _records
    from syncopate.search_space import BACKEND_NAMES

    row = {
        "workload": W.to_dict(),
        "baselines": {},
        "trials": [{"candidate": NV.to_dict(), "status": "ok", "median_us": 80.0, "samples_us": [80.0]}],
        "seconds": 1.0,
    }
    started = datetime(2026, 11, 27, tzinfo=timezone.utc)
    marked = {"rows": [row], "backend_names": BACKEND_NAMES}
    trials, _ = _records(marked, tmp_path / "b.json", TOPO, ENV, started, {})
    assert [t.candidate for t in trials] == [NV]
    trials, _ = _records({"rows": [row]}, tmp_path / "b.json", TOPO, ENV, started, {})
    assert [t.candidate for t in trials] == [SM]
