"""Where :func:`~syncopate.results_db.lookups.lookup` reads best configurations from.

A :class:`BestSource` answers two questions, which is all the lookup ladder needs:
`shapes(kind, dtype)` (which shapes of that kind and dtype are stored) and
`fastest(shape_ref, topology_key, environment_key, same_environment=…)` (the fastest `ok`, `measured`
trial of that shape on that topology, under that environment or under any other).

Three sources, one contract (tests run the same ladder against each):

- :class:`SqliteSource`: the standard library's sqlite3, read-only
  (:func:`~syncopate.results_db.sqlite_files.connect_read_only`), so a job pays neither the
  SQLAlchemy import nor a write lock at start, reads a file on a read-only mount, and never creates
  a file, beside the database included;
- :class:`SqlAlchemySource`: the same SQL through SQLAlchemy, for PostgreSQL;
- :class:`ExportSource`: an export file (`syncopate export`), in memory.

:func:`open_source` picks one for a `db` value and checks the schema revision first.
"""

from __future__ import annotations

import json
import os
import sqlite3
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, NamedTuple

from syncopate.errors import DatabaseError, LookupFailedError
from syncopate.records import Environment
from syncopate.results_db import codec, sqlite_files
from syncopate.results_db.schema import (
    SQLITE_HEADER,
    TABLES,
    VERSION_TABLE,
    check_revision,
    check_sqlite_file,
    missing_error,
    no_tables_error,
    unreachable_error,
)
from syncopate.results_db.urls import DbLocation, locate
from syncopate.search_space import Candidate, Shape

__all__ = ["BestSource", "ExportSource", "Hit", "ShapeRef", "SqlAlchemySource", "SqliteSource", "open_source"]

SQL_TOPOLOGY = "SELECT id FROM syncopate_topologies WHERE key = :key"
SQL_ENVIRONMENT_ID = "SELECT id FROM syncopate_environments WHERE key = :key"
SQL_ENVIRONMENT = (
    "SELECT syncopate, torch, triton, cuda, nccl, driver, gpu_model FROM syncopate_environments WHERE id = :id"
)
SQL_SHAPES = "SELECT id, m, n, k FROM syncopate_workloads WHERE kind = :kind AND dtype = :dtype"
_SQL_FASTEST = (
    "SELECT id, candidate, median_us, environment_id FROM syncopate_trials "
    "WHERE workload_id = :workload AND topology_id = :topology AND environment_id {op} :environment "
    "AND source = 'measured' AND status = 'ok' ORDER BY median_us, id LIMIT 1"
)
SQL_FASTEST_SAME = _SQL_FASTEST.format(op="=")
SQL_FASTEST_OTHER = _SQL_FASTEST.format(op="<>")


class ShapeRef(NamedTuple):
    """A stored workload of the kind and dtype asked for: its shape and the source's handle on it."""

    ref: Any
    shape: Shape


class Hit(NamedTuple):
    """The fastest `ok`, `measured` trial found for one shape."""

    trial_id: int
    candidate: Candidate
    median_us: float
    environment: Environment


class BestSource(ABC):
    """A store of best configurations, as the lookup ladder sees it."""

    shown: str = ""
    """Where it is, for messages (password hidden)."""

    @abstractmethod
    def shapes(self, kind: str, dtype: str) -> list[ShapeRef]:
        """Every stored workload of `kind` and `dtype`."""

    @abstractmethod
    def fastest(self, shape: ShapeRef, topology_key: str, environment_key: str, *,
                same_environment: bool) -> Hit | None:
        """The fastest `ok` + `measured` trial of `shape` on `topology_key`, under `environment_key`
        (same_environment=True) or under any other environment (False, the fastest of them)."""

    def close(self) -> None:
        """Release connections; called when the lookup cache is cleared."""


