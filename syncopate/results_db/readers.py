"""Where :func:`~syncopate.results_db.lookups.lookup` reads best configurations from.

A :class:`BestSource` answers what the lookup ladder asks:

- `shapes(kind, dtype)`: which shapes of that kind and dtype are stored;
- `topologies()`: which topologies are stored;
- `served(shape_ref, topology, environment_key, environment=…, mode=…)`: what is served in a mode
  for that shape on that topology, under that environment, under any other, or under any
  (:func:`~syncopate.records.pick`: the fastest `ok`, `measured` tuned trial, unless the untuned
  default's or the unfused template's trial under the same environment is faster in the mode; in
  `graph`, of the trials whose calls replay from a CUDA graph, :func:`~syncopate.records.replays_in_graph`);
- `holdings()`: what it holds in all (for a lookup that nothing measured answers);
- `calibration_records()`: the measured cost-model calibrations it holds.

Three sources, one contract (tests run the same ladder against each):

- :class:`SqliteSource`: the standard library's sqlite3, read-only
  (:func:`~syncopate.results_db.sqlite_files.connect_read_only`), so a job pays neither the
  SQLAlchemy import nor a write lock at start, reads a file on a read-only mount, and never creates
  a file, beside the database included;
- :class:`SqlAlchemySource`: the same SQL through SQLAlchemy, for PostgreSQL;
- :class:`ExportSource`: an export file (`syncopate export`), in memory, whose entries say what
  is served in which mode.

A database at an older revision this code reads (:data:`~syncopate.results_db.schema.READ_COMPATIBLE`)
is read as it is: columns it lacks (`eager_us`, `host_us` before revision 0002) read as NULL, and a
backend its rows name by an earlier name (before revision 0003: `nvshmem` for `sm_copy`) reads by
the current one, while a later row's `nvshmem` is the NVSHMEM backend
(:meth:`~syncopate.search_space.Candidate.from_stored`,
:func:`~syncopate.results_db.stored_names.stored_calibration`).

:func:`open_source` picks one for a `db` value and checks the schema revision first.
"""

from __future__ import annotations

import json
import os
import sqlite3
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NamedTuple

from syncopate.errors import ConfigError, DatabaseError, LookupFailedError
from syncopate.records import CalibrationRecord, Environment, objective, pick, replays_in_graph
from syncopate.results_db import codec, sqlite_files
from syncopate.results_db.kinds import stored_candidate
from syncopate.results_db.schema import (
    MOE_REVISION,
    SQLITE_HEADER,
    TABLES,
    VERSION_TABLE,
    _since,
    check_revision,
    check_sqlite_file,
    has_current_names,
    has_times,
    missing_error,
    no_tables_error,
    unreachable_error,
)
from syncopate.results_db.stored_names import stored_calibration
from syncopate.results_db.urls import DbLocation, locate
from syncopate.search_space import Candidate, MoeWorkload, Shape, Topology, Workload, guard_candidates

__all__ = [
    "ENVIRONMENTS",
    "BestSource",
    "ExportSource",
    "Hit",
    "Holdings",
    "Served",
    "ShapeRef",
    "SqlAlchemySource",
    "SqliteSource",
    "open_source",
]

ENVIRONMENTS: tuple[str, ...] = ("same", "other", "any")
"""Which environments :meth:`BestSource.served` looks under: the one given, any other, or any."""

SQL_TOPOLOGY = "SELECT id FROM syncopate_topologies WHERE key = :key"
SQL_TOPOLOGIES = (
    "SELECT key, world_size, gpu_model, interconnect, nodes, sm_count, memory_gb, link_gbps "
    "FROM syncopate_topologies"
)
SQL_ENVIRONMENT_ID = "SELECT id FROM syncopate_environments WHERE key = :key"
SQL_ENVIRONMENT = (
    "SELECT syncopate, torch, triton, cuda, nccl, driver, gpu_model "
    "FROM syncopate_environments WHERE id = :id"
)
SQL_SHAPES = "SELECT id, m, n, k FROM syncopate_workloads WHERE kind = :kind AND dtype = :dtype"
SQL_MOE_WORKLOADS = "SELECT id, params FROM syncopate_workloads WHERE kind = :kind AND dtype = :dtype"
SQL_HOLDINGS = (
    "SELECT w.kind, w.dtype, t.key, tr.environment_id, COUNT(*) FROM syncopate_trials tr "
    "JOIN syncopate_workloads w ON w.id = tr.workload_id JOIN syncopate_topologies t ON t.id = tr.topology_id "
    "WHERE tr.source = 'measured' AND tr.status = 'ok' GROUP BY w.kind, w.dtype, t.key, tr.environment_id"
)
SQL_CALIBRATIONS = (
    "SELECT c.kind, c.key, c.payload, c.source, c.created_at, t.key, c.environment_id FROM syncopate_calibrations c "
    "JOIN syncopate_topologies t ON t.id = c.topology_id WHERE c.source = 'measured'"
)
_ENVIRONMENT_CLAUSE = {
    "same": "AND environment_id = :environment",
    "other": "AND environment_id <> :environment",
    "any": "",
}
_ORDER = {"graph": "median_us, id", "eager": "eager_us IS NULL, eager_us, median_us, id"}


