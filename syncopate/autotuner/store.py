"""Where the coordinator keeps what it measures: the one seam between the tuner and the database.

Every database call of `syncopate tune` goes through :class:`TrialStore`; :class:`ResultsDBStore`
forwards it to :class:`syncopate.results_db.ResultsDB`, on SQLite or PostgreSQL. The conformance
suite `tests/support/store_suite.py` states what an implementation must do.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from syncopate.errors import DatabaseError
from syncopate.records import DEFAULT_MODE, BaselineRecord, Environment, TrialRecord
from syncopate.search_space import Topology, Workload

__all__ = ["SWEEP_STATUSES", "StoredSweep", "TrialStore", "ResultsDBStore", "open_store"]

SWEEP_STATUSES: tuple[str, ...] = ("running", "done", "stopped", "interrupted", "failed")
"""A sweep is `running` until it ends: `done` (every planned trial stored), `stopped` (its time
budget ran out), `interrupted` (Ctrl-C) or `failed` (no gang left). A sweep killed outright stays
`running`; `--resume` continues any of them."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StoredSweep:
    """A sweep as the store holds it."""

    sweep_id: int
    name: str
    status: str
    """One of :data:`SWEEP_STATUSES`."""
    config: dict[str, Any] = field(default_factory=dict)
    """The config it was started with (:meth:`TrialStore.start_sweep`)."""

    @property
    def runner(self) -> str | None:
        """The runner that measured it (None where its config does not say)."""
        return self.config.get("runner")


class TrialStore(ABC):
    """Sweeps, trials and baselines as the coordinator needs them."""

    @abstractmethod
    def start_sweep(self, name: str, config: dict[str, Any]) -> int:
        """Create a sweep named `name` (its validated config as a JSON-able dict), status
        `running`; return its id. This is the first write of a `syncopate tune` run."""

    @abstractmethod
    def latest_sweep(self, name: str) -> StoredSweep | None:
        """The most recently started sweep named `name`, or None. Writes nothing."""

    @abstractmethod
    def resume_sweep(self, sweep_id: int) -> None:
        """Mark sweep `sweep_id` `running` again (`--resume`)."""

    @abstractmethod
    def stored_keys(
        self, sweep_id: int, workload: Workload, topology: Topology, environment: Environment
    ) -> set[str]:
        """Keys of the candidates with a trial stored (any status, any source) for this workload,
        topology and environment in sweep `sweep_id`: what a resumed sweep does not measure again."""

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
    def sweep_best(
        self, sweep_id: int, workload: Workload, topology: Topology, environment: Environment, *,
        mode: str = DEFAULT_MODE,
    ) -> TrialRecord | None:
        """The fastest `ok` trial in `mode` (:func:`~syncopate.records.rank_key`) of sweep `sweep_id`
        for this workload, topology and environment, whatever its source (a `fixture` sweep's best is
        a fixture trial). What `lookup` serves is another question, answered from `measured` trials
        only."""

    @abstractmethod
    def finish_sweep(self, sweep_id: int, status: str) -> None:
        """Mark the sweep ended with `status`, one of :data:`SWEEP_STATUSES` other than `running`."""

    def close(self) -> None:
        """Release connections. Called once, at the end of the run."""


class ResultsDBStore(TrialStore):
    """:class:`TrialStore` over :class:`syncopate.results_db.ResultsDB`."""

    def __init__(self, db: Any) -> None:
        self._db = db

    @property
    def url(self) -> str:
        """The database as shown in messages (password hidden)."""
        return self._db.url

    @classmethod
    def open(cls, url: str | None) -> ResultsDBStore:
        """Open the results database `url` (None: `SYNCOPATE_DB`, else the per-user default).

        The per-user default, and a SQLite file that does not exist yet in a folder that does, are
        created with the current schema (a sweep writes). Anything else must exist at this
        version's schema revision (checked here, before anything is measured); the error says what
        to run.
        """
        try:
            from syncopate.results_db import ResultsDB
            from syncopate.results_db.urls import locate
        except ImportError as e:
            raise DatabaseError(
                f"cannot open the results database {url or '(default)'}: syncopate.results_db is not "
                f"usable in this installation ({e}): install syncopate with its dependencies"
            ) from None
        location = locate(url)
        path = location.sqlite_path
        new_file = path is not None and not path.exists() and path.parent.is_dir()
        db = ResultsDB.open(url, upgrade=location.is_default or new_file)
        try:
            db.check_writable()
        except BaseException:
            db.close()
            raise
        return cls(db)

    def start_sweep(self, name: str, config: dict[str, Any]) -> int:
        return self._db.start_sweep(name, config)

    def latest_sweep(self, name: str) -> StoredSweep | None:
        info = self._db.latest_sweep(name)
        if info is None:
            return None
        return StoredSweep(
            sweep_id=info.sweep_id, name=info.name, status=info.status, config=dict(info.config)
        )

    def resume_sweep(self, sweep_id: int) -> None:
        self._db.resume_sweep(sweep_id)

    def stored_keys(
        self, sweep_id: int, workload: Workload, topology: Topology, environment: Environment
    ) -> set[str]:
        return set(self._db.measured_keys(workload, topology, environment, sweep_id=sweep_id, source=None))

    def stored_baselines(
        self, sweep_id: int, workload: Workload, topology: Topology, environment: Environment
    ) -> list[BaselineRecord]:
        stored = self._db.baselines(
            workload=workload, topology=topology, environment=environment, sweep_id=sweep_id
        )
        return [b.record for b in stored]

    def record_trial(self, sweep_id: int, trial: TrialRecord) -> None:
        self._db.record_trial(sweep_id, trial)

    def record_baselines(self, sweep_id: int, baselines: Sequence[BaselineRecord]) -> None:
        self._db.record_baselines(sweep_id, baselines)

    def sweep_best(
        self, sweep_id: int, workload: Workload, topology: Topology, environment: Environment, *,
        mode: str = DEFAULT_MODE,
    ) -> TrialRecord | None:
        stored = self._db.sweep_best(sweep_id, workload, topology, environment, mode=mode)
        return stored.record if stored is not None else None

    def finish_sweep(self, sweep_id: int, status: str) -> None:
        self._db.finish_sweep(sweep_id, status)

    def close(self) -> None:
        self._db.close()


def open_store(url: str | None) -> TrialStore:
    """The store behind `url` (None: `SYNCOPATE_DB` or the per-user default); raises
    :class:`~syncopate.errors.SyncopateError` with one line when it cannot be opened."""
    return ResultsDBStore.open(url)
