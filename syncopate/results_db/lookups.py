"""`syncopate.lookup`: the best known configuration for a shape and topology, at job start.

```python
import syncopate

result = syncopate.lookup((8192, 4096, 8192), "H200x2-nvlink")     # kind="ag_gemm", dtype=bf16
result.candidate, result.match, result.trial_id, result.time_us
```

The ladder, first rung that answers wins (the result's `match` says which):

1. `exact`: the fastest `ok`, `measured` trial of this kind, shape, dtype, topology and environment;
2. `nearest_shape`: same kind, dtype, topology and environment, at the stored shape nearest by
   log-distance over (M, N, K), sqrt(Σ ln²(a/b));
3. `other_environment`: same topology under another environment fingerprint (exact shape first,
   then by distance; the fastest there), logged as a warning — results from another fingerprint are
   never served silently;
4. `default`: :func:`~syncopate.search_space.default_candidate` (no trial, no time).

A stored configuration is only served if it is valid for the shape asked for
(:func:`~syncopate.search_space.check_candidate`); an invalid one moves the search to the next shape.

Every answer is cached for the life of the process (a repeat lookup costs microseconds; a changed
database is seen by a new process, or after :func:`clear_cache`). Bad arguments raise ConfigError
before any database is touched. On SQLite the first lookup reads the file read-only through the
standard library and creates nothing.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from dataclasses import dataclass
from typing import Any

from syncopate.environment import GLUON_VAR
from syncopate.errors import ConfigError, RuntimeUnavailableError
from syncopate.records import Environment
from syncopate.results_db.readers import BestSource, Hit, ShapeRef, open_source
from syncopate.results_db.urls import ENV_VAR, locate
from syncopate.search_space import Candidate, Shape, Topology, Workload, check_candidate, default_candidate

__all__ = ["MATCHES", "LookupResult", "clear_cache", "lookup", "shape_distance"]

log = logging.getLogger(__name__)

MATCHES: tuple[str, ...] = ("exact", "nearest_shape", "other_environment", "default")
"""The rungs of the ladder, best first."""

_CACHE_LIMIT = 4096


@dataclass(frozen=True, kw_only=True, slots=True)
class LookupResult:
    """What :func:`lookup` found."""

    candidate: Candidate
    """The configuration to run."""
    match: str
    """The rung it came from, one of :data:`MATCHES`."""
    trial_id: int | None
    """The stored trial it came from (None for `default`)."""
    time_us: float | None
    """That trial's measured median, µs, on `measured_on` (None for `default`)."""
    workload: Workload
    """What was asked for."""
    topology: Topology
    measured_on: Workload | None = None
    """The workload the trial measured (the nearest shape for `nearest_shape`)."""
    environment: Environment | None = None
    """The environment the trial was measured under (another one for `other_environment`)."""
    database: str = ""
    """Where it was found (URL with the password hidden, or the export file)."""

    def to_dict(self) -> dict[str, Any]:
        """What `syncopate lookup --json` prints: candidate, match, trial_id, time_us, and where a
        trial answered, the shape it measured (`measured_on`, MxNxK) and its environment's key."""
        d: dict[str, Any] = {"candidate": self.candidate.to_dict(), "match": self.match, "trial_id": self.trial_id,
                             "time_us": self.time_us}
        if self.measured_on is not None:
            d["measured_on"] = self.measured_on.shape.key()
        if self.environment is not None:
            d["environment"] = self.environment.key()
        return d


def shape_distance(a: Shape, b: Shape) -> float:
    """Log-distance between two shapes: sqrt(ln²(Ma/Mb) + ln²(Na/Nb) + ln²(Ka/Kb))."""
    return math.sqrt(sum(math.log(x / y) ** 2 for x, y in zip(a.as_tuple(), b.as_tuple())))


def _climb(source: BestSource, workload: Workload, topology: Topology, environment: Environment) -> LookupResult:
    target = workload.shape
    refs = sorted(source.shapes(workload.kind, workload.dtype),
                  key=lambda r: (shape_distance(r.shape, target), r.shape.as_tuple()))
    topo_key, env_key = topology.key(), environment.key()

    def usable(ref: ShapeRef, hit: Hit | None) -> bool:
        if hit is None:
            return False
        try:
            check_candidate(hit.candidate, workload, topology)
        except ConfigError as e:
            log.debug("trial %d of %s does not fit %s: %s", hit.trial_id, ref.shape, workload, e)
            return False
        return True

    def result(ref: ShapeRef, hit: Hit, match: str) -> LookupResult:
        return LookupResult(
            candidate=hit.candidate, match=match, trial_id=hit.trial_id, time_us=hit.median_us,
            workload=workload, topology=topology,
            measured_on=Workload(kind=workload.kind, shape=ref.shape, dtype=workload.dtype),
            environment=hit.environment, database=source.shown,
        )

    for ref in refs:
        hit = source.fastest(ref, topo_key, env_key, same_environment=True)
        if usable(ref, hit):
            return result(ref, hit, "exact" if ref.shape == target else "nearest_shape")
    for ref in refs:
        hit = source.fastest(ref, topo_key, env_key, same_environment=False)
        if usable(ref, hit):
            log.warning(
                "lookup %s on %s: nothing measured under this environment (%s); serving trial %d of %s "
                "measured under another (%s)", workload, topo_key, environment.short(), hit.trial_id,
                ref.shape, hit.environment.short(),
            )
            return result(ref, hit, "other_environment")
    if refs:  # measured elsewhere, or only predicted here: a topology key that differs from the sweep's?
        log.warning(
            "lookup %s on %s: %s holds %d %s %s shape(s) but no measured trial of them on %s; serving the "
            "default configuration. If this job runs where a sweep ran, compare its topology key with this "
            "one (a detected topology, or the key given)", workload, topo_key, source.shown or "the database",
            len(refs), workload.kind, workload.dtype, topo_key,
        )
    return LookupResult(candidate=default_candidate(workload, topology), match="default", trial_id=None,
                        time_us=None, workload=workload, topology=topology, database=source.shown)