def _sql_fastest(environment: str, mode: str, times: bool, guards: int, among: bool) -> str:
    """The fastest `ok`, `measured` trial of a workload on a topology, in `mode`: of the candidates
    other than the `guards` given (among=False), or of those (among=True)."""
    eager = "eager_us, host_us" if times else "NULL AS eager_us, NULL AS host_us"
    order = _ORDER[mode] if times else _ORDER["graph"]
    hashes = ", ".join(f":g{i}" for i in range(guards))
    candidates = f"AND candidate_hash {'IN' if among else 'NOT IN'} ({hashes})" if guards else ""
    return (
        f"SELECT id, candidate, median_us, {eager}, environment_id, candidate_hash FROM syncopate_trials "
        f"WHERE workload_id = :workload AND topology_id = :topology {_ENVIRONMENT_CLAUSE[environment]} "
        f"AND source = 'measured' AND status = 'ok' {candidates} ORDER BY {order} LIMIT 1"
    )


def _since_moe(revision: str | None) -> bool:
    return _since(revision, MOE_REVISION)


class ShapeRef(NamedTuple):
    """A stored workload of the kind and dtype asked for: its shape and the source's handle on it."""

    ref: Any
    shape: Shape | None
    """None for a MoE workload (no GEMM shape: its parameters are `workload`)."""
    workload: Workload


class Hit(NamedTuple):
    """A stored `ok`, `measured` trial."""

    trial_id: int
    candidate: Candidate
    median_us: float
    eager_us: float | None
    host_us: float | None
    environment: Environment


class Served(NamedTuple):
    """What is served for one shape on one topology (:func:`~syncopate.records.pick`)."""

    hit: Hit
    """The trial served."""
    objective: str
    """What ranked it."""
    guard: str
    """`default` or `unfused` where that guard's trial is served; '' for a tuned one."""
    tuned: Hit | None
    """The fastest tuned trial (None where only guards were measured, or the source does not say)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Holdings:
    """What a source holds, counted by kind and dtype, topology and environment."""

    unit: str = "measured trial"
    """What is counted: `measured trial` (ok, measured) or `exported configuration`."""
    total: int = 0
    kinds: dict[str, int] = field(default_factory=dict)
    """`kind/dtype` → count."""
    topologies: dict[str, int] = field(default_factory=dict)
    """Topology key → count."""
    environments: dict[str, int] = field(default_factory=dict)
    """Environment key → count."""
    environment_names: dict[str, str] = field(default_factory=dict)
    """Environment key → its versions in words."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "unit": self.unit,
            "total": self.total,
            "kinds": dict(self.kinds),
            "topologies": dict(self.topologies),
            "environments": {
                k: {"count": n, "versions": self.environment_names.get(k, "")}
                for k, n in self.environments.items()
            },
        }

    def describe(self) -> str:
        """One sentence, such as `12 measured trials: ag_gemm/bf16 12; on H200x4-nvswitch 12; under 1
        environment: torch 2.11.0, …: 12`."""
        if not self.total:
            return f"no {self.unit}s at all"

        def counts(d: dict[str, int]) -> str:
            return ", ".join(f"{k} {n}" for k, n in sorted(d.items(), key=lambda kv: (-kv[1], kv[0])))

        envs = "; ".join(
            f"{self.environment_names.get(k) or k}: {n}"
            for k, n in sorted(self.environments.items(), key=lambda kv: (-kv[1], kv[0]))
        )
        plural = "s" if self.total != 1 else ""
        n_env = len(self.environments)
        return (
            f"{self.total} {self.unit}{plural}: {counts(self.kinds)}; on {counts(self.topologies)}; under "
            f"{n_env} environment{'s' if n_env != 1 else ''}: {envs}"
        )