class _EmptySource(BestSource):
    """A database that does not exist yet (the per-user default before first use): nothing stored."""

    def __init__(self, shown: str) -> None:
        self.shown = shown

    def shapes(self, kind: str, dtype: str) -> list[ShapeRef]:
        return []

    def fastest(self, shape: ShapeRef, topology_key: str, environment_key: str, *,
                same_environment: bool) -> Hit | None:
        return None


class _SqlSource(BestSource):
    """The SQL of both database sources; subclasses run a query and return its rows."""

    @abstractmethod
    def _rows(self, sql: str, params: dict[str, Any]) -> list[tuple]:
        ...

    def __init__(self) -> None:
        self._ids: dict[tuple[str, str], int] = {}

    def _id(self, sql: str, key: str) -> int | None:
        """The id of a topology or environment by key; ids found are remembered (rows never go)."""
        found = self._ids.get((sql, key))
        if found is None:
            rows = self._rows(sql, {"key": key})
            if rows:
                found = self._ids[(sql, key)] = rows[0][0]
        return found

    def shapes(self, kind: str, dtype: str) -> list[ShapeRef]:
        return [ShapeRef(row_id, Shape(m=m, n=n, k=k))
                for row_id, m, n, k in self._rows(SQL_SHAPES, {"kind": kind, "dtype": dtype})]

    def fastest(self, shape: ShapeRef, topology_key: str, environment_key: str, *,
                same_environment: bool) -> Hit | None:
        topology_id = self._id(SQL_TOPOLOGY, topology_key)
        if topology_id is None:
            return None
        environment_id = self._id(SQL_ENVIRONMENT_ID, environment_key)
        if environment_id is None:
            if same_environment:
                return None
            environment_id = -1
        sql = SQL_FASTEST_SAME if same_environment else SQL_FASTEST_OTHER
        rows = self._rows(sql, {"workload": shape.ref, "topology": topology_id, "environment": environment_id})
        if not rows:
            return None
        trial_id, candidate, median_us, env_id = rows[0]
        doc = codec.decode(json.loads(candidate) if isinstance(candidate, str) else candidate)
        env = self._rows(SQL_ENVIRONMENT, {"id": env_id})[0]
        return Hit(
            trial_id=trial_id, candidate=Candidate.from_dict(doc), median_us=float(median_us),
            environment=Environment(syncopate=env[0], torch=env[1], triton=env[2], cuda=env[3], nccl=env[4],
                                    driver=env[5], gpu_model=env[6]),
        )


class SqliteSource(_SqlSource):
    """A SQLite file read through the standard library, read-only."""

    def __init__(self, path: Path, shown: str) -> None:
        super().__init__()
        self.shown = shown
        self._path = path
        self._conn = self._connect()

    def _connect(self) -> sqlite_files.ReadConnection:
        connection = sqlite_files.connect_read_only(self._path, self.shown)
        try:
            connection.execute("PRAGMA query_only = ON")
        except sqlite3.Error as e:
            connection.close()
            raise unreachable_error(self.shown, str(e), "sqlite", self._path) from e
        return connection

    def _rows(self, sql: str, params: dict[str, Any]) -> list[tuple]:
        if self._conn.immutable and sqlite_files.writer_present(self._path):
            # a writer has opened the file since: read through its journal, as it commits
            self._conn.close()
            self._conn = self._connect()
        try:
            return self._conn.execute(sql, params).fetchall()
        except sqlite3.Error as e:
            raise DatabaseError(f"cannot read database {self.shown}: {e}{sqlite_files.damaged(self._path, e)}") from e

    def revision(self) -> str | None:
        """Our schema revision, or None where the file holds none of our tables."""
        names = {row[0] for row in self._rows("SELECT name FROM sqlite_master WHERE type = 'table'", {})}
        if VERSION_TABLE not in names:
            return None
        rows = self._rows(f"SELECT version_num FROM {VERSION_TABLE}", {})
        return rows[0][0] if rows else None

    def has_tables(self) -> bool:
        names = {row[0] for row in self._rows("SELECT name FROM sqlite_master WHERE type = 'table'", {})}
        return bool(names & set(TABLES))

    def close(self) -> None:
        self._conn.close()


