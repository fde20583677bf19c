"""Runs `syncopate tune ...` (argv after the script name) as a real process, on the real results
database, for tests that kill it. With SYNCOPATE_TEST_WRITE_LOG set, every trial and baseline
write, once committed, is also appended to that file as a JSON line {kind, key, pid}: the database
keeps one row per identity, so only this log can tell a trial measured twice from one stored once.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from syncopate.autotuner import store  # noqa: E402
from syncopate.cli import main  # noqa: E402

LOG_VAR = "SYNCOPATE_TEST_WRITE_LOG"


class LoggedStore(store.ResultsDBStore):
    """The results database, with each committed write appended to the log."""

    def _log(self, kind: str, key: str) -> None:
        with open(os.environ[LOG_VAR], "a") as f:
            f.write(json.dumps({"kind": kind, "key": key, "pid": os.getpid()}) + "\n")

    def record_trial(self, sweep_id, trial) -> None:
        super().record_trial(sweep_id, trial)
        self._log("trial", f"{trial.workload.key()}/{trial.candidate.key()}")

    def record_baselines(self, sweep_id, baselines) -> None:
        super().record_baselines(sweep_id, baselines)
        for b in baselines:
            self._log("baseline", f"{b.workload.key()}/{b.name}")


if __name__ == "__main__":
    if os.environ.get(LOG_VAR):
        store.open_store = LoggedStore.open
    sys.exit(main(["tune", *sys.argv[1:]]))
