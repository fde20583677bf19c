"""The sweep loop: what to measure next, how every answer is stored, when to stop. One loop,
whatever runs the tasks.

One :class:`Coordinator` drives one sweep through an :class:`Executor`, the one thing that differs
between a sweep on Ray gangs (:class:`~syncopate.autotuner.gangs.GangExecutor`: many tasks at once,
asynchronously, under a watchdog) and a sweep in this process
(:class:`~syncopate.autotuner.in_process.LocalExecutor`: one task at a time, synchronously). Each
idle slot of the executor gets the next piece of work, workloads in config order: the workload's
baselines first (once; stored baselines of a resumed sweep are reused), then candidates from the
workload's strategy (its guards first: the untuned default and `unfused`), then the
re-measurements of the best few (:mod:`syncopate.autotuner.confirm`; stored in the companion
sweep). Every finished trial, failures included, becomes a record by one rule
(:meth:`Coordinator._trial_record`), is stored at once and told to the strategy. A task that leaves
its slot unfit (a missed deadline, a lost process, a rank it no longer trusts) makes the executor
restart the slot; the sweep goes on. Once the time budget is spent, no new work is handed out.
"""

from __future__ import annotations

import logging
import os
import socket
import statistics
import time
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from syncopate.autotuner.confirm import Confirmation, companion_sweep
from syncopate.autotuner.store import TrialStore
from syncopate.autotuner.strategies import Strategy
from syncopate.errors import ConfigError, RuntimeUnavailableError
from syncopate.records import (
    DEFAULT_MODE,
    OBJECTIVE_EAGER,
    TRIAL_STATUSES,
    BaselineRecord,
    Environment,
    TrialRecord,
    objective,
    rank_key,
)
from syncopate.search_space import Candidate, Topology, Workload
from syncopate.workers import CandidateOutcome, GangTask, failure_text, slowest, summarize

__all__ = ["WorkloadRun", "SweepProgress", "Executor", "Coordinator"]

log = logging.getLogger(__name__)


@dataclass(eq=False)
class WorkloadRun:
    """One workload of the sweep while it runs."""

    workload: Workload
    strategy: Strategy
    baselines: dict[str, BaselineRecord] = field(default_factory=dict)
    baselines_state: str = "todo"
    """`todo`, `measuring`, `done` (stored or measured) or `failed`."""
    stored_before: int = 0
    """Trials of this workload already stored when the run started (a resumed sweep)."""
    in_flight: int = 0
    measured: int = 0
    """Trials finished in this run."""
    statuses: Counter = field(default_factory=Counter)
    mode: str = DEFAULT_MODE
    """The mode the sweep ranks by (`eager` or `graph`, see :data:`syncopate.records.MODES`)."""
    best: TrialRecord | None = None
    """Fastest `ok` trial in the mode so far: stored before a resume, or finished in this run."""
    exhausted: bool = False
    confirm: Confirmation | None = None
    """Re-measures the best few once the strategy is done (None: no re-measuring)."""
    remeasured: int = 0
    """Re-measurements finished in this run."""

    @property
    def finished(self) -> bool:
        return self.exhausted and self.in_flight == 0 and self.baselines_state != "measuring"

    @property
    def failures(self) -> int:
        return sum(n for s, n in self.statuses.items() if s != "ok")

    def offer(self, trial: TrialRecord) -> None:
        """A finished trial: the new best if it is `ok` and faster in the mode."""
        if trial.status != "ok" or trial.median_us is None:
            return
        if self.best is None or rank_key(self.mode, trial.median_us, trial.eager_us) < rank_key(
            self.mode, self.best.median_us, self.best.eager_us
        ):
            self.best = trial

    def best_us(self, trial: TrialRecord | None = None) -> float | None:
        """The trial's time in the mode's objective (default: the best so far)."""
        trial = trial or self.best
        if trial is None:
            return None
        return trial.eager_us if objective(self.mode, trial.eager_us) == OBJECTIVE_EAGER else trial.median_us

    def speedup(self, trial: TrialRecord | None = None) -> float | None:
        """torch_seq's time over the trial's (default: the sweep's best so far), in the mode's
        objective (eager times where both have one, else device times); both come from one sweep."""
        trial = trial or self.best
        seq = self.baselines.get("torch_seq")
        if trial is None or seq is None or not trial.median_us:
            return None
        if objective(self.mode, trial.eager_us) == OBJECTIVE_EAGER:
            return seq.eager_us / trial.eager_us if seq.eager_us and trial.eager_us else None
        return seq.median_us / trial.median_us

    def bound_us(self) -> float | None:
        """The overlap bound: max(GEMM alone, fastest communication alone)."""
        gemm = self.baselines.get("gemm_alone")
        comms = [b.median_us for n, b in self.baselines.items() if n.startswith("comm_alone")]
        if gemm is None or not comms:
            return None
        return max(gemm.median_us, min(comms))


