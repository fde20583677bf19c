"""The repository: :class:`ResultsDB`, the one way in to the results database.

```python
from syncopate.results_db import ResultsDB

with ResultsDB.open("postgresql+psycopg://tuner@db/syncopate") as db:   # or a path, or None
    sweep_id = db.start_sweep("llama_tp2", config_dict)
    done = db.measured_keys(workload, topology, environment, sweep_id=sweep_id)   # resume
    trial_id = db.record_trial(sweep_id, trial_record)       # idempotent: once per identity
    db.record_baseline(sweep_id, baseline_record)       # or record_baselines: all or none
    db.finish_sweep(sweep_id)
    db.best(workload, topology, environment)                 # StoredTrial | None
```

Every method runs in :meth:`ResultsDB.session_scope`, which commits, or rolls back and re-raises a
driver error as :class:`~syncopate.errors.DatabaseError` naming the URL. A database at an older
revision that this code reads as it is (:data:`~syncopate.results_db.schema.READ_COMPATIBLE`) opens
for reading, its missing columns read as None and a backend named by an earlier name as the current
one; a write to it raises SchemaError saying what to run. Writes are
retried on lock
contention ("database is locked", deadlocks) for up to :data:`RETRY_S` seconds. A trial's identity is
(workload, topology, environment, sweep, candidate hash): recording it again keeps the first row
and returns its id. Failed trials are stored like any other.
"""

from __future__ import annotations

import logging
import random
import socket
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime
from os import PathLike
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import select, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from syncopate.errors import ConfigError, DatabaseError, describe
from syncopate.records import MODES, BaselineRecord, CalibrationRecord, Environment, TrialRecord, utcnow
from syncopate.results_db import codec, migrate, queries, sqlite_files, writes
from syncopate.results_db.engine import WRITE_OPTION, is_transient, make_engine
from syncopate.results_db.engine import describe as error_text
from syncopate.results_db.migrate import read_revision
from syncopate.results_db.models import SWEEP_STATUSES, SweepModel
from syncopate.results_db.schema import (
    HEAD,
    REVISIONS,
    VERSION_TABLE,
    check_revision,
    check_sqlite_file,
    has_current_names,
    has_times,
    missing_error,
    no_tables_error,
    unreachable_error,
)
from syncopate.results_db.urls import DbLocation, locate
from syncopate.results_db.values import ServedPick, StoredBaseline, StoredCalibration, StoredTrial, SweepInfo
from syncopate.search_space import Topology, Workload

__all__ = ["RETRY_S", "ResultsDB"]

log = logging.getLogger(__name__)

RETRY_S = 120.0
"""How long a write keeps retrying on lock contention before the error surfaces."""

T = TypeVar("T")


