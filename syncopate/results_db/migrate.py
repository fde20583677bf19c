"""Schema revision checks and `syncopate db upgrade`.

:func:`read_revision` reads our Alembic version table without importing Alembic (cheap enough for
every open); :func:`upgrade` runs the shipped migrations to the head inside one write transaction
that holds a migration lock (SQLite: `BEGIN IMMEDIATE`; PostgreSQL: an advisory lock), so two
processes upgrading at once do it once. A database at a revision this code does not know is never
touched.
"""

from __future__ import annotations

import logging
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from syncopate.errors import DatabaseError
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

    Creates the SQLite file (and its folder) where needed. Raises SchemaError, touching nothing,
    where the database is at a revision newer than this code knows.
    """
    if location.dialect == "sqlite":
        check_sqlite_file(location, create=True)
    if location.sqlite_path is not None:
        location.sqlite_path.parent.mkdir(parents=True, exist_ok=True)
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

                    log.info("upgrading %s from %s to %s", location.shown(), before or "an empty database", HEAD)
                    command.upgrade(alembic_config(connection), "head")
            return before, HEAD
    except SQLAlchemyError as e:
        hint = ""
        if location.dialect == "postgresql":
            hint = " (a PostgreSQL database must exist first: `createdb NAME`)"
        raise DatabaseError(f"cannot upgrade database {location.shown()}: {describe(e)}{hint}") from e
    finally:
        if own:
            engine.dispose()
