"""Schema revision checks and `syncopate db upgrade`.

:func:`read_revision` reads our Alembic version table without importing Alembic (cheap enough for
every open); :func:`upgrade` runs the shipped migrations to the head inside one write transaction
that holds a migration lock (SQLite: `BEGIN IMMEDIATE`; PostgreSQL: an advisory lock), so two
processes upgrading at once do it once. A database at a revision this code does not know is never
touched.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from syncopate.errors import DatabaseError
from syncopate.results_db import sqlite_files
from syncopate.results_db.engine import WRITE_OPTION, describe, make_engine
from syncopate.results_db.schema import HEAD, REVISIONS, VERSION_TABLE, check_revision, check_sqlite_file
from syncopate.results_db.urls import DbLocation

__all__ = ["MIGRATIONS_DIR", "alembic_config", "read_revision", "upgrade"]

log = logging.getLogger(__name__)

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"

_PG_LOCK_KEY = 0x53594E43  # "SYNC": the advisory lock that serialises concurrent upgrades


def read_revision(connection: Connection) -> str | None:
    """Our schema revision in the database, or None where our version table is absent or empty."""
    if connection.dialect.name == "sqlite":
        exists = connection.exec_driver_sql(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (VERSION_TABLE,)
        ).first()
    else:
        exists = connection.execute(text("SELECT to_regclass(:name)"), {"name": VERSION_TABLE}).scalar()
    if not exists:
        return None
    return connection.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar()


def alembic_config(connection: Connection | None = None):
    """An Alembic Config for the shipped migrations (optionally bound to an open connection)."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def upgrade(location: DbLocation, engine: Engine | None = None) -> tuple[str | None, str]:
    """Bring the database at `location` to the head revision; return (revision before, after).

    Creates the SQLite file (and its folder) where needed, whole or not at all: the schema is made
    in a temporary file beside it, which is then linked into place, so that a run stopped half-way
    leaves no database that a rerun would refuse. Raises SchemaError, touching nothing, where the
    database is at a revision newer than this code knows.
    """
    if location.dialect == "sqlite":
        check_sqlite_file(location, create=True)
    path = location.sqlite_path
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() and _create_sqlite(location, path):
            return None, HEAD
    own = engine is None
    engine = engine or make_engine(location)
    try:
        with engine.connect() as connection:
            connection.execution_options(**{WRITE_OPTION: True})
            with connection.begin():
                if connection.dialect.name == "postgresql":
                    connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_LOCK_KEY})
                before = read_revision(connection)
                if before is not None and before not in REVISIONS:
                    check_revision(before, location)
                if before != HEAD:
                    from alembic import command

                    log.info(
                        "upgrading %s from %s to %s", location.shown(), before or "an empty database", HEAD
                    )
                    command.upgrade(alembic_config(connection), "head")
            return before, HEAD
    except SQLAlchemyError as e:
        if location.dialect == "postgresql":
            hint = " (a PostgreSQL database must exist first: `createdb NAME`)"
        else:
            hint = sqlite_files.damaged(path, describe(e))
        raise DatabaseError(f"cannot upgrade database {location.shown()}: {describe(e)}{hint}") from e
    finally:
        if own:
            engine.dispose()


def _create_sqlite(location: DbLocation, path: Path) -> bool:
    """Make a new database at `path` (see :func:`upgrade`); False where another process made one
    there first (it is then upgraded like any existing database)."""
    temporary = sqlite_files.temporary_beside(path)
    shown = location.shown()
    try:
        engine = make_engine(replace(location, url=f"sqlite:///{temporary}", sqlite_path=temporary))
        try:
            with engine.connect() as connection:
                connection.execution_options(**{WRITE_OPTION: True})
                with connection.begin():
                    from alembic import command

                    log.info("creating %s at revision %s", shown, HEAD)
                    command.upgrade(alembic_config(connection), "head")
                # everything into the file itself before it is linked: its WAL is not linked with it
                busy = connection.connection.driver_connection.execute(
                    "PRAGMA wal_checkpoint(TRUNCATE)"
                ).fetchone()
                if busy is not None and busy[0]:
                    raise DatabaseError(
                        f"cannot create database {shown}: its new file {temporary} stayed busy"
                    )
        finally:
            engine.dispose()
        return sqlite_files.link_into_place(temporary, path)
    except SQLAlchemyError as e:
        raise DatabaseError(f"cannot create database {shown}: {describe(e)}") from e
    except OSError as e:
        raise DatabaseError(f"cannot create database {shown}: {e.strerror or e}") from e
    finally:
        sqlite_files.remove_with_journals(temporary)
