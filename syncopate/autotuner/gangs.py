"""The coordinator's tasks on Ray gangs: forming them, dispatching to them, rebuilding them.

:func:`form_gangs` reserves every gang's GPUs and forms its process group, and refuses gangs of
mixed GPU models or environments before anything is stored. :class:`GangExecutor` is the
:class:`~syncopate.autotuner.coordinator.Executor` over the formed gangs: many tasks in flight at
once, one per gang, watched by a :class:`~syncopate.workers.TaskBoard`. A gang restarted after a
hang, a lost process or an unfit rank is killed and formed again in its placement group, and must
come back with the same GPU model and environment; one that fails to form `max_rebuild_failures`
times in a row is dropped.
"""

from __future__ import annotations

import logging
from collections import Counter

from syncopate.autotuner.coordinator import Executor
from syncopate.errors import RuntimeUnavailableError, SyncopateError
from syncopate.records import Environment
from syncopate.search_space import Candidate, Topology, Workload
from syncopate.workers import Gang, GangTask, TaskBoard, failure_text

__all__ = ["RESERVE_TIMEOUT_S", "GangExecutor", "check_gang_members", "form_gangs", "gangs_environment"]

log = logging.getLogger(__name__)

RESERVE_TIMEOUT_S = 60.0
"""How long Ray may take to reserve a gang's GPUs at start."""


def check_gang_members(gangs: list[Gang], expected_model: str | None) -> None:
    """Raise RuntimeUnavailableError unless every GPU of every gang is of one model (and of
    `expected_model` when the topology names one)."""
    seen = [(g.index, m) for g in gangs for m in g.members]
    models = {m["gpu_model"] for _, m in seen}
    if len(models) > 1:
        listing = "; ".join(
            f"gang {gi} rank {m['rank']}: {m['gpu_model']} ({m['gpu_uuid']} on {m['host']})" for gi, m in seen
        )
        raise RuntimeUnavailableError(
            f"GPUs of mixed models ({', '.join(sorted(models))}): {listing}. A sweep measures one GPU model: "
            f"run it on nodes with one model"
        )
    if expected_model is not None and models and models != {expected_model}:
        raise RuntimeUnavailableError(
            f"the sweep's topology names {expected_model} GPUs, but the gangs have {models.pop()}: "
            f"set `topology: detect` or a key for these GPUs"
        )


def form_gangs(gangs: list[Gang], timeout_s: float) -> None:
    """Reserve and form every gang; at the first failure raise one error naming the gang and the
    rank (the caller shuts every gang down)."""
    for gang in gangs:
        gang.reserve(RESERVE_TIMEOUT_S)
    board = TaskBoard()
    for gang in gangs:
        board.add(gang.start())
    while len(board):
        for task in board.wait(max_wait_s=timeout_s):
            index = task.gang.index
            if task.errors:
                rank, exc = min(task.errors.items())
                cause = getattr(exc, "cause", None)
                if isinstance(cause, SyncopateError):
                    raise type(cause)(f"gang {index} could not start: {cause}")
                raise RuntimeUnavailableError(
                    f"gang {index} could not start: rank {rank}: {failure_text(exc)}"
                )
            if task.expired:
                raise RuntimeUnavailableError(
                    f"gang {index} could not start: ranks {task.pending_ranks} did not form a process group "
                    f"within {timeout_s:.0f} s"
                )
            task.gang.formed(list(task.values.values()))


def gangs_environment(gangs: list[Gang]) -> Environment:
    """The one environment every rank of every gang runs; RuntimeUnavailableError where they differ."""
    envs = {Environment.from_dict(m["environment"]) for g in gangs for m in g.members}
    if len(envs) > 1:
        raise RuntimeUnavailableError(
            "the gangs run different environments (" + "; ".join(e.short() for e in envs) + "): "
            "results must come from one environment; run the workers from one image"
        )
    return envs.pop()


class GangExecutor(Executor):
    """Formed gangs as the coordinator's slots: one task per gang in flight, all watched at once."""

    def __init__(
        self,
        gangs: list[Gang],
        *,
        deadline_s: float,
        topology: Topology,
        environment: Environment,
        max_rebuild_failures: int = 3,
    ) -> None:
        self._gangs = list(gangs)
        self.deadline_s = deadline_s
        """Seconds a task may take before its gang is killed (the runner's own deadline is shorter)."""
        self.topology = topology
        self.environment = environment
        self.max_rebuild_failures = max_rebuild_failures
        self._board = TaskBoard()
        self._busy: dict[Gang, GangTask] = {}
        self._rebuild_failures: Counter = Counter()

    @property
    def slots(self) -> list[Gang]:
        return list(self._gangs)

    def idle(self) -> list[Gang]:
        return [g for g in self._gangs if g not in self._busy]

    def _watch(self, task: GangTask) -> GangTask:
        self._busy[task.gang] = task
        self._board.add(task)
        return task

    def submit_baselines(self, slot: Gang, workload: Workload) -> GangTask:
        return self._watch(slot.submit_baselines(workload, self.deadline_s))

    def submit_trial(self, slot: Gang, workload: Workload, candidate: Candidate) -> GangTask:
        return self._watch(slot.submit_trial(workload, candidate, self.deadline_s))

    def wait(self, max_wait_s: float) -> list[GangTask]:
        out = []
        finished = self._board.wait(max_wait_s=max_wait_s)
        self.woke_at = self._board.woke_at
        for task in finished:
            self._busy.pop(task.gang, None)
            if task.kind == "form":
                self._finish_form(task)
            else:
                out.append(task)
        return out

    def in_flight(self) -> bool:
        return len(self._board) > 0

    def restart(self, slot: Gang, why: str) -> None:
        log.warning("gang %d: %s; killing and rebuilding it", slot.index, why)
        slot.kill()
        self.rebuilds += 1
        self._watch(slot.start())

    def abort(self) -> None:
        for task in self._board.tasks:
            self._board.discard(task)
        self._busy.clear()

    def _finish_form(self, task: GangTask) -> None:
        gang = task.gang
        problem = None
        if task.errors:
            rank, exc = min(task.errors.items())
            problem = f"rank {rank} could not start: {failure_text(exc)}"
        elif task.expired:
            problem = (
                f"ranks {task.pending_ranks} did not form a process group within {task.deadline_s:.0f} s"
            )
        else:
            gang.formed(list(task.values.values()))
            envs = {Environment.from_dict(m["environment"]) for m in gang.members}
            try:
                check_gang_members([gang], self.topology.gpu_model)
                if envs != {self.environment}:
                    problem = f"rebuilt with another environment ({', '.join(e.short() for e in envs)})"
            except RuntimeUnavailableError as e:
                problem = str(e)
        if problem is None:
            self._rebuild_failures[gang] = 0
            log.info("gang %d formed again (build %d)", gang.index, gang.builds)
            return
        self._rebuild_failures[gang] += 1
        gang.kill()
        if self._rebuild_failures[gang] >= self.max_rebuild_failures:
            log.error(
                "gang %d dropped after %d failed rebuilds: %s",
                gang.index,
                self._rebuild_failures[gang],
                problem,
            )
            self._gangs.remove(gang)
            gang.shutdown()
            return
        self.restart(gang, f"rebuild failed ({problem})")
