"""Work in flight on gangs, and the watchdog that waits on it.

A :class:`GangTask` is one request to every rank of a gang (form the gang, measure baselines, run
a candidate), one Ray object per rank. A :class:`TaskBoard` waits on all tasks of all gangs at
once; a task is finished when every rank answered, when a rank's process died (the others may
then wait forever in a collective), or when its deadline passed: then it is *expired*, and the
caller kills and rebuilds the gang.
"""

from __future__ import annotations

import re
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from syncopate.search_space import Candidate, Workload
from syncopate.workers.outcomes import CandidateOutcome

if TYPE_CHECKING:
    from syncopate.workers.gang import Gang

__all__ = ["GangTask", "TaskBoard", "failure_text", "FAILURE_GRACE_S"]

FAILURE_GRACE_S = 5.0
"""Once one rank reported a failure, how long the others get to report before the gang is
considered stuck (they may be waiting in a collective for the rank that failed)."""

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def failure_text(exc: BaseException) -> str:
    """One line saying why a Ray call failed: the exception a rank raised, or how its process died;
    for any other exception (a runner's in this process), its type and text. Ray is not imported
    for that: where it never was, no exception can be Ray's."""
    if "ray.exceptions" not in sys.modules:
        return f"{type(exc).__name__}: {str(exc).strip() or repr(exc)}"
    from ray.exceptions import ActorDiedError, GetTimeoutError, RayTaskError

    if isinstance(exc, RayTaskError):
        cause = getattr(exc, "cause", None)
        if cause is not None:
            return f"{type(cause).__name__}: {str(cause).strip() or repr(cause)}"
    if isinstance(exc, ActorDiedError):
        msg = _ANSI.sub("", getattr(exc, "error_msg", "") or str(exc))
        lines = [line.strip() for line in msg.splitlines() if line.strip()]
        if getattr(exc, "_actor_init_failed", False) and lines:
            return f"the worker failed to start: {lines[-1]}"
        fields = dict(m.groups() for line in lines if (m := re.match(r"(pid|ip): (\S+)$", line)))
        where = ", ".join(f"{k} {v}" for k, v in fields.items())
        reason = next(
            (line for line in lines if "exit detail" in line or "ray.kill" in line),
            lines[-1] if lines else "",
        )
        reason = reason.split(" Some common causes")[0]
        if "Worker exit type" in reason:
            reason = reason[reason.index("Worker exit type") :]
        return (
            f"the worker process died ({where}): {reason}" if where else f"the worker process died: {reason}"
        )
    if isinstance(exc, GetTimeoutError):
        return f"no answer in time: {exc}"
    return f"{type(exc).__name__}: {str(exc).strip() or repr(exc)}"


@dataclass(eq=False)
class GangTask:
    """One request to every rank of a gang, and the answers so far."""

    kind: str
    """`form`, `baselines` or `trial`."""
    gang: Gang
    refs: list[Any]
    """One Ray object per rank, in rank order."""
    deadline_s: float
    """Seconds the task may take before the gang is killed."""
    workload: Workload | None = None
    candidate: Candidate | None = None
    started: float = field(default_factory=time.monotonic)
    """`time.monotonic()` at submission."""
    values: dict[int, Any] = field(default_factory=dict)
    """Answers by rank."""
    errors: dict[int, BaseException] = field(default_factory=dict)
    """Failed Ray calls by rank (a rank's exception, or its process's death)."""
    expired: bool = False
    """Set when the deadline passed before every rank answered."""
    finished_at: float | None = None
    """`time.monotonic()` when the board saw the task finish."""

    def __post_init__(self) -> None:
        self.deadline = self.started + self.deadline_s

    def collect(self, rank: int, ref: Any) -> None:
        """Take rank `rank`'s answer (ready in the object store)."""
        import ray

        try:
            value = ray.get(ref, timeout=0)
        except Exception as exc:  # a rank's failure is data for the coordinator, not a crash of it
            self.errors[rank] = exc
            return
        self.values[rank] = value
        if isinstance(value, CandidateOutcome) and (value.status != "ok" or not value.healthy):
            self.deadline = min(self.deadline, time.monotonic() + FAILURE_GRACE_S)

    @property
    def done(self) -> bool:
        """Every rank answered, or one failed at the Ray level."""
        return bool(self.errors) or len(self.values) == len(self.refs)

    @property
    def pending_ranks(self) -> list[int]:
        return [r for r in range(len(self.refs)) if r not in self.values and r not in self.errors]

    @property
    def elapsed_s(self) -> float:
        return (self.finished_at or time.monotonic()) - self.started


class TaskBoard:
    """Every task in flight, by Ray object; :meth:`wait` returns tasks as they finish or expire."""

    def __init__(self) -> None:
        self._by_ref: dict[Any, tuple[GangTask, int]] = {}
        self._tasks: list[GangTask] = []
        self.woke_at = 0.0
        """`time.perf_counter()` when the last :meth:`wait` stopped waiting: what follows is the
        caller's own work (collecting answers included)."""

    def add(self, task: GangTask) -> None:
        self._tasks.append(task)
        for rank, ref in enumerate(task.refs):
            self._by_ref[ref] = (task, rank)

    def discard(self, task: GangTask) -> None:
        """Stop watching `task` (its gang is being killed)."""
        if task in self._tasks:
            self._tasks.remove(task)
        for ref in task.refs:
            self._by_ref.pop(ref, None)

    def __len__(self) -> int:
        return len(self._tasks)

    @property
    def tasks(self) -> list[GangTask]:
        return list(self._tasks)

    def wait(self, max_wait_s: float) -> list[GangTask]:
        """Wait up to `max_wait_s` (less if a deadline comes first) for answers; return the tasks
        that finished or expired, no longer watched."""
        import ray

        if not self._tasks:
            return []
        now = time.monotonic()
        timeout = max(0.0, min(max_wait_s, min(t.deadline for t in self._tasks) - now))
        refs = list(self._by_ref)
        ready: list[Any] = []
        if refs:
            ready, rest = ray.wait(refs, num_returns=1, timeout=timeout)
            if ready and rest:
                more, _ = ray.wait(rest, num_returns=len(rest), timeout=0)
                ready += more
        elif timeout:
            time.sleep(timeout)
        self.woke_at = time.perf_counter()
        for ref in ready:
            task, rank = self._by_ref.pop(ref)
            task.collect(rank, ref)
        now = time.monotonic()
        finished = []
        for task in list(self._tasks):
            if task.done or now >= task.deadline:
                task.expired = not task.done
                task.finished_at = now
                self.discard(task)
                finished.append(task)
        return finished
