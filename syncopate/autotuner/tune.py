"""`syncopate tune`: a sweep config in, every trial stored, a summary out.

Order of work, so that bad input fails before anything is started or written:

1. read and check the config and the options (runner, strategy, topology);
2. open the store, writing nothing: a database that cannot be used (missing, another
   application's, another schema, read-only) is refused here; a new SQLite file is only checked
   for; for `--resume`, find the sweep to continue and check that the same runner measured it;
3. for the `gpu` runner on a local cluster, count this machine's GPUs (as Ray will);
4. connect to Ray (or start a local cluster), count GPUs, reserve one placement group per gang and
   form the gangs (one model of GPU, one environment);
5. make the database where it is new (:meth:`TrialStore.prepare_writes`): a run refused before
   this point leaves no file;
6. build every workload's strategy (an Optuna study made over another space fails here);
7. only then start (or resume) the sweep in the store, and run the coordinator.

The `model` and `replay` runners need neither GPUs nor Ray: their sweeps run in this process
(:mod:`syncopate.autotuner.in_process`), steps 1 and 2, then 5 to 7 (the cost model reads its
calibrations from the database). Either way, steps 6 and 7 are one function, :func:`run_sweep`, and
the sweep one loop (:class:`~syncopate.autotuner.coordinator.Coordinator`): what differs is only
the executor that runs its tasks, gangs (:mod:`syncopate.autotuner.gangs`) or this process.

The closing summary gives, per workload, the fastest `ok` trial of this sweep in its mode (trials
stored before a resume included) and its speedup over the baselines of the same sweep; where the
best few were measured again, the winner on the pooled samples instead. The mode (`--mode`,
default `eager`) is what the job will see: back-to-back eager time with the host on the path, or
device time where calls are replayed from CUDA graphs (`graph`); both are measured either way,
and every sweep measures the untuned default and the unfused template first. A `cpu-fixture` sweep's numbers are
synthetic and stored with source `fixture`, a `model` sweep's are predictions (source
`predicted`): `syncopate best` and `lookup` never serve them.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from syncopate.autotuner import store as store_module
from syncopate.autotuner.cluster import Cluster, check_local_gpus, connect, gang_capacity, gang_shape
from syncopate.autotuner.coordinator import Coordinator, Executor, SweepProgress
from syncopate.autotuner.gangs import GangExecutor, check_gang_members, form_gangs, gangs_environment
from syncopate.autotuner.progress import LiveProgress, WorkloadSummary
from syncopate.autotuner.runs import (
    build_runs,
    close_runs,
    load_calibration,
    restore_runs,
    stored_done,
    summarize_runs,
)
from syncopate.autotuner.store import StoredSweep, TrialStore
from syncopate.autotuner.strategies import strategy_class
from syncopate.autotuner.sweep import RUNNERS, SWEEP_FIELDS, Sweep, load_sweep, parse_sweep
from syncopate.errors import ConfigError
from syncopate.records import DEFAULT_MODE, Environment, check_mode
from syncopate.search_space import MoeWorkload, Topology
from syncopate.workers import IN_PROCESS_RUNNERS, Gang, RunnerSpec, runner_class

__all__ = ["TuneOptions", "TuneResult", "run_tune"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True, slots=True)
class TuneOptions:
    """The command line of `syncopate tune`; None means: as the config says."""

    config: Path
    """The sweep config (YAML)."""
    db: str | None = None
    """Database URL; overrides the config's `db`."""
    resume: bool = False
    """Continue the most recent sweep of the config's name, skipping stored trials."""
    max_trials: int | None = None
    """Trials per workload; overrides `strategy.max_trials`."""
    time_budget_s: float | None = None
    """Wall-clock budget of the run; overrides `strategy.time_budget_s`."""
    ray_address: str | None = None
    """Ray cluster to join; overrides `ray_address` (none: start a local cluster)."""
    runner: str | None = None
    """Overrides `runner`."""
    verbose: bool = False
    """Forward the workers' logs and log at INFO."""
    form_timeout_s: float = 300.0
    """How long a gang may take to start its actors and form its process group."""
    topology: str | None = None
    """A topology key overriding the config's `topology` (e.g. to predict for one not at hand)."""
    mode: str = DEFAULT_MODE
    """What the sweep's best and the re-measurements rank by: `eager` (back-to-back eager time, the
    host on the path) or `graph` (device time, calls replayed from CUDA graphs)."""

    def __post_init__(self) -> None:
        check_mode(self.mode)
        if self.max_trials is not None and self.max_trials <= 0:
            raise ConfigError(f"--max-trials {self.max_trials} must be positive")
        if self.time_budget_s is not None and not 0 < self.time_budget_s < math.inf:
            raise ConfigError(
                f"--time-budget {self.time_budget_s} must be a positive, finite number of seconds "
                f"(leave it out for no limit)"
            )
        if self.runner is not None and self.runner not in RUNNERS:
            raise ConfigError(f"--runner {self.runner!r} is unknown: accepted are {', '.join(RUNNERS)}")
        if self.form_timeout_s <= 0:
            raise ConfigError(f"form_timeout_s={self.form_timeout_s} must be positive")


