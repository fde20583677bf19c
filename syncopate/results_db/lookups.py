"""`syncopate.lookup`: the configuration to run for a shape and topology, at job start.

```python
import syncopate

result = syncopate.lookup((8192, 4096, 8192), "H200x2-nvlink")     # kind="ag_gemm", dtype=bf16, mode="eager"
result.candidate, result.match, result.reason, result.trial_id, result.eager_us
```

The mode says how the job calls the op (:data:`~syncopate.records.MODES`): `eager` (the default:
calls back to back, the host on the path; trials rank by `eager_us`, or by device time where a
workload's trials have no eager figure, which the result's `objective` then says) or `graph` (calls
replayed from CUDA graphs; trials rank by device time, `median_us`).

What a rung serves of the trials of one shape, topology and environment is
:func:`~syncopate.records.pick`: the fastest tuned trial in the mode, unless the untuned default's
or the unfused template's trial there is faster in that mode; then that guard is served (`guard`
says which, `reason` says why): a configuration slower in the job's mode than either is never served.

The ladder, first rung that answers wins (the result's `match` says which, `reason` says why):

1. `exact`: this kind, shape, dtype, topology and environment;
2. `nearest_shape`: same kind, dtype, topology and environment, at the stored shape nearest by
   log-distance over (M, N, K), sqrt(Σ ln²(a/b));
3. `other_environment`: same topology under another environment fingerprint (exact shape first,
   then by distance; the fastest there), logged as a warning — results from another fingerprint are
   never served silently;
4. `other_topology`: the closest stored topology of the same GPU count and nodes, another GPU model
   (same interconnect first, then any; closeness by GPU rates, SMs and link bandwidth), any
   environment, shapes by distance; logged as a warning;
5. `cost_model`: the cost model's pick for the shape on the asked topology, among `syncopate
   bench`'s `tiny` grid and the guards, ranked in the mode (device time, or the larger of device
   and host time in mode eager), from the calibrations the database holds for the topology, else
   the documented defaults. Only a calibration measured on the topology (`syncopate calibrate`)
   lets it serve a fused configuration: from leads of other machines its predictions have erred
   by up to 2× (docs/search.md, "Where nothing is measured"), so it serves unfused, torch's own
   path, which cannot be slower than torch. The model is imported on this rung only (numpy; no torch);
6. `default`: :func:`~syncopate.search_space.default_candidate`, where nothing above answers (a
   GPU model the cost model has no figures for). Its result says what the database holds instead.

A stored configuration is only served if it is valid for the shape asked for
(:func:`~syncopate.search_space.check_candidate`); an invalid one moves the search to the next shape.
Mode `graph` serves, on every rung, only configurations whose calls replay from a CUDA graph
(:attr:`~syncopate.search_space.Candidate.replays_in_graph`: not the `nccl` backend's chunk plans).

Every answer is cached for the life of the process, per mode (a repeat lookup costs microseconds; a
changed database is seen by a new process, or after :func:`clear_cache`). Bad arguments raise
ConfigError before any database is touched. On SQLite the first lookup reads the file read-only
through the standard library and creates nothing; a database at an older schema revision is read
as it is (no eager figures there).
"""

from __future__ import annotations

import logging
import math
import os
import threading
from dataclasses import dataclass
from typing import Any

from syncopate.environment import GLUON_VAR
from syncopate.errors import CalibrationError, ConfigError, RuntimeUnavailableError
from syncopate.platform import detect_topology
from syncopate.records import (
    DEFAULT_MODE,
    OBJECTIVE_EAGER,
    OBJECTIVE_NO_EAGER,
    CalibrationRecord,
    Environment,
    check_mode,
)
from syncopate.results_db.readers import BestSource, Holdings, Served, ShapeRef, open_source
from syncopate.results_db.urls import ENV_VAR, locate
from syncopate.search_space import (
    DEFAULT_BACKENDS,
    Candidate,
    Shape,
    Topology,
    Workload,
    bench_grid,
    check_candidate,
    default_candidate,
    guard_candidates,
    unfused_candidate,
)

__all__ = ["MATCHES", "LookupResult", "clear_cache", "lookup", "shape_distance", "topology_distance"]

log = logging.getLogger(__name__)

MATCHES: tuple[str, ...] = (
    "exact",
    "nearest_shape",
    "other_environment",
    "other_topology",
    "cost_model",
    "default",
)
"""The rungs of the ladder, best first."""

