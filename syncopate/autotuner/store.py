"""Where the coordinator keeps what it measures: the one seam between the tuner and the database.

Every database call of `syncopate tune` goes through :class:`TrialStore`. :class:`ResultsDBStore`
forwards it to :mod:`syncopate.results_db`; tests use their own implementation of the same
interface, and every implementation passes one conformance suite.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from syncopate.errors import DatabaseError
from syncopate.records import BaselineRecord, Environment, TrialRecord
from syncopate.search_space import Topology, Workload

__all__ = ["SWEEP_STATUSES", "TrialStore", "ResultsDBStore", "open_store"]

SWEEP_STATUSES: tuple[str, ...] = ("running", "done", "stopped", "interrupted", "failed")
"""A sweep is `running` until it ends: `done` (every planned trial stored), `stopped` (its time
budget ran out), `interrupted` (Ctrl-C) or `failed` (no gang left). A sweep killed outright stays
`running`; `--resume` continues any of them."""


class TrialStore(ABC):
    """Sweeps, trials and baselines as the coordinator needs them."""

    @abstractmethod
    def start_sweep(self, name: str, config: dict[str, Any]) -> int:
        """Create a sweep named `name` (its validated config as a JSON-able dict); return its id.
        This is the first write of a `syncopate tune` run."""

    @abstractmethod
    def resume_sweep(self, name: str) -> int | None:
        """The id of the most recent sweep named `name`, or None; marks it `running` again."""

    @abstractmethod
    def stored_keys(
        self, sweep_id: int, workload: Workload, topology: Topology, environment: Environment
    ) -> set[str]:
        """Keys of the candidates with a trial stored (any status) for this workload, topology and
        environment in sweep `sweep_id`."""

    @abstractmethod
    def stored_baselines(
        self, sweep_id: int, workload: Workload, topology: Topology, environment: Environment
    ) -> list[BaselineRecord]:
        """Baselines stored for this workload, topology and environment in sweep `sweep_id`."""

    @abstractmethod
    def record_trial(self, sweep_id: int, trial: TrialRecord) -> None:
        """Store `trial` in sweep `sweep_id`, committed on return; idempotent on
        (sweep, candidate, workload, topology, environment)."""

    @abstractmethod
    def record_baselines(self, sweep_id: int, baselines: Sequence[BaselineRecord]) -> None:
        """Store the baselines of one workload, all or none, committed on return; idempotent on
        (sweep, workload, topology, environment, name)."""

    @abstractmethod
    def best(self, workload: Workload, topology: Topology, environment: Environment) -> TrialRecord | None:
        """The fastest `ok` trial stored for this workload, topology and environment (any sweep)."""

    @abstractmethod
    def finish_sweep(self, sweep_id: int, status: str) -> None:
        """Mark the sweep ended with `status`, one of :data:`SWEEP_STATUSES`."""

    def close(self) -> None:
        """Release connections. Called once, at the end of the run."""


class ResultsDBStore(TrialStore):
    """:class:`TrialStore` over :class:`syncopate.results_db.ResultsDB`."""

    def __init__(self, db: Any) -> None:
        self._db = db

    @classmethod
    def open(cls, url: str | None) -> ResultsDBStore:
        try:
            from syncopate.results_db import ResultsDB
        except ImportError as e:
            raise DatabaseError(
                f"cannot open the results database {url or '(default)'}: "
                f"syncopate.results_db is not part of this "
                f"installation ({e})"
            ) from None
        return cls(ResultsDB.open(url))

    def start_sweep(self, name: str, config: dict[str, Any]) -> int:
        return self._db.start_sweep(name, config)

    def resume_sweep(self, name: str) -> int | None:
        info = self._db.latest_sweep(name)
        if info is None:
            return None
        self._db.resume_sweep(info.sweep_id)
        return info.sweep_id

    def stored_keys(
        self, sweep_id: int, workload: Workload, topology: Topology, environment: Environment
    ) -> set[str]:
        return set(self._db.measured_keys(workload, topology, environment, sweep_id=sweep_id, source=None))

    def stored_baselines(self, sweep_id, workload, topology, environment) -> list[BaselineRecord]:
        stored = self._db.baselines(workload=workload, topology=topology, environment=environment, sweep_id=sweep_id)
        return [b.record for b in stored]

    def record_trial(self, sweep_id: int, trial: TrialRecord) -> None:
        self._db.record_trial(sweep_id, trial)

    def record_baselines(self, sweep_id: int, baselines: Sequence[BaselineRecord]) -> None:
        for b in baselines:
            self._db.record_baseline(sweep_id, b)

    def best(self, workload: Workload, topology: Topology, environment: Environment) -> TrialRecord | None:
        stored = self._db.best(workload, topology, environment)
        return stored.record if stored is not None else None

    def finish_sweep(self, sweep_id: int, status: str) -> None:
        self._db.finish_sweep(sweep_id, status)

    def close(self) -> None:
        close = getattr(self._db, "close", None)
        if close is not None:
            close()


def open_store(url: str | None) -> TrialStore:
    """The store behind `url` (None: `SYNCOPATE_DB` or the per-user default); raises
    :class:`~syncopate.errors.DatabaseError` with one line when it cannot be opened."""
    return ResultsDBStore.open(url)
