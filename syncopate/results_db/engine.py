"""Engines for the two databases, and which errors are worth a retry.

SQLite: WAL journal (readers never block the writer; set by connections that may write, so that
a database only read is left as it is, header included), `synchronous=NORMAL`, a 30 s busy timeout,
foreign keys on, and transactions begun by us: `BEGIN IMMEDIATE` for a write transaction, so that a
writer waits for the lock (the busy timeout) when it starts instead of failing half-way with
"database is locked" when a read transaction tries to become a write one; plain `BEGIN` for reads.
A read-only engine opens the file through :func:`~syncopate.results_db.sqlite_files.connect_read_only`,
so that it reads a file on a read-only mount and creates nothing beside it; a pooled connection
opened `immutable` is replaced when a writer appears. PostgreSQL: psycopg 3, pre-ping on checkout.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError, DisconnectionError, OperationalError
from sqlalchemy.pool import QueuePool

from syncopate.results_db import sqlite_files
from syncopate.results_db.urls import DbLocation

__all__ = ["BUSY_TIMEOUT_S", "WRITE_OPTION", "make_engine", "is_transient", "describe"]

BUSY_TIMEOUT_S = 30.0
"""How long a SQLite connection waits for a lock before the error surfaces (then we retry)."""

WRITE_OPTION = "syncopate_write"
"""Execution option marking a write transaction (SQLite: `BEGIN IMMEDIATE`)."""

_TRANSIENT_SQLSTATES = {"40001", "40P01", "55P03"}  # serialization failure, deadlock, lock not available


def make_engine(location: DbLocation, *, read_only: bool = False) -> Engine:
    """A SQLAlchemy engine for `location`, configured as the module docstring says; `read_only`
    leaves a SQLite file's journal mode as it is."""
    if location.dialect == "sqlite":
        if read_only and location.sqlite_path is not None:
            engine = _read_only_file_engine(location.sqlite_path, location.subject())
        else:
            engine = create_engine(location.url, connect_args={"timeout": BUSY_TIMEOUT_S})
        event.listen(engine, "connect", _sqlite_on_read_connect if read_only else _sqlite_on_connect)
        event.listen(engine, "begin", _sqlite_on_begin)
        return engine
    return create_engine(location.url, pool_pre_ping=True)


def _read_only_file_engine(path: Path, subject: str) -> Engine:
    def connect() -> sqlite_files.ReadConnection:
        return sqlite_files.connect_read_only(path, subject, timeout=BUSY_TIMEOUT_S)

    def checkout(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
        if getattr(dbapi_connection, "immutable", False) and sqlite_files.writer_present(path):
            raise DisconnectionError(f"a writer opened {path}: reading it through its journal from now on")

    engine = create_engine("sqlite://", creator=connect, poolclass=QueuePool)
    event.listen(engine, "checkout", checkout)
    return engine


def _sqlite_on_connect(dbapi_connection: Any, _record: Any, *, wal: bool = True) -> None:
    dbapi_connection.isolation_level = None  # the driver emits no BEGIN of its own; see _sqlite_on_begin
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        cursor.execute("PRAGMA foreign_keys = ON")
        if wal:  # written into the file's header: a reader leaves it alone
            cursor.execute("PRAGMA journal_mode = WAL")
        cursor.execute("PRAGMA synchronous = NORMAL")
    finally:
        cursor.close()


def _sqlite_on_read_connect(dbapi_connection: Any, record: Any) -> None:
    _sqlite_on_connect(dbapi_connection, record, wal=False)


def _sqlite_on_begin(connection: Any) -> None:
    write = connection.get_execution_options().get(WRITE_OPTION, False)
    connection.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")


def is_transient(error: BaseException | None) -> bool:
    """True for lock contention worth retrying: SQLite busy/locked, PostgreSQL deadlock or
    serialization failure."""
    if not isinstance(error, DBAPIError):
        return False
    orig = error.orig
    sqlstate = getattr(orig, "sqlstate", None)
    if sqlstate in _TRANSIENT_SQLSTATES:
        return True
    if isinstance(error, OperationalError):
        text = str(orig).lower()
        return (
            "database is locked" in text or "database is busy" in text or "database table is locked" in text
        )
    return False


def describe(error: BaseException) -> str:
    """The driver's message of a SQLAlchemy error, on one line, without SQLAlchemy's boilerplate."""
    orig = getattr(error, "orig", None)
    text = str(orig if orig is not None else error)
    first = text.strip().splitlines()[0] if text.strip() else type(error).__name__
    return first
