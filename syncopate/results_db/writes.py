"""Idempotent inserts: INSERT … ON CONFLICT on the natural keys, on SQLite and PostgreSQL alike.

Dimension rows (environments, topologies, workloads) are got-or-created by key; trials and
baselines are inserted with ON CONFLICT DO NOTHING on their identity, so recording the same thing
twice, from one process or from many at once, keeps one row (the first); calibrations are upserted
(the latest measurement replaces the payload). Every function takes an open session and leaves the
commit to :meth:`ResultsDB.session_scope`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Table, select, tuple_
from sqlalchemy.orm import Session

from syncopate.records import BaselineRecord, CalibrationRecord, Environment, TrialRecord, utcnow
from syncopate.results_db import codec
from syncopate.results_db.kinds import workload_values
from syncopate.results_db.models import (
    BaselineModel,
    CalibrationModel,
    EnvironmentModel,
    TopologyModel,
    TrialModel,
    WorkloadModel,
)
from syncopate.search_space import MoeWorkload, Topology, Workload

__all__ = ["DimensionIds", "insert_baseline", "insert_trials", "upsert_calibration"]

_CHUNK = 400  # rows per IN (...) list when reading back ids


def _insert(session: Session, table: Table) -> Any:
    if session.get_bind().dialect.name == "sqlite":
        from sqlalchemy.dialects.sqlite import insert
    else:
        from sqlalchemy.dialects.postgresql import insert
    return insert(table)


class DimensionIds:
    """Ids of environment, topology and workload rows by key, got or created.

    Ids a session finds are kept in that session until :meth:`committed` is called with it after
    its commit; from then on every session reuses them (dimension rows are never deleted).
    """

    _PENDING = "syncopate_dimension_ids"

    def __init__(self) -> None:
        self._committed: dict[tuple[str, str], int] = {}

    def committed(self, session: Session) -> None:
        """`session` has committed: the ids it found are safe to reuse."""
        self._committed.update(session.info.pop(self._PENDING, {}))

    def _get_or_create(self, session: Session, model: Any, key: str, values: dict[str, Any]) -> int:
        cache_key = (model.__tablename__, key)
        pending = session.info.setdefault(self._PENDING, {})
        found = self._committed.get(cache_key) or pending.get(cache_key)
        if found is not None:
            return found
        table = model.__table__
        session.execute(
            _insert(session, table).values(key=key, **values).on_conflict_do_nothing(index_elements=["key"])
        )
        row_id = session.scalar(select(table.c.id).where(table.c.key == key))
        pending[cache_key] = row_id
        return row_id

    def environment(self, session: Session, env: Environment) -> int:
        return self._get_or_create(
            session, EnvironmentModel, env.key(), {**env.to_dict(), "created_at": utcnow()}
        )

    def topology(self, session: Session, topo: Topology) -> int:
        values = {
            "world_size": topo.world_size,
            "gpu_model": topo.gpu_model,
            "interconnect": topo.interconnect,
            "nodes": topo.nodes,
            "sm_count": topo.sm_count,
            "memory_gb": topo.memory_gb,
            "link_gbps": topo.link_gbps,
            "created_at": utcnow(),
        }
        return self._get_or_create(session, TopologyModel, topo.key(), values)

    def workload(self, session: Session, workload: Workload | MoeWorkload) -> int:
        """A dense workload's row, or a MoE workload's with its parameters (:mod:`.kinds`)."""
        return self._get_or_create(session, WorkloadModel, workload.key(), workload_values(workload))

    def of(self, session: Session, record: Any) -> tuple[int, int, int]:
        """(workload_id, topology_id, environment_id) of a trial or baseline record."""
        return (
            self.workload(session, record.workload),
            self.topology(session, record.topology),
            self.environment(session, record.environment),
        )


def _trial_row(sweep_id: int, dims: tuple[int, int, int], t: TrialRecord) -> dict[str, Any]:
    return {
        "sweep_id": sweep_id,
        "workload_id": dims[0],
        "topology_id": dims[1],
        "environment_id": dims[2],
        "candidate_hash": t.candidate.key(),
        "candidate": t.candidate.to_dict(),
        "status": t.status,
        "source": t.source,
        "median_us": t.median_us,
        "p20_us": t.p20_us,
        "p80_us": t.p80_us,
        "samples_us": list(t.samples_us),
        "eager_us": t.eager_us,
        "host_us": t.host_us,
        "max_rel_error": t.max_rel_error,
        "error": t.error,
        "worker": codec.encode(dict(t.worker), "trial worker"),
        "strategy": t.strategy,
        "created_at": t.created_at,
    }


def insert_trials(
    session: Session, dims: DimensionIds, sweep_id: int, trials: Sequence[TrialRecord]
) -> list[int]:
    """Insert `trials` into sweep `sweep_id` (duplicates kept once); their row ids, in input order."""
    rows: dict[tuple[int, int, int, str], dict[str, Any]] = {}
    order: list[tuple[int, int, int, str]] = []
    for t in trials:
        ids = dims.of(session, t)
        identity = (*ids, t.candidate.key())
        order.append(identity)
        rows.setdefault(identity, _trial_row(sweep_id, ids, t))
    table = TrialModel.__table__
    if rows:
        session.execute(
            _insert(session, table).on_conflict_do_nothing(
                index_elements=["workload_id", "topology_id", "environment_id", "sweep_id", "candidate_hash"]
            ),
            list(rows.values()),
        )
    by_dims: dict[tuple[int, int, int], list[str]] = defaultdict(list)
    for w, tp, e, h in rows:
        by_dims[(w, tp, e)].append(h)
    found: dict[tuple[int, int, int, str], int] = {}
    for (w, tp, e), hashes in by_dims.items():
        for start in range(0, len(hashes), _CHUNK):
            chunk = hashes[start : start + _CHUNK]
            result = session.execute(
                select(table.c.id, table.c.candidate_hash).where(
                    table.c.sweep_id == sweep_id,
                    table.c.workload_id == w,
                    table.c.topology_id == tp,
                    table.c.environment_id == e,
                    table.c.candidate_hash.in_(chunk),
                )
            )
            for row_id, h in result:
                found[(w, tp, e, h)] = row_id
    return [found[identity] for identity in order]


def insert_baseline(session: Session, dims: DimensionIds, sweep_id: int, b: BaselineRecord) -> int:
    """Insert baseline `b` of sweep `sweep_id` (kept once); its row id."""
    w, tp, e = dims.of(session, b)
    table = BaselineModel.__table__
    session.execute(
        _insert(session, table)
        .values(
            sweep_id=sweep_id,
            workload_id=w,
            topology_id=tp,
            environment_id=e,
            name=b.name,
            source=b.source,
            median_us=b.median_us,
            p20_us=b.p20_us,
            p80_us=b.p80_us,
            samples_us=list(b.samples_us),
            eager_us=b.eager_us,
            host_us=b.host_us,
            detail=b.detail,
            created_at=b.created_at,
        )
        .on_conflict_do_nothing(
            index_elements=["workload_id", "topology_id", "environment_id", "sweep_id", "name"]
        )
    )
    return session.scalar(
        select(table.c.id).where(
            tuple_(
                table.c.workload_id,
                table.c.topology_id,
                table.c.environment_id,
                table.c.sweep_id,
                table.c.name,
            )
            == tuple_(w, tp, e, sweep_id, b.name)
        )
    )


def upsert_calibration(
    session: Session, dims: DimensionIds, c: CalibrationRecord, sweep_id: int | None
) -> int:
    """Insert calibration `c`, or replace the payload of the one with the same kind, topology,
    environment and key; its row id."""
    tp = dims.topology(session, c.topology)
    e = dims.environment(session, c.environment)
    table = CalibrationModel.__table__
    values = {
        "payload": codec.encode(c.payload, "calibration payload"),
        "source": c.source,
        "sweep_id": sweep_id,
        "created_at": c.created_at,
    }
    stmt = _insert(session, table).values(kind=c.kind, topology_id=tp, environment_id=e, key=c.key, **values)
    stmt = stmt.on_conflict_do_update(
        index_elements=["kind", "topology_id", "environment_id", "key"],
        set_={name: getattr(stmt.excluded, name) for name in values},
    )
    session.execute(stmt)
    return session.scalar(
        select(table.c.id).where(
            table.c.kind == c.kind,
            table.c.topology_id == tp,
            table.c.environment_id == e,
            table.c.key == c.key,
        )
    )
