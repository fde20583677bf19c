"""A TrialStore on one SQLite file (WAL), for tests only: the coordinator's seam is exercised
with a real database that survives a killed process, without the project's results database."""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from syncopate.autotuner.store import SWEEP_STATUSES, TrialStore
from syncopate.errors import DatabaseError
from syncopate.records import BaselineRecord, Environment, TrialRecord
from syncopate.search_space import Candidate, Topology, Workload

SCHEMA = """
CREATE TABLE IF NOT EXISTS sweeps (
    id INTEGER PRIMARY KEY, name TEXT NOT NULL, config TEXT NOT NULL, status TEXT NOT NULL,
    started_at TEXT NOT NULL, finished_at TEXT
);
CREATE TABLE IF NOT EXISTS trials (
    id INTEGER PRIMARY KEY, sweep_id INTEGER NOT NULL REFERENCES sweeps(id), candidate_key TEXT NOT NULL,
    workload_key TEXT NOT NULL, topology_key TEXT NOT NULL, environment_key TEXT NOT NULL,
    status TEXT NOT NULL,
    source TEXT NOT NULL, median_us REAL, record TEXT NOT NULL,
    UNIQUE (sweep_id, candidate_key, workload_key, topology_key, environment_key)
);
CREATE TABLE IF NOT EXISTS baselines (
    id INTEGER PRIMARY KEY, sweep_id INTEGER NOT NULL REFERENCES sweeps(id), workload_key TEXT NOT NULL,
    topology_key TEXT NOT NULL, environment_key TEXT NOT NULL, name TEXT NOT NULL, source TEXT NOT NULL,
    median_us REAL NOT NULL, record TEXT NOT NULL,
    UNIQUE (sweep_id, workload_key, topology_key, environment_key, name)
);
CREATE TABLE IF NOT EXISTS writes (
    id INTEGER PRIMARY KEY, kind TEXT NOT NULL, sweep_id INTEGER NOT NULL, key TEXT NOT NULL,
    pid INTEGER NOT NULL
);
"""
"""`writes` logs every record call, ignored duplicates included: a test can tell a trial measured
twice from one stored twice."""


_SCOPE = "workload_key = ? AND topology_key = ? AND environment_key = ?"


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()


def trial_to_json(t: TrialRecord) -> str:
    return json.dumps(
        {
            "workload": t.workload.to_dict(),
            "topology": t.topology.to_dict(),
            "environment": t.environment.to_dict(),
            "candidate": t.candidate.to_dict(),
            "status": t.status,
            "source": t.source,
            "median_us": t.median_us,
            "p20_us": t.p20_us,
            "p80_us": t.p80_us,
            "samples_us": list(t.samples_us),
            "max_rel_error": t.max_rel_error,
            "error": t.error,
            "worker": t.worker,
            "strategy": t.strategy,
            "created_at": t.created_at.isoformat(),
        }
    )


def trial_from_json(text: str) -> TrialRecord:
    d = json.loads(text)
    return TrialRecord(
        workload=Workload.from_dict(d["workload"]),
        topology=Topology.from_dict(d["topology"]),
        environment=Environment.from_dict(d["environment"]),
        candidate=Candidate.from_dict(d["candidate"]),
        status=d["status"],
        source=d["source"],
        median_us=d["median_us"],
        p20_us=d["p20_us"],
        p80_us=d["p80_us"],
        samples_us=tuple(d["samples_us"]),
        max_rel_error=d["max_rel_error"],
        error=d["error"],
        worker=d["worker"],
        strategy=d["strategy"],
        created_at=datetime.fromisoformat(d["created_at"]),
    )


def baseline_to_json(b: BaselineRecord) -> str:
    return json.dumps(
        {
            "workload": b.workload.to_dict(),
            "topology": b.topology.to_dict(),
            "environment": b.environment.to_dict(),
            "name": b.name,
            "median_us": b.median_us,
            "p20_us": b.p20_us,
            "p80_us": b.p80_us,
            "samples_us": list(b.samples_us),
            "source": b.source,
            "detail": b.detail,
            "created_at": b.created_at.isoformat(),
        }
    )


def baseline_from_json(text: str) -> BaselineRecord:
    d = json.loads(text)
    return BaselineRecord(
        workload=Workload.from_dict(d["workload"]),
        topology=Topology.from_dict(d["topology"]),
        environment=Environment.from_dict(d["environment"]),
        name=d["name"],
        median_us=d["median_us"],
        p20_us=d["p20_us"],
        p80_us=d["p80_us"],
        samples_us=tuple(d["samples_us"]),
        source=d["source"],
        detail=d["detail"],
        created_at=datetime.fromisoformat(d["created_at"]),
    )


