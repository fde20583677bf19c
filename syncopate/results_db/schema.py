"""Names of the schema and the migration revisions this version of Syncopate knows.

Every table is prefixed `syncopate_` and Alembic's version table is `syncopate_alembic_version`, so
Optuna's RDB storage (tables `studies`, `trials`, … and `alembic_version`) lives in the same database
without collision, and `optuna-dashboard URL` works on it as it is.

Nothing here imports SQLAlchemy: the light lookup path checks the schema revision with the standard
library's sqlite3 and these constants.
"""

from __future__ import annotations

from syncopate.errors import DatabaseError, SchemaError

__all__ = [
    "BEST_VIEW",
    "HEAD",
    "REVISIONS",
    "TABLES",
    "VERSION_TABLE",
    "check_revision",
    "include_object",
    "missing_error",
    "no_tables_error",
    "unreachable_error",
]

VERSION_TABLE = "syncopate_alembic_version"
"""Alembic's version table for our migrations (Optuna keeps its own `alembic_version`)."""

TABLES: tuple[str, ...] = (
    "syncopate_environments",
    "syncopate_topologies",
    "syncopate_workloads",
    "syncopate_sweeps",
    "syncopate_trials",
    "syncopate_baselines",
    "syncopate_calibrations",
)
"""Our tables, in creation order."""

BEST_VIEW = "syncopate_best"
"""View: the fastest `ok`, `measured` trial per (workload, topology, environment)."""

REVISIONS: tuple[str, ...] = ("0001",)
"""Every migration revision shipped, oldest first; a test checks it against the scripts."""

HEAD = REVISIONS[-1]


def no_tables_error(shown_url: str) -> SchemaError:
    return SchemaError(
        f"database {shown_url} has no Syncopate tables: run `syncopate db upgrade --db {shown_url}`"
    )


def missing_error(shown_url: str) -> SchemaError:
    return SchemaError(
        f"database {shown_url} does not exist: check the path, or create it with "
        f"`syncopate db upgrade --db {shown_url}`"
    )


def unreachable_error(shown_url: str, reason: str, dialect: str) -> DatabaseError:
    """The database cannot be opened at all: the driver's reason, and what to check or run."""
    if dialect == "postgresql":
        fix = (f"check the URL and that the server runs; a new database is made with `createdb NAME` "
               f"then `syncopate db upgrade --db {shown_url}`")
    else:
        fix = f"check the path; a new database is made with `syncopate db upgrade --db {shown_url}`"
    return DatabaseError(f"cannot open database {shown_url}: {reason} ({fix})")


def check_revision(revision: str | None, shown_url: str) -> None:
    """Raise SchemaError unless `revision` is the head this code knows.

    None means no schema at all; an older revision asks for `syncopate db upgrade`; an unknown one
    is newer than this version of Syncopate, which then refuses to touch the database.
    """
    if revision == HEAD:
        return
    if revision is None:
        raise no_tables_error(shown_url)
    if revision in REVISIONS:
        raise SchemaError(
            f"database {shown_url} has schema revision {revision}, older than this Syncopate's {HEAD}: "
            f"run `syncopate db upgrade --db {shown_url}`"
        )
    raise SchemaError(
        f"database {shown_url} has schema revision {revision!r}, newer than this version of Syncopate "
        f"knows (latest {HEAD}); it was left untouched: upgrade syncopate to use it"
    )


def include_object(obj: object, name: str | None, type_: str, reflected: bool, compare_to: object) -> bool:
    """Alembic's filter: only our tables (Optuna's, and anything else in the database, are not ours)."""
    if type_ == "table":
        return name in TABLES
    return True
