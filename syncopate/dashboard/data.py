"""The dashboard's data: pandas DataFrames aggregated in SQL, shared by the web app and the report.

Every function takes an open :class:`~syncopate.results_db.ResultsDB` (read only) and returns a
DataFrame whose size follows the number of workloads, sweeps or chart points asked for, never the
number of trials: grouping, ranking and running minima run in the database (SQLite or PostgreSQL).

| function | one row per |
|---|---|
| :func:`overview` | (workload, topology, environment, source): best configuration, baselines, speedups |
| :func:`convergence` | trial of one :class:`Selection` in stored order (thinned past `max_points`) |
| :func:`backend_splits` | (backend, num_splits) of one selection: best time |
| :func:`tile_orders` | tile order of one selection |
| :func:`failures` | (status, error text) of one selection |
| :func:`sweeps` | sweep: when, where, environments, trials, duration |
| :func:`compare_sweeps` | (workload, topology, source) measured in either of two sweeps |
| :func:`environments` | environment fingerprint |

Rows of different sources (`measured`, `predicted`, `fixture`) are never merged: `source` is part
of every grouping, and a baseline is paired only with trials of its own sweep and source. Speedups
are ratios within one sweep: baseline time / best time. The overlap bound is
max(gemm_alone, fastest comm_alone*); `of_bound` = bound / best time (1.0: at the bound).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
from sqlalchemy import Integer, String, and_, case, cast, func, literal, or_, select
from sqlalchemy.engine import Connection

from syncopate.errors import ConfigError
from syncopate.records import SOURCES
from syncopate.results_db.models import (
    BaselineModel,
    EnvironmentModel,
    SweepModel,
    TopologyModel,
    TrialModel,
    WorkloadModel,
)
from syncopate.results_db.repository import ResultsDB
from syncopate.results_db.schema import has_current_names
from syncopate.search_space import KINDS, MOE_KINDS, UNFUSED, canonical_dtype, stored_backend, topology_key

__all__ = [
    "ENV_FIELDS",
    "Filters",
    "FilterOptions",
    "SWEEP_COLUMNS",
    "Selection",
    "backend_splits",
    "compare_sweeps",
    "convergence",
    "counts",
    "env_label",
    "environment_diff",
    "environments",
    "failures",
    "filter_options",
    "overview",
    "sweeps",
    "tile_orders",
]

ENV_FIELDS: tuple[str, ...] = ("syncopate", "torch", "triton", "cuda", "nccl", "driver", "gpu_model")

_T = TrialModel.__table__
_B = BaselineModel.__table__
_W = WorkloadModel.__table__
_TP = TopologyModel.__table__
_E = EnvironmentModel.__table__
_S = SweepModel.__table__
_DIMS = ("workload_id", "topology_id", "environment_id")


@dataclass(frozen=True, kw_only=True, slots=True)
class Filters:
    """What the views show; an empty tuple means every value."""

    topologies: tuple[str, ...] = ()
    """Topology keys such as `H200x2-nvlink`."""
    environments: tuple[str, ...] = ()
    """Environment fingerprint keys (:meth:`Environment.key`)."""
    dtypes: tuple[str, ...] = ()
    """Workload dtypes such as `bf16`."""
    kinds: tuple[str, ...] = ()
    """Op kinds such as `ag_gemm`."""
    sources: tuple[str, ...] = ()
    """Trial sources: `measured`, `predicted`, `fixture` (shown apart, whichever are chosen)."""

    def __post_init__(self) -> None:
        for name in ("topologies", "environments", "dtypes", "kinds", "sources"):
            value = getattr(self, name)
            if isinstance(value, str) or not all(isinstance(v, str) for v in value):
                raise ConfigError(f"filter {name}={value!r} must be a tuple of strings")
            object.__setattr__(self, name, tuple(value))
        for s in self.sources:
            if s not in SOURCES:
                raise ConfigError(f"unknown source {s!r} in the filter: accepted are {', '.join(SOURCES)}")
        for k in self.kinds:
            if k not in KINDS + MOE_KINDS:
                raise ConfigError(
                    f"unknown kind {k!r} in the filter: accepted are {', '.join(KINDS + MOE_KINDS)}"
                )
        object.__setattr__(self, "dtypes", tuple(canonical_dtype(d) for d in self.dtypes))
        object.__setattr__(self, "topologies", tuple(topology_key(t) for t in self.topologies))

    def active(self) -> bool:
        return any((self.topologies, self.environments, self.dtypes, self.kinds, self.sources))


@dataclass(frozen=True, kw_only=True, slots=True)
class Selection:
    """One row of the overview, the subject of the drill-down views."""

    workload: str
    """Workload key such as `ag_gemm/8192x2048x8192/bf16`."""
    topology: str
    environment: str
    source: str = "measured"

    @classmethod
    def of(cls, row: Any) -> Selection:
        """The selection of an overview row (a Series or a mapping with those columns)."""
        return cls(
            workload=row["workload"],
            topology=row["topology"],
            environment=row["environment"],
            source=row["source"],
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class FilterOptions:
    """The values stored, to choose filters from."""

    topologies: tuple[str, ...] = ()
    environments: dict[str, str] = field(default_factory=dict)
    """Environment key → label."""
    dtypes: tuple[str, ...] = ()
    kinds: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()


# ---- helpers ----------------------------------------------------------------------------------


def _frame(conn: Connection, stmt: Any, columns: list[str] | None = None) -> pd.DataFrame:
    result = conn.execute(stmt)
    names = columns or list(result.keys())
    rows = result.fetchall()
    # Column by column: pandas reads a Row's fields as hints (a column named `dtype` would be one).
    return pd.DataFrame(
        {name: pd.Series([row[i] for row in rows], dtype=object) for i, name in enumerate(names)},
        columns=names,
    ).infer_objects()


def _json_field(conn: Connection, column: Any, name: str, integer: bool = False) -> Any:
    """A field of a JSON column, extracted by the database (SQLite json_extract, PostgreSQL ->>)."""
    if conn.dialect.name == "sqlite":
        out = func.json_extract(column, f"$.{name}")
        return cast(out, Integer) if integer else cast(out, String)
    out = func.jsonb_extract_path_text(column, name)
    return cast(out, Integer) if integer else out


def _route(conn: Connection, column: Any) -> Any:
    """The candidate's backend, or `unfused` for that template (it moves nothing itself: the group's
    collective runs after the matmul), so that charts by backend do not count it as NCCL's. A row
    stored before a backend was renamed names it by its earlier name: :func:`_backends` maps the
    column of the frame it ends up in."""
    return case(
        (_json_field(conn, column, "template") == UNFUSED, UNFUSED),
        else_=_json_field(conn, column, "backend"),
    )


def _route_of(d: Any, renamed: bool) -> str | None:
    """`_route` of a decoded candidate dict (`renamed`: stored before the backend rename)."""
    if not isinstance(d, dict):
        return None
    return UNFUSED if d.get("template") == UNFUSED else stored_backend(d.get("backend"), renamed=renamed)


def _renamed(db: ResultsDB) -> bool:
    """Whether `db`'s rows were stored before the backend rename (a revision before 0003)."""
    return not has_current_names(db.revision)