class SqlAlchemySource(_SqlSource):
    """A database read through SQLAlchemy (PostgreSQL, or SQLite where asked for)."""

    def __init__(self, location: DbLocation) -> None:
        from sqlalchemy.exc import SQLAlchemyError

        from syncopate.results_db.engine import describe, make_engine
        from syncopate.results_db.migrate import read_revision

        super().__init__()
        self.shown = location.shown()
        self._engine = make_engine(location, read_only=True)
        try:
            with self._engine.connect() as connection:
                revision = read_revision(connection)
        except SQLAlchemyError as e:
            self._engine.dispose()
            raise unreachable_error(self.shown, describe(e), location.dialect) from e
        check_revision(revision, self.shown)

    def _rows(self, sql: str, params: dict[str, Any]) -> list[tuple]:
        from sqlalchemy import text
        from sqlalchemy.exc import SQLAlchemyError

        from syncopate.results_db.engine import describe

        try:
            with self._engine.connect() as connection:
                return [tuple(row) for row in connection.execute(text(sql), params)]
        except SQLAlchemyError as e:
            raise DatabaseError(f"cannot read database {self.shown}: {describe(e)}") from e

    def close(self) -> None:
        self._engine.dispose()


class ExportSource(BestSource):
    """An export file, read whole into memory."""

    def __init__(self, path: Path) -> None:
        from syncopate.results_db.transfer import read_export

        self.shown = str(path)
        self._entries = read_export(path)

    def shapes(self, kind: str, dtype: str) -> list[ShapeRef]:
        keys = {e.workload.key(): e.workload.shape for e in self._entries
                if e.workload.kind == kind and e.workload.dtype == dtype}
        return [ShapeRef(key, shape) for key, shape in keys.items()]

    def fastest(self, shape: ShapeRef, topology_key: str, environment_key: str, *,
                same_environment: bool) -> Hit | None:
        found = [
            e for e in self._entries
            if e.workload.key() == shape.ref and e.topology.key() == topology_key
            and (e.environment.key() == environment_key) == same_environment
        ]
        if not found:
            return None
        e = min(found, key=lambda e: (e.median_us, e.trial_id))
        return Hit(trial_id=e.trial_id, candidate=e.candidate, median_us=e.median_us, environment=e.environment)


def _is_export_file(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            head = f.read(64)
    except OSError:
        return path.suffix.lower() == ".json"
    if head.startswith(SQLITE_HEADER):  # a database, whatever its name
        return False
    return path.suffix.lower() == ".json" or head.lstrip()[:1] == b"{"


def open_source(db: str | os.PathLike[str] | None) -> BestSource:
    """The source for a `db` value: an export file, a SQLite file, or a database URL.

    The per-user default that does not exist yet (or holds no tables) reads as empty, and nothing is
    created; an explicit path that does not exist, or a database without our tables or at another
    schema revision, raises with what to run.
    """
    location = locate(db)
    path = location.sqlite_path
    if location.dialect != "sqlite":
        return SqlAlchemySource(location)
    if path is None:
        raise DatabaseError(f"database {location.subject()} is in memory: lookup needs a file or a server")
    if not path.exists():
        if location.is_default:
            return _EmptySource(location.shown())
        if "://" not in location.given and path.suffix.lower() == ".json":
            raise LookupFailedError(
                f"export file {path} does not exist: check the path, or write it with `syncopate export --out {path}`"
            )
        raise missing_error(location)
    if "://" not in location.given and not path.is_dir() and _is_export_file(path):
        return ExportSource(path)
    check_sqlite_file(location)
    source = SqliteSource(path, location.shown())
    try:
        revision = source.revision()
        if revision is None and location.is_default and not source.has_tables():
            source.close()
            return _EmptySource(location.shown())
        if revision is None:
            raise no_tables_error(location)
        check_revision(revision, location)
    except BaseException:
        source.close()
        raise
    return source
