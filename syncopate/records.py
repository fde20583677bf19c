"""What a measurement produces: the environment fingerprint, trials and baselines, as plain values.

These are what runners return and what the results database stores; they carry no database or
torch state. Times are in microseconds.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any

from syncopate.errors import ConfigError, describe
from syncopate.search_space import Candidate, Topology, Workload

__all__ = [
    "TRIAL_STATUSES",
    "SOURCES",
    "BASELINES",
    "Environment",
    "TrialRecord",
    "BaselineRecord",
    "CalibrationRecord",
    "utcnow",
]

TRIAL_STATUSES: tuple[str, ...] = ("ok", "wrong_result", "compile_error", "oom", "timeout", "crash")
"""Outcome of a trial; only `ok` trials can become best."""

SOURCES: tuple[str, ...] = ("measured", "predicted", "fixture")
"""Where a number comes from: a GPU measurement, the cost model, or the CPU test fixture."""

BASELINES: tuple[str, ...] = ("torch_seq", "torch_async_tp", "gemm_alone", "comm_alone", "comm_alone_copy_engine")
"""Reference times measured beside the candidates: torch's collective then matmul; torch's fused
async-TP op; the local GEMM alone (cuBLAS); the collective alone (NCCL); the collective alone with
the copy engine. The overlap bound is max(gemm_alone, min of the comm_alone rows)."""


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


@dataclass(frozen=True, kw_only=True, slots=True)
class Environment:
    """Versions that decide whether a measurement still holds: the environment fingerprint."""

    syncopate: str
    torch: str
    triton: str
    cuda: str
    nccl: str
    driver: str
    gpu_model: str

    def key(self) -> str:
        """Stable hash of every field (16 hex digits)."""
        blob = json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, str]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Environment:
        return cls(**{k: str(d[k]) for k in ("syncopate", "torch", "triton", "cuda", "nccl", "driver", "gpu_model")})

    def short(self) -> str:
        return f"torch {self.torch}, triton {self.triton}, CUDA {self.cuda}, NCCL {self.nccl}, {self.gpu_model}"

    @classmethod
    def current(cls) -> Environment:
        """The fingerprint of this process (imports torch; GPU fields read `none` without a GPU)."""
        from syncopate.environment import current_environment

        return current_environment()


def _check_times(median_us, p20_us, p80_us) -> None:
    for name, v in (("median_us", median_us), ("p20_us", p20_us), ("p80_us", p80_us)):
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
    """Raw per-repetition times (max over ranks per repetition)."""
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
            raise ConfigError(f"trial status {self.status!r} is unknown: accepted are {', '.join(TRIAL_STATUSES)}")
        if self.source not in SOURCES:
            raise ConfigError(f"trial source {self.source!r} is unknown: accepted are {', '.join(SOURCES)}")
        if self.status == "ok" and self.median_us is None:
            raise ConfigError("an ok trial needs median_us")
        _check_times(self.median_us, self.p20_us, self.p80_us)
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
    source: str = "measured"
    detail: str = ""
    """What exactly was run (e.g. the torch op's name), or why it is missing."""
    created_at: datetime = field(default_factory=utcnow)

    def __post_init__(self) -> None:
        if self.name not in BASELINES:
            raise ConfigError(f"baseline {self.name!r} is unknown: accepted are {', '.join(BASELINES)}")
        if self.source not in SOURCES:
            raise ConfigError(f"baseline source {self.source!r} is unknown: accepted are {', '.join(SOURCES)}")
        _check_times(self.median_us, self.p20_us, self.p80_us)
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
            raise ConfigError(f"calibration key {self.key!r} must be a non-empty string of at most 200 characters")
        if not isinstance(self.payload, dict):
            raise ConfigError(f"calibration payload must be a dict, got {describe(self.payload)}")
        if self.source not in SOURCES:
            raise ConfigError(f"calibration source {self.source!r} is unknown: accepted are {', '.join(SOURCES)}")
