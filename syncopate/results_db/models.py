"""SQLAlchemy 2 models of the results database (tables prefixed `syncopate_`).

| table | one row per | unique key |
|---|---|---|
| `syncopate_environments` | environment fingerprint | `key` (:meth:`Environment.key`) |
| `syncopate_topologies` | topology | `key` (`H200x2-nvlink`) |
| `syncopate_workloads` | (kind, M, N, K, dtype), or a MoE workload's params | `key` (`ag_gemm/8192x4096x8192/bf16`) |
| `syncopate_sweeps` | tuning run | id |
| `syncopate_trials` | candidate measured in a sweep | (workload, topology, environment, sweep, candidate_hash) |
| `syncopate_baselines` | reference time in a sweep | (workload, topology, environment, sweep, name) |
| `syncopate_calibrations` | cost-model curve | (kind, topology, environment, key) |

The view `syncopate_best` (made by the migrations) lists the fastest `ok` + `measured` trial per
(workload, topology, environment) by device time.

Trials and baselines carry `eager_us` and `host_us` from revision 0002 on (:data:`TIMES`): they are
mapped in a deferred group, so that a database at revision 0001, read as it is, is queried without
them (:mod:`.queries` loads them where the columns exist). Workloads carry `params` from revision
0005 on, the parameters of a MoE workload (NULL for the dense kinds), deferred the same way: it is
read for rows of a MoE kind only, which a database before 0005 does not hold (:mod:`.kinds`).
Each model has `find_by_*` helpers returning None and `find_or_raise_by_*` helpers raising
:class:`~syncopate.errors.NotFoundError` with the id.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar

from sqlalchemy import (
    CheckConstraint,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    select,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from syncopate.errors import NotFoundError
from syncopate.records import SOURCES, TRIAL_STATUSES, utcnow
from syncopate.results_db.types import ExactFloat, JSONDoc, UTCDateTime

__all__ = [
    "MOE_PARAMS",
    "SWEEP_STATUSES",
    "TIMES",
    "Base",
    "BaselineModel",
    "CalibrationModel",
    "EnvironmentModel",
    "SweepModel",
    "TopologyModel",
    "TrialModel",
    "WorkloadModel",
]

MOE_PARAMS = "moe_params"
"""The deferred group of the column added by revision 0005 (`params` of workloads)."""

TIMES = "times"
"""The deferred group of the columns added by revision 0002 (`eager_us`, `host_us`)."""

SWEEP_STATUSES: tuple[str, ...] = ("running", "done", "stopped", "failed", "interrupted")
"""A sweep is `running` from :meth:`ResultsDB.start_sweep` until it is finished with one of the others:
`done` (every planned trial stored), `stopped` (its time budget ran out), `failed`, `interrupted`."""

_NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s",
    "pk": "pk_%(table_name)s",
}


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=_NAMING)


class _Finders:
    """`find_by_id` / `find_or_raise_by_id` for every model."""

    _noun: ClassVar[str] = "row"

    @classmethod
    def find_by_id(cls, session: Session, row_id: int) -> Any:
        return session.get(cls, row_id)

    @classmethod
    def find_or_raise_by_id(cls, session: Session, row_id: int) -> Any:
        row = session.get(cls, row_id)
        if row is None:
            raise NotFoundError(f"{cls._noun} {row_id} does not exist in this database")
        return row


class _Keyed(_Finders):
    """`find_by_key` / `find_or_raise_by_key` for the models with a natural key."""

    @classmethod
    def find_by_key(cls, session: Session, key: str) -> Any:
        return session.scalars(select(cls).where(cls.key == key)).one_or_none()

    @classmethod
    def find_or_raise_by_key(cls, session: Session, key: str) -> Any:
        row = cls.find_by_key(session, key)
        if row is None:
            raise NotFoundError(f"{cls._noun} {key!r} does not exist in this database")
        return row


class EnvironmentModel(_Keyed, Base):
    __tablename__ = "syncopate_environments"
    _noun: ClassVar[str] = "environment"

    id: Mapped[int] = mapped_column(primary_key=True)
    key: Mapped[str] = mapped_column(String(32), unique=True)
    syncopate: Mapped[str] = mapped_column(String(64))
    torch: Mapped[str] = mapped_column(String(64))
    triton: Mapped[str] = mapped_column(String(64))
    cuda: Mapped[str] = mapped_column(String(64))
    nccl: Mapped[str] = mapped_column(String(64))
    driver: Mapped[str] = mapped_column(String(64))
    gpu_model: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class TopologyModel(_Keyed, Base):
    __tablename__ = "syncopate_topologies"
    _noun: ClassVar[str] = "topology"

    id: Mapped[int] = mapped_column(primary_key=True)
    key: Mapped[str] = mapped_column(String(64), unique=True)
    world_size: Mapped[int] = mapped_column(Integer)
    gpu_model: Mapped[str] = mapped_column(String(64))
    interconnect: Mapped[str] = mapped_column(String(16))
    nodes: Mapped[int] = mapped_column(Integer)
    sm_count: Mapped[int] = mapped_column(Integer)
    memory_gb: Mapped[float] = mapped_column(ExactFloat)
    link_gbps: Mapped[float] = mapped_column(ExactFloat)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class WorkloadModel(_Keyed, Base):
    __tablename__ = "syncopate_workloads"
    __table_args__ = (Index(None, "kind", "dtype"),)
    _noun: ClassVar[str] = "workload"

    id: Mapped[int] = mapped_column(primary_key=True)
    key: Mapped[str] = mapped_column(String(128), unique=True)
    kind: Mapped[str] = mapped_column(String(32))
    m: Mapped[int] = mapped_column(Integer)
    n: Mapped[int] = mapped_column(Integer)
    k: Mapped[int] = mapped_column(Integer)
    dtype: Mapped[str] = mapped_column(String(16))
    params: Mapped[dict[str, Any] | None] = mapped_column(
        JSONDoc, nullable=True, deferred=True, deferred_group=MOE_PARAMS
    )
    """A MoE workload's parameters (kind, tokens, hidden, ffn, experts, top_k, routing, dtype); NULL
    for the dense kinds."""


class SweepModel(_Finders, Base):
    __tablename__ = "syncopate_sweeps"
    __table_args__ = (CheckConstraint(_in("status", SWEEP_STATUSES), name="status"),)
    _noun: ClassVar[str] = "sweep"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200), index=True)
    config: Mapped[dict[str, Any]] = mapped_column(JSONDoc)
    status: Mapped[str] = mapped_column(String(16))
    host: Mapped[str] = mapped_column(String(255))
    started_at: Mapped[datetime] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class TrialModel(_Finders, Base):
    __tablename__ = "syncopate_trials"
    __table_args__ = (
        UniqueConstraint(
            "workload_id",
            "topology_id",
            "environment_id",
            "sweep_id",
            "candidate_hash",
            name="uq_syncopate_trials_identity",
        ),
        # The exact and nearest-shape rungs of lookup: one index seek to the fastest ok measured row.
        Index(
            "ix_syncopate_trials_best",
            "workload_id",
            "topology_id",
            "environment_id",
            "source",
            "status",
            "median_us",
        ),
        # The other-environment rung.
        Index("ix_syncopate_trials_other_env", "workload_id", "topology_id", "source", "status", "median_us"),
        # The same rungs in mode eager (revision 0002).
        Index(
            "ix_syncopate_trials_best_eager",
            "workload_id",
            "topology_id",
            "environment_id",
            "source",
            "status",
            "eager_us",
        ),
        Index(None, "sweep_id"),
        CheckConstraint(_in("status", TRIAL_STATUSES), name="status"),
        CheckConstraint(_in("source", SOURCES), name="source"),
    )
    _noun: ClassVar[str] = "trial"

    id: Mapped[int] = mapped_column(primary_key=True)
    sweep_id: Mapped[int] = mapped_column(ForeignKey("syncopate_sweeps.id", ondelete="CASCADE"))
    workload_id: Mapped[int] = mapped_column(ForeignKey("syncopate_workloads.id"))
    topology_id: Mapped[int] = mapped_column(ForeignKey("syncopate_topologies.id"))
    environment_id: Mapped[int] = mapped_column(ForeignKey("syncopate_environments.id"))
    candidate_hash: Mapped[str] = mapped_column(String(32))
    candidate: Mapped[dict[str, Any]] = mapped_column(JSONDoc)
    status: Mapped[str] = mapped_column(String(16))
    source: Mapped[str] = mapped_column(String(16))
    median_us: Mapped[float | None] = mapped_column(ExactFloat)
    p20_us: Mapped[float | None] = mapped_column(ExactFloat)
    p80_us: Mapped[float | None] = mapped_column(ExactFloat)
    samples_us: Mapped[list[float]] = mapped_column(JSONDoc)
    eager_us: Mapped[float | None] = mapped_column(ExactFloat, deferred=True, deferred_group=TIMES)
    host_us: Mapped[float | None] = mapped_column(ExactFloat, deferred=True, deferred_group=TIMES)
    max_rel_error: Mapped[float | None] = mapped_column(ExactFloat)
    error: Mapped[str] = mapped_column(Text)
    worker: Mapped[dict[str, Any]] = mapped_column(JSONDoc)
    strategy: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class BaselineModel(_Finders, Base):
    __tablename__ = "syncopate_baselines"
    __table_args__ = (
        UniqueConstraint(
            "workload_id",
            "topology_id",
            "environment_id",
            "sweep_id",
            "name",
            name="uq_syncopate_baselines_identity",
        ),
        Index(None, "sweep_id"),
        CheckConstraint(_in("source", SOURCES), name="source"),
    )
    _noun: ClassVar[str] = "baseline"

    id: Mapped[int] = mapped_column(primary_key=True)
    sweep_id: Mapped[int] = mapped_column(ForeignKey("syncopate_sweeps.id", ondelete="CASCADE"))
    workload_id: Mapped[int] = mapped_column(ForeignKey("syncopate_workloads.id"))
    topology_id: Mapped[int] = mapped_column(ForeignKey("syncopate_topologies.id"))
    environment_id: Mapped[int] = mapped_column(ForeignKey("syncopate_environments.id"))
    name: Mapped[str] = mapped_column(String(64))
    source: Mapped[str] = mapped_column(String(16))
    median_us: Mapped[float] = mapped_column(ExactFloat)
    p20_us: Mapped[float | None] = mapped_column(ExactFloat)
    p80_us: Mapped[float | None] = mapped_column(ExactFloat)
    samples_us: Mapped[list[float]] = mapped_column(JSONDoc)
    eager_us: Mapped[float | None] = mapped_column(ExactFloat, deferred=True, deferred_group=TIMES)
    host_us: Mapped[float | None] = mapped_column(ExactFloat, deferred=True, deferred_group=TIMES)
    detail: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class CalibrationModel(_Finders, Base):
    __tablename__ = "syncopate_calibrations"
    __table_args__ = (
        UniqueConstraint(
            "kind", "topology_id", "environment_id", "key", name="uq_syncopate_calibrations_identity"
        ),
        CheckConstraint(_in("source", SOURCES), name="source"),
    )
    _noun: ClassVar[str] = "calibration"

    id: Mapped[int] = mapped_column(primary_key=True)
    kind: Mapped[str] = mapped_column(String(64))
    topology_id: Mapped[int] = mapped_column(ForeignKey("syncopate_topologies.id"))
    environment_id: Mapped[int] = mapped_column(ForeignKey("syncopate_environments.id"))
    key: Mapped[str] = mapped_column(String(200))
    payload: Mapped[dict[str, Any]] = mapped_column(JSONDoc)
    source: Mapped[str] = mapped_column(String(16))
    sweep_id: Mapped[int | None] = mapped_column(ForeignKey("syncopate_sweeps.id", ondelete="SET NULL"))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
