"""A SQLite results file on disk: read it without changing it, check it can be written, make it
whole or not at all.

Reading. Every results file is in WAL mode, and a WAL reader normally needs the `-wal` and `-shm`
files beside the database: SQLite creates them where the folder is writable (and leaves them there
when the reader cannot clean up) and fails ("attempt to write a readonly database") where it is not,
on a read-only mount or in a container image. A reader here opens the file `mode=ro`, and, where
no writer has it open (a writer in WAL mode keeps both files while it is connected), also
`immutable=1`: SQLite then reads the database file alone, takes no lock and creates nothing. A
connection opened that way is replaced by an ordinary read-only one as soon as a writer appears
(:func:`writer_present`), so that it never reads pages a checkpoint is rewriting and sees what the
writer commits.

Creating. A new database is built in a temporary file beside its final path, which is then linked
into place: a run stopped while the schema is made (a signal, a full disk) leaves no database, and
the next run starts afresh. Nothing here imports SQLAlchemy.
"""

from __future__ import annotations

import os
import sqlite3
import uuid
from pathlib import Path
from typing import NamedTuple
from urllib.parse import quote

from syncopate.errors import DatabaseError

__all__ = [
    "ReadConnection",
    "SchemaState",
    "check_writable",
    "connect_read_only",
    "damaged",
    "is_wal",
    "link_into_place",
    "read_schema",
    "remove_with_journals",
    "temporary_beside",
    "writable_problem",
    "writer_present",
]

_SUFFIXES = ("-wal", "-shm", "-journal")


class ReadConnection(sqlite3.Connection):
    """A read-only connection that knows whether it was opened `immutable` (see the module
    docstring)."""

    immutable: bool = False


def is_wal(path: Path) -> bool:
    """Whether the database file's header says WAL mode (bytes 18 and 19 are 2)."""
    try:
        with path.open("rb") as f:
            head = f.read(20)
    except OSError:
        return False
    return len(head) == 20 and head[18] == 2 and head[19] == 2


def _beside(path: Path, suffix: str) -> Path:
    return path.with_name(path.name + suffix)


def writer_present(path: Path) -> bool:
    """Whether a `-wal` or `-shm` file is beside the database: a writer has it open (or left them)."""
    return _beside(path, "-wal").exists() or _beside(path, "-shm").exists()


def _folder_writable(path: Path) -> bool:
    folder = path.parent if str(path.parent) else Path(".")
    return os.access(folder, os.W_OK | os.X_OK)


def _uri(path: Path, immutable: bool) -> str:
    return f"file:{quote(str(path))}?mode=ro" + ("&immutable=1" if immutable else "")


def connect_read_only(path: Path, subject: str, *, timeout: float = 30.0) -> ReadConnection:
    """A read-only connection to the database file `path` that creates and changes nothing (see the
    module docstring); `subject` names the database in errors.

    Raises DatabaseError where the file cannot be read as it is: a `-wal` file with changes not yet
    written into the database, without its `-shm`, in a folder where the `-shm` cannot be made.
    """
    immutable = is_wal(path) and not writer_present(path)
    if not immutable and not _folder_writable(path):
        wal, shm = _beside(path, "-wal"), _beside(path, "-shm")
        if wal.exists() and not shm.exists():
            if wal.stat().st_size == 0:  # an empty WAL holds nothing: the database file is whole
                immutable = True
            else:
                raise DatabaseError(
                    f"cannot read database {subject}: {wal.name} beside it holds changes not yet written into "
                    f"the database, and SQLite cannot make {shm.name} in its read-only folder to read them: "
                    f"open it once where its folder is writable (e.g. `syncopate best --db COPY` on a writable "
                    f"copy of both files) and use that copy"
                )
    try:
        connection = sqlite3.connect(
            _uri(path, immutable), uri=True, timeout=timeout, check_same_thread=False, factory=ReadConnection
        )
    except sqlite3.Error as e:
        raise DatabaseError(f"cannot open database {subject}: {e}{damaged(path, e)}") from e
    connection.immutable = immutable
    return connection