@dataclass(frozen=True, kw_only=True, slots=True)
class _Plan:
    """The checked settings of one run, before anything is started."""

    sweep: Sweep
    runner: str
    source: str
    max_trials: int | None
    time_budget_s: float | None
    topology: Topology | None
    db: str | None
    ray_address: str | None
    declared_gpus: int | None
    mode: str = DEFAULT_MODE


@dataclass(kw_only=True, slots=True)
class TuneResult:
    """What a run did."""

    sweep_id: int
    sweep_name: str
    status: str
    resumed: bool
    topology: str
    environment: Environment
    runner: str
    source: str
    summaries: list[WorkloadSummary] = field(default_factory=list)
    progress: SweepProgress | None = None
    note: str = ""
    """What the numbers are, where they are not measurements (the model's and replay's runs)."""
    mode: str = DEFAULT_MODE
    """What the summary's best ranks by."""

    @property
    def served(self) -> bool:
        """Whether `lookup` and `syncopate best` serve this sweep's results (measured ones only)."""
        return self.source == "measured"


def _plan(options: TuneOptions) -> _Plan:
    sweep = load_sweep(options.config)
    runner = options.runner or sweep.runner
    runner_cls = runner_class(runner)
    if options.ray_address is not None and runner in IN_PROCESS_RUNNERS:
        raise ConfigError(
            f"--ray-address {options.ray_address} is for the runners on Ray (gpu, cpu-fixture); runner {runner} "
            f"runs in this process: leave out --ray-address, or pass --runner gpu"
        )
    strategy_class(sweep.strategy.name)
    if options.topology is not None:
        topology = None if options.topology == "detect" else Topology.from_key(options.topology)
    else:
        topology = None if sweep.detect_topology else Topology.from_key(sweep.topology_key)
    if topology is not None:
        for w in sweep.workloads:
            w.check_world_size(topology.world_size)
    declared = None
    if runner == "cpu-fixture":
        fixture_gpus = sweep.fixture.gpus if sweep.fixture is not None else None
        declared = fixture_gpus or (topology.world_size if topology is not None else 2)
    moe = [str(w) for w in sweep.workloads if isinstance(w, MoeWorkload)]
    if moe and runner in ("replay", "cpu-fixture"):
        raise ConfigError(
            f"runner {runner} answers for the dense kinds only; the config lists MoE workloads ({', '.join(moe)}): "
            f"measure them with runner gpu, runner cpu (gloo ranks on the CPU, wall-clock times), or predict "
            f"them with runner model"
        )
    if runner == "cpu":
        dense = [str(w) for w in sweep.workloads if not isinstance(w, MoeWorkload)]
        if dense:
            raise ConfigError(
                f"runner cpu measures the MoE kinds only (a `moe:` section); the config lists {', '.join(dense)}: "
                f"use runner gpu for them, or cpu-fixture for synthetic times"
            )
        if topology is None:
            raise ConfigError(
                f"{sweep.source}: runner cpu measures on gloo ranks, one a rank of a named topology: set "
                f"`topology:` to a key such as H200x2-nvlink (or pass --topology KEY), not `detect`"
            )
        declared = topology.world_size
    return _Plan(
        sweep=sweep,
        runner=runner,
        source=runner_cls.source,
        max_trials=options.max_trials or sweep.strategy.max_trials,
        time_budget_s=options.time_budget_s or sweep.strategy.time_budget_s,
        topology=topology,
        db=options.db or sweep.db,
        ray_address=options.ray_address or sweep.ray_address,
        declared_gpus=declared,
        mode=options.mode,
    )


