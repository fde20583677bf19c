"""Files that are read-only for real, for tests of what Syncopate does with them.

`chmod` does not stop root, and CI runs as root: :func:`unprivileged` runs a function in a forked
child that has dropped to the `nobody` user (for whom a 0444 file in a 0555 folder is read-only,
as on a read-only mount), and hands back its result or raises its error here. Run as another
user, it calls the function directly. Where root cannot drop its privileges (no CAP_SETUID), the
test is skipped with the reason.

The child can import nothing new where the interpreter's own files are out of `nobody`'s reach:
call the function once first on a writable copy (:func:`read_only_copy` keeps the writable
original), so that everything it imports is already loaded.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

__all__ = ["NOBODY", "captured", "listing", "read_only", "shared_folder", "unprivileged"]

NOBODY = 65534
"""The uid and gid of `nobody` on Linux."""

T = TypeVar("T")


@contextlib.contextmanager
def shared_folder() -> Iterator[Path]:
    """A new folder that `nobody` may enter (pytest's own are private to the user running it),
    removed at the end whatever its modes."""
    folder = Path(tempfile.mkdtemp(prefix="syncopate-ro-"))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        for p in [folder, *folder.rglob("*")]:
            if p.is_dir() and not p.is_symlink():
                p.chmod(0o755)
        shutil.rmtree(folder, ignore_errors=True)


def read_only(folder: Path) -> None:
    """Make `folder` and every file in it read-only (0555 and 0444)."""
    for p in folder.iterdir():
        p.chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
    folder.chmod(0o555)


def listing(folder: Path) -> dict[str, bytes]:
    """Every file in `folder` with its bytes (a folder: None): what a read must leave exactly as it was."""
    return {p.name: p.read_bytes() if p.is_file() else None for p in sorted(folder.iterdir())}


def captured(call: Callable[[], Any]) -> tuple[Any, str, str]:
    """(what `call()` returned, its stdout, its stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        value = call()
    return value, out.getvalue(), err.getvalue()


def unprivileged(fn: Callable[[], T]) -> T:
    """`fn()` run by a user whom file modes bind (see the module docstring)."""
    if os.geteuid() != 0:
        return fn()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop to nobody, run, report, and leave without running pytest's exit
        try:
            os.close(read_end)
            try:
                os.setgroups([])
                os.setgid(NOBODY)
                os.setuid(NOBODY)
            except OSError as e:
                payload: tuple[str, Any] = ("skip", f"root cannot drop its privileges here ({e})")
            else:
                try:
                    payload = ("returned", fn())
                except BaseException as e:  # noqa: BLE001 - handed to the parent, which raises it
                    payload = ("raised", e)
            try:
                data = pickle.dumps(payload)
            except Exception as e:  # noqa: BLE001
                data = pickle.dumps(("raised", RuntimeError(f"unpicklable result: {payload!r} ({e})")))
            with os.fdopen(write_end, "wb") as pipe:
                pipe.write(data)
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        data = pipe.read()
    _, status = os.waitpid(pid, 0)
    if not data:
        raise AssertionError(f"the unprivileged child ended with status {status} and no result")
    kind, value = pickle.loads(data)
    if kind == "skip":
        pytest.skip(value)
    if kind == "raised":
        raise value
    return value
