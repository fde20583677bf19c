"""Layer: pure CPU, SQLite files. MoE workloads (kinds `a2a_gemm`, `gemm_a2a`) and their trials and
baselines in the results database beside the dense kinds: the round trip, the export file, the
migration that adds the workloads' `params` (0005) up and down, and a database of revision 0004
read as it is."""

from __future__ import annotations

import dataclasses
import json
import sqlite3

import pytest
import sqlalchemy as sa
from db_data import ENV, TOPO, W, trial

from syncopate.errors import SchemaError
from syncopate.records import BaselineRecord, TrialRecord
from syncopate.results_db import ResultsDB, upgrade
from syncopate.results_db.migrate import alembic_config
from syncopate.results_db.schema import HEAD, MOE_REVISION, READ_COMPATIBLE, REVISIONS
from syncopate.results_db.transfer import import_export, read_export, write_export
from syncopate.results_db.urls import locate
from syncopate.search_space import MoeWorkload, RoutingSpec
from syncopate.search_space.moe_workload import MoeCandidate

MW = MoeWorkload(
    kind="a2a_gemm",
    tokens=16,
    hidden=64,
    ffn=32,
    experts=8,
    top_k=2,
    routing=RoutingSpec(distribution="skewed", skew=2.0, seed=3),
)
PIPELINED = MoeCandidate(template="pipelined", chunks_per_source=2)


def moe_trial(candidate: MoeCandidate, median_us: float, workload: MoeWorkload = MW, **kw) -> TrialRecord:
    return TrialRecord(
        workload=workload,
        topology=TOPO,
        environment=ENV,
        candidate=candidate,
        status="ok",
        median_us=median_us,
        eager_us=median_us + 1,
        samples_us=(median_us,),
        **kw,
    )


def _downgrade(url: str, revision: str) -> None:
    from alembic import command

    from syncopate.results_db.engine import make_engine

    engine = make_engine(locate(url))
    with engine.begin() as connection:
        command.downgrade(alembic_config(connection), revision)
    engine.dispose()


@pytest.fixture
def url(tmp_path):
    return f"sqlite:///{tmp_path / 'results.db'}"


def _stored(url: str) -> list[tuple]:
    path = url.removeprefix("sqlite:///")
    with sqlite3.connect(path) as c:
        return c.execute(
            "SELECT id, key, kind, m, n, k, dtype FROM syncopate_workloads ORDER BY id"
        ).fetchall()


def test_the_revisions_end_with_0005_and_0004_is_read_as_it_is():
    assert REVISIONS[-1] == HEAD == MOE_REVISION == "0005"
    assert READ_COMPATIBLE == set(REVISIONS[:-1])


def test_moe_trials_and_baselines_round_trip_beside_dense_ones(url):
    with ResultsDB.open(url, upgrade=True) as db:
        sweep = db.start_sweep("s", {"name": "s"})
        db.record_trials(sweep, [moe_trial(MoeCandidate(), 12.0), moe_trial(PIPELINED, 9.0), trial(0)])
        db.record_baselines(
            sweep,
            [BaselineRecord(workload=MW, topology=TOPO, environment=ENV, name="torch_seq", median_us=14.0)],
        )
        stored = db.trials(kind="a2a_gemm")
        assert [t.record.candidate for t in stored] == [MoeCandidate(), PIPELINED]
        assert {t.record.workload for t in stored} == {MW}
        assert [t.record.workload for t in db.trials(kind="ag_gemm")] == [W]
        assert [b.record.workload for b in db.baselines()] == [MW]
        assert db.measured_keys(MW, TOPO, ENV, sweep_id=sweep) == {MoeCandidate().key(), PIPELINED.key()}
        assert db.sweep_best(sweep, MW, TOPO, ENV, mode="graph").record.candidate == PIPELINED
        served = [p for p in db.picks() if p.trial.record.workload == MW]
        assert {(p.mode, p.trial.record.candidate) for p in served} == {
            ("eager", PIPELINED),
            ("graph", PIPELINED),
        }
    # the row: the key of every parameter, the GEMM-equivalent dims, the parameters as JSON
    path = url.removeprefix("sqlite:///")
    with sqlite3.connect(path) as c:
        key, kind, m, n, k, params = c.execute(
            "SELECT key, kind, m, n, k, params FROM syncopate_workloads WHERE kind = 'a2a_gemm'"
        ).fetchone()
        dense = c.execute("SELECT params FROM syncopate_workloads WHERE kind = 'ag_gemm'").fetchone()
    assert (key, kind, (m, n, k)) == (MW.key(), "a2a_gemm", (32, 64, 64))
    assert json.loads(params) == MW.to_dict() and dense == (None,)


def test_workloads_differing_only_in_routing_are_two_rows(url):
    other = dataclasses.replace(MW, routing=RoutingSpec(distribution="uniform", seed=3))
    with ResultsDB.open(url, upgrade=True) as db:
        sweep = db.start_sweep("s", {"name": "s"})
        db.record_trials(sweep, [moe_trial(PIPELINED, 9.0), moe_trial(PIPELINED, 7.0, workload=other)])
        assert {t.record.workload for t in db.trials()} == {MW, other}


