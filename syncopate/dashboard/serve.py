"""Starting the web dashboard: checks first, then Streamlit in place of this process.

:func:`serve` checks what would otherwise fail later or with a long traceback (Streamlit missing,
a database URL that cannot be read, a port already taken) and raises a SyncopateError with one
line saying what to do; then it replaces the process with `python -m streamlit run app.py`, so that
signals and the exit code are Streamlit's own.
"""

from __future__ import annotations

import errno
import os
import socket
import sys
from pathlib import Path

from syncopate.errors import ConfigError, RuntimeUnavailableError
from syncopate.results_db.schema import check_sqlite_file
from syncopate.results_db.urls import locate

__all__ = ["APP", "check_port", "serve", "streamlit_command"]

APP = Path(__file__).resolve().parent / "app.py"
"""The Streamlit script."""


def check_port(host: str, port: int) -> None:
    """Raise ConfigError unless a server could listen on `port` at every address of `host` now
    (the same socket options as Streamlit's server, so a port in TIME_WAIT counts as free)."""
    if not 1 <= port <= 65535:
        raise ConfigError(f"port {port} is not a TCP port: give one in 1..65535")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise ConfigError(
            f"host {host!r} does not resolve ({e.strerror}): give an address such as 127.0.0.1 or 0.0.0.0"
        ) from None
    for family, kind, proto, _, address in infos:
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                s.bind(address)
            except OSError as e:
                if e.errno == errno.EADDRINUSE:
                    raise ConfigError(
                        f"port {port} on {host} is in use: stop what listens there or pick another "
                        f"with --port"
                    ) from None
                if e.errno == errno.EADDRNOTAVAIL and family == socket.AF_INET6:
                    continue  # no IPv6 on this machine; Streamlit skips it too
                raise ConfigError(f"cannot listen on {host}:{port}: {e.strerror}") from None


def streamlit_command(db: str | None, host: str, port: int) -> list[str]:
    """The command line that serves the app."""
    command = [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(APP),
        "--server.address",
        host,
        "--server.port",
        str(port),
        "--server.headless",
        "true",
        "--server.fileWatcherType",
        "none",
        "--server.runOnSave",
        "false",
        "--browser.gatherUsageStats",
        "false",
        "--global.developmentMode",
        "false",
        "--client.toolbarMode",
        "viewer",
        "--theme.base",
        "light",
    ]
    if db is not None:
        command += ["--", "--db", db]
    return command


def serve(db: str | None, *, host: str = "127.0.0.1", port: int = 8501) -> None:
    """Serve the dashboard over `db` (URL or SQLite path; None: SYNCOPATE_DB, else the per-user
    database) on host:port; never returns. A database that is missing, empty or of an older schema
    is explained on the page itself; a location that can never hold one fails here."""
    try:
        import altair  # noqa: F401
        import streamlit  # noqa: F401
    except ImportError as e:
        raise RuntimeUnavailableError(
            f"the dashboard needs the `dashboard` extra ({e.name} is not installed): "
            f"pip install 'syncopate[dashboard]'"
        ) from None
    location = locate(db)  # an unsupported URL fails here, in the terminal
    if location.dialect == "sqlite":  # as do a directory, a file that is not SQLite, `sqlite://` in memory
        check_sqlite_file(location)
    check_port(host, port)
    shown = f"[{host}]" if ":" in host else host
    print(
        f"syncopate: dashboard over {location.shown()} on http://{shown}:{port} (Ctrl-C stops it)",
        file=sys.stderr,
        flush=True,
    )
    command = streamlit_command(location.given if db is not None else None, host, port)
    os.execv(command[0], command)