_CACHE_LIMIT = 4096


_GUARD_NAMES = {
    "default": "the untuned default",
    "unfused": "the unfused op (torch's matmul, then its collective)",
}


@dataclass(frozen=True, kw_only=True, slots=True)
class LookupResult:
    """What :func:`lookup` found, and why."""

    candidate: Candidate
    """The configuration to run."""
    match: str
    """The rung it came from, one of :data:`MATCHES`."""
    trial_id: int | None
    """The stored trial it came from (None for `cost_model` and `default`)."""
    time_us: float | None
    """That trial's device time (median), µs, on `measured_on` (None without a trial)."""
    workload: Workload
    """What was asked for."""
    topology: Topology
    measured_on: Workload | None = None
    """The workload the trial measured (the nearest shape for `nearest_shape`)."""
    environment: Environment | None = None
    """The environment the trial was measured under (another one for `other_environment`)."""
    database: str = ""
    """Where it was found (URL with the password hidden, or the export file)."""
    mode: str = DEFAULT_MODE
    """The mode asked for: `eager` or `graph`."""
    objective: str = ""
    """What ranked the answer: `eager`, `device`, `device (no eager measurement)`, `eager (predicted)`
    or `device (predicted)`; '' for `default`."""
    eager_us: float | None = None
    """The trial's back-to-back eager time per call, µs (None without a trial, or not measured)."""
    host_us: float | None = None
    """The trial's host time to enqueue one call, µs (None without a trial, or not measured)."""
    measured_topology: Topology | None = None
    """The topology the trial was measured on (another one for `other_topology`)."""
    guard: str = ""
    """`default` or `unfused` where that guard is served, being faster in the mode than every tuned
    candidate; '' otherwise."""
    predicted_us: float | None = None
    """The cost model's prediction in the mode, µs (`cost_model` only)."""
    reason: str = ""
    """Why this rung answered, in words."""
    holdings: Holdings | None = None
    """What the database holds (`cost_model` and `default`, where nothing measured answered)."""

    def to_dict(self) -> dict[str, Any]:
        """What `syncopate lookup --json` prints: candidate, match, mode, objective, reason, trial_id
        and time_us; where a trial answered, its eager and host times, the shape (`measured_on`,
        MxNxK), topology and environment it was measured on, and the guard served if one was; for
        `cost_model` the prediction; for `cost_model` and `default` what the database holds."""
        d: dict[str, Any] = {
            "candidate": self.candidate.to_dict(),
            "match": self.match,
            "mode": self.mode,
            "objective": self.objective,
            "reason": self.reason,
            "trial_id": self.trial_id,
            "time_us": self.time_us,
        }
        if self.trial_id is not None:
            d["eager_us"] = self.eager_us
            d["host_us"] = self.host_us
        if self.measured_on is not None:
            d["measured_on"] = self.measured_on.shape.key()
        if self.measured_topology is not None:
            d["measured_topology"] = self.measured_topology.key()
        if self.environment is not None:
            d["environment"] = self.environment.key()
            d["environment_versions"] = self.environment.short()
        if self.guard:
            d["guard"] = self.guard
        if self.predicted_us is not None:
            d["predicted_us"] = self.predicted_us
        if self.holdings is not None:
            d["database_holds"] = self.holdings.to_dict()
        return d


def shape_distance(a: Shape, b: Shape) -> float:
    """Log-distance between two shapes: sqrt(ln²(Ma/Mb) + ln²(Na/Nb) + ln²(Ka/Kb))."""
    return math.sqrt(sum(math.log(x / y) ** 2 for x, y in zip(a.as_tuple(), b.as_tuple())))


def topology_distance(asked: Topology, other: Topology) -> tuple[int, float, str]:
    """Sort key of `other` as a stand-in for `asked` (same GPU count and nodes): another
    interconnect after the same one, then the log-distance of the GPUs' bf16 rates, memory
    bandwidths and SM counts and of the links' bandwidths; the key breaks ties."""
    a, b = asked.spec, other.spec
    pairs = (
        (a.bf16_tflops, b.bf16_tflops),
        (a.hbm_gbps, b.hbm_gbps),
        (asked.sm_count, other.sm_count),
        (asked.link_gbps, other.link_gbps),
    )
    far = sum(abs(math.log(x / y)) for x, y in pairs if x > 0 and y > 0)
    return (0 if other.interconnect == asked.interconnect else 1, far, other.key())


