"""Reads: rows back into records, filtered by workload, topology, environment, sweep, status.

"Best" is one rule everywhere: the `ok` trial of source `measured` with the lowest median (ties:
the lowest id) per (workload, topology, environment); predicted and fixture rows never qualify.
The view `syncopate_best` states the rule in SQL for the dashboard; :func:`best` seeks it through
the `ix_syncopate_trials_best` index.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import Column, Integer, MetaData, Select, Table, select
from sqlalchemy.orm import Session

from syncopate.errors import ConfigError
from syncopate.records import SOURCES, TRIAL_STATUSES, BaselineRecord, CalibrationRecord, Environment, TrialRecord
from syncopate.results_db.models import (
    BaselineModel,
    CalibrationModel,
    EnvironmentModel,
    SweepModel,
    TopologyModel,
    TrialModel,
    WorkloadModel,
)
from syncopate.results_db.schema import BEST_VIEW
from syncopate.results_db.values import StoredBaseline, StoredCalibration, StoredTrial, SweepInfo
from syncopate.search_space import KINDS, Candidate, Shape, Topology, Workload, topology_key

__all__ = [
    "Filters",
    "baselines",
    "best",
    "best_configs",
    "calibrations",
    "stored_keys",
    "sweep_best",
    "sweep_info",
    "trial",
    "trials",
]

_best_view = Table(BEST_VIEW, MetaData(), Column("trial_id", Integer), Column("workload_id", Integer),
                   Column("topology_id", Integer), Column("environment_id", Integer))


def _check(name: str, value: str | Iterable[str] | None, accepted: tuple[str, ...]) -> None:
    values = [] if value is None else [value] if isinstance(value, str) else list(value)
    for v in values:
        if v not in accepted:
            raise ConfigError(f"unknown {name} {v!r}: accepted are {', '.join(accepted)}")


class Filters:
    """Optional filters resolved to row ids once per query (a value that is not stored matches nothing)."""

    def __init__(self, session: Session, *, workload: Workload | None = None, topology: Topology | str | None = None,
                 environment: Environment | None = None, kind: str | None = None) -> None:
        _check("kind", kind, KINDS)
        self.nothing = False
        self.kind = kind
        self.workload_id = self._id(session, WorkloadModel, workload.key() if workload else None)
        key = None if not topology else topology_key(topology) if isinstance(topology, str) else Topology.of(topology).key()
        self.topology_id = self._id(session, TopologyModel, key)
        self.environment_id = self._id(session, EnvironmentModel, environment.key() if environment else None)

    def _id(self, session: Session, model: Any, key: str | None) -> int | None:
        if key is None:
            return None
        row = model.find_by_key(session, key)
        if row is None:
            self.nothing = True
            return None
        return row.id

    def apply(self, stmt: Select, cols: Any) -> Select:
        if self.workload_id is not None:
            stmt = stmt.where(cols.workload_id == self.workload_id)
        if self.topology_id is not None:
            stmt = stmt.where(cols.topology_id == self.topology_id)
        if self.environment_id is not None:
            stmt = stmt.where(cols.environment_id == self.environment_id)
        if self.kind is not None:
            stmt = stmt.where(cols.workload_id.in_(select(WorkloadModel.id).where(WorkloadModel.kind == self.kind)))
        return stmt


class _Dims:
    """Rows of the dimension tables turned into values, each converted once per query."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self._cache: dict[tuple[str, int], Any] = {}

    def _get(self, model: Any, row_id: int, convert: Any) -> Any:
        key = (model.__tablename__, row_id)
        if key not in self._cache:
            self._cache[key] = convert(model.find_or_raise_by_id(self.session, row_id))
        return self._cache[key]

    def workload(self, row_id: int) -> Workload:
        return self._get(WorkloadModel, row_id, lambda r: Workload(
            kind=r.kind, shape=Shape(m=r.m, n=r.n, k=r.k), dtype=r.dtype))

    def topology(self, row_id: int) -> Topology:
        return self._get(TopologyModel, row_id, lambda r: Topology(
            world_size=r.world_size, gpu_model=r.gpu_model, interconnect=r.interconnect, nodes=r.nodes,
            sm_count=r.sm_count, memory_gb=r.memory_gb, link_gbps=r.link_gbps))

    def environment(self, row_id: int) -> Environment:
        return self._get(EnvironmentModel, row_id, lambda r: Environment(
            syncopate=r.syncopate, torch=r.torch, triton=r.triton, cuda=r.cuda, nccl=r.nccl, driver=r.driver,
            gpu_model=r.gpu_model))


def _stored_trial(row: TrialModel, dims: _Dims) -> StoredTrial:
    record = TrialRecord(
        workload=dims.workload(row.workload_id), topology=dims.topology(row.topology_id),
        environment=dims.environment(row.environment_id), candidate=Candidate.from_dict(row.candidate),
        status=row.status, source=row.source, median_us=row.median_us, p20_us=row.p20_us, p80_us=row.p80_us,
        samples_us=tuple(row.samples_us), max_rel_error=row.max_rel_error, error=row.error,
        worker=dict(row.worker), strategy=row.strategy, created_at=row.created_at,
    )
    return StoredTrial(trial_id=row.id, sweep_id=row.sweep_id, record=record)


def sweep_info(row: SweepModel) -> SweepInfo:
    return SweepInfo(
        sweep_id=row.id, name=row.name, config=dict(row.config), status=row.status, host=row.host,
        started_at=row.started_at, finished_at=row.finished_at,
    )


def trial(session: Session, trial_id: int) -> StoredTrial:
    """The trial `trial_id` (NotFoundError if there is none)."""
    return _stored_trial(TrialModel.find_or_raise_by_id(session, trial_id), _Dims(session))


