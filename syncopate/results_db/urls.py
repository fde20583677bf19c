"""Where the results database is: URL resolution, the per-user default, and safe display.

Resolution order for a command or a call that takes `db`:

1. the explicit value (`--db URL`, `db=`), a URL or a filesystem path;
2. the `SYNCOPATE_DB` environment variable;
3. the per-user default, `$XDG_DATA_HOME/syncopate/results.db` (`~/.local/share/syncopate/results.db`
   where XDG_DATA_HOME is unset), a SQLite file created and upgraded on first use by commands that
   write.

Accepted URLs: `sqlite:///ABSOLUTE/PATH` (or `sqlite:///relative/path`), `postgresql+psycopg://…`
(`postgresql://` and `postgres://` are read as psycopg 3). A value without `://` is a path to a
SQLite file. Nothing here imports SQLAlchemy.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from syncopate.errors import ConfigError

__all__ = ["ENV_VAR", "DbLocation", "default_path", "default_url", "locate", "redact"]

ENV_VAR = "SYNCOPATE_DB"
"""Environment variable naming the database when `--db` / `db=` is not given."""

_POSTGRES_PREFIXES = ("postgresql+psycopg://", "postgresql://", "postgres://")
_PASSWORD = re.compile(r"(://[^:/@]*:)(.*)(@)")


def default_path() -> Path:
    """The per-user SQLite file (honours XDG_DATA_HOME)."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "syncopate" / "results.db"


def default_url() -> str:
    return f"sqlite:///{default_path()}"


def redact(url: str) -> str:
    """The URL with any password replaced by `***`, for messages and logs."""
    return _PASSWORD.sub(r"\1***\3", url)


@dataclass(frozen=True, kw_only=True, slots=True)
class DbLocation:
    """A resolved database location."""

    url: str
    """SQLAlchemy URL (`sqlite:///…` or `postgresql+psycopg://…`)."""
    given: str
    """What the user gave (or the variable / default it came from), as shown in messages."""
    is_default: bool
    """True for the per-user default file: only that one is created and upgraded automatically."""
    sqlite_path: Path | None
    """The SQLite file, or None for an in-memory or a server database."""
    origin: str = ""
    """Where the value came from when not given explicitly: `SYNCOPATE_DB` or `default`."""

    @property
    def dialect(self) -> str:
        return "sqlite" if self.url.startswith("sqlite") else "postgresql"

    def shown(self) -> str:
        """The URL as printed in messages (password hidden)."""
        return redact(self.given)

    def subject(self) -> str:
        """The database as a message names it: its URL, and the variable it came from if one did."""
        return f"{self.shown()} (from ${ENV_VAR})" if self.origin == ENV_VAR else self.shown()

    @property
    def in_memory(self) -> bool:
        """A SQLite database in memory (`sqlite://`): it holds nothing once the command ends."""
        return self.dialect == "sqlite" and self.sqlite_path is None


def _sqlite_path(url: str) -> Path | None:
    rest = url[len("sqlite://") :]
    if rest in ("", "/", "/:memory:") or rest.startswith("/:memory:") or rest.startswith("/file:"):
        return None
    path = rest[1:] if rest.startswith("/") else rest
    path = path.split("?", 1)[0]
    return Path(path).expanduser()


def locate(db: str | os.PathLike[str] | None = None) -> DbLocation:
    """Resolve `db` (explicit value, else SYNCOPATE_DB, else the per-user default)."""
    is_default = False
    origin = ""
    if db is None or (isinstance(db, str) and not db.strip()):
        env = os.environ.get(ENV_VAR, "").strip()
        if env:
            db, origin = env, ENV_VAR
        else:
            db = default_url()
            is_default, origin = True, "default"
    given = os.fspath(db).strip()
    if "://" not in given:
        path = Path(given).expanduser().absolute()
        return DbLocation(
            url=f"sqlite:///{path}", given=given, is_default=is_default, sqlite_path=path, origin=origin
        )
    scheme = given.split("://", 1)[0].lower()
    if scheme == "sqlite":
        return DbLocation(
            url=given, given=given, is_default=is_default, sqlite_path=_sqlite_path(given), origin=origin
        )
    if given.lower().startswith(_POSTGRES_PREFIXES):
        url = "postgresql+psycopg://" + given.split("://", 1)[1]
        return DbLocation(url=url, given=given, is_default=False, sqlite_path=None, origin=origin)
    where = f" (from ${ENV_VAR})" if origin == ENV_VAR else ""
    raise ConfigError(
        f"database URL {redact(given)!r}{where} is not supported: accepted are sqlite:///PATH, a path to a "
        f"SQLite file, or postgresql+psycopg://USER@HOST/DBNAME"
    )
