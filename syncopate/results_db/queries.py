"""Reads: rows back into records, filtered by workload, topology, environment, sweep, status.

"Best" is one rule everywhere, in a mode (:data:`~syncopate.records.MODES`): among the `ok` trials
of source `measured` of one (workload, topology, environment), the fastest by
:func:`~syncopate.records.rank_key` (device time in mode `graph`; eager time in mode `eager`, device
time where no trial has an eager figure; ties: the lowest id); predicted and fixture rows never
qualify. What is *served* (:func:`picks`, hence `syncopate best` and the export) follows
:func:`~syncopate.records.pick`: the fastest tuned trial, unless the untuned default's or the unfused
template's trial is faster in the mode. The view `syncopate_best` states the device-time rule in
SQL for the dashboard; :func:`best` seeks it through the `ix_syncopate_trials_best` index (and
`ix_syncopate_trials_best_eager` in mode eager).

A database read at an older revision (:data:`~syncopate.results_db.schema.READ_COMPATIBLE`) may lack
the `eager_us` / `host_us` columns: the session says so (:data:`TIMES_INFO`) and they read as None.
Its rows may name a backend by an earlier name: candidates and calibrations read under the current
one (:meth:`~syncopate.search_space.Candidate.from_stored`,
:func:`~syncopate.results_db.stored_names.stored_calibration`), and a trial's key is that of the
candidate so read (the session says whether the stored hashes are: :data:`NAMES_INFO`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from sqlalchemy import Select, literal, select
from sqlalchemy.orm import Session, undefer_group

from syncopate.errors import ConfigError
from syncopate.records import (
    MODES,
    SOURCES,
    TRIAL_STATUSES,
    BaselineRecord,
    CalibrationRecord,
    Environment,
    TrialRecord,
    check_mode,
    pick,
    rank_key,
    replays_in_graph,
)
from syncopate.results_db.kinds import is_moe, stored_candidate, stored_workload
from syncopate.results_db.models import (
    TIMES,
    BaselineModel,
    CalibrationModel,
    EnvironmentModel,
    SweepModel,
    TopologyModel,
    TrialModel,
    WorkloadModel,
)
from syncopate.results_db.stored_names import stored_calibration, stored_calibration_keys
from syncopate.results_db.values import ServedPick, StoredBaseline, StoredCalibration, StoredTrial, SweepInfo
from syncopate.search_space import (
    KINDS,
    MOE_KINDS,
    RENAMED_BACKENDS,
    Candidate,
    MoeWorkload,
    Topology,
    Workload,
    guard_candidates,
    topology_key,
)

__all__ = [
    "NAMES_INFO",
    "TIMES_INFO",
    "Filters",
    "baselines",
    "best",
    "best_configs",
    "calibrations",
    "guard_keys",
    "picks",
    "stored_keys",
    "sweep_best",
    "sweep_info",
    "trial",
    "trials",
]

TIMES_INFO = "syncopate_times"
"""`session.info` key: False where the database predates the `eager_us` / `host_us` columns."""


NAMES_INFO = "syncopate_names"
"""`session.info` key: False where the database's rows may name a backend by an earlier name
(before :data:`~syncopate.results_db.schema.NAMES_REVISION`), their candidate hashes included."""


def _has_times(session: Session) -> bool:
    return bool(session.info.get(TIMES_INFO, True))


def _renamed(session: Session) -> bool:
    """Whether the session's rows were stored before the backend rename (:data:`NAMES_INFO`)."""
    return not session.info.get(NAMES_INFO, True)


def _current_key(candidate_hash: str, doc: Any) -> str:
    """The key of a trial's candidate, stored before the backend rename, under the current backend
    names: a row stored under an earlier name holds the key of that name's document."""
    if not isinstance(doc, dict) or doc.get("backend") not in RENAMED_BACKENDS:
        return candidate_hash
    try:
        return Candidate.from_stored(doc, renamed=True).key()
    except ConfigError:  # a document this version cannot read keeps its stored key
        return candidate_hash


def _with_times(stmt: Select, session: Session) -> Select:
    """`stmt` over a model, loading its eager and host times where the database has them."""
    return stmt.options(undefer_group(TIMES)) if _has_times(session) else stmt


def _times_of(row: Any) -> tuple[float | None, float | None]:
    """(eager_us, host_us) of a loaded row; None for a column not loaded (an older database)."""
    loaded = row.__dict__
    return loaded.get("eager_us"), loaded.get("host_us")