class TopologyUndetected(RuntimeUnavailableError):
    """Raised by a lookup without a topology where this process cannot detect one; `reason` says
    why, for a caller that words the remedy its own way (the CLI names `--topology`)."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"cannot detect the topology here ({reason}): pass topology=KEY, such as "
                         f"topology='H200x2-nvlink'")
        self.reason = reason


def _detect_topology() -> Topology:
    try:
        return Topology.detect()
    except ImportError as e:
        reason = f"the topology detector is not available: {e}"
    except RuntimeUnavailableError as e:
        reason = getattr(e, "reason", str(e))
    raise TopologyUndetected(reason)


class _Resolver:
    """The lookup cache and the sources it has opened; one per process (see :func:`clear_cache`)."""

    def __init__(self) -> None:
        self._answers: dict[Any, LookupResult] = {}
        self._sources: dict[str, BestSource] = {}
        self._detected: Topology | None = None
        self._lock = threading.Lock()

    def lookup(self, shape: Any, topology: Any, kind: str, dtype: Any, db: Any,
               environment: Environment | None) -> LookupResult:
        # the dims' types are part of the key: 8192.0 == 8192, but only 8192 is a dim
        dims = tuple((type(v), v) for v in shape) if isinstance(shape, tuple) else shape
        raw = (dims, topology, kind, dtype, db, environment, os.environ.get(ENV_VAR) if db is None else None,
               os.environ.get(GLUON_VAR) if environment is None else None)  # this process's fingerprint
        try:
            answer = self._answers.get(raw)
        except TypeError:  # an unhashable argument (a list shape): no fast path
            raw, answer = None, None
        if answer is not None:
            return answer
        with self._lock:
            answer = self._resolve(shape, topology, kind, dtype, db, environment)
            if len(self._answers) >= _CACHE_LIMIT:
                self._answers.clear()
            if raw is not None:
                self._answers[raw] = answer
        return answer

    def _resolve(self, shape: Any, topology: Any, kind: str, dtype: Any, db: Any,
                 environment: Environment | None) -> LookupResult:
        workload = Workload(kind=kind, shape=Shape.of(shape), dtype=dtype)
        if topology is None:
            if self._detected is None:
                self._detected = _detect_topology()
            topo = self._detected
        else:
            topo = Topology.of(topology)
        workload.check_world_size(topo.world_size)
        if environment is None:
            environment = Environment.current()
        elif not isinstance(environment, Environment):
            raise ConfigError(f"environment {environment!r} is not an Environment")
        location = locate(db)
        source = self._sources.get(location.url)
        if source is None:
            source = open_source(db)
            self._sources[location.url] = source
        return _climb(source, workload, topo, environment)

    def clear(self) -> None:
        with self._lock:
            for source in self._sources.values():
                source.close()
            self._sources.clear()
            self._answers.clear()
            self._detected = None


_resolver = _Resolver()


def lookup(shape: Shape | tuple[int, int, int], topology: Topology | str | None = None, *,
           kind: str = "ag_gemm", dtype: Any = "bf16", db: str | os.PathLike[str] | None = None,
           environment: Environment | None = None) -> LookupResult:
    """The best known configuration for `shape` on `topology` (see the module docstring).

    shape: a Shape or (M, N, K), global GEMM dims. topology: a Topology, its key such as
    `H200x2-nvlink`, or None to detect the current one. kind: `ag_gemm`, `gemm_rs` or `gemm_ar`.
    dtype: torch.bfloat16 (the default, also spelled `bf16`), torch.float16 / `fp16`,
    torch.float32 / `fp32`. db: a database URL, a SQLite path or an export file (None:
    SYNCOPATE_DB, else the per-user default). environment: the fingerprint to match (None: this
    process's, which imports torch).
    """
    return _resolver.lookup(shape, topology, kind, dtype, db, environment)


def clear_cache() -> None:
    """Forget every cached answer and close the sources lookups have opened."""
    _resolver.clear()
