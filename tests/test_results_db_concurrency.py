"""Layer: the results database under concurrent writers, on the CPU. Eight processes each record
500 trials into one SQLite file and into one PostgreSQL schema at the same time, half of them
recorded by a neighbour too and some twice by the same process: every distinct trial is stored
exactly once, every process gets the same id for it, no error (no "database is locked") surfaces,
and nothing is lost."""

from __future__ import annotations

import dataclasses
import multiprocessing as mp

import pytest
from db_data import ENV, TOPO, workload

from syncopate.records import TrialRecord
from syncopate.results_db import ResultsDB
from syncopate.search_space import space

WRITERS = 8
PER_WRITER = 500
STRIDE = 250  # writer p records keys p*250 … p*250+499: its second half is the next writer's first
DISTINCT = STRIDE * (WRITERS - 1) + PER_WRITER
SHAPES = [workload(n=1024 * (1 + i)) for i in range(DISTINCT // STRIDE)]


def _trial(key: int, candidates: list) -> TrialRecord:
    status = "ok" if key % 7 else "crash"
    return TrialRecord(
        workload=SHAPES[key // STRIDE],
        topology=TOPO,
        environment=ENV,
        candidate=candidates[key % STRIDE],
        status=status,
        median_us=float(key) + 0.5 if status == "ok" else None,
        error="" if status == "ok" else f"crash {key}",
        samples_us=(float(key),),
        worker={"key": key},
    )


def _writer(url: str, sweep_id: int, writer: int, start, results) -> None:
    candidates = space(SHAPES[0], TOPO)[:STRIDE]
    errors: list[str] = []
    ids: dict[int, int] = {}
    with ResultsDB.open(url) as db:
        start.wait()
        for j in range(PER_WRITER):
            key = writer * STRIDE + j
            for _ in range(2 if j % 10 == 0 else 1):  # some twice on purpose
                try:
                    tid = db.record_trial(sweep_id, _trial(key, candidates))
                except Exception as e:  # reported to the parent, which fails the test with it
                    errors.append(f"{type(e).__name__}: {e}")
                    continue
                if ids.setdefault(key, tid) != tid:
                    errors.append(f"key {key}: id {tid} after {ids[key]}")
    results.put((writer, ids, errors))


def _hammer(url: str) -> None:
    with ResultsDB.open(url, upgrade=True) as db:
        sweep_id = db.start_sweep("concurrency")
    ctx = mp.get_context("spawn")
    start = ctx.Barrier(WRITERS)
    results = ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(url, sweep_id, w, start, results)) for w in range(WRITERS)]
    for p in procs:
        p.start()
    reports = [results.get(timeout=240) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    errors = [e for _, _, errs in reports for e in errs]
    assert errors == []
    ids_by_key: dict[int, set[int]] = {}
    for _, ids, _ in reports:
        for key, tid in ids.items():
            ids_by_key.setdefault(key, set()).add(tid)
    assert sorted(ids_by_key) == list(range(DISTINCT))
    assert all(len(ids) == 1 for ids in ids_by_key.values())
    with ResultsDB.open(url) as db:
        stored = db.trials(sweep_id=sweep_id)
    assert len(stored) == DISTINCT
    by_key = {t.record.worker["key"]: t for t in stored}
    assert sorted(by_key) == list(range(DISTINCT))
    candidates = space(SHAPES[0], TOPO)[:STRIDE]
    for key, t in by_key.items():
        assert {t.trial_id} == ids_by_key[key]
        assert t.record == dataclasses.replace(_trial(key, candidates), created_at=t.record.created_at)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_eight_sqlite_writers(tmp_path):
    _hammer(f"sqlite:///{tmp_path / 'results.db'}")


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_eight_postgresql_writers(pg_url):
    _hammer(pg_url)


def test_a_new_file_whose_schema_another_process_is_creating(tmp_path):
    """Two sweeps started at once on a SQLite file that did not exist: the one that finds the file
    already made (by the other, whose migration holds the write lock) waits for the schema instead
    of calling the file one without tables."""
    import sqlite3
    import threading

    from syncopate.autotuner.store import ResultsDBStore

    template = tmp_path / "template.db"
    ResultsDB.open(f"sqlite:///{template}", upgrade=True).close()
    with sqlite3.connect(template) as t:
        schema = [
            sql for (sql,) in t.execute("SELECT sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY rowid")
        ]
        version = t.execute("SELECT version_num FROM syncopate_alembic_version").fetchall()
    assert schema and version

    path = tmp_path / "new.db"
    creator = sqlite3.connect(path, isolation_level=None)  # makes the file, as a migration's connect does
    creator.execute("PRAGMA journal_mode = WAL")
    creator.execute("BEGIN IMMEDIATE")
    opened: list = []

    def open_it() -> None:
        try:
            opened.append(ResultsDBStore.open(f"sqlite:///{path}"))
        except Exception as e:  # noqa: BLE001 - the test reports it
            opened.append(e)

    other = threading.Thread(target=open_it)
    other.start()
    other.join(timeout=1.0)
    assert other.is_alive(), f"did not wait for the schema being created: {opened}"
    for sql in schema:
        creator.execute(sql)
    creator.executemany("INSERT INTO syncopate_alembic_version VALUES (?)", version)
    creator.execute("COMMIT")
    creator.close()
    other.join(timeout=30)
    assert len(opened) == 1 and isinstance(opened[0], ResultsDBStore), opened
    assert opened[0].latest_sweep("anything") is None
    opened[0].close()
