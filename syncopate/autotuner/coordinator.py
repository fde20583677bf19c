"""The coordinator's loop: keep every gang busy, store every trial as it arrives, watch deadlines.

One :class:`Coordinator` drives one sweep on formed gangs. Each idle gang gets the next piece of
work, workloads in config order: the workload's baselines first (once; stored baselines of a
resumed sweep are reused), then candidates from the workload's strategy, then the re-measurements
of the best few (:mod:`syncopate.autotuner.confirm`; stored in the companion sweep). Every finished trial,
failures included, is stored at once and told to the strategy. A gang that misses its deadline,
loses a process, or reports a process it no longer trusts is killed and rebuilt in its placement
group; the sweep goes on. A gang that fails to rebuild `max_rebuild_failures` times in a row is
dropped.
"""

from __future__ import annotations

import logging
import os
import socket
import statistics
import time
from collections import Counter
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
from syncopate.search_space import Topology, Workload
from syncopate.workers import CandidateOutcome, Gang, GangTask, TaskBoard, failure_text, slowest, summarize

__all__ = ["WorkloadRun", "SweepProgress", "Coordinator", "check_gang_members"]

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
    """Time a gang sat between two consecutive trials (its clock), Ray's round trip included."""
    rebuilds: int = 0
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


class Coordinator:
    """Runs one sweep's workloads on formed gangs; see the module docstring."""

    def __init__(
        self,
        *,
        sweep_id: int,
        gangs: list[Gang],
        store: TrialStore,
        runs: list[WorkloadRun],
        topology: Topology,
        environment: Environment,
        deadline_s: float,
        source: str,
        strategy_name: str,
        time_budget_s: float | None = None,
        progress: SweepProgress,
        max_rebuild_failures: int = 3,
        sweep_name: str = "",
        resumed: bool = False,
    ) -> None:
        self.sweep_id = sweep_id
        self.gangs = list(gangs)
        self.store = store
        self.runs = runs
        self.topology = topology
        self.environment = environment
        self.deadline_s = deadline_s
        self.source = source
        self.strategy_name = strategy_name
        self.time_budget_s = time_budget_s
        self.progress = progress
        self.max_rebuild_failures = max_rebuild_failures
        self._board = TaskBoard()
        self._busy: dict[Gang, GangTask] = {}
        self._rebuild_failures: Counter = Counter()
        self._last_finish: dict[Gang, float] = {}
        self._coordinator = {"host": socket.gethostname(), "pid": os.getpid()}
        self.sweep_name = sweep_name
        self.resumed = resumed
        self.confirm_sweep_id: int | None = None
        """The companion sweep holding re-measurements, once one was stored."""
        self._confirming: set[GangTask] = set()

    # -- the loop ---------------------------------------------------------------------------

    def run(self) -> str:
        """Run until every workload is finished (`done`), the time budget ran out (`stopped`), or
        no gang is left (raises RuntimeUnavailableError)."""
        try:
            return self._loop()
        finally:
            self.progress.ended = time.monotonic()

    def _loop(self) -> str:
        self._dispatch()
        while len(self._board):
            finished = self._board.wait(max_wait_s=0.5)
            woke = self._board.woke_at
            trials = 0
            for task in finished:
                trials += task.kind == "trial"
                self._finish(task)
            self._dispatch()
            if trials:
                per_trial = (time.perf_counter() - woke) * 1e3 / trials
                self.progress.handling_ms.extend([per_trial] * trials)
        if self.progress.stopping:
            return "stopped"
        if not self.gangs and not all(r.finished for r in self.runs):
            raise RuntimeUnavailableError(
                "every gang was lost (killed after hangs or crashes and could not be rebuilt); "
                "the trials so far are stored: fix the workers and run again with --resume"
            )
        return "done"

    def abort(self) -> None:
        """Stop watching everything in flight (Ctrl-C); the caller shuts the gangs down."""
        for task in self._board.tasks:
            self._board.discard(task)
        self._busy.clear()

    # -- dispatch ---------------------------------------------------------------------------

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
        for gang in self.gangs:
            if gang in self._busy or self._over_budget():
                continue
            task = self._next_task(gang)
            if task is not None:
                self._busy[gang] = task
                self._board.add(task)

    def _next_task(self, gang: Gang) -> GangTask | None:
        for run in self.runs:
            if run.exhausted:
                continue
            if run.baselines_state == "todo":
                run.baselines_state = "measuring"
                return gang.submit_baselines(run.workload, self.deadline_s)
            if run.baselines_state == "measuring":
                continue
            asked = run.strategy.ask(1)
            if not asked:
                again = run.confirm.next() if run.confirm is not None and run.in_flight == 0 else None
                if again is None:
                    if run.confirm is None or run.in_flight == 0:
                        run.exhausted = True
                    continue
                run.in_flight += 1
                task = gang.submit_trial(run.workload, again, self.deadline_s)
                self._confirming.add(task)
                return task
            run.in_flight += 1
            return gang.submit_trial(run.workload, asked[0], self.deadline_s)
        return None

    def confirm_sweep(self) -> int:
        """The companion sweep re-measurements are stored in (made, or resumed, on first use)."""
        if self.confirm_sweep_id is None:
            self.confirm_sweep_id = companion_sweep(self.store, self.sweep_name, self.sweep_id, self.resumed)
        return self.confirm_sweep_id

    def _run_of(self, workload: Workload) -> WorkloadRun:
        return next(r for r in self.runs if r.workload == workload)

    # -- results ----------------------------------------------------------------------------

    def _finish(self, task: GangTask) -> None:
        gang = task.gang
        self._busy.pop(gang, None)
        if task.kind == "form":
            self._finish_form(task)
        elif task.kind == "baselines":
            self._finish_baselines(task)
        else:
            self._finish_trial(task)

    def _rebuild(self, gang: Gang, why: str) -> None:
        log.warning("gang %d: %s; killing and rebuilding it", gang.index, why)
        self._last_finish.pop(gang, None)
        gang.kill()
        self.progress.rebuilds += 1
        task = gang.start()
        self._busy[gang] = task
        self._board.add(task)

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
            self.gangs.remove(gang)
            gang.shutdown()
            self.progress.gangs = len(self.gangs)
            return
        self._rebuild(gang, f"rebuild failed ({problem})")

    def _finish_baselines(self, task: GangTask) -> None:
        run = self._run_of(task.workload)
        if task.errors or task.expired:
            why = (
                failure_text(min(task.errors.items())[1])
                if task.errors
                else f"no answer within {task.deadline_s:.0f} s"
            )
            log.warning(
                "baselines of %s failed on gang %d (%s): its candidates are measured without them",
                run.workload,
                task.gang.index,
                why,
            )
            run.baselines_state = "failed"
            self._rebuild(task.gang, "baselines failed")
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
        """The trial a finished task stands for, and why its gang must be rebuilt (or None)."""
        outcomes: list[CandidateOutcome] = [task.values[r] for r in sorted(task.values)]
        failed = [o for o in outcomes if o.status != "ok"]
        rebuild: str | None = None
        if task.errors:
            rank, exc = min(task.errors.items())
            status, error = "crash", f"rank {rank}: {failure_text(exc)}"
            rebuild = f"rank {rank} failed"
        elif task.expired:
            if failed:
                status, error = failed[0].status, failed[0].error
            else:
                status = "timeout"
                error = (
                    f"no answer within the {task.deadline_s:g} s deadline from rank(s) "
                    f"{', '.join(map(str, task.pending_ranks))}; the gang was killed and rebuilt"
                )
            rebuild = f"candidate {task.candidate.key()} missed its {task.deadline_s:g} s deadline"
        else:
            chosen = failed[0] if failed else outcomes[0]
            status, error = chosen.status, chosen.error
            if any(not o.healthy for o in outcomes):
                rebuild = f"candidate {task.candidate.key()} left a rank unfit ({status})"
        if status not in TRIAL_STATUSES:
            status, error = "crash", f"the runner reported an unknown status {status!r}: {error}"
        lead = failed[0] if failed else (outcomes[0] if outcomes else None)
        samples = lead.samples_us if lead is not None and lead.status == status else ()
        stats = summarize(samples)
        if status == "ok" and stats is None:
            status, error = "crash", "the runner reported ok without timing samples"
        median, p20, p80 = stats if stats else (None, None, None)
        measured = [o for o in outcomes if o.status == "ok"] if status == "ok" else []
        eager = slowest([o.eager_us for o in measured])
        host = slowest([o.host_us for o in measured])
        worker = {
            **task.gang.provenance(),
            "finished_at": datetime.now(timezone.utc).isoformat(),
            "elapsed_s": round(task.elapsed_s, 6),
            "coordinator": self._coordinator,
        }
        if lead is not None and lead.extra:
            worker["runner_extra"] = lead.extra
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
            samples_us=samples,
            eager_us=eager,
            host_us=host,
            max_rel_error=lead.max_rel_error if lead is not None else None,
            error=error,
            worker=worker,
            strategy=self.strategy_name,
        )
        return trial, rebuild

    def _finish_trial(self, task: GangTask) -> None:
        run = self._run_of(task.workload)
        run.in_flight -= 1
        trial, rebuild = self._trial_record(task)
        if task in self._confirming:
            self._confirming.discard(task)
            self.store.record_trial(self.confirm_sweep(), trial)
            run.confirm.record(trial)
            run.remeasured += 1
            if rebuild is not None:
                self._rebuild(task.gang, rebuild)
            return
        self.store.record_trial(self.sweep_id, trial)
        run.strategy.tell(trial)
        if run.confirm is not None:
            run.confirm.observe(trial)
        run.measured += 1
        run.statuses[trial.status] += 1
        run.offer(trial)
        self.progress.latest = run
        self.progress.trial_seconds.append(task.elapsed_s)
        self._note_gap(task)
        if trial.status != "ok":
            log.warning(
                "%s: candidate %s: %s: %s", run.workload, task.candidate.key(), trial.status, trial.error
            )
        if rebuild is not None:
            self._rebuild(task.gang, rebuild)

    def _note_gap(self, task: GangTask) -> None:
        outcome: Any = task.values.get(0)
        if not isinstance(outcome, CandidateOutcome) or task.errors or task.expired:
            self._last_finish.pop(task.gang, None)
            return
        previous = self._last_finish.get(task.gang)
        if previous is not None:
            self.progress.idle_gap_ms.append((outcome.started_at - previous) * 1e3)
        self._last_finish[task.gang] = outcome.finished_at