def _order(session: Session, mode: str) -> tuple:
    """ORDER BY of :func:`~syncopate.records.rank_key` in `mode`, ties by id."""
    if mode == "eager" and _has_times(session):
        return (TrialModel.eager_us.is_(None), TrialModel.eager_us, TrialModel.median_us, TrialModel.id)
    return (TrialModel.median_us, TrialModel.id)


def guard_keys(workload: Workload, topology: Topology) -> dict[str, str]:
    """Candidate key of each guard (:func:`~syncopate.search_space.guard_candidates`) by name."""
    return {name: c.key() for name, c in guard_candidates(workload, topology).items()}


def _check(name: str, value: str | Iterable[str] | None, accepted: tuple[str, ...]) -> None:
    values = [] if value is None else [value] if isinstance(value, str) else list(value)
    for v in values:
        if v not in accepted:
            raise ConfigError(f"unknown {name} {v!r}: accepted are {', '.join(accepted)}")


class Filters:
    """Optional filters resolved to row ids once per query (a value that is not stored matches nothing)."""

    def __init__(
        self,
        session: Session,
        *,
        workload: Workload | None = None,
        topology: Topology | str | None = None,
        environment: Environment | None = None,
        kind: str | None = None,
    ) -> None:
        _check("kind", kind, KINDS + MOE_KINDS)
        self.nothing = False
        self.kind = kind
        self.workload_id = self._id(session, WorkloadModel, workload.key() if workload else None)
        key = (
            None
            if not topology
            else topology_key(topology)
            if isinstance(topology, str)
            else Topology.of(topology).key()
        )
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
            stmt = stmt.where(
                cols.workload_id.in_(select(WorkloadModel.id).where(WorkloadModel.kind == self.kind))
            )
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

    def workload(self, row_id: int) -> Workload | MoeWorkload:
        # `params` is read for a MoE row only: a database before revision 0005 has neither
        return self._get(
            WorkloadModel,
            row_id,
            lambda r: stored_workload(r.kind, r.m, r.n, r.k, r.dtype, r.params if is_moe(r.kind) else None),
        )

    def topology(self, row_id: int) -> Topology:
        return self._get(
            TopologyModel,
            row_id,
            lambda r: Topology(
                world_size=r.world_size,
                gpu_model=r.gpu_model,
                interconnect=r.interconnect,
                nodes=r.nodes,
                sm_count=r.sm_count,
                memory_gb=r.memory_gb,
                link_gbps=r.link_gbps,
            ),
        )

    def environment(self, row_id: int) -> Environment:
        return self._get(
            EnvironmentModel,
            row_id,
            lambda r: Environment(
                syncopate=r.syncopate,
                torch=r.torch,
                triton=r.triton,
                cuda=r.cuda,
                nccl=r.nccl,
                driver=r.driver,
                gpu_model=r.gpu_model,
            ),
        )


def _dims_of(workload: Workload | MoeWorkload) -> tuple[int, int, int]:
    """(M, N, K) a workload sorts by: its shape, or a MoE workload's GEMM-equivalent dims."""
    return workload.gemm_dims() if isinstance(workload, MoeWorkload) else workload.shape.as_tuple()


def _stored_trial(row: TrialModel, dims: _Dims) -> StoredTrial:
    eager, host = _times_of(row)
    workload = dims.workload(row.workload_id)
    record = TrialRecord(
        workload=workload,
        topology=dims.topology(row.topology_id),
        environment=dims.environment(row.environment_id),
        candidate=stored_candidate(workload.kind, row.candidate, renamed=_renamed(dims.session)),
        status=row.status,
        source=row.source,
        median_us=row.median_us,
        p20_us=row.p20_us,
        p80_us=row.p80_us,
        samples_us=tuple(row.samples_us),
        eager_us=eager,
        host_us=host,
        max_rel_error=row.max_rel_error,
        error=row.error,
        worker=dict(row.worker),
        strategy=row.strategy,
        created_at=row.created_at,
    )
    return StoredTrial(trial_id=row.id, sweep_id=row.sweep_id, record=record)


def sweep_info(row: SweepModel) -> SweepInfo:
    return SweepInfo(
        sweep_id=row.id,
        name=row.name,
        config=dict(row.config),
        status=row.status,
        host=row.host,
        started_at=row.started_at,
        finished_at=row.finished_at,
    )


def trial(session: Session, trial_id: int) -> StoredTrial:
    """The trial `trial_id` (NotFoundError if there is none)."""
    row = session.scalars(_with_times(select(TrialModel).where(TrialModel.id == trial_id), session)).first()
    if row is None:
        TrialModel.find_or_raise_by_id(session, trial_id)
    return _stored_trial(row, _Dims(session))