def test_the_export_file_carries_moe_entries_and_imports_them(url, tmp_path):
    with ResultsDB.open(url, upgrade=True) as db:
        sweep = db.start_sweep("s", {"name": "s"})
        db.record_trials(sweep, [moe_trial(MoeCandidate(), 12.0), moe_trial(PIPELINED, 9.0), trial(0)])
        path = tmp_path / "best.json"
        write_export(path, db.picks(), database=url)
    doc = json.loads(path.read_text())
    assert doc["version"] == 4
    entries = {e.workload.key(): e for e in read_export(path)}
    assert entries[MW.key()].workload == MW and entries[MW.key()].candidate == PIPELINED
    other = f"sqlite:///{tmp_path / 'other.db'}"
    with ResultsDB.open(other, upgrade=True) as db:
        assert import_export(db, path) == 2
        assert [t.record.candidate for t in db.trials(kind="a2a_gemm")] == [PIPELINED]


def test_an_export_file_of_version_3_holding_a_moe_entry_is_refused(url, tmp_path):
    with ResultsDB.open(url, upgrade=True) as db:
        sweep = db.start_sweep("s", {"name": "s"})
        db.record_trials(sweep, [moe_trial(PIPELINED, 9.0)])
        path = tmp_path / "best.json"
        write_export(path, db.picks(), database=url)
    doc = json.loads(path.read_text())
    doc["version"] = 3
    path.write_text(json.dumps(doc))
    from syncopate.errors import LookupFailedError

    with pytest.raises(LookupFailedError, match="a2a_gemm workload, which only version 4 files hold"):
        read_export(path)


def test_migration_0005_goes_down_and_up_without_moe_rows_and_a_0004_database_reads_as_it_is(url):
    with ResultsDB.open(url, upgrade=True) as db:
        sweep = db.start_sweep("s", {"name": "s"})
        db.record_trials(sweep, [trial(0), trial(1)])
    before = _stored(url)
    _downgrade(url, "0004")
    path = url.removeprefix("sqlite:///")
    with sqlite3.connect(path) as c:
        columns = [row[1] for row in c.execute("PRAGMA table_info(syncopate_workloads)")]
    assert "params" not in columns and _stored(url) == before
    with ResultsDB.open(url, read_only=True) as db:
        assert db.revision == "0004"
        assert [t.record.workload for t in db.trials()] == [W, W]
        assert len(db.picks()) == 2
    with ResultsDB.open(url) as db, pytest.raises(SchemaError, match="revision 0004, older than"):
        db.start_sweep("more")
    assert upgrade(locate(url)) == ("0004", HEAD)
    assert _stored(url) == before


def test_migration_0005_refuses_to_go_below_it_while_moe_workloads_are_stored(url):
    with ResultsDB.open(url, upgrade=True) as db:
        sweep = db.start_sweep("s", {"name": "s"})
        db.record_trials(sweep, [trial(0), moe_trial(PIPELINED, 9.0)])
    before = _stored(url)
    moe_id = next(row[0] for row in before if row[2] == "a2a_gemm")
    with pytest.raises(Exception, match="cannot downgrade below revision 0005") as info:
        _downgrade(url, "0004")
    assert f"syncopate_workloads ids {moe_id} are of a MoE kind" in str(info.value)
    assert _stored(url) == before
    with ResultsDB.open(url, read_only=True) as db:
        assert db.revision == HEAD
    engine = sa.create_engine(url)
    with engine.begin() as c:
        c.execute(sa.text("DELETE FROM syncopate_trials WHERE workload_id = :w"), {"w": moe_id})
        c.execute(sa.text("DELETE FROM syncopate_workloads WHERE id = :w"), {"w": moe_id})
    engine.dispose()
    _downgrade(url, "0004")
    assert upgrade(locate(url)) == ("0004", HEAD)


def test_the_dashboard_lists_moe_trials_and_filters_by_a_moe_kind(url):
    from syncopate.dashboard import data

    with ResultsDB.open(url, upgrade=True) as db:
        sweep = db.start_sweep("s", {"name": "s"})
        db.record_trials(sweep, [moe_trial(MoeCandidate(), 12.0), moe_trial(PIPELINED, 9.0), trial(0)])
    with ResultsDB.open(url, read_only=True) as db:
        assert data.filter_options(db).kinds == ("a2a_gemm", "ag_gemm")
        moe = data.overview(db, data.Filters(kinds=("a2a_gemm",)))
        assert list(moe["workload"]) == [MW.key()] and list(moe["trials"]) == [2]
        assert (moe.iloc[0]["m"], moe.iloc[0]["n"], moe.iloc[0]["k"]) == MW.gemm_dims()
        assert len(data.overview(db)) == 2
        assert data.sweeps(db).iloc[0]["trials"] == 3