def _us(value: float | None) -> str:
    return f"{value:.1f} µs" if value is not None else "not measured"


def _in_mode(objective: str, median_us: float | None, eager_us: float | None) -> str:
    if objective == OBJECTIVE_EAGER:
        return f"{_us(eager_us)} a call eager"
    return f"{_us(median_us)} on the device"


def _ranked(objective: str, median_us: float | None, eager_us: float | None) -> str:
    if objective == OBJECTIVE_EAGER:
        return f"ranked by eager time ({_us(eager_us)} a call back to back, the host on the path)"
    if objective == OBJECTIVE_NO_EAGER:
        return f"ranked by device time ({_us(median_us)}): no eager time was measured for it"
    return f"ranked by device time ({_us(median_us)})"


class _Ladder:
    """One lookup's climb down the rungs."""

    def __init__(
        self, source: BestSource, workload: Workload, topology: Topology, environment: Environment, mode: str
    ) -> None:
        self.source, self.workload, self.topology, self.environment, self.mode = (
            source,
            workload,
            topology,
            environment,
            mode,
        )
        target = workload.shape
        self.refs = sorted(
            source.shapes(workload.kind, workload.dtype),
            key=lambda r: (shape_distance(r.shape, target), r.shape.as_tuple()),
        )

    # -- the rungs ------------------------------------------------------------------------------

    def climb(self) -> LookupResult:
        topo, env_key = self.topology, self.environment.key()
        for ref in self.refs:
            served = self.source.served(ref, topo, env_key, environment="same", mode=self.mode)
            found = self._answer(
                ref, served, topo, "exact" if ref.shape == self.workload.shape else "nearest_shape"
            )
            if found is not None:
                return found
        for ref in self.refs:
            served = self.source.served(ref, topo, env_key, environment="other", mode=self.mode)
            found = self._answer(ref, served, topo, "other_environment")
            if found is not None:
                log.warning(
                    "lookup %s on %s: nothing measured under this environment (%s); serving trial %d of %s "
                    "measured under another (%s)",
                    self.workload,
                    topo.key(),
                    self.environment.short(),
                    found.trial_id,
                    ref.shape,
                    found.environment.short(),
                )
                return found
        if self.refs:
            for other in self._nearby_topologies():
                for ref in self.refs:
                    served = self.source.served(ref, other, env_key, environment="any", mode=self.mode)
                    found = self._answer(ref, served, other, "other_topology")
                    if found is not None:
                        log.warning("lookup %s on %s: %s", self.workload, topo.key(), found.reason)
                        return found
        holdings = self.source.holdings()
        if (
            self.refs
        ):  # measured elsewhere, or only predicted here: a topology key that differs from the sweep's?
            log.warning(
                "lookup %s on %s: %s holds %d %s %s shape(s) but no measured trial of them on %s or a topology "
                "like it. If this job runs where a sweep ran, compare its topology key with this one (a "
                "detected topology, or the key given)",
                self.workload,
                topo.key(),
                self.source.shown or "the database",
                len(self.refs),
                self.workload.kind,
                self.workload.dtype,
                topo.key(),
            )
        modelled, why_not = self._cost_model(holdings)
        if modelled is not None:
            return modelled
        return LookupResult(
            candidate=default_candidate(self.workload, topo),
            match="default",
            trial_id=None,
            time_us=None,
            workload=self.workload,
            topology=topo,
            database=self.source.shown,
            mode=self.mode,
            reason=(
                f"{self._nothing_measured()}, and the cost model cannot predict here ({why_not}): the "
                f"documented default; `syncopate tune` measures this workload. The database holds "
                f"{holdings.describe()}"
            ),
            holdings=holdings,
        )

    def _nearby_topologies(self) -> list[Topology]:
        asked = self.topology
        others = [
            t
            for t in self.source.topologies()
            if t.world_size == asked.world_size and t.nodes == asked.nodes and t.key() != asked.key()
        ]
        return sorted(others, key=lambda t: topology_distance(asked, t))

    # -- answers --------------------------------------------------------------------------------

    def _served_candidate(self, served: Served) -> Candidate:
        """The configuration an answer runs: the trial's, or, where a guard is served, that guard for
        the shape and topology asked (the default of another shape is not this shape's default)."""
        if served.guard == "default":
            return default_candidate(self.workload, self.topology)
        if served.guard == "unfused":
            return unfused_candidate()
        return served.hit.candidate

    def _answer(
        self, ref: ShapeRef, served: Served | None, measured_topology: Topology, match: str
    ) -> LookupResult | None:
        if served is None:
            return None
        candidate = self._served_candidate(served)
        try:
            check_candidate(candidate, self.workload, self.topology)
        except ConfigError as e:
            log.debug(
                "trial %d of %s on %s does not fit %s on %s: %s",
                served.hit.trial_id,
                ref.shape,
                measured_topology.key(),
                self.workload,
                self.topology.key(),
                e,
            )
            return None
        hit = served.hit
        measured_on = Workload(kind=self.workload.kind, shape=ref.shape, dtype=self.workload.dtype)
        return LookupResult(
            candidate=candidate,
            match=match,
            trial_id=hit.trial_id,
            time_us=hit.median_us,
            workload=self.workload,
            topology=self.topology,
            measured_on=measured_on,
            environment=hit.environment,
            database=self.source.shown,
            mode=self.mode,
            objective=served.objective,
            eager_us=hit.eager_us,
            host_us=hit.host_us,
            measured_topology=measured_topology,
            guard=served.guard,
            reason=self._reason(match, ref, served, measured_topology),
        )

    def _reason(self, match: str, ref: ShapeRef, served: Served, measured_topology: Topology) -> str:
        hit, topo = served.hit, self.topology.key()
        shape = ref.shape.key()
        distance = shape_distance(ref.shape, self.workload.shape)
        if match == "exact":
            why = f"measured: trial {hit.trial_id} of this shape on {topo} under this environment"
        elif match == "nearest_shape":
            why = (
                f"no trial of this shape on {topo} under this environment; nearest measured shape {shape} at "
                f"log-distance {distance:.2f}, trial {hit.trial_id}"
            )
        elif match == "other_environment":
            where = (
                "this shape"
                if ref.shape == self.workload.shape
                else f"nearest shape {shape} (log-distance {distance:.2f})"
            )
            why = (
                f"nothing measured on {topo} under this environment ({self.environment.short()}); trial "
                f"{hit.trial_id} of {where} measured under another ({hit.environment.short()})"
            )
        else:
            other = measured_topology
            alike = (
                "same GPU count and interconnect"
                if other.interconnect == self.topology.interconnect
                else "same GPU count, another interconnect"
            )
            where = (
                "this shape"
                if ref.shape == self.workload.shape
                else f"shape {shape} (log-distance {distance:.2f})"
            )
            why = (
                f"nothing measured on {topo}; closest measured topology {other.key()} ({alike}, {other.gpu_model} "
                f"GPUs): trial {hit.trial_id} of {where}, under {hit.environment.short()}"
            )
        why += f"; {_ranked(served.objective, hit.median_us, hit.eager_us)}"
        if served.guard:
            guard = _GUARD_NAMES[served.guard]
            if served.tuned is None:
                why += (
                    f"; {guard} is served: no tuned candidate measured there is as fast in mode {self.mode}"
                )
            else:
                t = served.tuned
                why += (
                    f"; {guard} is served: the fastest tuned candidate there (trial {t.trial_id}, "
                    f"{_in_mode(served.objective, t.median_us, t.eager_us)}) is slower in mode {self.mode}"
                )
        return why

    def _nothing_measured(self) -> str:
        topo = self.topology.key()
        if not self.refs:
            where = self.source.shown or "the database"
            return f"nothing of {self.workload.kind}/{self.workload.dtype} is measured in {where}"
        return (
            f"no measured trial of {self.workload.kind}/{self.workload.dtype} on {topo} or another topology of "
            f"{self.topology.world_size} GPUs fits this shape"
        )

    # -- the cost model -------------------------------------------------------------------------

    def _cost_model(self, holdings: Holdings) -> tuple[LookupResult | None, str]:
        """The cost model's pick, or None and why it cannot answer."""
        try:
            from syncopate.cost_model.host_time import candidate_host_us, eager_us
            from syncopate.cost_model.model import CostModel
        except ImportError as e:
            return None, f"the cost model is not available: {e}"
        try:
            calibration = source_calibration(self.source, self.topology, self.environment)
        except CalibrationError as e:
            return None, str(e)
        model = CostModel(calibration)
        guards = guard_candidates(self.workload, self.topology)
        found: dict[str, Candidate] = {}
        for c in [
            *guards.values(),
            *bench_grid(self.workload, self.topology, "tiny", DEFAULT_BACKENDS),
        ]:
            found.setdefault(c.key(), c)
        scored = []
        for c in found.values():
            if self.mode == "graph" and not c.replays_in_graph:
                continue
            try:
                p = model.predict(self.workload, self.topology, c)
            except (ConfigError, CalibrationError) as e:
                log.debug("the cost model passes over %s: %s", c.short(), e)
                continue
            if not p.feasible or not math.isfinite(p.time_us):
                continue
            host = candidate_host_us(self.workload, self.topology.world_size, c)
            score = p.time_us if self.mode == "graph" else eager_us(p.time_us, host)
            scored.append((score, c))
        if not scored:
            return None, f"no candidate of {len(found)} it ranks can run on {self.topology.key()}"
        score, best = min(scored, key=lambda sc: sc[0])
        among = f"the cost model's pick among {len(scored)} candidates (the `tiny` grid and the references)"
        unfused = guards["unfused"]
        unfused_score = next((sc for sc, c in scored if c == unfused), None)
        best, score, pick = guarded_pick(
            among, self.mode, calibration, (best, score), (unfused, unfused_score)
        )
        objective = "device (predicted)" if self.mode == "graph" else "eager (predicted)"
        reason = f"{self._nothing_measured()}: {pick}. The database holds {holdings.describe()}"
        return LookupResult(
            candidate=best,
            match="cost_model",
            trial_id=None,
            time_us=None,
            workload=self.workload,
            topology=self.topology,
            database=self.source.shown,
            mode=self.mode,
            objective=objective,
            predicted_us=score,
            reason=reason,
            holdings=holdings,
        ), ""