def trials(
    session: Session,
    filters: Filters,
    *,
    sweep_id: int | None = None,
    status: str | Iterable[str] | None = None,
    source: str | None = None,
    limit: int | None = None,
) -> list[StoredTrial]:
    """Stored trials matching every filter given, oldest first."""
    _check("status", status, TRIAL_STATUSES)
    _check("source", source, SOURCES)
    if filters.nothing:
        return []
    stmt = _with_times(filters.apply(select(TrialModel), TrialModel), session)
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


def stored_keys(
    session: Session, filters: Filters, *, sweep_id: int | None, source: str | None
) -> frozenset[str]:
    """Candidate hashes already stored (any status) for the filters' workload, topology, environment."""
    _check("source", source, SOURCES)
    if filters.nothing:
        return frozenset()
    stmt = filters.apply(select(TrialModel.candidate_hash), TrialModel)
    if sweep_id is not None:
        stmt = stmt.where(TrialModel.sweep_id == sweep_id)
    if source is not None:
        stmt = stmt.where(TrialModel.source == source)
    if not _renamed(session):
        return frozenset(session.scalars(stmt))
    return frozenset(
        _current_key(h, doc) for h, doc in session.execute(stmt.add_columns(TrialModel.candidate))
    )


def best(session: Session, filters: Filters, mode: str = "eager") -> StoredTrial | None:
    """The fastest trial in `mode` of one (workload, topology, environment); None where none is
    `ok` + `measured`."""
    check_mode(mode)
    if filters.nothing:
        return None
    stmt = (
        _with_times(filters.apply(select(TrialModel), TrialModel), session)
        .where(TrialModel.source == "measured", TrialModel.status == "ok")
        .order_by(*_order(session, mode))
        .limit(1)
    )
    row = session.scalars(stmt).first()
    return None if row is None else _stored_trial(row, _Dims(session))


def sweep_best(session: Session, filters: Filters, sweep_id: int, mode: str = "eager") -> StoredTrial | None:
    """The fastest `ok` trial in `mode` of one sweep for the filters' workload, topology and
    environment, any source (ties: the lowest id); None where the sweep has none."""
    check_mode(mode)
    if filters.nothing:
        return None
    stmt = (
        _with_times(filters.apply(select(TrialModel), TrialModel), session)
        .where(TrialModel.sweep_id == sweep_id, TrialModel.status == "ok")
        .order_by(*_order(session, mode))
        .limit(1)
    )
    row = session.scalars(stmt).first()
    return None if row is None else _stored_trial(row, _Dims(session))


class _Light(NamedTuple):
    """An ok measured trial as :func:`picks` ranks it, with its candidate's document only."""

    id: int
    workload_id: int
    topology_id: int
    environment_id: int
    candidate_hash: str
    median_us: float
    eager_us: float | None
    candidate: Any


def _ranked(mode: str):
    """The sort key of a `_Light` in `mode`, fastest first (ties: the lowest id)."""
    return lambda r: (rank_key(mode, r.median_us, r.eager_us), r.id)


def _fastest(rows: list[_Light], mode: str) -> _Light | None:
    return min(rows, key=_ranked(mode), default=None)


def _fastest_served(rows: list[_Light], mode: str, kind: str, renamed: bool) -> _Light | None:
    """The fastest of `rows` in `mode` that mode can serve: in `graph`, the fastest whose call replays
    from a CUDA graph (`Candidate.replays_in_graph`)."""
    if mode != "graph":
        return _fastest(rows, mode)
    for row in sorted(rows, key=_ranked(mode)):
        if replays_in_graph(stored_candidate(kind, row.candidate, renamed=renamed)):
            return row
    return None


