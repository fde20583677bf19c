"""Runs `syncopate tune ...` (argv after the script name) with the tests' SQLite store behind the
coordinator's seam, as a real process that a test can kill."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from support.sqlite_store import SqliteTrialStore  # noqa: E402
from syncopate.autotuner import store  # noqa: E402
from syncopate.cli import main  # noqa: E402

store.open_store = SqliteTrialStore.open

if __name__ == "__main__":
    sys.exit(main(["tune", *sys.argv[1:]]))