def _backends(frame: pd.DataFrame, renamed: bool) -> pd.DataFrame:
    """`frame` with its `backend` column under the current names (:func:`stored_backend`)."""
    frame["backend"] = pd.Series(
        [stored_backend(b, renamed=renamed) for b in frame["backend"]], index=frame.index, dtype=object
    )
    return frame


def env_label(row: Any) -> str:
    """`torch 2.11.0+cu130 · triton 3.6.0 · CUDA 13.0 · NCCL 2.28.3 · driver 580.159.04 · H200`."""
    return (
        f"torch {row['torch']} · triton {row['triton']} · CUDA {row['cuda']} · NCCL {row['nccl']} · "
        f"driver {row['driver']} · {row['gpu_model']}"
    )


def _dimension_ids(conn: Connection, filters: Filters) -> dict[str, list[int] | None]:
    """Ids of the dimension rows the filters allow (None: no restriction)."""
    out: dict[str, list[int] | None] = {"workload_id": None, "topology_id": None, "environment_id": None}
    if filters.dtypes or filters.kinds:
        stmt = select(_W.c.id)
        if filters.dtypes:
            stmt = stmt.where(_W.c.dtype.in_(filters.dtypes))
        if filters.kinds:
            stmt = stmt.where(_W.c.kind.in_(filters.kinds))
        out["workload_id"] = list(conn.scalars(stmt))
    if filters.topologies:
        out["topology_id"] = list(conn.scalars(select(_TP.c.id).where(_TP.c.key.in_(filters.topologies))))
    if filters.environments:
        out["environment_id"] = list(conn.scalars(select(_E.c.id).where(_E.c.key.in_(filters.environments))))
    return out