@dataclass(eq=False)
class SweepProgress:
    """What the progress display shows; updated by the coordinator as trials arrive."""

    sweep_name: str
    topology: str
    runs: list[WorkloadRun]
    gangs: int
    """Slots measuring at once: gangs still in use, or 1 in this process."""
    source: str = "measured"
    """The source label of the runner's results (`fixture`: synthetic times)."""
    started: float = field(default_factory=time.monotonic)
    latest: WorkloadRun | None = None
    """The workload whose trial arrived last."""
    trial_seconds: list[float] = field(default_factory=list)
    """Wall time of each finished trial on its gang."""
    handling_ms: list[float] = field(default_factory=list)
    """Coordinator time per finished trial, from Ray reporting it ready to the next candidate
    submitted: fetching the answers, building and storing the record, the strategy, dispatch."""
    idle_gap_ms: list[float] = field(default_factory=list)
    """Time a slot sat between two consecutive trials (its clock): the coordinator's handling, and
    Ray's round trip on gangs."""
    rebuilds: int = 0
    """Slots killed and started again (gangs after a hang, a lost process or an unfit rank)."""
    stopping: str = ""
    """Why no new work is dispatched, once that is so (`time budget`)."""
    ended: float | None = None
    """`time.monotonic()` when the coordinator returned."""
    where: str = ""
    """What measures, when it is not gangs (`the cost model, in this process`)."""

    @property
    def total(self) -> int:
        return sum(r.strategy.planned for r in self.runs)

    @property
    def done(self) -> int:
        return sum(r.stored_before + r.measured for r in self.runs)

    @property
    def measured(self) -> int:
        return sum(r.measured for r in self.runs)

    @property
    def failures(self) -> Counter:
        c: Counter = Counter()
        for r in self.runs:
            c.update({s: n for s, n in r.statuses.items() if s != "ok"})
        return c

    @property
    def elapsed_s(self) -> float:
        return (self.ended or time.monotonic()) - self.started

    def eta_s(self) -> float | None:
        """Remaining trials × mean trial time ÷ gangs; None before the first trial."""
        if not self.trial_seconds or not self.gangs:
            return None
        remaining = max(self.total - self.done, 0)
        return remaining * statistics.fmean(self.trial_seconds) / self.gangs


