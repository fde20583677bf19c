"""`syncopate tune` with a runner that needs neither GPUs nor Ray (`model`, `replay`): the runner
is built in this process and the coordinator's one loop drives it through a
:class:`LocalExecutor`, one task after another, with the same strategies, store, progress display
and summary as a sweep on gangs.

Order of work, as on gangs: :func:`~syncopate.autotuner.tune.run_tune` opens the store and checks
a `--resume` (the same runner) before anything else; then the runner is built and everything is
checked, the database is made where it is new, and :func:`~syncopate.autotuner.tune.run_sweep`
builds the strategies (a study made over another space fails there), starts or resumes the sweep
and runs it.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import Any

from rich.console import Console

from syncopate.autotuner.coordinator import Executor
from syncopate.autotuner.store import StoredSweep, TrialStore
from syncopate.errors import ConfigError
from syncopate.records import Environment
from syncopate.search_space import Candidate, Topology, Workload
from syncopate.workers import GangTask, Runner, make_runner
from syncopate.workers.actor import run_candidate

__all__ = ["LocalExecutor", "run_in_process"]

log = logging.getLogger(__name__)


class _Here:
    """The one slot of a :class:`LocalExecutor`: this process, rank 0 of a world of one."""

    index = 0

    def __init__(self, runner: Runner) -> None:
        self._provenance = {"runner": runner.name, "host": socket.gethostname(), "pid": os.getpid()}

    def provenance(self) -> dict[str, Any]:
        """Who measures: the runner, this host and this process."""
        return dict(self._provenance)


class LocalExecutor(Executor):
    """A runner in this process as the coordinator's one slot: a submitted task runs when the
    coordinator waits for it, synchronously, and comes back as a gang's task of one rank would.

    There is no watchdog: the runner's own deadline is all there is. Nor is there a process to
    rebuild: the runners that run here hold no device state a failure could leave broken, so a
    candidate that leaves its rank unfit is stored as on a gang and the next one runs on the same
    runner."""

    def __init__(
        self,
        runner: Runner,
        *,
        deadline_s: float,
        note: str = "",
        where: str = "",
        measurable: Any = None,
        calibration: Any = None,
    ) -> None:
        self.runner = runner
        self.deadline_s = deadline_s
        self._note = note
        self.where = where
        self.measurable = measurable
        self.calibration = calibration
        self._here = _Here(runner)
        self._pending: GangTask | None = None

    @property
    def note(self) -> str:
        """What the numbers are; for a replay, also how many trials asked for candidates the
        replayed sweep does not hold."""
        unheld = getattr(self.runner, "unheld", 0)
        if not unheld:
            return self._note
        return (
            f"{self._note} {unheld} trial(s) asked for candidates that the replayed sweep does not hold, stored "
            f"as `crash`: give the config the `space:` of the replayed sweep to search only what it measured."
        )

    @property
    def slots(self) -> list[Any]:
        return [self._here]

    def idle(self) -> list[Any]:
        return [] if self._pending is not None else [self._here]

    def _hold(self, task: GangTask) -> GangTask:
        self._pending = task
        return task

    def submit_baselines(self, slot: Any, workload: Workload) -> GangTask:
        return self._hold(
            GangTask(kind="baselines", gang=slot, refs=[None], deadline_s=self.deadline_s, workload=workload)
        )

    def submit_trial(self, slot: Any, workload: Workload, candidate: Candidate) -> GangTask:
        return self._hold(
            GangTask(
                kind="trial",
                gang=slot,
                refs=[None],
                deadline_s=self.deadline_s,
                workload=workload,
                candidate=candidate,
            )
        )

    def wait(self, max_wait_s: float) -> list[GangTask]:
        task, self._pending = self._pending, None
        if task is None:
            return []
        if task.kind == "baselines":
            try:
                task.values[0] = self.runner.baselines(task.workload)
            except Exception as e:  # a runner's failure is the task's outcome, as on a gang
                task.errors[0] = e
        else:
            task.values[0] = run_candidate(self.runner, 0, task.workload, task.candidate, self.deadline_s)
        task.finished_at = time.monotonic()
        self.woke_at = time.perf_counter()
        return [task]

    def in_flight(self) -> bool:
        return self._pending is not None

    def restart(self, slot: Any, why: str) -> None:
        log.debug("%s; the runner in this process goes on", why)

    def abort(self) -> None:
        self._pending = None


def _runner_and_topology(plan: Any) -> tuple[Runner, Topology, str]:
    """The runner, the topology it answers for, and a sentence saying what its numbers are."""
    from syncopate.autotuner.tune import runner_spec

    sweep = plan.sweep
    if plan.runner == "model":
        if plan.topology is None:
            raise ConfigError(
                f"{sweep.source}: runner model predicts for a topology named in the config: set `topology:` to a "
                f"key such as H200x2-nvlink (or pass --topology KEY), not `detect`"
            )
        runner = make_runner(runner_spec(plan))
        calibration = runner.calibration
        note = (
            f"runner model: no GPU is used; every time is a PREDICTION of the cost model, stored as "
            f"source `predicted` (never served as a measurement). {calibration.describe()}."
        )
        if calibration.source != "measured":
            note += " Measure one with `syncopate calibrate` on the GPUs."
        return runner, plan.topology, note
    if sweep.replay is None:
        raise ConfigError(
            f"{sweep.source}: runner replay needs a `replay:` section naming the stored sweep, e.g. "
            f"replay: {{source: results/llama_tp2-sweep.db, sweep: llama_tp2_sweep}} (a measured sweep in this "
            f"repository; configs/replay_example.yaml replays it)"
        )
    runner = make_runner(runner_spec(plan))
    stored = runner.stored
    missing = [w for w in sweep.workloads if w.key() not in stored.trials]
    if missing:
        held = ", ".join(sorted(stored.trials)) or "none"
        raise ConfigError(
            f"{sweep.source}: the replayed sweep ({stored.label}) holds no trial of "
            f"{', '.join(str(w) for w in missing)}: it holds {held}; replay only workloads it measured"
        )
    kind = "a SYNTHETIC sweep" if stored.synthetic else "a stored sweep"
    note = (
        f"runner replay: no GPU is used; every time is replayed from {kind} ({stored.label}), stored as "
        f"source `fixture` (never served as a measurement)."
    )
    return runner, plan.topology or stored.topology, note


def run_in_process(plan: Any, previous: StoredSweep | None, store: TrialStore, console: Console) -> Any:
    """Run the sweep `plan` describes with an in-process runner, continuing `previous` where
    `--resume` found one (the caller has opened `store` and checked that `previous` was run by the
    same runner); a :class:`~syncopate.autotuner.tune.TuneResult`."""
    from syncopate.autotuner.tune import run_sweep

    runner, topology, note = _runner_and_topology(plan)
    try:
        for w in plan.sweep.workloads:
            w.check_world_size(topology.world_size)
        store.prepare_writes()  # nothing left that could refuse the run: make the database where it is new
        device = runner.bind_device(0, [0])
        runner.setup(0, 1, None)
        executor = LocalExecutor(
            runner,
            deadline_s=plan.sweep.timing.deadline_s,
            note=note,
            where="predicted by the cost model" if plan.runner == "model" else "replayed",
            measurable=getattr(runner, "holds", None),
            calibration=getattr(runner, "calibration", None),
        )
        return run_sweep(plan, store, executor, topology, _environment(runner, device), previous, console)
    finally:
        runner.close()


def _environment(runner: Runner, device: Any) -> Environment:
    """The environment the trials are stored under: a replay's is the replayed sweep's."""
    stored = getattr(getattr(runner, "stored", None), "environment", None)
    if stored is not None:
        return stored
    return runner.environment(device)