class BestSource(ABC):
    """A store of best configurations, as the lookup ladder sees it."""

    shown: str = ""
    """Where it is, for messages (password hidden)."""

    @abstractmethod
    def shapes(self, kind: str, dtype: str) -> list[ShapeRef]:
        """Every stored workload of `kind` and `dtype`."""

    @abstractmethod
    def topologies(self) -> list[Topology]:
        """Every stored topology."""

    @abstractmethod
    def served(
        self, shape: ShapeRef, topology: Topology, environment_key: str, *, environment: str, mode: str
    ) -> Served | None:
        """What is served in `mode` for `shape` on `topology`, under `environment_key`
        (environment `same`), under another environment (`other`: the fastest of them) or under any
        (`any`); None where nothing `ok` and `measured` is stored there."""

    @abstractmethod
    def holdings(self) -> Holdings:
        """What the source holds in all."""

    def calibration_records(self) -> list[CalibrationRecord]:
        """Every measured cost-model calibration stored (none for an export file)."""
        return []

    def moe_workloads(self, kind: str, dtype: str) -> list[ShapeRef]:
        """Every stored MoE workload of `kind` and `dtype` (their `shape` None)."""
        return []

    def close(self) -> None:
        """Release connections; called when the lookup cache is cleared."""


class _EmptySource(BestSource):
    """A database that does not exist yet (the per-user default before first use): nothing stored."""

    def __init__(self, shown: str) -> None:
        self.shown = shown

    def shapes(self, kind: str, dtype: str) -> list[ShapeRef]:
        return []

    def topologies(self) -> list[Topology]:
        return []

    def served(
        self, shape: ShapeRef, topology: Topology, environment_key: str, *, environment: str, mode: str
    ) -> Served | None:
        return None

    def holdings(self) -> Holdings:
        return Holdings()


def _check_environment(environment: str) -> None:
    if environment not in ENVIRONMENTS:
        raise ValueError(f"environment={environment!r}: one of {', '.join(ENVIRONMENTS)}")


def _time(value: Any) -> datetime:
    when = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