def _where(table: Any, ids: dict[str, list[int] | None], filters: Filters) -> list[Any]:
    """Filter clauses. Topology, environment and source are written as expressions (`id + 0`,
    `source || ''`) that no index serves, so that SQLite, which has no statistics to go by, keeps
    scanning the covering index that leads with the workload rather than seek through a partial one
    and read every row (`benchmarks/dashboard_speed.py` times these queries on a large database)."""
    clauses = []
    for name, values in ids.items():
        if values is None:
            continue
        column = table.c[name] if name == "workload_id" else table.c[name] + 0
        clauses.append(column.in_(values))
    if filters.sources:
        clauses.append(table.c.source.concat("").in_(filters.sources))
    return clauses


def _selection_where(conn: Connection, sel: Selection) -> list[Any]:
    """Clauses on the trials table for one selection (matching nothing where a key is not stored)."""
    ids = {}
    for name, table, key in (
        ("workload_id", _W, sel.workload),
        ("topology_id", _TP, sel.topology),
        ("environment_id", _E, sel.environment),
    ):
        ids[name] = conn.scalar(select(table.c.id).where(table.c.key == key))
    if any(v is None for v in ids.values()):
        return [literal(False)]
    return [_T.c[name] == value for name, value in ids.items()] + [_T.c.source == sel.source]


def _candidate_columns(frame: pd.DataFrame, renamed: bool, column: str = "candidate") -> pd.DataFrame:
    """Adds backend (`unfused` for that template), num_splits, tile_order and a one-line summary
    from decoded candidate dicts."""
    from syncopate.search_space import Candidate

    def short(d: Any) -> str:
        if not isinstance(d, dict):
            return ""
        try:
            return Candidate.from_stored(d, renamed=renamed).short()
        except ConfigError:
            return str(d)

    docs = frame[column] if column in frame else pd.Series([None] * len(frame), dtype=object)
    frame["backend"] = [_route_of(d, renamed) for d in docs]
    frame["num_splits"] = pd.array(
        [d.get("num_splits") if isinstance(d, dict) else None for d in docs], dtype="Int64"
    )
    frame["tile_order"] = [d.get("tile_order") if isinstance(d, dict) else None for d in docs]
    frame["config"] = [short(d) for d in docs]
    return frame.drop(columns=[column])


# ---- overview ---------------------------------------------------------------------------------


def counts(db: ResultsDB) -> dict[str, int]:
    """Rows per table: trials, baselines, sweeps, workloads (what the empty-database check reads)."""
    with db.engine.connect() as conn:
        return {
            "trials": conn.scalar(select(func.count()).select_from(_T)),
            "baselines": conn.scalar(select(func.count()).select_from(_B)),
            "sweeps": conn.scalar(select(func.count()).select_from(_S)),
            "workloads": conn.scalar(select(func.count()).select_from(_W)),
        }


def filter_options(db: ResultsDB) -> FilterOptions:
    """Topologies, environments, dtypes, kinds and sources that have trials."""
    with db.engine.connect() as conn:
        used = select(_T.c.workload_id, _T.c.topology_id, _T.c.environment_id).distinct().subquery()
        topologies = conn.scalars(
            select(_TP.c.key).where(_TP.c.id.in_(select(used.c.topology_id))).order_by(_TP.c.key)
        ).all()
        envs = _frame(conn, select(_E).where(_E.c.id.in_(select(used.c.environment_id))).order_by(_E.c.id))
        loads = _frame(
            conn, select(_W.c.dtype, _W.c.kind).where(_W.c.id.in_(select(used.c.workload_id))).distinct()
        )
        sources = conn.scalars(select(_T.c.source).distinct()).all()
    return FilterOptions(
        topologies=tuple(topologies),
        environments={row["key"]: env_label(row) for _, row in envs.iterrows()},
        dtypes=tuple(sorted(loads["dtype"].unique())) if len(loads) else (),
        kinds=tuple(sorted(loads["kind"].unique())) if len(loads) else (),
        sources=tuple(s for s in SOURCES if s in sources),
    )