class ResultsDB:
    """An open results database. Make one with :meth:`open`; close it (or use `with`)."""

    def __init__(self, location: DbLocation, engine: Engine, revision: str = HEAD) -> None:
        self.location = location
        self.engine = engine
        """The SQLAlchemy engine (for pandas' `read_sql` and the like); read-only use, please."""
        self.revision = revision
        """The database's schema revision: the head, or an older one read as it is."""
        self._write_engine = engine.execution_options(**{WRITE_OPTION: True})
        self._dims = writes.DimensionIds()

    # ---- opening -------------------------------------------------------------------------------

    @classmethod
    def open(
        cls, db: str | PathLike[str] | None = None, *, upgrade: bool | None = None, read_only: bool = False
    ) -> ResultsDB:
        """Open the database `db` (URL or SQLite path; None: SYNCOPATE_DB, else the per-user default).

        upgrade: True creates or upgrades the schema (as `syncopate db upgrade`); False never does;
        None (the default) does so only for the per-user default database. read_only: for callers
        that only read (`best`, `export`, the dashboard and the report): never upgrades, and leaves a
        SQLite file as it is (its journal mode included), creating nothing beside it, so that a file
        on a read-only mount reads. A database without our tables, or at a newer schema revision or
        an older one this code cannot read, raises SchemaError saying what to run; one at an older
        revision it reads opens, and refuses writes (:meth:`check_writable`).

        A SQLite file is checked, read-only, before anything is written to it: one refused (another
        application's, a newer schema) is left exactly as it was, its journal mode included. Whether
        it may be written is the writer's question (:func:`~syncopate.results_db.sqlite_files.check_writable`).
        """
        location = locate(db)
        if read_only:
            upgrade = False
        elif upgrade is None:
            upgrade = location.is_default
        if location.dialect == "sqlite":
            check_sqlite_file(location, create=upgrade)
            _check_sqlite_before_use(location, upgrade=upgrade)
        engine = make_engine(location, read_only=read_only)
        try:
            if upgrade:
                migrate.upgrade(location, engine)
            revision = _check_schema(location, engine, read_only=read_only)
        except BaseException:
            engine.dispose()
            raise
        return cls(location, engine, revision)

    @property
    def url(self) -> str:
        """The database URL as shown in messages (password hidden)."""
        return self.location.shown()

    @property
    def has_times(self) -> bool:
        """Whether trials and baselines here have `eager_us` and `host_us` (revision 0002 on)."""
        return has_times(self.revision)

    def check_writable(self) -> None:
        """Raise SchemaError, saying what to run, unless the database is at the head revision."""
        check_revision(self.revision, self.location)

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> ResultsDB:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ResultsDB({self.url!r})"

    # ---- sessions ------------------------------------------------------------------------------

    @contextmanager
    def session_scope(self, *, write: bool = True) -> Iterator[Session]:
        """A session that commits at the end, or rolls back and re-raises.

        Driver errors become DatabaseError (`from` the original); any other error (Syncopate's own
        included) passes as it is. `write=True` takes SQLite's write lock when the transaction begins.
        """
        if write:
            self.check_writable()
        session = Session(bind=self._write_engine if write else self.engine, expire_on_commit=False)
        session.info[queries.TIMES_INFO] = self.has_times
        session.info[queries.NAMES_INFO] = has_current_names(self.revision)
        try:
            yield session
            session.commit()
        except SQLAlchemyError as e:
            session.rollback()
            reason = error_text(e)
            advice = sqlite_files.damaged(self.location.sqlite_path, reason)
            raise DatabaseError(f"database {self.url}: {reason}{advice}") from e
        except BaseException:
            session.rollback()
            raise
        else:
            self._dims.committed(session)
        finally:
            session.close()

    def _run(self, work: Callable[[Session], T], *, write: bool = True) -> T:
        """`work(session)` in one session scope, retried on lock contention."""
        deadline = time.monotonic() + RETRY_S
        delay = 0.02
        while True:
            try:
                with self.session_scope(write=write) as session:
                    return work(session)
            except DatabaseError as e:
                if not is_transient(e.__cause__) or time.monotonic() > deadline:
                    raise
                log.debug("%s: %s; retrying in %.2f s", self.url, e, delay)
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 1.0)

    def _read(self, work: Callable[[Session], T]) -> T:
        return self._run(work, write=False)

    # ---- sweeps --------------------------------------------------------------------------------

    def start_sweep(
        self,
        name: str,
        config: dict[str, Any] | None = None,
        *,
        host: str | None = None,
        started_at: datetime | None = None,
    ) -> int:
        """Record the start of a sweep (status `running`); its id.

        host defaults to this machine's name and started_at to now; an import of results measured
        elsewhere gives both.
        """
        if not isinstance(name, str) or not name.strip() or len(name) > 200:
            raise ConfigError(f"sweep name {name!r} must be a non-empty string of at most 200 characters")
        doc = codec.encode(dict(config or {}), "sweep config")
        host = host or socket.gethostname()
        started_at = started_at or utcnow()

        def work(session: Session) -> int:
            row = SweepModel(
                name=name, config=doc, status="running", host=host, started_at=started_at, finished_at=None
            )
            session.add(row)
            session.flush()
            return row.id

        return self._run(work)

    def finish_sweep(
        self, sweep_id: int, status: str = "done", *, finished_at: datetime | None = None
    ) -> None:
        """Mark a sweep finished: `done`, `stopped`, `failed` or `interrupted`, stamping the end time
        (now unless finished_at is given)."""
        if status not in SWEEP_STATUSES or status == "running":
            raise ConfigError(
                f"sweep status {status!r} cannot finish a sweep: accepted are done, stopped, failed, interrupted"
            )
        self._set_sweep(sweep_id, status=status, finished_at=finished_at or utcnow())

    def resume_sweep(self, sweep_id: int) -> SweepInfo:
        """Mark a finished or interrupted sweep `running` again (its end time cleared)."""
        self._set_sweep(sweep_id, status="running", finished_at=None)
        return self.sweep(sweep_id)

    def _set_sweep(self, sweep_id: int, **values: Any) -> None:
        def work(session: Session) -> None:
            SweepModel.find_or_raise_by_id(session, sweep_id)
            session.execute(update(SweepModel).where(SweepModel.id == sweep_id).values(**values))

        self._run(work)

    def sweep(self, sweep_id: int) -> SweepInfo:
        """The sweep `sweep_id` (NotFoundError if there is none)."""
        return self._read(lambda s: queries.sweep_info(SweepModel.find_or_raise_by_id(s, sweep_id)))

    def sweeps(self, *, name: str | None = None, status: str | None = None) -> list[SweepInfo]:
        """Sweeps, oldest first, optionally of one name and status."""

        def work(session: Session) -> list[SweepInfo]:
            stmt = select(SweepModel).order_by(SweepModel.id)
            if name is not None:
                stmt = stmt.where(SweepModel.name == name)
            if status is not None:
                stmt = stmt.where(SweepModel.status == status)
            return [queries.sweep_info(row) for row in session.scalars(stmt)]

        return self._read(work)

    def latest_sweep(self, name: str) -> SweepInfo | None:
        """The most recently started sweep called `name`, or None."""
        found = self.sweeps(name=name)
        return found[-1] if found else None

    # ---- writes --------------------------------------------------------------------------------

    def record_trial(self, sweep_id: int, trial: TrialRecord) -> int:
        """Store one trial of sweep `sweep_id` (any status); its row id (the existing one if stored)."""
        return self.record_trials(sweep_id, [trial])[0]

    def record_trials(self, sweep_id: int, trials: Iterable[TrialRecord]) -> list[int]:
        """Store many trials of sweep `sweep_id` in one transaction; their row ids, in order."""
        batch = list(trials)
        for i, t in enumerate(batch):
            if not isinstance(t, TrialRecord):
                raise ConfigError(f"trial {i} is {describe(t)}, not a TrialRecord")

        def work(session: Session) -> list[int]:
            SweepModel.find_or_raise_by_id(session, sweep_id)
            return writes.insert_trials(session, self._dims, sweep_id, batch)

        return self._run(work)

    def record_baseline(self, sweep_id: int, baseline: BaselineRecord) -> int:
        """Store one baseline of sweep `sweep_id` (kept once per workload, topology, environment, name)."""
        if not isinstance(baseline, BaselineRecord):
            raise ConfigError(f"baseline is {describe(baseline)}, not a BaselineRecord")

        def work(session: Session) -> int:
            SweepModel.find_or_raise_by_id(session, sweep_id)
            return writes.insert_baseline(session, self._dims, sweep_id, baseline)

        return self._run(work)

    def record_baselines(self, sweep_id: int, baselines: Iterable[BaselineRecord]) -> list[int]:
        """Store the baselines of sweep `sweep_id` in one transaction, all or none; their row ids."""
        batch = list(baselines)
        for i, b in enumerate(batch):
            if not isinstance(b, BaselineRecord):
                raise ConfigError(f"baseline {i} is {describe(b)}, not a BaselineRecord")

        def work(session: Session) -> list[int]:
            SweepModel.find_or_raise_by_id(session, sweep_id)
            return [writes.insert_baseline(session, self._dims, sweep_id, b) for b in batch]

        return self._run(work)

    def record_calibration(self, calibration: CalibrationRecord, *, sweep_id: int | None = None) -> int:
        """Store a calibration curve; one with the same kind, topology, environment and key is replaced."""
        if not isinstance(calibration, CalibrationRecord):
            raise ConfigError(f"calibration is {describe(calibration)}, not a CalibrationRecord")

        def work(session: Session) -> int:
            if sweep_id is not None:
                SweepModel.find_or_raise_by_id(session, sweep_id)
            return writes.upsert_calibration(session, self._dims, calibration, sweep_id)

        return self._run(work)

    # ---- reads ---------------------------------------------------------------------------------

    def trial(self, trial_id: int) -> StoredTrial:
        """The trial `trial_id` (NotFoundError if there is none)."""
        return self._read(lambda s: queries.trial(s, trial_id))

    def trials(
        self,
        *,
        workload: Workload | None = None,
        topology: Topology | str | None = None,
        environment: Environment | None = None,
        sweep_id: int | None = None,
        status: str | Iterable[str] | None = None,
        source: str | None = None,
        kind: str | None = None,
        limit: int | None = None,
    ) -> list[StoredTrial]:
        """Stored trials matching every filter given, in the order they were stored."""
        return self._read(
            lambda s: queries.trials(
                s,
                queries.Filters(s, workload=workload, topology=topology, environment=environment, kind=kind),
                sweep_id=sweep_id,
                status=status,
                source=source,
                limit=limit,
            )
        )

    def measured_keys(
        self,
        workload: Workload,
        topology: Topology | str,
        environment: Environment,
        *,
        sweep_id: int | None = None,
        source: str | None = "measured",
    ) -> frozenset[str]:
        """Candidate hashes (:meth:`Candidate.key`) already stored for this workload, topology and
        environment, whatever their status: what a resumed sweep need not measure again.

        sweep_id limits it to one sweep; source (default `measured`; None for any) to one source.
        """
        return self._read(
            lambda s: queries.stored_keys(
                s,
                queries.Filters(s, workload=workload, topology=topology, environment=environment),
                sweep_id=sweep_id,
                source=source,
            )
        )

    def best(
        self, workload: Workload, topology: Topology | str, environment: Environment, *, mode: str = "eager"
    ) -> StoredTrial | None:
        """The fastest `ok` trial of source `measured` in `mode` (see
        :func:`~syncopate.records.rank_key`) for this workload, topology and environment."""
        return self._read(
            lambda s: queries.best(
                s, queries.Filters(s, workload=workload, topology=topology, environment=environment), mode
            )
        )

    def sweep_best(
        self,
        sweep_id: int,
        workload: Workload,
        topology: Topology | str,
        environment: Environment,
        *,
        mode: str = "eager",
    ) -> StoredTrial | None:
        """The fastest `ok` trial in `mode` of sweep `sweep_id` for this workload, topology and
        environment, whatever its source: what that sweep found (a `fixture` sweep's is synthetic).
        Not what lookup serves: that is :meth:`picks`, from `measured` trials only."""
        return self._read(
            lambda s: queries.sweep_best(
                s,
                queries.Filters(s, workload=workload, topology=topology, environment=environment),
                sweep_id,
                mode,
            )
        )

    def picks(
        self,
        *,
        kind: str | None = None,
        topology: Topology | str | None = None,
        environment: Environment | None = None,
        modes: tuple[str, ...] = MODES,
    ) -> list[ServedPick]:
        """What is served in each of `modes` for every stored (workload, topology, environment),
        optionally filtered: the fastest tuned trial, or a guard's where it is faster
        (:func:`~syncopate.records.pick`)."""
        return self._read(
            lambda s: queries.picks(
                s, queries.Filters(s, topology=topology, environment=environment, kind=kind), modes
            )
        )

    def best_configs(
        self,
        *,
        kind: str | None = None,
        topology: Topology | str | None = None,
        environment: Environment | None = None,
        mode: str = "eager",
    ) -> list[StoredTrial]:
        """What is served in `mode` for every stored (workload, topology, environment), optionally
        filtered (see :meth:`picks`)."""
        return self._read(
            lambda s: queries.best_configs(
                s, queries.Filters(s, topology=topology, environment=environment, kind=kind), mode
            )
        )

    def baselines(
        self,
        *,
        workload: Workload | None = None,
        topology: Topology | str | None = None,
        environment: Environment | None = None,
        sweep_id: int | None = None,
        name: str | None = None,
    ) -> list[StoredBaseline]:
        """Stored baselines matching every filter given, in the order they were stored."""
        return self._read(
            lambda s: queries.baselines(
                s,
                queries.Filters(s, workload=workload, topology=topology, environment=environment),
                sweep_id=sweep_id,
                name=name,
            )
        )

    def calibration(
        self, kind: str, topology: Topology | str, environment: Environment, key: str
    ) -> StoredCalibration | None:
        """The calibration of this kind and key on this topology and environment, or None."""
        found = self.calibrations(kind=kind, topology=topology, environment=environment, key=key)
        return found[0] if found else None

    def calibrations(
        self,
        *,
        kind: str | None = None,
        topology: Topology | str | None = None,
        environment: Environment | None = None,
        key: str | None = None,
    ) -> list[StoredCalibration]:
        """Stored calibrations matching every filter given."""
        return self._read(
            lambda s: queries.calibrations(
                s, queries.Filters(s, topology=topology, environment=environment), kind=kind, key=key
            )
        )

    # ---- export / import -----------------------------------------------------------------------

    def export_best(
        self,
        path: str | PathLike[str],
        *,
        kind: str | None = None,
        topology: Topology | str | None = None,
        environment: Environment | None = None,
    ) -> int:
        """Write what is served in each mode to the JSON file `path` atomically; how many entries
        (trials) were written."""
        from syncopate.results_db.transfer import write_export

        return write_export(
            Path(path), self.picks(kind=kind, topology=topology, environment=environment), database=self.url
        )

    def import_best(self, path: str | PathLike[str]) -> int:
        """Store the entries of an export file as trials of a sweep named after the file's content
        (importing the same file again adds nothing); how many entries were read."""
        from syncopate.results_db.transfer import import_export

        return import_export(self, Path(path))