class _SqlSource(BestSource):
    """The SQL of both database sources; subclasses run a query and return its rows."""

    @abstractmethod
    def _rows(self, sql: str, params: dict[str, Any]) -> list[tuple]: ...

    def __init__(self) -> None:
        self._ids: dict[tuple[str, str], int] = {}
        self._envs: dict[int, Environment] = {}
        self._topologies: dict[str, Topology] | None = None
        self._times: bool | None = None
        self._revision: tuple[str | None] | None = None

    def _id(self, sql: str, key: str) -> int | None:
        """The id of a topology or environment by key; ids found are remembered (rows never go)."""
        found = self._ids.get((sql, key))
        if found is None:
            rows = self._rows(sql, {"key": key})
            if rows:
                found = self._ids[(sql, key)] = rows[0][0]
        return found

    def _environment(self, env_id: int) -> Environment:
        env = self._envs.get(env_id)
        if env is None:
            row = self._rows(SQL_ENVIRONMENT, {"id": env_id})[0]
            env = self._envs[env_id] = Environment(
                syncopate=row[0],
                torch=row[1],
                triton=row[2],
                cuda=row[3],
                nccl=row[4],
                driver=row[5],
                gpu_model=row[6],
            )
        return env

    def _stored_revision(self) -> str | None:
        if self._revision is None:
            rows = self._rows(f"SELECT version_num FROM {VERSION_TABLE}", {})
            self._revision = (rows[0][0] if rows else None,)
        return self._revision[0]

    def has_times(self) -> bool:
        """Whether the trials here have `eager_us` and `host_us` (a database at revision 0002 on)."""
        if self._times is None:
            self._times = has_times(self._stored_revision())
        return self._times

    def renamed(self) -> bool:
        """Whether the rows here were stored before the backend rename (a revision before 0003):
        they name `sm_copy` by its earlier name `nvshmem`."""
        return not has_current_names(self._stored_revision())

    def shapes(self, kind: str, dtype: str) -> list[ShapeRef]:
        return [
            ShapeRef(
                row_id, Shape(m=m, n=n, k=k), Workload(kind=kind, shape=Shape(m=m, n=n, k=k), dtype=dtype)
            )
            for row_id, m, n, k in self._rows(SQL_SHAPES, {"kind": kind, "dtype": dtype})
        ]

    def topologies(self) -> list[Topology]:
        out = []
        for _key, ws, gpu, ic, nodes, sms, memory, link in self._rows(SQL_TOPOLOGIES, {}):
            try:
                out.append(
                    Topology(
                        world_size=ws,
                        gpu_model=gpu,
                        interconnect=ic,
                        nodes=nodes,
                        sm_count=sms,
                        memory_gb=float(memory),
                        link_gbps=float(link),
                    )
                )
            except ConfigError:  # a row this version cannot read as a topology is no answer
                continue
        return out

    def _fastest(
        self,
        shape: ShapeRef,
        topology_id: int,
        environment: str,
        environment_id: int,
        mode: str,
        hashes: list[str],
        among: bool,
    ) -> tuple | None:
        params: dict[str, Any] = {
            "workload": shape.ref,
            "topology": topology_id,
            "environment": environment_id,
        }
        params.update({f"g{i}": h for i, h in enumerate(hashes)})
        rows = self._rows(_sql_fastest(environment, mode, self.has_times(), len(hashes), among), params)
        return rows[0] if rows else None

    def moe_workloads(self, kind: str, dtype: str) -> list[ShapeRef]:
        """Every stored MoE workload of `kind` and `dtype` (shape None); none before revision 0005,
        whose workloads have no `params` column."""
        if not _since_moe(self._stored_revision()):
            return []
        out = []
        for row_id, params in self._rows(SQL_MOE_WORKLOADS, {"kind": kind, "dtype": dtype}):
            doc = codec.decode(json.loads(params) if isinstance(params, str) else params)
            try:
                out.append(ShapeRef(row_id, None, MoeWorkload.from_dict(doc)))
            except ConfigError:  # a row this version cannot read is no answer
                continue
        return out

    def _hit(self, row: tuple, kind: str = "") -> Hit:
        trial_id, candidate, median_us, eager_us, host_us, env_id, _ = row
        doc = codec.decode(json.loads(candidate) if isinstance(candidate, str) else candidate)
        return Hit(
            trial_id=trial_id,
            candidate=stored_candidate(kind, doc, renamed=self.renamed()),
            median_us=float(median_us),
            eager_us=None if eager_us is None else float(eager_us),
            host_us=None if host_us is None else float(host_us),
            environment=self._environment(env_id),
        )

    def served(
        self, shape: ShapeRef, topology: Topology, environment_key: str, *, environment: str, mode: str
    ) -> Served | None:
        _check_environment(environment)
        topology_id = self._id(SQL_TOPOLOGY, topology.key())
        if topology_id is None:
            return None
        environment_id = self._id(SQL_ENVIRONMENT_ID, environment_key)
        if environment_id is None:
            if environment == "same":
                return None
            environment_id = -1
        if self._topologies is None:
            self._topologies = {t.key(): t for t in self.topologies()}
        stored = self._topologies.get(topology.key(), topology)  # as the sweep saw it (detected SMs, …)
        guards = {name: c.key() for name, c in guard_candidates(shape.workload, stored).items()}
        hashes = list(guards.values())
        tuned = self._fastest(shape, topology_id, environment, environment_id, mode, hashes, among=False)
        if mode == "graph":  # the fastest tuned trial whose call replays from a CUDA graph
            passed = list(hashes)
            while tuned is not None and not replays_in_graph(self._hit(tuned, shape.workload.kind).candidate):
                passed.append(tuned[6])
                tuned = self._fastest(
                    shape, topology_id, environment, environment_id, mode, passed, among=False
                )
        if tuned is None:  # only guards measured here: the fastest of them decides the environment
            first = self._fastest(shape, topology_id, environment, environment_id, mode, hashes, among=True)
            if first is None:
                return None
            env_of = first[5]
        else:
            env_of = tuned[5]
        found = {}
        for name, h in guards.items():
            row = self._fastest(shape, topology_id, "same", env_of, mode, [h], among=True)
            if row is not None:
                found[name] = self._hit(row, shape.workload.kind)
        tuned_hit = self._hit(tuned, shape.workload.kind) if tuned is not None else None
        chosen = pick(mode, tuned_hit, found)
        return Served(hit=chosen.chosen, objective=chosen.objective, guard=chosen.guard, tuned=tuned_hit)

    def holdings(self) -> Holdings:
        kinds: dict[str, int] = {}
        topologies: dict[str, int] = {}
        environments: dict[str, int] = {}
        names: dict[str, str] = {}
        total = 0
        for kind, dtype, topo, env_id, count in self._rows(SQL_HOLDINGS, {}):
            env = self._environment(env_id)
            total += count
            kinds[f"{kind}/{dtype}"] = kinds.get(f"{kind}/{dtype}", 0) + count
            topologies[topo] = topologies.get(topo, 0) + count
            environments[env.key()] = environments.get(env.key(), 0) + count
            names[env.key()] = env.short()
        return Holdings(
            total=total,
            kinds=kinds,
            topologies=topologies,
            environments=environments,
            environment_names=names,
        )

    def calibration_records(self) -> list[CalibrationRecord]:
        by_key = {t.key(): t for t in self.topologies()}
        out = []
        for kind, key, payload, source, created_at, topo_key, env_id in self._rows(SQL_CALIBRATIONS, {}):
            topology = by_key.get(topo_key)
            if topology is None:
                continue
            doc = codec.decode(json.loads(payload) if isinstance(payload, str) else payload)
            key, doc = stored_calibration(kind, key, doc, renamed=self.renamed())
            try:
                out.append(
                    CalibrationRecord(
                        kind=kind,
                        topology=topology,
                        environment=self._environment(env_id),
                        key=key,
                        payload=doc,
                        source=source,
                        created_at=_time(created_at),
                    )
                )
            except (ConfigError, ValueError):  # a row this version cannot read is no calibration
                continue
        return out