_OVERVIEW_COLUMNS = [
    "topology",
    "environment",
    "env_label",
    "source",
    "workload",
    "kind",
    "m",
    "n",
    "k",
    "dtype",
    "shape",
    "trials",
    "ok",
    "failed",
    "best_trial_id",
    "sweep_id",
    "best_us",
    "p20_us",
    "p80_us",
    "config",
    "backend",
    "num_splits",
    "tile_order",
    "torch_seq_us",
    "torch_async_tp_us",
    "gemm_alone_us",
    "comm_alone_us",
    "bound_us",
    "speedup_seq",
    "speedup_async_tp",
    "of_bound",
]


def overview(db: ResultsDB, filters: Filters = Filters()) -> pd.DataFrame:
    """Every (workload, topology, environment, source) with trials: its best `ok` trial, the
    baselines of that trial's sweep, the speedups and the fraction of the overlap bound.

    Shapes with no `ok` trial are listed with their counts and no best time.
    """
    with db.engine.connect() as conn:
        ids = _dimension_ids(conn, filters)
        where = _where(_T, ids, filters)
        part = [_T.c.workload_id, _T.c.topology_id, _T.c.environment_id, _T.c.source]
        # Counted and ranked through the index ix_syncopate_trials_best (dims, source, status, median):
        # the fastest time per group, then the lowest id among the trials at that time.
        tally = (
            select(
                *part,
                func.count().label("trials"),
                func.sum(case((_T.c.status == "ok", 1), else_=0)).label("ok"),
            )
            .where(*where)
            .group_by(*part)
            .subquery("tally")
        )
        fastest = (
            select(*part, func.min(_T.c.median_us).label("median_us"))
            .where(_T.c.status == "ok", *where)
            .group_by(*part)
            .subquery("fastest")
        )
        winner = (
            select(func.min(_T.c.id).label("id"))
            .join(fastest, and_(*(fastest.c[c] == _T.c[c] for c in (*_DIMS, "source", "median_us"))))
            .where(_T.c.status == "ok")
            .group_by(*(fastest.c[c] for c in (*_DIMS, "source")))
            .subquery("winner")
        )
        best = (
            select(_T.c.id, _T.c.sweep_id, *part, _T.c.median_us, _T.c.p20_us, _T.c.p80_us, _T.c.candidate)
            .join(winner, winner.c.id == _T.c.id)
            .subquery("best")
        )
        bpart = [_B.c.sweep_id, _B.c.workload_id, _B.c.topology_id, _B.c.environment_id, _B.c.source]

        def named(name: str) -> Any:
            return func.min(case((_B.c.name == name, _B.c.median_us))).label(f"{name}_us")

        base = (
            select(
                *bpart,
                named("torch_seq"),
                named("torch_async_tp"),
                named("gemm_alone"),
                func.min(case((_B.c.name.like("comm\\_alone%", escape="\\"), _B.c.median_us))).label(
                    "comm_alone_us"
                ),
            )
            .where(*_where(_B, ids, filters))
            .group_by(*bpart)
            .subquery("base")
        )
        same = [tally.c[c] == best.c[c] for c in (*_DIMS, "source")]
        paired = [base.c.sweep_id == best.c.sweep_id] + [base.c[c] == best.c[c] for c in (*_DIMS, "source")]
        stmt = (
            select(
                _TP.c.key.label("topology"),
                _E.c.key.label("environment"),
                *(_E.c[f] for f in ENV_FIELDS),
                tally.c.source,
                _W.c.key.label("workload"),
                _W.c.kind,
                _W.c.m,
                _W.c.n,
                _W.c.k,
                _W.c.dtype,
                tally.c.trials,
                tally.c.ok,
                best.c.id.label("best_trial_id"),
                best.c.sweep_id,
                best.c.median_us.label("best_us"),
                best.c.p20_us,
                best.c.p80_us,
                best.c.candidate,
                base.c.torch_seq_us,
                base.c.torch_async_tp_us,
                base.c.gemm_alone_us,
                base.c.comm_alone_us,
            )
            .select_from(tally)
            .join(_W, _W.c.id == tally.c.workload_id)
            .join(_TP, _TP.c.id == tally.c.topology_id)
            .join(_E, _E.c.id == tally.c.environment_id)
            .outerjoin(best, and_(*same))
            .outerjoin(base, and_(*paired))
            .order_by(_TP.c.key, _E.c.id, tally.c.source, _W.c.kind, _W.c.dtype, _W.c.m, _W.c.n, _W.c.k)
        )
        frame = _frame(conn, stmt)
    if frame.empty:
        return pd.DataFrame(columns=_OVERVIEW_COLUMNS)
    frame["env_label"] = [env_label(row) for _, row in frame.iterrows()]
    frame["shape"] = [f"{m}×{n}×{k}" for m, n, k in zip(frame["m"], frame["n"], frame["k"])]
    frame["ok"] = frame["ok"].astype(int)
    frame["failed"] = frame["trials"] - frame["ok"]
    frame = _candidate_columns(frame, _renamed(db))
    for c in ("best_trial_id", "sweep_id"):
        frame[c] = pd.array(frame[c], dtype="Int64")
    for c in (
        "best_us",
        "p20_us",
        "p80_us",
        "torch_seq_us",
        "torch_async_tp_us",
        "gemm_alone_us",
        "comm_alone_us",
    ):
        frame[c] = pd.to_numeric(frame[c], errors="coerce").astype(float)
    frame["bound_us"] = frame[["gemm_alone_us", "comm_alone_us"]].max(axis=1, skipna=False)
    frame["speedup_seq"] = frame["torch_seq_us"] / frame["best_us"]
    frame["speedup_async_tp"] = frame["torch_async_tp_us"] / frame["best_us"]
    frame["of_bound"] = frame["bound_us"] / frame["best_us"]
    return frame[_OVERVIEW_COLUMNS].reset_index(drop=True)


