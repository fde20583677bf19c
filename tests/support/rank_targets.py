"""Targets for `spawn_ranks` in the tests (module level, so that spawned processes import them)."""

from __future__ import annotations

import os
import time
from pathlib import Path


def sleeper(rank, world, port, folder, queue) -> None:
    """Say where it runs, then wait far longer than any test."""
    Path(folder, f"rank{rank}.pid").write_text(str(os.getpid()))
    time.sleep(600)


def one_fails(rank, world, port, folder, queue) -> None:
    """Rank 1 fails at once; the others would wait."""
    Path(folder, f"rank{rank}.pid").write_text(str(os.getpid()))
    if rank == 1:
        raise SystemExit(3)
    time.sleep(600)


def silent(rank, world, port, folder, queue) -> None:
    """Ends cleanly without a result."""
    Path(folder, f"rank{rank}.pid").write_text(str(os.getpid()))