def run_tune(
    options: TuneOptions,
    *,
    open_store: Callable[[str | None], TrialStore] | None = None,
    console: Console | None = None,
) -> TuneResult:
    """Run the sweep `options` describes; see the module docstring. `open_store` defaults to
    :func:`syncopate.autotuner.store.open_store`; the live display goes to `console`."""
    plan = _plan(options)
    store = (open_store or store_module.open_store)(plan.db)
    try:
        previous = _sweep_to_resume(store, plan) if options.resume else None
        if plan.runner in IN_PROCESS_RUNNERS:
            from syncopate.autotuner.in_process import run_in_process

            return run_in_process(plan, previous, store, console or Console(stderr=True))
        if plan.declared_gpus is None and plan.ray_address is None and not os.environ.get("RAY_ADDRESS"):
            check_local_gpus(plan.topology, plan.runner, moe=_has_moe(plan))
        cluster = connect(plan.ray_address, declared_gpus=plan.declared_gpus, verbose=options.verbose)
        try:
            return _tune_on(cluster, plan, options, store, previous, console or Console(stderr=True))
        finally:
            cluster.disconnect()
    finally:
        store.close()


def _sweep_to_resume(store: TrialStore, plan: _Plan) -> StoredSweep | None:
    """The sweep `--resume` continues (None: there is none, a new one starts); raises ConfigError
    where another runner measured it, since one sweep holds one runner's results."""
    name = plan.sweep.name
    previous = store.latest_sweep(name)
    if previous is None:
        log.warning("no sweep named %r to resume: starting a new one", name)
        return None
    if previous.runner is not None and previous.runner != plan.runner:
        raise ConfigError(
            f"sweep {name!r} (id {previous.sweep_id}) was run with runner {previous.runner}, not "
            f"{plan.runner}: one sweep holds one runner's results; resume it with --runner "
            f"{previous.runner}, or leave out --resume to start a new sweep"
        )
    check_same_sweep(previous, plan, plan.topology)
    return previous


def check_same_sweep(previous: StoredSweep, plan: _Plan, topology: Topology | None) -> None:
    """Raise ConfigError where `--resume` would add this run's trials to a sweep started with other
    workloads, search space, timing, runner settings or topology (`topology` None: not known yet)."""
    differences = _differences(previous, plan.sweep, topology)
    if differences:
        raise ConfigError(
            f"sweep {previous.name!r} (id {previous.sweep_id}) was started with other settings: "
            + "; ".join(differences)
            + ". One sweep holds the results of one config: resume it with the config it was started "
            "with, or leave out --resume (or rename the sweep) to start a new one"
        )


