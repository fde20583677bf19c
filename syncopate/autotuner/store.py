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
        self,
        sweep_id: int,
        workload: Workload,
        topology: Topology,
        environment: Environment,
        *,
        mode: str = DEFAULT_MODE,
    ) -> TrialRecord | None:
        """The fastest `ok` trial in `mode` (:func:`~syncopate.records.rank_key`) of sweep `sweep_id`
        for this workload, topology and environment, whatever its source (a `fixture` sweep's best is
        a fixture trial). What `lookup` serves is another question, answered from `measured` trials
        only."""

    @abstractmethod
    def finish_sweep(self, sweep_id: int, status: str) -> None:
        """Mark the sweep ended with `status`, one of :data:`SWEEP_STATUSES` other than `running`."""

    def prepare_writes(self) -> None:
        """Called once by `syncopate tune` when nothing is left that could refuse the run (Ray
        connected, GPUs counted, gangs formed) and before anything writes, the strategies' own
        Optuna studies included: make the database where it does not exist yet. Reads before it
        find nothing stored; writes do it themselves. Default: nothing to make."""

    def close(self) -> None:
        """Release connections. Called once, at the end of the run."""


class ResultsDBStore(TrialStore):
    """:class:`TrialStore` over :class:`syncopate.results_db.ResultsDB`.

    A SQLite file that does not exist yet is checked when the store opens (its folder exists and
    may be written) but made only by :meth:`prepare_writes` or the first write, so that a run
    refused or failed before then leaves no file.
    """

    def __init__(self, db: Any, *, url: str | None = None, shown: str = "") -> None:
        """`db`: an open ResultsDB; or None for a SQLite file still to be made at `url` (as given to
        :meth:`open`), shown in messages as `shown`."""
        self._db = db
        self._url = url
        self._shown = shown

    @property
    def url(self) -> str:
        """The database as shown in messages (password hidden)."""
        return self._db.url if self._db is not None else self._shown

    @classmethod
    def open(cls, url: str | None) -> ResultsDBStore:
        """Open the results database `url` (None: `SYNCOPATE_DB`, else the per-user default),
        checking everything a sweep needs of it and writing nothing.

        The per-user default, and a SQLite file that does not exist yet in a folder that does, are
        made with the current schema by :meth:`prepare_writes`. Anything else must exist at this
        version's schema revision, and a SQLite file must be writable; the error says what to do.
        """
        try:
            from syncopate.results_db import ResultsDB
            from syncopate.results_db.schema import check_sqlite_file
            from syncopate.results_db.sqlite_files import check_writable
            from syncopate.results_db.urls import locate
        except ImportError as e:
            raise DatabaseError(
                f"cannot open the results database {url or '(default)'}: syncopate.results_db is not "
                f"usable in this installation ({e}): install syncopate with its dependencies"
            ) from None
        location = locate(url)
        path = location.sqlite_path
        if path is not None and not path.exists() and (location.is_default or path.parent.is_dir()):
            check_sqlite_file(location, create=True)
            check_writable(path, location.subject())
            return cls(None, url=url, shown=location.shown())
        if path is not None and path.is_file():
            check_sqlite_file(location)
            check_writable(path, location.subject())  # before anything opens it: a reader may leave files
        db = ResultsDB.open(url, upgrade=location.is_default)
        try:
            db.check_writable()  # an older revision opens for reading; a sweep writes: the upgrade first
        except BaseException:
            db.close()
            raise
        return cls(db)

    def prepare_writes(self) -> None:
        if self._db is None:
            from syncopate.results_db import ResultsDB

            self._db = ResultsDB.open(self._url, upgrade=True)

    def _writer(self) -> Any:
        self.prepare_writes()
        return self._db

    def start_sweep(self, name: str, config: dict[str, Any]) -> int:
        return self._writer().start_sweep(name, config)

    def latest_sweep(self, name: str) -> StoredSweep | None:
        if self._db is None:
            return None
        info = self._db.latest_sweep(name)
        if info is None:
            return None
        return StoredSweep(
            sweep_id=info.sweep_id, name=info.name, status=info.status, config=dict(info.config)
        )

    def resume_sweep(self, sweep_id: int) -> None:
        self._writer().resume_sweep(sweep_id)

    def stored_keys(
        self, sweep_id: int, workload: Workload, topology: Topology, environment: Environment
    ) -> set[str]:
        if self._db is None:
            return set()
        return set(self._db.measured_keys(workload, topology, environment, sweep_id=sweep_id, source=None))

    def stored_baselines(
        self, sweep_id: int, workload: Workload, topology: Topology, environment: Environment
    ) -> list[BaselineRecord]:
        if self._db is None:
            return []
        stored = self._db.baselines(
            workload=workload, topology=topology, environment=environment, sweep_id=sweep_id
        )
        return [b.record for b in stored]

    def record_trial(self, sweep_id: int, trial: TrialRecord) -> None:
        self._writer().record_trial(sweep_id, trial)

    def record_baselines(self, sweep_id: int, baselines: Sequence[BaselineRecord]) -> None:
        self._writer().record_baselines(sweep_id, baselines)

    def sweep_best(
        self,
        sweep_id: int,
        workload: Workload,
        topology: Topology,
        environment: Environment,
        *,
        mode: str = DEFAULT_MODE,
    ) -> TrialRecord | None:
        if self._db is None:
            return None
        stored = self._db.sweep_best(sweep_id, workload, topology, environment, mode=mode)
        return stored.record if stored is not None else None

    def finish_sweep(self, sweep_id: int, status: str) -> None:
        self._writer().finish_sweep(sweep_id, status)

    def close(self) -> None:
        if self._db is not None:
            self._db.close()


def open_store(url: str | None) -> TrialStore:
    """The store behind `url` (None: `SYNCOPATE_DB` or the per-user default); raises
    :class:`~syncopate.errors.SyncopateError` with one line when it cannot be opened."""
    return ResultsDBStore.open(url)