class SqliteSource(_SqlSource):
    """A SQLite file read through the standard library, read-only."""

    def __init__(self, path: Path, shown: str) -> None:
        super().__init__()
        self.shown = shown
        self._path = path
        self._conn = self._connect()

    def _connect(self) -> sqlite_files.ReadConnection:
        connection = sqlite_files.connect_read_only(self._path, self.shown)
        try:
            connection.execute("PRAGMA query_only = ON")
        except sqlite3.Error as e:
            connection.close()
            raise unreachable_error(self.shown, str(e), "sqlite", self._path) from e
        return connection

    def _rows(self, sql: str, params: dict[str, Any]) -> list[tuple]:
        if self._conn.immutable and sqlite_files.writer_present(self._path):
            # a writer has opened the file since: read through its journal, as it commits
            self._conn.close()
            self._conn = self._connect()
        try:
            return self._conn.execute(sql, params).fetchall()
        except sqlite3.Error as e:
            raise DatabaseError(
                f"cannot read database {self.shown}: {e}{sqlite_files.damaged(self._path, e)}"
            ) from e

    def revision(self) -> str | None:
        """Our schema revision, or None where the file holds none of our tables."""
        names = {row[0] for row in self._rows("SELECT name FROM sqlite_master WHERE type = 'table'", {})}
        if VERSION_TABLE not in names:
            return None
        rows = self._rows(f"SELECT version_num FROM {VERSION_TABLE}", {})
        return rows[0][0] if rows else None

    def has_tables(self) -> bool:
        names = {row[0] for row in self._rows("SELECT name FROM sqlite_master WHERE type = 'table'", {})}
        return bool(names & set(TABLES))

    def close(self) -> None:
        self._conn.close()


class SqlAlchemySource(_SqlSource):
    """A database read through SQLAlchemy (PostgreSQL, or SQLite where asked for)."""

    def __init__(self, location: DbLocation) -> None:
        from sqlalchemy.exc import SQLAlchemyError

        from syncopate.results_db.engine import describe, make_engine
        from syncopate.results_db.migrate import read_revision

        super().__init__()
        self.shown = location.shown()
        self._engine = make_engine(location, read_only=True)
        try:
            with self._engine.connect() as connection:
                revision = read_revision(connection)
        except SQLAlchemyError as e:
            self._engine.dispose()
            raise unreachable_error(self.shown, describe(e), location.dialect) from e
        check_revision(revision, self.shown, read=True)

    def _rows(self, sql: str, params: dict[str, Any]) -> list[tuple]:
        from sqlalchemy import text
        from sqlalchemy.exc import SQLAlchemyError

        from syncopate.results_db.engine import describe

        try:
            with self._engine.connect() as connection:
                return [tuple(row) for row in connection.execute(text(sql), params)]
        except SQLAlchemyError as e:
            raise DatabaseError(f"cannot read database {self.shown}: {describe(e)}") from e

    def close(self) -> None:
        self._engine.dispose()