def trials(session: Session, filters: Filters, *, sweep_id: int | None = None,
           status: str | Iterable[str] | None = None, source: str | None = None,
           limit: int | None = None) -> list[StoredTrial]:
    """Stored trials matching every filter given, oldest first."""
    _check("status", status, TRIAL_STATUSES)
    _check("source", source, SOURCES)
    if filters.nothing:
        return []
    stmt = filters.apply(select(TrialModel), TrialModel)
    if sweep_id is not None:
        stmt = stmt.where(TrialModel.sweep_id == sweep_id)
    if status is not None:
        stmt = stmt.where(TrialModel.status.in_([status] if isinstance(status, str) else list(status)))
    if source is not None:
        stmt = stmt.where(TrialModel.source == source)
    stmt = stmt.order_by(TrialModel.id)
    if limit is not None:
        stmt = stmt.limit(limit)
    dims = _Dims(session)
    return [_stored_trial(row, dims) for row in session.scalars(stmt)]


def stored_keys(session: Session, filters: Filters, *, sweep_id: int | None, source: str | None) -> frozenset[str]:
    """Candidate hashes already stored (any status) for the filters' workload, topology, environment."""
    _check("source", source, SOURCES)
    if filters.nothing:
        return frozenset()
    stmt = filters.apply(select(TrialModel.candidate_hash), TrialModel)
    if sweep_id is not None:
        stmt = stmt.where(TrialModel.sweep_id == sweep_id)
    if source is not None:
        stmt = stmt.where(TrialModel.source == source)
    return frozenset(session.scalars(stmt))


def best(session: Session, filters: Filters) -> StoredTrial | None:
    """The best trial of one (workload, topology, environment); None where none is `ok` + `measured`."""
    if filters.nothing:
        return None
    stmt = (
        filters.apply(select(TrialModel), TrialModel)
        .where(TrialModel.source == "measured", TrialModel.status == "ok")
        .order_by(TrialModel.median_us, TrialModel.id)
        .limit(1)
    )
    row = session.scalars(stmt).first()
    return None if row is None else _stored_trial(row, _Dims(session))


def sweep_best(session: Session, filters: Filters, sweep_id: int) -> StoredTrial | None:
    """The fastest `ok` trial of one sweep for the filters' workload, topology and environment, any
    source (ties: the lowest id); None where the sweep has none."""
    if filters.nothing:
        return None
    stmt = (
        filters.apply(select(TrialModel), TrialModel)
        .where(TrialModel.sweep_id == sweep_id, TrialModel.status == "ok")
        .order_by(TrialModel.median_us, TrialModel.id)
        .limit(1)
    )
    row = session.scalars(stmt).first()
    return None if row is None else _stored_trial(row, _Dims(session))


def best_configs(session: Session, filters: Filters) -> list[StoredTrial]:
    """The best trial of every (workload, topology, environment) matching the filters, by workload key."""
    if filters.nothing:
        return []
    ids = select(_best_view.c.trial_id)
    ids = filters.apply(ids, _best_view.c)
    rows = session.scalars(select(TrialModel).where(TrialModel.id.in_(ids)))
    dims = _Dims(session)
    out = [_stored_trial(row, dims) for row in rows]
    return sorted(out, key=lambda t: (t.workload.kind, t.workload.dtype, t.workload.shape.as_tuple(),
                                      t.topology.key(), t.environment.key()))


def baselines(session: Session, filters: Filters, *, sweep_id: int | None = None,
              name: str | None = None) -> list[StoredBaseline]:
    """Stored baselines matching every filter given, oldest first."""
    if filters.nothing:
        return []
    stmt = filters.apply(select(BaselineModel), BaselineModel)
    if sweep_id is not None:
        stmt = stmt.where(BaselineModel.sweep_id == sweep_id)
    if name is not None:
        stmt = stmt.where(BaselineModel.name == name)
    dims = _Dims(session)
    out = []
    for row in session.scalars(stmt.order_by(BaselineModel.id)):
        record = BaselineRecord(
            workload=dims.workload(row.workload_id), topology=dims.topology(row.topology_id),
            environment=dims.environment(row.environment_id), name=row.name, median_us=row.median_us,
            p20_us=row.p20_us, p80_us=row.p80_us, samples_us=tuple(row.samples_us), source=row.source,
            detail=row.detail, created_at=row.created_at,
        )
        out.append(StoredBaseline(baseline_id=row.id, sweep_id=row.sweep_id, record=record))
    return out


def calibrations(session: Session, filters: Filters, *, kind: str | None = None,
                 key: str | None = None) -> list[StoredCalibration]:
    """Stored calibrations matching every filter given, by kind then key."""
    if filters.nothing:
        return []
    stmt = select(CalibrationModel)
    if filters.topology_id is not None:
        stmt = stmt.where(CalibrationModel.topology_id == filters.topology_id)
    if filters.environment_id is not None:
        stmt = stmt.where(CalibrationModel.environment_id == filters.environment_id)
    if kind is not None:
        stmt = stmt.where(CalibrationModel.kind == kind)
    if key is not None:
        stmt = stmt.where(CalibrationModel.key == key)
    dims = _Dims(session)
    out = []
    for row in session.scalars(stmt.order_by(CalibrationModel.kind, CalibrationModel.key, CalibrationModel.id)):
        record = CalibrationRecord(
            kind=row.kind, topology=dims.topology(row.topology_id), environment=dims.environment(row.environment_id),
            key=row.key, payload=dict(row.payload), source=row.source, created_at=row.created_at,
        )
        out.append(StoredCalibration(calibration_id=row.id, sweep_id=row.sweep_id, record=record))
    return out
