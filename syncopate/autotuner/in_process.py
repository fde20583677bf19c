"""`syncopate tune` with a runner that needs neither GPUs nor Ray (`model`, `replay`): the sweep
runs in this process, one trial after another, with the same strategies, store, progress display
and summary as a sweep on gangs.

Order of work, as on gangs: :func:`~syncopate.autotuner.tune.run_tune` opens the store and checks
a `--resume` (the same runner) before anything else; then everything is checked and the
strategies are built (a study made over another space fails here), then the sweep is started or
resumed, then ask, run, store and tell, workload by workload; the best few are measured again
where the runner can measure again (a replay with noise; predictions are deterministic and are
not).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from datetime import datetime, timezone
from typing import Any

from rich.console import Console

from syncopate.autotuner.confirm import companion_sweep
from syncopate.autotuner.coordinator import SweepProgress, WorkloadRun
from syncopate.autotuner.progress import LiveProgress
from syncopate.autotuner.runs import (
    build_runs,
    close_runs,
    load_calibration,
    restore_runs,
    stored_done,
    summarize_runs,
)
from syncopate.autotuner.store import StoredSweep, TrialStore
from syncopate.errors import ConfigError
from syncopate.records import TRIAL_STATUSES, BaselineRecord, Environment, TrialRecord
from syncopate.search_space import Topology
from syncopate.workers import RunnerSpec, classify_exception, make_runner, summarize

__all__ = ["run_in_process"]

log = logging.getLogger(__name__)


def _runner_and_topology(plan: Any) -> tuple[Any, Topology, str]:
    """The runner, the topology it answers for, and a sentence saying what its numbers are."""
    sweep = plan.sweep
    if plan.runner == "model":
        if plan.topology is None:
            raise ConfigError(
                f"{sweep.source}: runner model predicts for a topology named in the config: set `topology:` to a "
                f"key such as H200x2-nvlink (or pass --topology KEY), not `detect`"
            )
        calibration = load_calibration(plan.topology, None, plan.db, sweep.calibration)
        runner = make_runner(
            RunnerSpec(name="model", timing=sweep.timing, topology=plan.topology, options=calibration)
        )
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
    runner = make_runner(
        RunnerSpec(name="replay", timing=sweep.timing, topology=plan.topology, options=sweep.replay.options())
    )
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
    from syncopate.autotuner.tune import TuneResult, interrupted_line, open_sweep

    sweep = plan.sweep
    runner, topology, note = _runner_and_topology(plan)
    try:
        for w in sweep.workloads:
            w.check_world_size(topology.world_size)
        store.prepare_writes()  # nothing left that could refuse the run: make the database where it is new
        device = runner.bind_device(0, [0])
        runner.setup(0, 1, None)
        environment = _environment(runner, device)
        resumed = previous is not None
        done = stored_done(store, previous, sweep, topology, environment)
        calibration = getattr(runner, "calibration", None)
        repeatable = plan.runner == "replay" and bool(getattr(runner, "noise", 0.0))
        runs = build_runs(
            sweep,
            topology,
            environment,
            max_trials=plan.max_trials,
            db=plan.db,
            done=done,
            calibration=calibration,
            confirm=repeatable,
            mode=plan.mode,
            measurable=getattr(runner, "holds", None),
        )
        try:
            sweep_id = open_sweep(plan, store, previous, topology, environment, note)
            if resumed:
                restore_runs(store, sweep_id, runs, topology, environment)
            console.print(note, highlight=False)
            if resumed:
                console.print(
                    f"resuming sweep {sweep.name!r} (id {sweep_id}): {sum(r.stored_before for r in runs)} trial(s) "
                    f"stored, {sum(r.strategy.remaining for r in runs)} to go",
                    highlight=False,
                )
            where = "predicted by the cost model" if plan.runner == "model" else "replayed"
            progress = SweepProgress(
                sweep_name=sweep.name,
                topology=topology.key(),
                runs=runs,
                gangs=1,
                where=where,
                source=runner.source,
            )
            loop = _Loop(plan, store, runner, topology, environment, sweep_id, resumed, progress)
            status = "failed"
            try:
                with LiveProgress(progress, console):
                    status = loop.run()
            except KeyboardInterrupt:
                status = "interrupted"
                console.print(interrupted_line(sweep.name, sweep_id), highlight=False)
                raise
            finally:
                progress.ended = time.monotonic()
                store.finish_sweep(sweep_id, status)
                if loop.confirm_id is not None:
                    store.finish_sweep(loop.confirm_id, status)
            summaries = summarize_runs(store, sweep_id, runs, topology, environment)
        finally:
            close_runs(runs)
    finally:
        runner.close()
    if getattr(runner, "unheld", 0):
        note += (
            f" {runner.unheld} trial(s) asked for candidates that the replayed sweep does not hold, stored as "
            f"`crash`: give the config the `space:` of the replayed sweep to search only what it measured."
        )
    return TuneResult(
        sweep_id=sweep_id,
        sweep_name=sweep.name,
        status=status,
        resumed=resumed,
        topology=topology.key(),
        environment=environment,
        runner=plan.runner,
        source=runner.source,
        summaries=summaries,
        progress=progress,
        note=note,
        mode=plan.mode,
    )


def _environment(runner: Any, device: Any) -> Environment:
    stored = getattr(getattr(runner, "stored", None), "environment", None)
    if stored is not None:
        return stored
    return runner.environment(device)


class _Loop:
    """Ask, run, store, tell: one trial at a time, workloads in config order."""

    def __init__(self, plan, store, runner, topology, environment, sweep_id, resumed, progress) -> None:
        self.plan, self.store, self.runner = plan, store, runner
        self.topology, self.environment = topology, environment
        self.sweep_id, self.resumed, self.progress = sweep_id, resumed, progress
        self.confirm_id: int | None = None
        self.worker = {"runner": runner.name, "host": socket.gethostname(), "pid": os.getpid()}

    def run(self) -> str:
        deadline = self.plan.time_budget_s
        for run in self.progress.runs:
            self._baselines(run)
            while True:
                if deadline is not None and self.progress.elapsed_s >= deadline:
                    self.progress.stopping = "time budget"
                    log.warning("time budget of %.0f s spent: no new trials", deadline)
                    return "stopped"
                asked = run.strategy.ask(1)
                if asked:
                    trial = self._trial(run, asked[0])
                    self.store.record_trial(self.sweep_id, trial)
                    run.strategy.tell(trial)
                    if run.confirm is not None:
                        run.confirm.observe(trial)
                    self._count(run, trial)
                    continue
                again = run.confirm.next() if run.confirm is not None else None
                if again is None:
                    run.exhausted = True
                    break
                trial = self._trial(run, again)
                self.store.record_trial(self._confirm_sweep(), trial)
                run.confirm.record(trial)
                run.remeasured += 1
        return "done"

    def _confirm_sweep(self) -> int:
        if self.confirm_id is None:
            self.confirm_id = companion_sweep(self.store, self.plan.sweep.name, self.sweep_id, self.resumed)
        return self.confirm_id

    def _baselines(self, run: WorkloadRun) -> None:
        if run.baselines_state == "done":  # stored before a resume
            return
        records = []
        for b in self.runner.baselines(run.workload):
            stats = summarize(b.samples_us)
            if stats is None:
                continue
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
                    source=self.runner.source,
                    detail=b.detail,
                )
            )
        self.store.record_baselines(self.sweep_id, records)
        run.baselines = {b.name: b for b in records}
        run.baselines_state = "done"

    def _trial(self, run: WorkloadRun, candidate) -> TrialRecord:
        started = time.perf_counter()
        try:
            outcome = self.runner.run(run.workload, candidate, self.plan.sweep.timing.deadline_s)
            status, error, samples = outcome.status, outcome.error, outcome.samples_us
            extra, rel, eager, host = outcome.extra, outcome.max_rel_error, outcome.eager_us, outcome.host_us
        except Exception as e:  # a runner's failure is the trial's outcome, as on a gang
            status, _ = classify_exception(e)
            error, samples, extra, rel, eager, host = f"{type(e).__name__}: {e}", (), {}, None, None, None
        if status not in TRIAL_STATUSES:
            status, error = "crash", f"the runner reported an unknown status {status!r}: {error}"
        stats = summarize(samples) if status == "ok" else None
        if status == "ok" and stats is None:
            status, error = "crash", "the runner reported ok without a time"
        median, p20, p80 = stats if stats else (None, None, None)
        self.progress.trial_seconds.append(time.perf_counter() - started)
        return TrialRecord(
            workload=run.workload,
            topology=self.topology,
            environment=self.environment,
            candidate=candidate,
            status=status,
            source=self.runner.source,
            median_us=median,
            p20_us=p20,
            p80_us=p80,
            samples_us=samples if status == "ok" else (),
            eager_us=eager if status == "ok" else None,
            host_us=host if status == "ok" else None,
            max_rel_error=rel,
            error=error,
            worker={**self.worker, "finished_at": datetime.now(timezone.utc).isoformat(), **extra},
            strategy=self.plan.sweep.strategy.name,
        )

    def _count(self, run: WorkloadRun, trial: TrialRecord) -> None:
        run.measured += 1
        run.statuses[trial.status] += 1
        run.offer(trial)
        self.progress.latest = run
