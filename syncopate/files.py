"""Files Syncopate writes for people (exports, reports): checked before the work that fills them,
and replaced atomically, so that a failure leaves the old file, or none, and no temporary behind."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from syncopate.errors import ConfigError

__all__ = ["check_writable", "write_atomically"]


def _folder(path: Path) -> Path:
    return path.parent if str(path.parent) else Path(".")


def check_writable(path: Path, example: str | None = None) -> None:
    """Raise ConfigError, naming `path`, where a file cannot be written there: a directory in its
    place (`example` is the file name suggested in it), a folder that does not exist or is a file,
    or one that this user may not write."""
    if path.is_dir():
        name = example or f"out{path.suffix or ''}"
        raise ConfigError(f"cannot write {path}: it is a directory; give a file name, such as {path / name}")
    folder = _folder(path)
    if not folder.is_dir():
        above = folder
        while not above.exists() and above != above.parent:
            above = above.parent
        if above.exists() and not above.is_dir():
            raise ConfigError(f"cannot write {path}: {above} is a file, not a folder")
        raise ConfigError(f"cannot write {path}: folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"cannot write {path}: folder {folder} is not writable by this user")


def write_atomically(path: Path, data: bytes, *, mode: int = 0o644) -> None:
    """Replace `path` with `data` (a temporary file in the same folder, synced, then renamed)."""
    check_writable(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=_folder(path))
    except OSError as e:
        raise ConfigError(f"cannot write {path}: {e.strerror or e}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)  # mkstemp makes it private
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise ConfigError(f"cannot write {path}: {e.strerror or e}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