def source_calibration(source: Any, topology: Topology, environment: Environment):
    """The calibration the cost-model rungs predict from: the parts `source` holds measured for
    `topology`, the documented defaults for the rest (CalibrationError where neither answers)."""
    from syncopate.cost_model.calibration import resolve_calibration

    records = source.calibration_records()
    stored = _StoredCalibrations(records, source.shown) if records else None
    return resolve_calibration(topology, environment, stored, "auto")


def guarded_pick(
    among: str, mode: str, calibration: Any, best: tuple[Any, float], unfused: tuple[Any, float | None]
) -> tuple[Any, float, str]:
    """(candidate, its predicted µs in `mode`, the sentence that says why) a cost-model rung serves:
    the model's `best` (candidate, µs), except where `calibration` is not measured on the topology
    and the pick is not `unfused` (candidate, µs or None where unranked): then unfused, torch's own
    path, the sentence naming what the model would have picked. `among` opens the sentence."""
    (pick, score), (plain, plain_score) = best, unfused
    where = "on the device" if mode == "graph" else "eager"
    if pick != plain and plain_score is not None and calibration.source != "measured":
        return (
            plain,
            plain_score,
            f"{among} would be {pick.short()}, predicted {score:.1f} µs {where} against unfused's "
            f"{plain_score:.1f} µs, from the {calibration.describe()}; that calibration is not measured "
            f"on this topology, so unfused, torch's own path, is served until `syncopate calibrate` or a "
            f"tune measures it",
        )
    return pick, score, f"{among}, predicted {score:.1f} µs {where} from the {calibration.describe()}"


