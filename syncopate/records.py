"""What a measurement produces: trials, baselines and calibrations, as plain values, each stamped
with the environment fingerprint (:class:`~syncopate.environment.Environment`, re-exported here).

These are what runners return and what the results database stores; they carry no database or
torch state. Times are in microseconds.

A trial has three times: its device time (`median_us`, p20/p80 and samples: the op's time on the
GPUs, as a job sees it when it replays calls from CUDA graphs), `host_us` (the median host time to
enqueue one call) and `eager_us` (the median time per call of back-to-back eager calls, the host
on the path). Which of them a job sees depends on how it calls the ops, its *mode*
(:data:`MODES`); :func:`rank_key` and :func:`pick` state the one rule by which trials are ranked
and served in a mode, used by the lookup ladder, the export and the tuner alike.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Generic, Protocol, TypeVar

from syncopate.environment import Environment
from syncopate.errors import ConfigError, describe
from syncopate.search_space import Candidate, Topology, Workload

__all__ = [
    "TRIAL_STATUSES",
    "SOURCES",
    "BASELINES",
    "MODES",
    "DEFAULT_MODE",
    "GUARDS",
    "OBJECTIVE_DEVICE",
    "OBJECTIVE_EAGER",
    "OBJECTIVE_NO_EAGER",
    "Environment",
    "TrialRecord",
    "BaselineRecord",
    "CalibrationRecord",
    "Pick",
    "check_mode",
    "figure",
    "objective",
    "pick",
    "rank_key",
    "utcnow",
]

TRIAL_STATUSES: tuple[str, ...] = ("ok", "wrong_result", "compile_error", "oom", "timeout", "crash")
"""Outcome of a trial; only `ok` trials can become best."""

SOURCES: tuple[str, ...] = ("measured", "predicted", "fixture")
"""Where a number comes from: a GPU measurement, the cost model, or the CPU test fixture."""

BASELINES: tuple[str, ...] = (
    "torch_seq",
    "torch_async_tp",
    "gemm_alone",
    "comm_alone",
    "comm_alone_copy_engine",
)
"""Reference times measured beside the candidates: torch's collective then matmul; torch's fused
async-TP op; the local GEMM alone (cuBLAS); the collective alone (NCCL); the collective alone with
the copy engine. The overlap bound is max(gemm_alone, min of the comm_alone rows)."""

MODES: tuple[str, ...] = ("eager", "graph")
"""How a job calls the ops, which decides what it sees of them: `eager`, calls back to back with
the host on the path (a call costs the longer of its device time and the host's time to enqueue
it: its `eager_us`); `graph`, calls replayed from CUDA graphs (the host is off the path: its
device time, `median_us`)."""

DEFAULT_MODE = "eager"
"""The mode of a job that does not say: most jobs call the ops eagerly."""

GUARDS: tuple[str, ...] = ("default", "unfused")
"""The two references every sweep measures beside its candidates, and that a served configuration
may never be slower than in the job's mode: the untuned default candidate
(:func:`~syncopate.search_space.default_candidate`) and the `unfused` template (torch's matmul,
then its collective)."""

OBJECTIVE_DEVICE = "device"
"""Ranked by device time (mode `graph`)."""
OBJECTIVE_EAGER = "eager"
"""Ranked by back-to-back eager time (mode `eager`)."""
OBJECTIVE_NO_EAGER = "device (no eager measurement)"
"""Mode `eager` where the trials have no eager figure (measured before it was recorded): ranked by
device time instead, and said so."""


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def check_mode(mode: object) -> str:
    """`mode` if it is one of :data:`MODES`; ConfigError naming the accepted ones otherwise."""
    if not isinstance(mode, str) or mode not in MODES:
        raise ConfigError(
            f"mode {mode!r} is unknown: accepted are eager (calls back to back, the host on the path) and "
            f"graph (calls replayed from CUDA graphs)"
        )
    return mode


def replays_in_graph(candidate: Any) -> bool:
    """Whether mode `graph` may serve `candidate`: a dense candidate whose call replays from a CUDA
    graph (:attr:`~syncopate.search_space.Candidate.replays_in_graph`); a MoE candidate, whose layer
    decides what it captures, always."""
    return candidate.replays_in_graph if isinstance(candidate, Candidate) else True


def rank_key(mode: str, median_us: float | None, eager_us: float | None) -> tuple[int, float]:
    """The sort key of a time in `mode`, fastest first: `graph` ranks by device time; `eager` by
    eager time, every time with an eager figure before every one without (those, measured before
    eager times were recorded, rank by device time after them)."""
    if mode == "eager":
        if eager_us is not None:
            return (0, eager_us)
        return (1, median_us if median_us is not None else math.inf)
    return (0, median_us if median_us is not None else math.inf)


def objective(mode: str, eager_us: float | None) -> str:
    """What ranked a trial chosen in `mode`: :data:`OBJECTIVE_DEVICE`, :data:`OBJECTIVE_EAGER`, or
    :data:`OBJECTIVE_NO_EAGER` where mode `eager` met a trial without an eager figure."""
    if mode == "graph":
        return OBJECTIVE_DEVICE
    return OBJECTIVE_EAGER if eager_us is not None else OBJECTIVE_NO_EAGER


def figure(objective_name: str, median_us: float | None, eager_us: float | None) -> float | None:
    """The time an objective compares: the eager figure for :data:`OBJECTIVE_EAGER`, else the
    device time."""
    return eager_us if objective_name == OBJECTIVE_EAGER else median_us


class _Timed(Protocol):
    @property
    def median_us(self) -> float | None: ...

    @property
    def eager_us(self) -> float | None: ...


T = TypeVar("T", bound=_Timed)


@dataclass(frozen=True, slots=True)
class Pick(Generic[T]):
    """What :func:`pick` serves of one workload, topology and environment."""

    chosen: T
    """The trial served (a tuned one, or a guard's)."""
    objective: str
    """What ranked it (see :func:`objective`)."""
    guard: str = ""
    """The guard served (`default` or `unfused`, see :data:`GUARDS`) where it is one; '' otherwise."""
    tuned: T | None = None
    """The fastest tuned trial (None where only guards were measured)."""

    @property
    def time_us(self) -> float | None:
        """The chosen trial's time in the objective."""
        return figure(self.objective, self.chosen.median_us, self.chosen.eager_us)


def pick(mode: str, tuned: T | None, guards: Mapping[str, T]) -> Pick[T] | None:
    """The rule of what is served in `mode`: the fastest tuned trial (by :func:`rank_key`), unless
    a guard's trial of the same workload, topology and environment is faster in the objective that
    ranked it, then the fastest such guard. Only the guards measured count (`guards` maps a name of
    :data:`GUARDS` to its fastest trial); one without a figure in the objective cannot be compared
    and is passed over. None where nothing was measured."""
    if tuned is None:
        if not guards:
            return None
        name, chosen = min(
            guards.items(),
            key=lambda kv: (rank_key(mode, kv[1].median_us, kv[1].eager_us), GUARDS.index(kv[0])),
        )
        return Pick(chosen=chosen, objective=objective(mode, chosen.eager_us), guard=name, tuned=None)
    obj = objective(mode, tuned.eager_us)
    best_name, best = "", tuned
    best_us = figure(obj, tuned.median_us, tuned.eager_us)
    for name in GUARDS:
        g = guards.get(name)
        if g is None:
            continue
        us = figure(obj, g.median_us, g.eager_us)
        if us is not None and best_us is not None and us < best_us:
            best_name, best, best_us = name, g, us
    return Pick(chosen=best, objective=obj, guard=best_name, tuned=tuned)


def _check_times(**times: float | None) -> None:
    for name, v in times.items():
        if v is not None and not (v >= 0):
            raise ConfigError(f"{name}={v!r} must be a non-negative number of microseconds")


@dataclass(frozen=True, kw_only=True, slots=True)
class TrialRecord:
    """One candidate measured (or predicted) on one workload, topology and environment."""

    workload: Workload
    topology: Topology
    environment: Environment
    candidate: Candidate
    status: str
    """One of :data:`TRIAL_STATUSES`."""
    source: str = "measured"
    """One of :data:`SOURCES`."""
    median_us: float | None = None
    p20_us: float | None = None
    p80_us: float | None = None
    samples_us: tuple[float, ...] = ()
    """Raw per-repetition device times (max over ranks per repetition)."""
    eager_us: float | None = None
    """Median time per call of back-to-back eager calls, the host on the path (slowest rank); None
    where it was not measured."""
    host_us: float | None = None
    """Median host time to enqueue one call (slowest rank); None where it was not measured."""
    max_rel_error: float | None = None
    """‖out − ref‖ / ‖ref‖ of the correctness check, worst rank."""
    error: str = ""
    """Error text for a failed trial."""
    worker: dict[str, Any] = field(default_factory=dict)
    """Who measured it: host, GPU UUIDs, actor ids, git revision, library versions."""
    strategy: str = ""
    """The strategy that proposed it."""
    created_at: datetime = field(default_factory=utcnow)

    def __post_init__(self) -> None:
        if self.status not in TRIAL_STATUSES:
            raise ConfigError(
                f"trial status {self.status!r} is unknown: accepted are {', '.join(TRIAL_STATUSES)}"
            )
        if self.source not in SOURCES:
            raise ConfigError(f"trial source {self.source!r} is unknown: accepted are {', '.join(SOURCES)}")
        if self.status == "ok" and self.median_us is None:
            raise ConfigError("an ok trial needs median_us")
        _check_times(
            median_us=self.median_us,
            p20_us=self.p20_us,
            p80_us=self.p80_us,
            eager_us=self.eager_us,
            host_us=self.host_us,
        )
        object.__setattr__(self, "samples_us", tuple(float(x) for x in self.samples_us))

    def identity(self) -> tuple[str, str, str, str]:
        """What makes two records the same trial: candidate, workload, topology, environment."""
        return (self.candidate.key(), self.workload.key(), self.topology.key(), self.environment.key())


@dataclass(frozen=True, kw_only=True, slots=True)
class BaselineRecord:
    """A reference time measured beside the candidates of a sweep."""

    workload: Workload
    topology: Topology
    environment: Environment
    name: str
    """One of :data:`BASELINES`."""
    median_us: float
    p20_us: float | None = None
    p80_us: float | None = None
    samples_us: tuple[float, ...] = ()
    eager_us: float | None = None
    """Median time per call of the reference op called back to back eagerly; None where not measured."""
    host_us: float | None = None
    """Median host time to enqueue one call of it; None where not measured."""
    source: str = "measured"
    detail: str = ""
    """What exactly was run (e.g. the torch op's name), or why it is missing."""
    created_at: datetime = field(default_factory=utcnow)

    def __post_init__(self) -> None:
        if self.name not in BASELINES:
            raise ConfigError(f"baseline {self.name!r} is unknown: accepted are {', '.join(BASELINES)}")
        if self.source not in SOURCES:
            raise ConfigError(
                f"baseline source {self.source!r} is unknown: accepted are {', '.join(SOURCES)}"
            )
        _check_times(
            median_us=self.median_us,
            p20_us=self.p20_us,
            p80_us=self.p80_us,
            eager_us=self.eager_us,
            host_us=self.host_us,
        )
        object.__setattr__(self, "samples_us", tuple(float(x) for x in self.samples_us))


_CALIBRATION_KIND = re.compile(r"[a-z][a-z0-9_]{0,63}")


@dataclass(frozen=True, kw_only=True, slots=True)
class CalibrationRecord:
    """A measured curve for the cost model (bandwidth against message size per backend, GEMM
    throughput per tile config, …) on one topology and environment."""

    kind: str
    """What was calibrated, a lowercase identifier such as `bandwidth` or `gemm_throughput`."""
    topology: Topology
    environment: Environment
    key: str
    """Which curve of that kind, e.g. the backend (`copy_engine`) or a tile config key."""
    payload: dict[str, Any]
    """The curve as JSON-able data (lists of sizes and rates, fitted parameters, …)."""
    source: str = "measured"
    """One of :data:`SOURCES`."""
    created_at: datetime = field(default_factory=utcnow)

    def __post_init__(self) -> None:
        if not isinstance(self.kind, str) or not _CALIBRATION_KIND.fullmatch(self.kind):
            raise ConfigError(
                f"calibration kind {self.kind!r} must be a lowercase identifier (letters, digits, _), "
                f"such as bandwidth or gemm_throughput"
            )
        if not isinstance(self.key, str) or not self.key.strip() or len(self.key) > 200:
            raise ConfigError(
                f"calibration key {self.key!r} must be a non-empty string of at most 200 characters"
            )
        if not isinstance(self.payload, dict):
            raise ConfigError(f"calibration payload must be a dict, got {describe(self.payload)}")
        if self.source not in SOURCES:
            raise ConfigError(
                f"calibration source {self.source!r} is unknown: accepted are {', '.join(SOURCES)}"
            )
