"""Names of the schema and the migration revisions this version of Syncopate knows.

Every table is prefixed `syncopate_` and Alembic's version table is `syncopate_alembic_version`, so
Optuna's RDB storage (tables `studies`, `trials`, … and `alembic_version`) lives in the same database
without collision, and `optuna-dashboard URL` works on it as it is.

Nothing here imports SQLAlchemy: the light lookup path checks the schema revision with the standard
library's sqlite3 and these constants.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from syncopate.errors import DatabaseError, SchemaError
from syncopate.results_db.sqlite_files import damaged

if TYPE_CHECKING:
    from syncopate.results_db.urls import DbLocation

__all__ = [
    "BEST_VIEW",
    "HEAD",
    "MOE_REVISION",
    "NAMES_REVISION",
    "READ_COMPATIBLE",
    "REVISIONS",
    "TABLES",
    "TIMES_REVISION",
    "SQLITE_HEADER",
    "VERSION_TABLE",
    "check_revision",
    "check_sqlite_file",
    "has_current_names",
    "has_times",
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

REVISIONS: tuple[str, ...] = ("0001", "0002", "0003", "0004", "0005")
"""Every migration revision shipped, oldest first; a test checks it against the scripts."""

HEAD = REVISIONS[-1]

READ_COMPATIBLE: frozenset[str] = frozenset({"0001", "0002", "0003", "0004"})
"""Older revisions this code reads as they are, without an upgrade. Their tables lack only nullable
columns of the head's, which read as NULL, and their rows name backend `sm_copy` by its earlier name
`nvshmem` (before :data:`NAMES_REVISION`): every reader of stored candidates and calibrations of
such a database reads it as `sm_copy`, as migration 0003 rewrites it (from 0003 on, rows are read
as they are: from 0004 on, `nvshmem` is the NVSHMEM backend, and 0003 has no row naming it).
Results files may sit on read-only mounts, so a lookup, an export or the dashboard works on them;
only a write asks for `syncopate db upgrade` (this code writes rows of the head's columns and
names), and so does `--resume`, which parses the stored sweep config as it was written. Before
revision 0005 workloads lack `params` and no row is of a MoE kind: readers read `params` only for
MoE rows."""

TIMES_REVISION = "0002"
"""The first revision whose trials and baselines have `eager_us` and `host_us`."""

NAMES_REVISION = "0003"
"""The first revision whose rows name every backend by its current name (0003 renamed `nvshmem`
`sm_copy` in stored candidates, their keys, sweep configs and calibrations; 0004 gave the name
`nvshmem` to the NVSHMEM backend)."""


MOE_REVISION = "0005"
"""The first revision whose workloads have `params`, and may be of a MoE kind."""


def _since(revision: str | None, first: str) -> bool:
    return (
        revision is not None and revision in REVISIONS and REVISIONS.index(revision) >= REVISIONS.index(first)
    )


def has_times(revision: str | None) -> bool:
    """Whether a database at `revision` has the `eager_us` and `host_us` columns."""
    return _since(revision, TIMES_REVISION)


def has_current_names(revision: str | None) -> bool:
    """Whether the rows of a database at `revision` name every backend by its current name (a
    trial's candidate_hash included)."""
    return _since(revision, NAMES_REVISION)


def _names(where: DbLocation | str) -> tuple[str, str]:
    """How a message names the database, and the value to give to --db in a command it suggests."""
    if isinstance(where, str):
        return where, where
    return where.subject(), where.shown()


def no_tables_error(where: DbLocation | str) -> SchemaError:
    subject, shown = _names(where)
    return SchemaError(f"database {subject} has no Syncopate tables: run `syncopate db upgrade --db {shown}`")


def missing_error(where: DbLocation | str) -> SchemaError:
    subject, shown = _names(where)
    folder = (
        where.sqlite_path.parent if not isinstance(where, str) and where.sqlite_path is not None else None
    )
    if folder is not None and not folder.is_dir():
        return SchemaError(
            f"database {subject} does not exist, nor does its folder {folder}: check the path, or create "
            f"the folder first"
        )
    return SchemaError(
        f"database {subject} does not exist: check the path, or create it with `syncopate db upgrade --db {shown}`"
    )


def unreachable_error(
    where: DbLocation | str, reason: str, dialect: str, path: Path | None = None
) -> DatabaseError:
    """The database cannot be opened at all: the driver's reason, and what to check or run. A SQLite
    file (`path`, else the location's) that exists and is damaged is not made anew by `syncopate db
    upgrade` on its path: the advice is then to move it aside."""
    subject, shown = _names(where)
    if path is None and not isinstance(where, str):
        path = where.sqlite_path
    damage = damaged(path, reason) if dialect == "sqlite" else ""
    if damage:
        return DatabaseError(f"cannot open database {subject}: {reason}{damage}")
    if dialect == "postgresql":
        fix = (
            f"check the URL and that the server runs; a new database is made with `createdb NAME` "
            f"then `syncopate db upgrade --db {shown}`"
        )
    else:
        fix = f"check the path; a new database is made with `syncopate db upgrade --db {shown}`"
    return DatabaseError(f"cannot open database {subject}: {reason} ({fix})")


SQLITE_HEADER = b"SQLite format 3\x00"
"""The first 16 bytes of every SQLite database file."""


def check_sqlite_file(location: DbLocation, *, create: bool = False) -> None:
    """Raise DatabaseError, before any driver touches it, where a SQLite location cannot be a
    results database: a directory, a file that is not SQLite, or (unless `create`) an in-memory
    database, which holds nothing between commands."""
    subject = location.subject()
    if location.in_memory:
        if not create:
            raise DatabaseError(
                f"database {subject} is in memory: it holds nothing between commands; give a file path "
                f"or a server URL"
            )
        return
    path = location.sqlite_path
    if path is None:
        return
    if path.is_dir():
        raise DatabaseError(
            f"database {subject} is a directory: give a file in it, such as {path / 'results.db'}"
        )
    try:
        with path.open("rb") as f:
            head = f.read(len(SQLITE_HEADER))
    except FileNotFoundError:
        return
    except OSError as e:
        raise DatabaseError(f"cannot open database {subject}: {e.strerror or e}") from None
    if head.lstrip()[:1] == b"{":
        raise DatabaseError(
            f"database {subject} is not a SQLite database file but JSON, such as an export file of "
            f"`syncopate export`, which only `syncopate lookup` reads (given as a path): give the results "
            f"database itself"
        )
    if head and head != SQLITE_HEADER:
        raise DatabaseError(
            f"database {subject} is not a SQLite database file: give the path of a results database, or a "
            f"new file name (`syncopate db upgrade --db NEW.db` makes one)"
        )


def check_revision(revision: str | None, where: DbLocation | str, *, read: bool = False) -> None:
    """Raise SchemaError unless `revision` is the head this code knows (or, with `read`, an older
    revision it reads as it is: :data:`READ_COMPATIBLE`).

    None means no schema at all; an older revision asks for `syncopate db upgrade`; an unknown one
    is newer than this version of Syncopate, which then refuses to touch the database.
    """
    if revision == HEAD or (read and revision in READ_COMPATIBLE and revision in REVISIONS):
        return
    if revision is None:
        raise no_tables_error(where)
    subject, shown = _names(where)
    if revision in REVISIONS:
        raise SchemaError(
            f"database {subject} has schema revision {revision}, older than this Syncopate's {HEAD}: "
            f"run `syncopate db upgrade --db {shown}`"
        )
    raise SchemaError(
        f"database {subject} has schema revision {revision!r}, newer than this version of Syncopate "
        f"knows (latest {HEAD}); it was left untouched: upgrade syncopate to use it"
    )


def include_object(obj: object, name: str | None, type_: str, reflected: bool, compare_to: object) -> bool:
    """Alembic's filter: only our tables (Optuna's, and anything else in the database, are not ours)."""
    if type_ == "table":
        return name in TABLES
    return True