class ExportSource(BestSource):
    """An export file, read whole into memory; its entries say in which modes each is served."""

    def __init__(self, path: Path) -> None:
        from syncopate.results_db.transfer import read_export

        self.shown = str(path)
        self._entries = read_export(path)

    def shapes(self, kind: str, dtype: str) -> list[ShapeRef]:
        found = {
            e.workload.key(): e.workload
            for e in self._entries
            if e.workload.kind == kind and e.workload.dtype == dtype
        }
        return [ShapeRef(key, w.shape, w) for key, w in found.items()]

    def moe_workloads(self, kind: str, dtype: str) -> list[ShapeRef]:
        found = {
            e.workload.key(): e.workload
            for e in self._entries
            if isinstance(e.workload, MoeWorkload) and e.workload.kind == kind and e.workload.dtype == dtype
        }
        return [ShapeRef(key, None, w) for key, w in found.items()]

    def topologies(self) -> list[Topology]:
        return list({e.topology.key(): e.topology for e in self._entries}.values())

    def served(
        self, shape: ShapeRef, topology: Topology, environment_key: str, *, environment: str, mode: str
    ) -> Served | None:
        _check_environment(environment)
        found = [
            e
            for e in self._entries
            if e.workload.key() == shape.ref
            and e.topology.key() == topology.key()
            and mode in e.served_in
            and (environment == "any" or (e.environment.key() == environment_key) == (environment == "same"))
            and (mode != "graph" or replays_in_graph(e.candidate))
        ]
        if not found:
            return None
        e = min(found, key=lambda e: (e.rank_key(mode), e.trial_id))
        hit = Hit(
            trial_id=e.trial_id,
            candidate=e.candidate,
            median_us=e.median_us,
            eager_us=e.eager_us,
            host_us=e.host_us,
            environment=e.environment,
        )
        return Served(
            hit=hit, objective=objective(mode, e.eager_us), guard=e.guards.get(mode, ""), tuned=None
        )

    def holdings(self) -> Holdings:
        kinds: dict[str, int] = {}
        topologies: dict[str, int] = {}
        environments: dict[str, int] = {}
        names: dict[str, str] = {}
        for e in self._entries:
            kind = f"{e.workload.kind}/{e.workload.dtype}"
            kinds[kind] = kinds.get(kind, 0) + 1
            topologies[e.topology.key()] = topologies.get(e.topology.key(), 0) + 1
            environments[e.environment.key()] = environments.get(e.environment.key(), 0) + 1
            names[e.environment.key()] = e.environment.short()
        return Holdings(
            unit="exported configuration",
            total=len(self._entries),
            kinds=kinds,
            topologies=topologies,
            environments=environments,
            environment_names=names,
        )


def _is_export_file(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            head = f.read(64)
    except OSError:
        return path.suffix.lower() == ".json"
    if head.startswith(SQLITE_HEADER):  # a database, whatever its name
        return False
    return path.suffix.lower() == ".json" or head.lstrip()[:1] == b"{"


def open_source(db: str | os.PathLike[str] | None) -> BestSource:
    """The source for a `db` value: an export file, a SQLite file, or a database URL.

    The per-user default that does not exist yet (or holds no tables) reads as empty, and nothing is
    created; an explicit path that does not exist, or a database without our tables or at another
    schema revision, raises with what to run.
    """
    location = locate(db)
    path = location.sqlite_path
    if location.dialect != "sqlite":
        return SqlAlchemySource(location)
    if path is None:
        raise DatabaseError(f"database {location.subject()} is in memory: lookup needs a file or a server")
    if not path.exists():
        if location.is_default:
            return _EmptySource(location.shown())
        if "://" not in location.given and path.suffix.lower() == ".json":
            raise LookupFailedError(
                f"export file {path} does not exist: check the path, or write it with `syncopate export --out {path}`"
            )
        raise missing_error(location)
    if "://" not in location.given and not path.is_dir() and _is_export_file(path):
        return ExportSource(path)
    check_sqlite_file(location)
    source = SqliteSource(path, location.shown())
    try:
        revision = source.revision()
        if revision is None and location.is_default and not source.has_tables():
            source.close()
            return _EmptySource(location.shown())
        if revision is None:
            raise no_tables_error(location)
        check_revision(revision, location, read=True)
    except BaseException:
        source.close()
        raise
    return source
