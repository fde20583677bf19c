"""Layer: pure CPU logic, over SQLite and PostgreSQL. The SM-copy backend is named `sm_copy`: input
that gives its earlier name `nvshmem` is refused with a message naming the new one; migration 0003
rewrites stored rows (candidates and their keys, sweep configs, calibrations) and its downgrade
rewrites them back; the committed databases are at the head revision and name it the new way."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import sqlite3
from pathlib import Path

import pytest
import sqlalchemy as sa
from db_data import ENV, TOPO, trial

from syncopate.cli import main
from syncopate.errors import ConfigError
from syncopate.records import CalibrationRecord
from syncopate.results_db import ResultsDB, upgrade
from syncopate.results_db.migrate import alembic_config
from syncopate.results_db.schema import HEAD
from syncopate.results_db.urls import locate
from syncopate.search_space import BACKENDS, Candidate, SpaceOptions

REPO = Path(__file__).resolve().parents[1]
RENAMED = (
    "backend 'nvshmem' was renamed 'sm_copy' (this backend stores chunks with SM copies; no NVSHMEM "
    "is used) — use 'sm_copy'"
)


def test_the_backend_is_named_sm_copy_and_its_old_name_is_refused_with_the_new_one():
    assert "sm_copy" in BACKENDS and "nvshmem" not in BACKENDS
    with pytest.raises(ConfigError) as info:
        Candidate(backend="nvshmem", comm_sms=16)
    assert str(info.value) == RENAMED
    with pytest.raises(ConfigError, match=f"^{re.escape(RENAMED)}$"):
        Candidate.from_json('{"backend": "nvshmem", "comm_sms": 16, "num_splits": 2}')
    with pytest.raises(ConfigError, match=f"^{re.escape(RENAMED)} in space.backends$"):
        SpaceOptions(backends=("copy_engine", "nvshmem"))
    with pytest.raises(ConfigError, match=f"^{re.escape(RENAMED)} in space.comm_sms$"):
        SpaceOptions(comm_sms={"nvshmem": (32,)})
    with pytest.raises(
        ConfigError, match="^unknown backend 'nvshmemx': accepted are copy_engine, sm_copy, nccl$"
    ):
        Candidate(backend="nvshmemx", comm_sms=16)


@pytest.mark.parametrize(
    ("space", "where"),
    [
        ("backends: [copy_engine, nvshmem]", "space.backends: "),
        ("comm_sms: {nvshmem: [32]}", ""),
    ],
)
def test_a_sweep_config_naming_the_old_backend_is_refused_with_the_new_name(tmp_path, capsys, space, where):
    config = tmp_path / "old.yaml"
    config.write_text(
        "name: old\ntopology: H200x2-nvlink\nworkloads:\n  - kind: ag_gemm\n    shapes: [[8192, 4096, 8192]]\n"
        f"space:\n  {space}\n"
    )
    assert main(["validate", str(config)]) == 2
    err = capsys.readouterr().err
    assert where + RENAMED in " ".join(err.split()), err


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


def test_the_committed_databases_are_at_the_head_and_name_the_backend_sm_copy():
    for path in sorted((REPO / "results").glob("*.db")):
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as c:
            assert c.execute("SELECT version_num FROM syncopate_alembic_version").fetchall() == [(HEAD,)], (
                path
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