# ---- drill-down -------------------------------------------------------------------------------


def convergence(db: ResultsDB, sel: Selection, *, max_points: int = 2000) -> pd.DataFrame:
    """The trials of `sel` in stored order, per (sweep, strategy): `order` (1, 2, …), status, time
    and the running best (`best_so_far`) computed over every trial.

    Past `max_points` trials, every n-th trial is returned plus every one that improved the running
    best, so the chart keeps its shape and the frame stays small; `thinned` says whether that happened.
    """
    if max_points < 1:
        raise ConfigError(f"max_points={max_points} must be at least 1")
    with db.engine.connect() as conn:
        where = _selection_where(conn, sel)
        total = conn.scalar(select(func.count()).select_from(_T).where(*where))
        step = max(1, math.ceil(total / max_points))
        group = [_T.c.sweep_id, _T.c.strategy]
        ordered = (
            select(
                _T.c.id.label("trial_id"),
                _T.c.sweep_id,
                _T.c.strategy,
                _T.c.status,
                _T.c.median_us,
                _T.c.p20_us,
                _T.c.p80_us,
                _T.c.created_at,
                _route(conn, _T.c.candidate).label("backend"),
                _json_field(conn, _T.c.candidate, "num_splits", integer=True).label("num_splits"),
                _json_field(conn, _T.c.candidate, "tile_order").label("tile_order"),
                func.row_number().over(partition_by=group, order_by=_T.c.id).label("order"),
                func.min(case((_T.c.status == "ok", _T.c.median_us)))
                .over(partition_by=group, order_by=_T.c.id, rows=(None, 0))
                .label("best_so_far"),
            )
            .where(*where)
            .subquery("ordered")
        )
        stmt = select(ordered).order_by(ordered.c.trial_id)
        if step > 1:
            stmt = stmt.where(
                or_((ordered.c.order - 1) % step == 0, ordered.c.median_us == ordered.c.best_so_far)
            )
        frame = _frame(conn, stmt)
    frame = _backends(frame, _renamed(db))
    for c in ("median_us", "p20_us", "p80_us", "best_so_far"):
        frame[c] = pd.to_numeric(frame[c], errors="coerce").astype(float)
    frame["strategy"] = frame["strategy"].replace("", "(none)")
    frame["series"] = [f"sweep {s} · {st}" for s, st in zip(frame["sweep_id"], frame["strategy"])]
    frame.attrs["thinned"] = step > 1
    frame.attrs["total"] = int(total)
    return frame


