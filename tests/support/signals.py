"""What a test that stops a child process with a signal starts the child with."""

from __future__ import annotations

import signal


def default_stops() -> None:
    """`subprocess.Popen`'s `preexec_fn`: SIGINT and SIGTERM at their default dispositions in the
    child. An ignored signal stays ignored across exec (a shell's background job, or anything that
    ignored it in the test's process), and a Python started with SIGINT ignored never raises
    KeyboardInterrupt: the test would see its Ctrl-C do nothing, whatever the command does."""
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, signal.SIG_DFL)