class Executor(ABC):
    """How the coordinator's tasks run: the one seam between a sweep on gangs and one in this
    process.

    A *slot* takes one task at a time (a gang of Ray actors, or this process). A task is a
    :class:`~syncopate.workers.GangTask` whatever the slot: every rank's answer, the ranks' failures,
    and whether the deadline passed; `task.gang` is its slot, whose `provenance()` says who
    measured. The coordinator asks for :meth:`idle` slots, submits work to them, waits for tasks to
    finish (:meth:`wait`), and calls :meth:`restart` where a finished task left its slot unfit.
    """

    where: str = ""
    """What measures, for the progress display, where it is not gangs."""
    measurable: Callable[[Workload, Candidate], bool] | None = None
    """Which candidates the runner can measure at all (None: any; see
    :attr:`~syncopate.autotuner.strategies.SearchProblem.measurable`)."""
    calibration: Any = None
    """The cost model's calibration the runner predicts with, for model-guided to share (None: the
    strategy loads its own)."""
    rebuilds: int = 0
    """Slots restarted so far."""
    woke_at: float = 0.0
    """`time.perf_counter()` when the last :meth:`wait` returned: what follows is the coordinator's
    own handling."""

    @property
    def note(self) -> str:
        """What the numbers are where they are not measurements (stored with the sweep, printed
        with its summary); empty for measurements."""
        return ""

    @property
    @abstractmethod
    def slots(self) -> list[Any]:
        """The slots still in use (a gang that could not be rebuilt is dropped)."""

    @abstractmethod
    def idle(self) -> list[Any]:
        """The slots ready for a task, in order."""

    @abstractmethod
    def submit_baselines(self, slot: Any, workload: Workload) -> GangTask:
        """Measure the baselines of `workload` on the idle `slot`."""

    @abstractmethod
    def submit_trial(self, slot: Any, workload: Workload, candidate: Candidate) -> GangTask:
        """Build, verify and time `candidate` on `workload` on the idle `slot`."""

    @abstractmethod
    def wait(self, max_wait_s: float) -> list[GangTask]:
        """The submitted tasks that finished (answered, failed or expired) within about
        `max_wait_s`, no longer in flight. The executor's own work (a gang forming again) is done
        in here."""

    @abstractmethod
    def in_flight(self) -> bool:
        """Whether anything is still running, the executor's own work included."""

    def restart(self, slot: Any, why: str) -> None:
        """A finished task left `slot` unfit (`why`): kill and start it again. Default: nothing to
        restart."""

    def abort(self) -> None:
        """Stop watching everything in flight (Ctrl-C); the caller closes the slots."""