class SqliteTrialStore(TrialStore):
    """TrialStore on the SQLite file named by `sqlite:///PATH` (or a bare path)."""

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            self._db = sqlite3.connect(path, timeout=30, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.executescript(SCHEMA)
        except sqlite3.Error as e:
            raise DatabaseError(f"cannot open the test database {path}: {e}") from None

    @classmethod
    def open(cls, url: str | None) -> SqliteTrialStore:
        if not url:
            raise DatabaseError("the test store needs a URL such as sqlite:///PATH")
        path = url.removeprefix("sqlite:///")
        if path != ":memory:" and not Path(path).parent.is_dir():
            raise DatabaseError(
                f"cannot open the test database {url}: directory {Path(path).parent} does not exist"
            )
        return cls(path)

    def _write(self, sql: str, args: Sequence[Any] = ()) -> sqlite3.Cursor:
        return self._db.execute(sql, args)

    def _log(self, kind: str, sweep_id: int, key: str) -> None:
        self._write(
            "INSERT INTO writes (kind, sweep_id, key, pid) VALUES (?, ?, ?, ?)",
            (kind, sweep_id, key, os.getpid()),
        )

    def start_sweep(self, name: str, config: dict[str, Any]) -> int:
        cur = self._write(
            "INSERT INTO sweeps (name, config, status, started_at) VALUES (?, ?, 'running', ?)",
            (name, json.dumps(config), _now()),
        )
        return int(cur.lastrowid)

    def resume_sweep(self, name: str) -> int | None:
        row = self._db.execute(
            "SELECT id FROM sweeps WHERE name = ? ORDER BY id DESC LIMIT 1", (name,)
        ).fetchone()
        if row is None:
            return None
        self._write("UPDATE sweeps SET status = 'running', finished_at = NULL WHERE id = ?", (row[0],))
        return int(row[0])

    def stored_keys(self, sweep_id, workload, topology, environment) -> set[str]:
        rows = self._db.execute(
            f"SELECT candidate_key FROM trials WHERE sweep_id = ? AND {_SCOPE}",
            (sweep_id, workload.key(), topology.key(), environment.key()),
        )
        return {r[0] for r in rows}

    def stored_baselines(self, sweep_id, workload, topology, environment) -> list[BaselineRecord]:
        rows = self._db.execute(
            f"SELECT record FROM baselines WHERE sweep_id = ? AND {_SCOPE} ORDER BY id",
            (sweep_id, workload.key(), topology.key(), environment.key()),
        )
        return [baseline_from_json(r[0]) for r in rows]

    def record_trial(self, sweep_id: int, trial: TrialRecord) -> None:
        c, w, t, e = trial.identity()
        self._log("trial", sweep_id, f"{w}/{c}")
        self._write(
            "INSERT OR IGNORE INTO trials (sweep_id, candidate_key, workload_key, topology_key, "
            "environment_key, status, source, median_us, record) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (sweep_id, c, w, t, e, trial.status, trial.source, trial.median_us, trial_to_json(trial)),
        )

    def record_baselines(self, sweep_id: int, baselines: Sequence[BaselineRecord]) -> None:
        self._write("BEGIN")
        try:
            for b in baselines:
                self._log("baseline", sweep_id, f"{b.workload.key()}/{b.name}")
                self._write(
                    "INSERT OR IGNORE INTO baselines (sweep_id, workload_key, topology_key, environment_key, "
                    "name, source, median_us, record) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        sweep_id,
                        b.workload.key(),
                        b.topology.key(),
                        b.environment.key(),
                        b.name,
                        b.source,
                        b.median_us,
                        baseline_to_json(b),
                    ),
                )
        except BaseException:
            self._write("ROLLBACK")
            raise
        self._write("COMMIT")

    def best(self, workload, topology, environment) -> TrialRecord | None:
        row = self._db.execute(
            f"SELECT record FROM trials WHERE status = 'ok' AND {_SCOPE} "
            "ORDER BY median_us ASC, id ASC LIMIT 1",
            (workload.key(), topology.key(), environment.key()),
        ).fetchone()
        return trial_from_json(row[0]) if row else None

    def finish_sweep(self, sweep_id: int, status: str) -> None:
        if status not in SWEEP_STATUSES:
            raise DatabaseError(
                f"sweep status {status!r} is unknown: accepted are {', '.join(SWEEP_STATUSES)}"
            )
        self._write("UPDATE sweeps SET status = ?, finished_at = ? WHERE id = ?", (status, _now(), sweep_id))

    def close(self) -> None:
        self._db.close()

    # -- for assertions in tests -------------------------------------------------------------

    def rows(self, sql: str, args: Sequence[Any] = ()) -> list[tuple]:
        return list(self._db.execute(sql, args))