def _differences(previous: StoredSweep, sweep: Sweep, topology: Topology | None) -> list[str]:
    stored = previous.config
    found: list[str] = []
    if topology is not None and stored.get("topology") not in (None, topology.key()):
        found.append(f"topology {stored['topology']}, not {topology.key()}")
    fields = {
        k: v for k, v in stored.items() if k in SWEEP_FIELDS and k not in ("topology", "runner", "strategy")
    }
    try:
        old = parse_sweep(fields, f"sweep {previous.sweep_id}")
    except ConfigError as e:  # written by another version: compare what is stored as it is
        log.debug("stored config of sweep %d not parsed (%s): comparing its fields", previous.sweep_id, e)
        return found + [
            f"{key} differs"
            for key in ("workloads", "dtype", "tokens", "space", "timing", "replay", "fixture")
            if stored.get(key) != sweep.raw.get(key)
        ]
    added = [str(w) for w in sweep.workloads if w not in old.workloads]
    removed = [str(w) for w in old.workloads if w not in sweep.workloads]
    if added or removed:
        found.append(
            "workloads "
            + ", ".join(
                ([f"added {', '.join(added)}"] if added else [])
                + ([f"left out {', '.join(removed)}"] if removed else [])
            )
        )
    for name in ("space", "timing", "replay", "fixture"):
        # a section written the same way is the same, even where this version's defaults moved
        if stored.get(name) != sweep.raw.get(name) and getattr(old, name) != getattr(sweep, name):
            found.append(
                f"{name} section {_section(stored.get(name))} then, {_section(sweep.raw.get(name))} now"
            )
    return found


def _section(value: Any) -> str:
    return "(none)" if value is None else json.dumps(value, sort_keys=True, default=str)


def runner_spec(plan: _Plan) -> RunnerSpec:
    """The runner `plan` names, as it is built wherever it runs (every rank of a gang, or this
    process): the sweep's timing and topology, and the runner's own settings: the fixture's planted
    faults, the stored sweep a replay answers from, the calibration the model predicts with."""
    sweep = plan.sweep
    options: Any = None
    if plan.runner == "cpu-fixture":
        options = sweep.fixture
    elif plan.runner == "replay" and sweep.replay is not None:
        options = sweep.replay.options()
    elif plan.runner == "model" and plan.topology is not None:
        options = load_calibration(plan.topology, None, plan.db, sweep.calibration)
    return RunnerSpec(name=plan.runner, timing=sweep.timing, topology=plan.topology, options=options)


def _remeasures(plan: _Plan) -> bool:
    """Whether the best few are measured again: GPU times and a noisy replay's vary from one
    measurement to the next; the fixture's jitter does too, but it is measured again only where
    the config sets `top_k_remeasure`; predictions never vary."""
    sweep = plan.sweep
    if plan.runner == "gpu":
        return True
    if plan.runner == "replay":
        return sweep.replay is not None and sweep.replay.noise > 0
    if plan.runner == "cpu-fixture":
        return "top_k_remeasure" in sweep.strategy.model_fields_set
    return False


def _has_moe(plan: _Plan) -> bool:
    """Whether the sweep lists MoE layers (`moe:`)."""
    return any(isinstance(w, MoeWorkload) for w in plan.sweep.workloads)


def _tune_on(
    cluster: Cluster,
    plan: _Plan,
    options: TuneOptions,
    store: TrialStore,
    previous: StoredSweep | None,
    console: Console,
) -> TuneResult:
    ws, nodes = gang_shape(plan.topology, cluster, plan.runner, moe=_has_moe(plan))
    spec = runner_spec(plan)
    count = gang_capacity(ws, nodes, cluster.gpus_by_node)
    gangs = [Gang(i, ws, spec, nodes=nodes, setup_timeout_s=options.form_timeout_s) for i in range(count)]
    idle = False
    try:
        form_gangs(gangs, options.form_timeout_s)
        check_gang_members(gangs, plan.topology.gpu_model if plan.topology else None)
        environment = gangs_environment(gangs)
        topology = plan.topology or gangs[0].detect_topology(options.form_timeout_s)
        for w in plan.sweep.workloads:
            w.check_world_size(topology.world_size)
        log.info("%d gang(s) of %s formed on %s", len(gangs), topology.key(), cluster.describe())
        store.prepare_writes()
        executor = GangExecutor(
            gangs, deadline_s=plan.sweep.timing.deadline_s, topology=topology, environment=environment
        )
        result = run_sweep(plan, store, executor, topology, environment, previous, console)
        idle = True
        return result
    finally:
        for gang in gangs:
            gang.shutdown(close_timeout_s=10.0 if idle else 0.0)


