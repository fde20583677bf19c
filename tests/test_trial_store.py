"""Layer: the results database on the CPU. The coordinator's TrialStore seam over the real results
database: the conformance suite on SQLite and on PostgreSQL, and how `syncopate tune` opens it."""

from __future__ import annotations

import socket

import pytest
import sqlalchemy as sa
from support.store_suite import TrialStoreSuite

from syncopate.autotuner.store import ResultsDBStore, open_store
from syncopate.errors import DatabaseError, SchemaError
from syncopate.results_db import ResultsDB
from syncopate.results_db.schema import VERSION_TABLE


class TestResultsDBStore(TrialStoreSuite):
    """SQLite file, then PostgreSQL schema (`db_url` in conftest.py)."""

    @pytest.fixture
    def store(self, db_url):
        s = ResultsDBStore(ResultsDB.open(db_url, upgrade=True))
        yield s
        s.close()


def _tables(path) -> set[str]:
    engine = sa.create_engine(f"sqlite:///{path}")
    try:
        return set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_a_new_sqlite_file_is_created_with_the_schema_when_the_run_is_ready_to_write(tmp_path):
    path = tmp_path / "new.db"
    store = open_store(f"sqlite:///{path}")
    try:
        assert store.latest_sweep("x") is None and store.url == f"sqlite:///{path}"
        assert list(tmp_path.iterdir()) == []  # opened and read: nothing made yet
        store.prepare_writes()
    finally:
        store.close()
    assert {VERSION_TABLE, "syncopate_sweeps", "syncopate_trials", "syncopate_baselines"} <= _tables(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new.db"]


def test_a_new_sqlite_file_is_made_by_the_first_write_without_prepare_writes(tmp_path):
    path = tmp_path / "new.db"
    store = open_store(str(path))
    try:
        sweep_id = store.start_sweep("s", {"name": "s"})
        assert store.latest_sweep("s").sweep_id == sweep_id
    finally:
        store.close()
    assert "syncopate_sweeps" in _tables(path)


def test_a_store_closed_before_it_writes_leaves_no_file(tmp_path):
    store = open_store(str(tmp_path / "new.db"))
    store.close()
    assert list(tmp_path.iterdir()) == []


def test_the_default_database_lives_under_xdg_data_home(tmp_path, monkeypatch):
    monkeypatch.delenv("SYNCOPATE_DB", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    store = open_store(None)
    try:
        assert store.url.endswith(f"{tmp_path}/xdg/syncopate/results.db")
        assert not (tmp_path / "xdg").exists()
        store.prepare_writes()
        assert store.url.endswith(f"{tmp_path}/xdg/syncopate/results.db")
    finally:
        store.close()
    assert "syncopate_trials" in _tables(tmp_path / "xdg" / "syncopate" / "results.db")


def test_syncopate_db_names_the_database(tmp_path, monkeypatch):
    monkeypatch.setenv("SYNCOPATE_DB", f"sqlite:///{tmp_path / 'env.db'}")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    store = open_store(None)
    store.prepare_writes()
    store.close()
    assert (tmp_path / "env.db").exists() and not (tmp_path / "xdg").exists()


def test_a_file_in_a_missing_folder_says_why_and_creates_nothing():
    with pytest.raises(DatabaseError) as e:
        open_store("sqlite:////nonexistent-dir/x.db")
    message = str(e.value)
    assert "/nonexistent-dir/x.db does not exist, nor does its folder /nonexistent-dir" in message
    assert "create the folder first" in message and "\n" not in message


def test_an_existing_database_without_tables_is_not_taken_over(tmp_path):
    path = tmp_path / "other.db"
    path.touch()
    with pytest.raises(SchemaError, match="has no Syncopate tables: run `syncopate db upgrade"):
        open_store(str(path))
    assert _tables(path) == set()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_postgresql_server_is_one_line():
    url = f"postgresql+psycopg://tuner:secret@127.0.0.1:{_closed_port()}/syncopate"
    with pytest.raises(DatabaseError) as e:
        open_store(url)
    message = str(e.value)
    assert message.startswith("cannot open database postgresql+psycopg://tuner:***@127.0.0.1:")
    assert "\n" not in message and "secret" not in message
    assert "check the URL and that the server runs" in message


@pytest.mark.postgres
def test_a_postgresql_schema_without_tables_says_what_to_run(pg_url):
    with pytest.raises(SchemaError, match="has no Syncopate tables: run `syncopate db upgrade --db"):
        open_store(pg_url)