def _check_sqlite_before_use(location: DbLocation, *, upgrade: bool) -> None:
    """What can be known of a SQLite file without opening it for writing: raises, changing
    nothing, where it does not exist (unless `upgrade`), or holds another application's tables or a
    schema this call may not use."""
    path = location.sqlite_path
    if path is None:
        return
    if path.exists():
        state = sqlite_files.read_schema(path, location.subject(), VERSION_TABLE)
        # an empty database that a writer has open may be getting its schema from another process
        # right now: _check_schema waits for that; any other without our tables is refused untouched
        if state.revision is None and not upgrade and (state.names or not sqlite_files.writer_present(path)):
            raise no_tables_error(location)
        if state.revision is not None and (state.revision not in REVISIONS or not upgrade):
            check_revision(state.revision, location, read=not upgrade)
    elif not upgrade:
        raise missing_error(location)


def _check_schema(location: DbLocation, engine: Engine, *, read_only: bool = False) -> str:
    """The database's revision, once checked readable by this code."""
    try:
        with engine.connect() as connection:
            revision = read_revision(connection)
    except SQLAlchemyError as e:
        raise unreachable_error(location, error_text(e), location.dialect) from e
    if revision is None and location.dialect == "sqlite" and not read_only:
        # another process may be creating the schema of a file it has just made: its migration
        # holds the write lock until it commits, so wait for that lock and look again
        try:
            with engine.connect() as connection:
                connection.execution_options(**{WRITE_OPTION: True})
                with connection.begin():
                    revision = read_revision(connection)
        except SQLAlchemyError as e:  # a read-only file: it has no tables either way
            log.debug("no write lock on %s (%s)", location.shown(), error_text(e))
    check_revision(revision, location, read=True)
    return revision