class _StoredCalibrations:
    """The measured calibrations a source holds, as :func:`resolve_calibration` reads a database."""

    def __init__(self, records: list[CalibrationRecord], url: str) -> None:
        self._records = records
        self.url = url

    def calibrations(self, *, kind: str | None = None, topology: Topology | None = None) -> list[Any]:
        return [
            _Stored(r)
            for r in self._records
            if (kind is None or r.kind == kind) and (topology is None or r.topology.key() == topology.key())
        ]


@dataclass(frozen=True, slots=True)
class _Stored:
    record: CalibrationRecord


class TopologyUndetected(RuntimeUnavailableError):
    """Raised by a lookup without a topology where this process cannot detect one; `reason` says
    why, for a caller that words the remedy its own way (the CLI names `--topology`)."""

    def __init__(self, reason: str) -> None:
        super().__init__(
            f"cannot detect the topology here ({reason}): pass topology=KEY, such as topology='H200x2-nvlink'"
        )
        self.reason = reason


def _detect_topology() -> Topology:
    try:
        return detect_topology()
    except ImportError as e:
        reason = f"the topology detector is not available: {e}"
    except RuntimeUnavailableError as e:
        reason = getattr(e, "reason", str(e))
    raise TopologyUndetected(reason)


class _Resolver:
    """The lookup cache and the sources it has opened; one per process (see :func:`clear_cache`)."""

    def __init__(self) -> None:
        self._answers: dict[Any, LookupResult] = {}
        self.moe_answers: dict[Any, Any] = {}
        """`lookup_moe`'s answers (`syncopate.results_db.moe_lookups`), which share the sources,
        the detected topology and the lock."""
        self._sources: dict[str, BestSource] = {}
        self._detected: Topology | None = None
        self._lock = threading.Lock()

    def lookup(
        self,
        shape: Any,
        topology: Any,
        kind: str,
        dtype: Any,
        db: Any,
        environment: Environment | None,
        mode: Any,
    ) -> LookupResult:
        # the dims' types are part of the key: 8192.0 == 8192, but only 8192 is a dim
        dims = tuple((type(v), v) for v in shape) if isinstance(shape, tuple) else shape
        raw = (
            dims,
            topology,
            kind,
            dtype,
            db,
            environment,
            mode,
            os.environ.get(ENV_VAR) if db is None else None,
            os.environ.get(GLUON_VAR) if environment is None else None,
        )  # this process's fingerprint
        try:
            answer = self._answers.get(raw)
        except TypeError:  # an unhashable argument (a list shape): no fast path
            raw, answer = None, None
        if answer is not None:
            return answer
        with self._lock:
            answer = self._resolve(shape, topology, kind, dtype, db, environment, mode)
            if len(self._answers) >= _CACHE_LIMIT:
                self._answers.clear()
            if raw is not None:
                self._answers[raw] = answer
        return answer

    def _resolve(
        self,
        shape: Any,
        topology: Any,
        kind: str,
        dtype: Any,
        db: Any,
        environment: Environment | None,
        mode: Any,
    ) -> LookupResult:
        mode = check_mode(mode)
        workload = Workload(kind=kind, shape=Shape.of(shape), dtype=dtype)
        topo = self.topology(topology)
        workload.check_world_size(topo.world_size)
        if environment is None:
            environment = Environment.current()
        elif not isinstance(environment, Environment):
            raise ConfigError(f"environment {environment!r} is not an Environment")
        return _Ladder(self.source(db), workload, topo, environment, mode).climb()

    def topology(self, topology: Any) -> Topology:
        """`topology` as a Topology; None: this machine's, detected once."""
        if topology is not None:
            return Topology.of(topology)
        if self._detected is None:
            self._detected = _detect_topology()
        return self._detected

    def source(self, db: Any) -> BestSource:
        """The opened source of `db`, one a location, kept until `clear` (the caller holds the lock)."""
        location = locate(db)
        source = self._sources.get(location.url)
        if source is None:
            source = self._sources[location.url] = open_source(db)
        return source

    def clear(self) -> None:
        with self._lock:
            for source in self._sources.values():
                source.close()
            self._sources.clear()
            self._answers.clear()
            self.moe_answers.clear()
            self._detected = None