def picks(session: Session, filters: Filters, modes: Sequence[str] = MODES) -> list[ServedPick]:
    """What is served in each of `modes` for every (workload, topology, environment) matching the
    filters (:func:`~syncopate.records.pick` over its `ok` measured trials), by workload key, then
    topology, environment and mode."""
    for mode in modes:
        check_mode(mode)
    if filters.nothing:
        return []
    t = TrialModel.__table__
    eager = t.c.eager_us if _has_times(session) else literal(None).label("eager_us")
    stmt = filters.apply(
        select(
            t.c.id,
            t.c.workload_id,
            t.c.topology_id,
            t.c.environment_id,
            t.c.candidate_hash,
            t.c.median_us,
            eager,
            t.c.candidate,
        ).where(t.c.source == "measured", t.c.status == "ok"),
        t.c,
    )
    groups: dict[tuple[int, int, int], list[_Light]] = {}
    for row in session.execute(stmt):
        light = _Light(*row)
        groups.setdefault((light.workload_id, light.topology_id, light.environment_id), []).append(light)
    dims = _Dims(session)
    renamed = _renamed(session)
    chosen: list[tuple[tuple[int, int, int], str, Any]] = []
    for group, rows in groups.items():
        workload = dims.workload(group[0])
        names = {key: name for name, key in guard_keys(workload, dims.topology(group[1])).items()}
        tuned = [r for r in rows if r.candidate_hash not in names]
        guard_rows: dict[str, list[_Light]] = {}
        for r in rows:
            if r.candidate_hash in names:
                guard_rows.setdefault(names[r.candidate_hash], []).append(r)
        for mode in modes:
            served = pick(
                mode,
                _fastest_served(tuned, mode, workload.kind, renamed),
                {name: _fastest(found, mode) for name, found in guard_rows.items()},
            )
            if served is not None:
                chosen.append((group, mode, served))
    ids = {served.chosen.id for _, _, served in chosen}
    rows_by_id: dict[int, StoredTrial] = {}
    for start in range(0, len(ids), 400):
        part = sorted(ids)[start : start + 400]
        stmt = _with_times(select(TrialModel).where(TrialModel.id.in_(part)), session)
        rows_by_id.update({row.id: _stored_trial(row, dims) for row in session.scalars(stmt)})
    out = [
        ServedPick(
            trial=rows_by_id[served.chosen.id], mode=mode, objective=served.objective, guard=served.guard
        )
        for _, mode, served in chosen
    ]
    return sorted(
        out,
        key=lambda p: (
            p.trial.workload.kind,
            p.trial.workload.dtype,
            _dims_of(p.trial.workload),
            p.trial.workload.key(),
            p.trial.topology.key(),
            p.trial.environment.key(),
            MODES.index(p.mode),
        ),
    )


def best_configs(session: Session, filters: Filters, mode: str = "eager") -> list[StoredTrial]:
    """What is served in `mode` for every (workload, topology, environment) matching the filters
    (see :func:`picks`), by workload key."""
    return [p.trial for p in picks(session, filters, (mode,))]


def baselines(
    session: Session, filters: Filters, *, sweep_id: int | None = None, name: str | None = None
) -> list[StoredBaseline]:
    """Stored baselines matching every filter given, oldest first."""
    if filters.nothing:
        return []
    stmt = _with_times(filters.apply(select(BaselineModel), BaselineModel), session)
    if sweep_id is not None:
        stmt = stmt.where(BaselineModel.sweep_id == sweep_id)
    if name is not None:
        stmt = stmt.where(BaselineModel.name == name)
    dims = _Dims(session)
    out = []
    for row in session.scalars(stmt.order_by(BaselineModel.id)):
        eager, host = _times_of(row)
        record = BaselineRecord(
            workload=dims.workload(row.workload_id),
            topology=dims.topology(row.topology_id),
            environment=dims.environment(row.environment_id),
            name=row.name,
            median_us=row.median_us,
            p20_us=row.p20_us,
            p80_us=row.p80_us,
            samples_us=tuple(row.samples_us),
            eager_us=eager,
            host_us=host,
            source=row.source,
            detail=row.detail,
            created_at=row.created_at,
        )
        out.append(StoredBaseline(baseline_id=row.id, sweep_id=row.sweep_id, record=record))
    return out


def calibrations(
    session: Session, filters: Filters, *, kind: str | None = None, key: str | None = None
) -> list[StoredCalibration]:
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
        stmt = stmt.where(CalibrationModel.key.in_(stored_calibration_keys(key, renamed=_renamed(session))))
    dims = _Dims(session)
    out = []
    for row in session.scalars(stmt):
        name, payload = stored_calibration(row.kind, row.key, dict(row.payload), renamed=_renamed(session))
        if key is not None and name != key:
            continue
        record = CalibrationRecord(
            kind=row.kind,
            topology=dims.topology(row.topology_id),
            environment=dims.environment(row.environment_id),
            key=name,
            payload=payload,
            source=row.source,
            created_at=row.created_at,
        )
        out.append(StoredCalibration(calibration_id=row.id, sweep_id=row.sweep_id, record=record))
    return sorted(out, key=lambda c: (c.record.kind, c.record.key, c.calibration_id))