class SchemaState(NamedTuple):
    """What a SQLite file holds, read without changing it."""

    names: frozenset[str]
    """Every table, view, index and trigger in it (empty for a new, empty database)."""
    revision: str | None
    """Our schema revision, or None where our version table is absent or empty."""


def read_schema(path: Path, subject: str, version_table: str) -> SchemaState:
    """The objects and our schema revision in the SQLite file `path`, read through
    :func:`connect_read_only`; raises DatabaseError (naming `subject`) where it cannot be read."""
    connection = connect_read_only(path, subject)
    try:
        names = frozenset(row[0] for row in connection.execute("SELECT name FROM sqlite_master"))
        revision = None
        if version_table in names:
            row = connection.execute(f"SELECT version_num FROM {version_table}").fetchone()
            revision = row[0] if row else None
    except sqlite3.Error as e:
        raise DatabaseError(f"cannot read database {subject}: {e}{damaged(path, e)}") from e
    finally:
        connection.close()
    return SchemaState(names=names, revision=revision)


_DAMAGED = ("malformed", "not a database", "file is encrypted")


def damaged(path: Path | None, error: BaseException | str) -> str:
    """Where `error` says the existing file at `path` is damaged or not a database: the advice that
    works (a new file; `syncopate db upgrade` on this path would fail the same way), as a clause
    to append to a message. Otherwise empty."""
    text = str(error).lower()
    if path is None or not path.is_file() or not any(word in text for word in _DAMAGED):
        return ""
    return (
        f" (the file is damaged or not a results database: restore it from a copy, or move it aside and "
        f"give a new file, e.g. `syncopate db upgrade --db {path.with_name('new-' + path.name)}`)"
    )


def check_writable(path: Path, subject: str) -> None:
    """Raise DatabaseError, naming `subject`, where this user could not write the SQLite database
    `path` (see :func:`writable_problem`): before a run that writes starts anything."""
    problem = writable_problem(path)
    if problem is None:
        return
    if not path.exists():
        raise DatabaseError(
            f"database {subject} cannot be created: {problem}; give a file in a writable folder"
        )
    raise DatabaseError(
        f"database {subject} cannot be written: {problem}. Reads (lookup, best, export, the dashboard) work as "
        f"it is; to write, give a file in a writable folder (a new one is created) or make it writable"
    )


def writable_problem(path: Path) -> str | None:
    """Why a writer could not write the SQLite database `path` (which may not exist yet, its folder
    made on the way), or None where it can: SQLite writes the file and, beside it, its journal."""
    if path.exists():
        if not os.access(path, os.W_OK):
            return "the file is read-only for this user"
        folder = path.parent if str(path.parent) else Path(".")
        if not _folder_writable(path):
            return f"its folder {folder} is read-only for this user, and SQLite writes its journal beside the file"
        return None
    above = path.parent if str(path.parent) else Path(".")
    while not above.exists() and above != above.parent:
        above = above.parent
    if above.is_dir() and not os.access(above, os.W_OK | os.X_OK):
        return f"the folder {above} is read-only for this user"
    return None


def temporary_beside(path: Path) -> Path:
    """A new name in `path`'s folder to build a database in before it is linked into place."""
    return _beside(path.with_name(f".{path.name}"), f".{os.getpid()}-{uuid.uuid4().hex[:8]}.creating")


def link_into_place(temporary: Path, path: Path) -> bool:
    """Give the finished database `temporary` the name `path`, atomically and only if `path` does not
    exist yet; False where another process made `path` first (its database is kept)."""
    folder = path.parent if str(path.parent) else Path(".")
    with temporary.open("rb+") as f:
        os.fsync(f.fileno())
    try:
        os.link(temporary, path)
    except FileExistsError:
        return False
    except OSError:  # a file system without hard links: rename, where nothing took the name meanwhile
        if path.exists():
            return False
        os.rename(temporary, path)
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return True
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
    return True


def remove_with_journals(path: Path) -> None:
    """Remove the SQLite file `path` and any journal beside it, where they exist."""
    for p in (path, *(_beside(path, s) for s in _SUFFIXES)):
        try:
            p.unlink()
        except FileNotFoundError:
            pass