_resolver = _Resolver()


def lookup(
    shape: Shape | tuple[int, int, int],
    topology: Topology | str | None = None,
    *,
    kind: str = "ag_gemm",
    dtype: Any = "bf16",
    db: str | os.PathLike[str] | None = None,
    environment: Environment | None = None,
    mode: str = DEFAULT_MODE,
) -> LookupResult:
    """The configuration to run for `shape` on `topology` (see the module docstring).

    shape: a Shape or (M, N, K), global GEMM dims. topology: a Topology, its key such as
    `H200x2-nvlink`, or None to detect the current one. kind: `ag_gemm`, `gemm_rs` or `gemm_ar`.
    dtype: torch.bfloat16 (the default, also spelled `bf16`), torch.float16 / `fp16`,
    torch.float32 / `fp32`, torch.float8_e4m3fn / `fp8`. db: a database URL, a SQLite path or an export file (None:
    SYNCOPATE_DB, else the per-user default). environment: the fingerprint to match (None: this
    process's, which imports torch). mode: `eager` (calls back to back, the host on the path; the
    default) or `graph` (calls replayed from CUDA graphs).
    """
    return _resolver.lookup(shape, topology, kind, dtype, db, environment, mode)


def clear_cache() -> None:
    """Forget every cached answer (MoE lookups' too) and close the sources lookups have opened."""
    _resolver.clear()