def backend_splits(db: ResultsDB, sel: Selection) -> pd.DataFrame:
    """The best `ok` time per (backend, num_splits) of `sel`, with trial counts (the heatmap); the
    template `unfused` is a backend of its own there."""
    with db.engine.connect() as conn:
        backend = _route(conn, _T.c.candidate)
        splits = _json_field(conn, _T.c.candidate, "num_splits", integer=True)
        stmt = (
            select(
                backend.label("backend"),
                splits.label("num_splits"),
                func.min(case((_T.c.status == "ok", _T.c.median_us))).label("best_us"),
                func.count().label("trials"),
                func.sum(case((_T.c.status == "ok", 1), else_=0)).label("ok"),
            )
            .where(*_selection_where(conn, sel))
            .group_by(backend, splits)
            .order_by(backend, splits)
        )
        frame = _frame(conn, stmt)
    frame["best_us"] = pd.to_numeric(frame["best_us"], errors="coerce").astype(float)
    # a database names a backend by one name, its earlier one only before the rename: no two cells merge
    return _backends(frame, _renamed(db))


def tile_orders(db: ResultsDB, sel: Selection) -> pd.DataFrame:
    """Per tile order of `sel`: best and mean `ok` time, trials, ok and failed counts."""
    with db.engine.connect() as conn:
        order = _json_field(conn, _T.c.candidate, "tile_order")
        ok_time = case((_T.c.status == "ok", _T.c.median_us))
        stmt = (
            select(
                order.label("tile_order"),
                func.min(ok_time).label("best_us"),
                func.avg(ok_time).label("mean_us"),
                func.count().label("trials"),
                func.sum(case((_T.c.status == "ok", 1), else_=0)).label("ok"),
            )
            .where(*_selection_where(conn, sel))
            .group_by(order)
            .order_by(order)
        )
        frame = _frame(conn, stmt)
    for c in ("best_us", "mean_us"):
        frame[c] = pd.to_numeric(frame[c], errors="coerce").astype(float)
    frame["ok"] = frame["ok"].astype(int)
    frame["failed"] = frame["trials"] - frame["ok"]
    return frame


def failures(db: ResultsDB, sel: Selection, *, limit: int = 100) -> pd.DataFrame:
    """Failed trials of `sel` grouped by (status, error text), most frequent first: count and the
    first and last trial ids (at most `limit` groups)."""
    with db.engine.connect() as conn:
        stmt = (
            select(
                _T.c.status,
                _T.c.error,
                func.count().label("trials"),
                func.min(_T.c.id).label("first_trial"),
                func.max(_T.c.id).label("last_trial"),
            )
            .where(_T.c.status != "ok", *_selection_where(conn, sel))
            .group_by(_T.c.status, _T.c.error)
            .order_by(func.count().desc(), _T.c.status, func.min(_T.c.id))
            .limit(limit)
        )
        return _frame(conn, stmt)


# ---- sweeps -----------------------------------------------------------------------------------


SWEEP_COLUMNS = [
    # what `sweeps` returns, in order; the dashboard's sweeps table shows all but the last
    "sweep_id",
    "name",
    "status",
    "host",
    "started_at",
    "finished_at",
    "duration_s",
    "trials",
    "ok",
    "failed",
    "workloads",
    "topologies",
    "environments",
    "sources",
    "last_trial_at",
]


