"""What a runner hands back for one rank: device facts, baseline samples, candidate outcomes.

Plain picklable values that travel from a gang actor to the coordinator, plus the two rules both
sides share: how raw samples become median/p20/p80, and how an exception raised while running a
candidate becomes a trial status.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from syncopate.errors import CandidateTimeoutError

__all__ = ["DeviceInfo", "BaselineOutcome", "CandidateOutcome", "slowest", "summarize", "classify_exception"]


@dataclass(frozen=True, kw_only=True, slots=True)
class DeviceInfo:
    """The device one rank measures on."""

    model: str
    """Short model name as used in topology keys (`H200`)."""
    uuid: str
    """The GPU's UUID (a synthetic one for the CPU fixture)."""
    index: int
    """The device index on its node."""
    name: str = ""
    """The full name the driver reports."""


@dataclass(frozen=True, kw_only=True, slots=True)
class BaselineOutcome:
    """One reference op timed on the gang: samples are the max over ranks of each repetition."""

    name: str
    """One of :data:`syncopate.records.BASELINES`."""
    samples_us: tuple[float, ...] = ()
    """Empty when the baseline could not run here (then `detail` says why)."""
    detail: str = ""
    eager_us: float | None = None
    """Median time per call of the op called back to back eagerly, the host on the path (None: not
    measured)."""
    host_us: float | None = None
    """Median host time to enqueue one call (None: not measured)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class CandidateOutcome:
    """A candidate built, verified and timed (or failed) on one rank."""

    status: str
    """One of :data:`syncopate.records.TRIAL_STATUSES`."""
    samples_us: tuple[float, ...] = ()
    """Device time per repetition, µs (max over ranks)."""
    eager_us: float | None = None
    """Median time per call of back-to-back eager calls, the host on the path, µs (None: not measured)."""
    host_us: float | None = None
    """Median host time to enqueue one call on this rank, µs (None: not measured)."""
    max_rel_error: float | None = None
    error: str = ""
    healthy: bool = True
    """False when the process should not be trusted with another candidate (a CUDA context left
    broken by an illegal access, say): the gang is then rebuilt."""
    started_at: float = 0.0
    """Wall-clock time (seconds since the epoch) the rank started this candidate."""
    finished_at: float = 0.0
    """Wall-clock time the rank finished it."""
    rank: int = 0
    extra: dict[str, object] = field(default_factory=dict)
    """Anything else the runner wants stored with the trial's provenance."""


def _percentile(ordered: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks, as numpy's default method."""
    pos = (len(ordered) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summarize(samples_us: Sequence[float]) -> tuple[float, float, float] | None:
    """(median, p20, p80) of `samples_us`, or None when there are none."""
    if not samples_us:
        return None
    ordered = sorted(float(x) for x in samples_us)
    return _percentile(ordered, 0.5), _percentile(ordered, 0.2), _percentile(ordered, 0.8)


def slowest(values: Sequence[float | None]) -> float | None:
    """The largest of the values measured (None where none was): a gang's host and eager times are
    its slowest rank's, as its device times are."""
    found = [float(v) for v in values if v is not None]
    return max(found) if found else None


def classify_exception(exc: BaseException) -> tuple[str, bool]:
    """The trial status an exception raised while running a candidate stands for, and whether the
    process is still fit for the next candidate.

    An exception may say for itself with a `trial_status` attribute; otherwise: a deadline → `timeout`;
    running out of memory (torch's `OutOfMemoryError`, `MemoryError`, "out of memory") → `oom`;
    Triton's compilation errors and resource overruns → `compile_error`; anything else → `crash`,
    after which the process is not trusted again.
    """
    declared = getattr(exc, "trial_status", None)
    if isinstance(declared, str):
        return declared, declared != "crash"
    if isinstance(exc, (CandidateTimeoutError, TimeoutError)):
        return "timeout", True
    names = {cls.__name__ for cls in type(exc).__mro__}
    text = str(exc).lower()
    if isinstance(exc, MemoryError) or "OutOfMemoryError" in names or "out of memory" in text:
        return "oom", True
    module = type(exc).__module__ or ""
    if names & {"CompilationError", "CompileTimeAssertionFailure", "OutOfResources"} or module.startswith(
        "triton"
    ):
        return "compile_error", True
    return "crash", False