def interrupted_line(name: str, sweep_id: int) -> str:
    """What an interrupted run says: where its trials are and how to go on."""
    return (
        f"sweep {name!r} (id {sweep_id}) interrupted: the trials so far are stored; run the same "
        f"command with --resume to continue"
    )


def open_sweep(
    plan: _Plan,
    store: TrialStore,
    previous: StoredSweep | None,
    topology: Topology,
    environment: Environment,
    note: str = "",
) -> int:
    """The first write of a run: resume `previous`, or start a new sweep whose config records the
    runner, the topology, the environment and the effective budgets (and `note`, what its numbers
    are, where they are not measurements); its id."""
    if previous is not None:
        check_same_sweep(previous, plan, topology)
        store.resume_sweep(previous.sweep_id)
        return previous.sweep_id
    sweep = plan.sweep
    config = {
        **sweep.raw,
        "runner": plan.runner,
        "mode": plan.mode,
        "topology": topology.key(),
        "environment": environment.to_dict(),
        "strategy": {
            **sweep.strategy.model_dump(),
            "max_trials": plan.max_trials,
            "time_budget_s": plan.time_budget_s,
        },
        **({"note": note} if note else {}),
    }
    return store.start_sweep(sweep.name, config)


def run_sweep(
    plan: _Plan,
    store: TrialStore,
    executor: Executor,
    topology: Topology,
    environment: Environment,
    previous: StoredSweep | None,
    console: Console,
) -> TuneResult:
    """Steps 6 and 7, on gangs or in this process alike: build every workload's strategy, start
    (or resume) the sweep, run the coordinator through `executor` with the live display on
    `console`, mark the sweep with how it ended, and sum it up. The database is ready for writes
    and `executor` ready for tasks."""
    sweep = plan.sweep
    resumed = previous is not None
    runs = build_runs(
        sweep,
        topology,
        environment,
        max_trials=plan.max_trials,
        db=plan.db,
        done=stored_done(store, previous, sweep, topology, environment),
        calibration=executor.calibration,
        confirm=_remeasures(plan),
        mode=plan.mode,
        measurable=executor.measurable,
    )
    try:
        sweep_id = open_sweep(plan, store, previous, topology, environment, executor.note)
        if resumed:
            restore_runs(store, sweep_id, runs, topology, environment)
        if executor.note:
            console.print(executor.note, highlight=False)
        if resumed:
            console.print(
                f"resuming sweep {sweep.name!r} (id {sweep_id}): {sum(r.stored_before for r in runs)} trial(s) "
                f"stored, {sum(r.strategy.remaining for r in runs)} to go",
                highlight=False,
            )
        progress = SweepProgress(
            sweep_name=sweep.name,
            topology=topology.key(),
            runs=runs,
            gangs=len(executor.slots),
            source=plan.source,
            where=executor.where,
        )
        coordinator = Coordinator(
            sweep_id=sweep_id,
            executor=executor,
            store=store,
            runs=runs,
            topology=topology,
            environment=environment,
            source=plan.source,
            strategy_name=sweep.strategy.name,
            time_budget_s=plan.time_budget_s,
            progress=progress,
            sweep_name=sweep.name,
            resumed=resumed,
        )
        status = "failed"
        try:
            with LiveProgress(progress, console):
                status = coordinator.run()
        except KeyboardInterrupt:
            status = "interrupted"
            coordinator.abort()
            console.print(interrupted_line(sweep.name, sweep_id), highlight=False)
            raise
        finally:
            store.finish_sweep(sweep_id, status)
            if coordinator.confirm_sweep_id is not None:
                store.finish_sweep(coordinator.confirm_sweep_id, status)
        summaries = summarize_runs(store, sweep_id, runs, topology, environment)
    finally:
        close_runs(runs)
    return TuneResult(
        sweep_id=sweep_id,
        sweep_name=sweep.name,
        status=status,
        resumed=resumed,
        topology=topology.key(),
        environment=environment,
        runner=plan.runner,
        source=plan.source,
        summaries=summaries,
        progress=progress,
        note=executor.note,
        mode=plan.mode,
    )