def sweeps(db: ResultsDB, filters: Filters = Filters()) -> pd.DataFrame:
    """Every sweep, newest first: name, status, host, start, end, duration, trial counts, and the
    topologies, environments and sources of its trials. With filters set, only sweeps that have
    matching trials (counted alone)."""
    with db.engine.connect() as conn:
        ids = _dimension_ids(conn, filters)
        where = _where(_T, ids, filters)
        tally = (
            select(
                _T.c.sweep_id,
                func.count().label("trials"),
                func.sum(case((_T.c.status == "ok", 1), else_=0)).label("ok"),
                func.count(_T.c.workload_id.distinct()).label("workloads"),
                func.max(_T.c.created_at).label("last_trial_at"),
            )
            .where(*where)
            .group_by(_T.c.sweep_id)
            .subquery("tally")
        )
        stmt = (
            select(
                _S.c.id.label("sweep_id"),
                _S.c.name,
                _S.c.status,
                _S.c.host,
                _S.c.started_at,
                _S.c.finished_at,
                tally.c.trials,
                tally.c.ok,
                tally.c.workloads,
                tally.c.last_trial_at,
            )
            .select_from(_S)
            .outerjoin(tally, tally.c.sweep_id == _S.c.id)
            .order_by(_S.c.id.desc())
        )
        if filters.active():
            stmt = stmt.where(tally.c.trials.is_not(None))
        frame = _frame(conn, stmt)
        labels = _frame(
            conn,
            (
                select(
                    _T.c.sweep_id,
                    _TP.c.key.label("topology"),
                    _E.c.key.label("environment"),
                    *(_E.c[f] for f in ENV_FIELDS),
                    _T.c.source,
                )
                .select_from(_T)
                .join(_TP, _TP.c.id == _T.c.topology_id)
                .join(_E, _E.c.id == _T.c.environment_id)
                .where(*where)
                .distinct()
            ),
        )
    if frame.empty:
        return pd.DataFrame(columns=SWEEP_COLUMNS)
    for c in ("trials", "ok", "workloads"):
        frame[c] = pd.to_numeric(frame[c]).fillna(0).astype(int)
    frame["failed"] = frame["trials"] - frame["ok"]
    started = pd.to_datetime(frame["started_at"], utc=True)
    finished = pd.to_datetime(frame["finished_at"], utc=True)
    frame["duration_s"] = (finished - started).dt.total_seconds()
    labels["env_label"] = [f"{row['environment'][:8]}: {env_label(row)}" for _, row in labels.iterrows()]

    def joined(column: str) -> dict[int, str]:
        return {s: ", ".join(sorted(set(g[column]))) for s, g in labels.groupby("sweep_id")}

    frame["topologies"] = frame["sweep_id"].map(joined("topology")).fillna("")
    frame["environments"] = frame["sweep_id"].map(joined("env_label")).fillna("")
    frame["sources"] = frame["sweep_id"].map(joined("source")).fillna("")
    return frame[SWEEP_COLUMNS].reset_index(drop=True)