class Coordinator:
    """Runs one sweep's workloads through an executor; see the module docstring."""

    def __init__(
        self,
        *,
        sweep_id: int,
        executor: Executor,
        store: TrialStore,
        runs: list[WorkloadRun],
        topology: Topology,
        environment: Environment,
        source: str,
        strategy_name: str,
        time_budget_s: float | None = None,
        progress: SweepProgress,
        sweep_name: str = "",
        resumed: bool = False,
    ) -> None:
        self.sweep_id = sweep_id
        self.executor = executor
        self.store = store
        self.runs = runs
        self.topology = topology
        self.environment = environment
        self.source = source
        self.strategy_name = strategy_name
        self.time_budget_s = time_budget_s
        self.progress = progress
        self.sweep_name = sweep_name
        self.resumed = resumed
        self.confirm_sweep_id: int | None = None
        """The companion sweep holding re-measurements, once one was stored."""
        self._confirming: set[GangTask] = set()
        self._last_finish: dict[Any, float] = {}
        self._coordinator = {"host": socket.gethostname(), "pid": os.getpid()}

    # -- the loop ---------------------------------------------------------------------------

    def run(self) -> str:
        """Run until every workload is finished (`done`), the time budget ran out (`stopped`), or
        no slot is left (raises RuntimeUnavailableError)."""
        try:
            return self._loop()
        finally:
            self.progress.ended = time.monotonic()

    def _loop(self) -> str:
        self._dispatch()
        while self.executor.in_flight():
            finished = self.executor.wait(max_wait_s=0.5)
            woke = self.executor.woke_at
            trials = 0
            for task in finished:
                trials += task.kind == "trial"
                self._finish(task)
            self.progress.gangs = len(self.executor.slots)
            self.progress.rebuilds = self.executor.rebuilds
            self._dispatch()
            if trials:
                per_trial = (time.perf_counter() - woke) * 1e3 / trials
                self.progress.handling_ms.extend([per_trial] * trials)
        if self.progress.stopping:
            return "stopped"
        if not self.executor.slots and not all(r.finished for r in self.runs):
            raise RuntimeUnavailableError(
                "every gang was lost (killed after hangs or crashes and could not be rebuilt); "
                "the trials so far are stored: fix the workers and run again with --resume"
            )
        return "done"

    def abort(self) -> None:
        """Stop watching everything in flight (Ctrl-C); the caller closes the slots."""
        self.executor.abort()

    # -- what next --------------------------------------------------------------------------

    def _over_budget(self) -> bool:
        if self.time_budget_s is not None and self.progress.elapsed_s >= self.time_budget_s:
            if not self.progress.stopping:
                log.warning(
                    "time budget of %.0f s spent: no new trials; waiting for those in flight",
                    self.time_budget_s,
                )
                self.progress.stopping = "time budget"
            return True
        return False

    def _dispatch(self) -> None:
        for slot in self.executor.idle():
            if self._over_budget():
                return
            if not self._submit_next(slot):
                return

    def _submit_next(self, slot: Any) -> bool:
        """Hand `slot` the next piece of work, workloads in config order; False when there is none
        for now."""
        for run in self.runs:
            if run.exhausted:
                continue
            if run.baselines_state == "todo":
                run.baselines_state = "measuring"
                self.executor.submit_baselines(slot, run.workload)
                return True
            if run.baselines_state == "measuring":
                continue
            asked = run.strategy.ask(1)
            if asked:
                run.in_flight += 1
                self.executor.submit_trial(slot, run.workload, asked[0])
                return True
            again = run.confirm.next() if run.confirm is not None and run.in_flight == 0 else None
            if again is not None:
                run.in_flight += 1
                self._confirming.add(self.executor.submit_trial(slot, run.workload, again))
                return True
            if run.confirm is None or run.in_flight == 0:
                run.exhausted = True
        return False

    def confirm_sweep(self) -> int:
        """The companion sweep re-measurements are stored in (made, or resumed, on first use)."""
        if self.confirm_sweep_id is None:
            self.confirm_sweep_id = companion_sweep(self.store, self.sweep_name, self.sweep_id, self.resumed)
        return self.confirm_sweep_id

    def _run_of(self, workload: Workload) -> WorkloadRun:
        return next(r for r in self.runs if r.workload == workload)

    # -- results ----------------------------------------------------------------------------

    def _finish(self, task: GangTask) -> None:
        if task.kind == "baselines":
            self._finish_baselines(task)
        else:
            self._finish_trial(task)

    def _finish_baselines(self, task: GangTask) -> None:
        run = self._run_of(task.workload)
        if task.errors or task.expired:
            why = (
                failure_text(min(task.errors.items())[1])
                if task.errors
                else f"no answer within {task.deadline_s:.0f} s"
            )
            log.warning(
                "baselines of %s failed (%s): its candidates are measured without them", run.workload, why
            )
            run.baselines_state = "failed"
            self._restart(task.gang, "baselines failed")
            return
        records = []
        for b in task.values[0]:
            stats = summarize(b.samples_us)
            if stats is None:
                log.info("baseline %s of %s is missing: %s", b.name, run.workload, b.detail or "no samples")
                continue
            try:
                records.append(
                    BaselineRecord(
                        workload=run.workload,
                        topology=self.topology,
                        environment=self.environment,
                        name=b.name,
                        median_us=stats[0],
                        p20_us=stats[1],
                        p80_us=stats[2],
                        samples_us=b.samples_us,
                        eager_us=b.eager_us,
                        host_us=b.host_us,
                        source=self.source,
                        detail=b.detail,
                    )
                )
            except ConfigError as e:
                log.warning("baseline %s of %s not stored: %s", b.name, run.workload, e)
        self.store.record_baselines(self.sweep_id, records)
        run.baselines = {b.name: b for b in records}
        run.baselines_state = "done"

    def _trial_record(self, task: GangTask) -> tuple[TrialRecord, str | None]:
        """The trial a finished task stands for, and why its slot must be restarted (or None).

        The status is the first failing rank's (a rank's exception or lost process: `crash`; no
        answer in time: `timeout`); times come from an `ok` trial only: the device samples of the
        first rank (the max over ranks, each repetition), and the slowest rank's eager and host
        times. A failed trial stores no times, so that it can never rank."""
        outcomes: list[CandidateOutcome] = [task.values[r] for r in sorted(task.values)]
        failed = [o for o in outcomes if o.status != "ok"]
        restart: str | None = None
        if task.errors:
            rank, exc = min(task.errors.items())
            status, error = "crash", f"rank {rank}: {failure_text(exc)}"
            restart = f"rank {rank} failed"
        elif task.expired:
            if failed:
                status, error = failed[0].status, failed[0].error
            else:
                status = "timeout"
                error = (
                    f"no answer within the {task.deadline_s:g} s deadline from rank(s) "
                    f"{', '.join(map(str, task.pending_ranks))}; the gang was killed and rebuilt"
                )
            restart = f"candidate {task.candidate.key()} missed its {task.deadline_s:g} s deadline"
        else:
            chosen = failed[0] if failed else outcomes[0]
            status, error = chosen.status, chosen.error
            if any(not o.healthy for o in outcomes):
                restart = f"candidate {task.candidate.key()} left a rank unfit ({status})"
        if status not in TRIAL_STATUSES:
            status, error = "crash", f"the runner reported an unknown status {status!r}: {error}"
        lead = failed[0] if failed else (outcomes[0] if outcomes else None)
        samples = lead.samples_us if status == "ok" and lead is not None else ()
        stats = summarize(samples)
        if status == "ok" and stats is None:
            status, error = "crash", "the runner reported ok without timing samples"
        median, p20, p80 = stats if status == "ok" and stats else (None, None, None)
        measured = outcomes if status == "ok" else []
        worker = {
            **(lead.extra if lead is not None else {}),
            **task.gang.provenance(),
            "finished_at": datetime.now(timezone.utc).isoformat(),
            "elapsed_s": round(task.elapsed_s, 6),
            "coordinator": self._coordinator,
        }
        trial = TrialRecord(
            workload=task.workload,
            topology=self.topology,
            environment=self.environment,
            candidate=task.candidate,
            status=status,
            source=self.source,
            median_us=median,
            p20_us=p20,
            p80_us=p80,
            samples_us=samples if status == "ok" else (),
            eager_us=slowest([o.eager_us for o in measured]),
            host_us=slowest([o.host_us for o in measured]),
            max_rel_error=lead.max_rel_error if lead is not None else None,
            error=error,
            worker=worker,
            strategy=self.strategy_name,
        )
        return trial, restart

    def _finish_trial(self, task: GangTask) -> None:
        run = self._run_of(task.workload)
        run.in_flight -= 1
        trial, restart = self._trial_record(task)
        if task in self._confirming:
            self._confirming.discard(task)
            self.store.record_trial(self.confirm_sweep(), trial)
            run.confirm.record(trial)
            run.remeasured += 1
        else:
            self.store.record_trial(self.sweep_id, trial)
            run.strategy.tell(trial)
            if run.confirm is not None:
                run.confirm.observe(trial)
            run.measured += 1
            run.statuses[trial.status] += 1
            run.offer(trial)
            self.progress.latest = run
            self.progress.trial_seconds.append(task.elapsed_s)
            if trial.status != "ok":
                log.warning(
                    "%s: candidate %s: %s: %s", run.workload, task.candidate.key(), trial.status, trial.error
                )
        self._note_gap(task)
        if restart is not None:
            self._restart(task.gang, restart)

    def _restart(self, slot: Any, why: str) -> None:
        self._last_finish.pop(slot, None)
        self.executor.restart(slot, why)

    def _note_gap(self, task: GangTask) -> None:
        """The slot's idle time between its previous trial and this one, by the ranks' clocks."""
        outcome: Any = task.values.get(0)
        if not isinstance(outcome, CandidateOutcome) or task.errors or task.expired:
            self._last_finish.pop(task.gang, None)
            return
        previous = self._last_finish.get(task.gang)
        if previous is not None:
            self.progress.idle_gap_ms.append((outcome.started_at - previous) * 1e3)
        self._last_finish[task.gang] = outcome.finished_at