def compare_sweeps(db: ResultsDB, a: int, b: int, filters: Filters = Filters()) -> pd.DataFrame:
    """Two sweeps side by side: per (workload, topology, source) measured in either, the best `ok`
    time, its p20 and p80, and the torch_seq baseline of each, the environment of each, `ratio` =
    best of B / best of A (above 1: B is slower), and that ratio's noise band from `ratio_lo` (B's
    p20 / A's p80) to `ratio_hi` (B's p80 / A's p20)."""
    with db.engine.connect() as conn:
        ids = _dimension_ids(conn, filters)
        part = [_T.c.sweep_id, _T.c.workload_id, _T.c.topology_id, _T.c.environment_id, _T.c.source]
        best = (
            select(
                *part,
                func.min(case((_T.c.status == "ok", _T.c.median_us))).label("best_us"),
                func.count().label("trials"),
            )
            .where(_T.c.sweep_id.in_((a, b)), *_where(_T, ids, filters))
            .group_by(*part)
            .subquery("best")
        )
        seq = (
            select(*(_B.c[c.name] for c in part), _B.c.median_us.label("torch_seq_us"))
            .where(_B.c.name == "torch_seq", _B.c.sweep_id.in_((a, b)))
            .subquery("seq")
        )
        # the spread (p20, p80) of the best trial; of the widest where several tie
        band = (
            select(
                *(_T.c[c.name] for c in part),
                func.min(_T.c.p20_us).label("p20_us"),
                func.max(_T.c.p80_us).label("p80_us"),
            )
            .join(
                best, and_(*(best.c[c.name] == _T.c[c.name] for c in part), best.c.best_us == _T.c.median_us)
            )
            .where(_T.c.status == "ok")
            .group_by(*(_T.c[c.name] for c in part))
            .subquery("band")
        )
        stmt = (
            select(
                best.c.sweep_id,
                _W.c.key.label("workload"),
                _W.c.kind,
                _W.c.m,
                _W.c.n,
                _W.c.k,
                _W.c.dtype,
                _TP.c.key.label("topology"),
                _E.c.key.label("environment"),
                *(_E.c[f] for f in ENV_FIELDS),
                best.c.source,
                best.c.best_us,
                best.c.trials,
                seq.c.torch_seq_us,
                band.c.p20_us,
                band.c.p80_us,
            )
            .select_from(best)
            .join(_W, _W.c.id == best.c.workload_id)
            .join(_TP, _TP.c.id == best.c.topology_id)
            .join(_E, _E.c.id == best.c.environment_id)
            .outerjoin(seq, and_(*(seq.c[c.name] == best.c[c.name] for c in part)))
            .outerjoin(band, and_(*(band.c[c.name] == best.c[c.name] for c in part)))
        )
        frame = _frame(conn, stmt)
    keys = ["workload", "kind", "m", "n", "k", "dtype", "topology", "source"]
    columns = keys + [
        "best_us_a",
        "best_us_b",
        "ratio",
        "ratio_lo",
        "ratio_hi",
        "p20_us_a",
        "p80_us_a",
        "p20_us_b",
        "p80_us_b",
        "torch_seq_us_a",
        "torch_seq_us_b",
        "trials_a",
        "trials_b",
        "env_a",
        "env_b",
    ]
    if frame.empty:
        return pd.DataFrame(columns=columns)
    frame["env"] = [f"{row['environment'][:8]}: {env_label(row)}" for _, row in frame.iterrows()]
    for c in ("best_us", "torch_seq_us", "p20_us", "p80_us"):
        frame[c] = pd.to_numeric(frame[c], errors="coerce").astype(float)
    # One sweep normally measures a workload under one environment; where it used several, the
    # fastest row stands for the sweep.
    frame = frame.sort_values("best_us", na_position="last").drop_duplicates(["sweep_id", *keys])
    values = [*keys, "best_us", "torch_seq_us", "p20_us", "p80_us", "trials", "env"]
    merged = frame[frame["sweep_id"] == a][values].merge(
        frame[frame["sweep_id"] == b][values], on=keys, how="outer", suffixes=("_a", "_b")
    )
    merged["ratio"] = merged["best_us_b"] / merged["best_us_a"]
    # the ratio's noise band: B's p20 over A's p80 up to B's p80 over A's p20
    merged["ratio_lo"] = merged["p20_us_b"] / merged["p80_us_a"]
    merged["ratio_hi"] = merged["p80_us_b"] / merged["p20_us_a"]
    return (
        merged[columns]
        .sort_values(["topology", "source", "kind", "dtype", "m", "n", "k"])
        .reset_index(drop=True)
    )


def environment_diff(db: ResultsDB, a: int, b: int) -> pd.DataFrame:
    """The environment fields of the trials of sweeps a and b, side by side (columns `A: sweep a`,
    `B: sweep b`), with `changed`; a sweep with several environments lists every value."""
    with db.engine.connect() as conn:
        rows = _frame(
            conn,
            (
                select(_T.c.sweep_id, *(_E.c[f] for f in ENV_FIELDS))
                .select_from(_T)
                .join(_E, _E.c.id == _T.c.environment_id)
                .where(_T.c.sweep_id.in_((a, b)))
                .distinct()
            ),
        )

    def side(sweep: int) -> dict[str, str]:
        mine = rows[rows["sweep_id"] == sweep]
        return {f: ", ".join(sorted(set(mine[f]))) or "–" for f in ENV_FIELDS}

    left, right = side(a), side(b)
    return pd.DataFrame(
        {
            "field": list(ENV_FIELDS),
            f"A: sweep {a}": [left[f] for f in ENV_FIELDS],
            f"B: sweep {b}": [right[f] for f in ENV_FIELDS],
            "changed": [left[f] != right[f] for f in ENV_FIELDS],
        }
    )


def environments(db: ResultsDB) -> pd.DataFrame:
    """Every environment fingerprint with its fields, trial count and first stored time."""
    with db.engine.connect() as conn:
        tally = (
            select(_T.c.environment_id, func.count().label("trials")).group_by(_T.c.environment_id).subquery()
        )
        frame = _frame(
            conn,
            (
                select(
                    _E.c.key.label("environment"),
                    *(_E.c[f] for f in ENV_FIELDS),
                    _E.c.created_at,
                    func.coalesce(tally.c.trials, 0).label("trials"),
                )
                .select_from(_E)
                .outerjoin(tally, tally.c.environment_id == _E.c.id)
                .order_by(_E.c.id)
            ),
        )
    return frame
