"""What every `syncopate tune` run sets up per workload, whatever measures it: the search problem
(with the Optuna study's storage and the cost model's calibration where the strategy needs them),
the strategy, and the noise-aware confirmation; on `--resume`, what the sweep already holds; at the
end, the summary.

Strategies are built before the sweep's first write, so that a bad strategy, an empty space or a
study made over another space fails with nothing stored.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from syncopate.autotuner.confirm import Confirmation
from syncopate.autotuner.coordinator import WorkloadRun
from syncopate.autotuner.progress import WorkloadSummary
from syncopate.autotuner.store import StoredSweep, TrialStore
from syncopate.autotuner.strategies import SearchProblem, make_strategy
from syncopate.autotuner.sweep import Sweep
from syncopate.cost_model.calibration import Calibration, resolve_calibration
from syncopate.errors import CalibrationError, DatabaseError, SchemaError
from syncopate.records import DEFAULT_MODE, Environment
from syncopate.search_space import Topology, guard_candidates

__all__ = [
    "OPTUNA_STRATEGIES",
    "build_runs",
    "close_runs",
    "load_calibration",
    "restore_runs",
    "stored_done",
    "study_storage",
    "summarize_runs",
]

log = logging.getLogger(__name__)

OPTUNA_STRATEGIES: tuple[str, ...] = ("optuna-tpe", "model-guided")
"""Strategies that keep an Optuna study in the results database."""


def study_storage(db: str | None) -> str:
    """The database URL an Optuna study lives in: the results database's."""
    from syncopate.results_db.urls import locate

    return locate(db).url


def load_calibration(
    topology: Topology, environment: Environment | None, db: str | None, policy: str
) -> Calibration:
    """The calibration the cost model uses here (see :func:`resolve_calibration`), read from the
    results database `db` where it can be opened; the defaults otherwise (policy `auto`)."""
    if policy == "default":
        return resolve_calibration(topology, environment, None, "default")
    if policy == "auto" and _new_sqlite_file(db):  # nothing measured there yet: the defaults, said as such
        return resolve_calibration(topology, environment, None, "auto")
    try:
        from syncopate.results_db import ResultsDB

        opened = ResultsDB.open(db)
    except (DatabaseError, SchemaError, ImportError) as e:
        if policy == "measured":
            raise CalibrationError(
                f"calibrations cannot be read ({e}); run `syncopate calibrate --db URL` on a machine with "
                f"{topology.key()}, then tune with that --db"
            ) from None
        log.warning("calibrations cannot be read (%s): the cost model uses its defaults", e)
        return resolve_calibration(topology, environment, None, "auto")
    with opened:
        return resolve_calibration(topology, environment, opened, policy)


def _new_sqlite_file(db: str | None) -> bool:
    """Whether `db` names a SQLite file that does not exist yet (a first run makes it later)."""
    from syncopate.results_db.urls import locate

    try:
        path = locate(db).sqlite_path
    except Exception:  # a URL that does not parse: the open below says what is wrong
        return False
    return path is not None and not path.exists()


def stored_done(
    store: TrialStore,
    previous: StoredSweep | None,
    sweep: Sweep,
    topology: Topology,
    environment: Environment,
) -> list[frozenset[str]]:
    """Per workload of `sweep`, the keys of the candidates the resumed sweep `previous` already
    stored (any status): what is not measured again. Empty for a new sweep. Reads only."""
    if previous is None:
        return [frozenset() for _ in sweep.workloads]
    return [
        frozenset(store.stored_keys(previous.sweep_id, w, topology, environment)) for w in sweep.workloads
    ]


def build_runs(
    sweep: Sweep,
    topology: Topology,
    environment: Environment,
    *,
    max_trials: int | None,
    db: str | None,
    done: Sequence[frozenset[str]] | None = None,
    calibration: Calibration | None = None,
    confirm: bool = True,
    mode: str = DEFAULT_MODE,
    measurable: Any = None,
) -> list[WorkloadRun]:
    """One :class:`WorkloadRun` per workload, its strategy built (`done[i]`: keys already stored for
    workload i). `calibration`: the cost model's, for model-guided (loaded here when None). `mode`:
    what the sweep's best and the re-measurements rank by. `measurable`: which candidates the
    runner can measure, `(workload, candidate) -> bool` (None: any; see
    :attr:`~syncopate.autotuner.strategies.SearchProblem.measurable`)."""
    name = sweep.strategy.name
    storage = study_storage(db) if name in OPTUNA_STRATEGIES else None
    if name == "model-guided" and calibration is None:
        calibration = load_calibration(topology, environment, db, sweep.calibration)
    runs = []
    for i, w in enumerate(sweep.workloads):
        problem = SearchProblem(
            workload=w,
            topology=topology,
            options=sweep.space,
            done=done[i] if done else frozenset(),
            environment=environment,
            storage=storage,
            calibration=calibration,
            model_top_k=sweep.strategy.model_top_k,
            measurable=measurable,
            moe_space=sweep.moe_space.get(w.key()),
        )
        strategy = make_strategy(name, problem, max_trials=max_trials, seed=sweep.strategy.seed)
        run = WorkloadRun(
            workload=w, strategy=strategy, stored_before=strategy.planned - strategy.remaining, mode=mode
        )
        if confirm and sweep.strategy.top_k_remeasure > 0:
            guards = {n: c.key() for n, c in guard_candidates(w, topology).items()}
            run.confirm = Confirmation(top_k=sweep.strategy.top_k_remeasure, mode=mode, guards=guards)
        runs.append(run)
    return runs


def restore_runs(
    store: TrialStore,
    sweep_id: int,
    runs: Sequence[WorkloadRun],
    topology: Topology,
    environment: Environment,
) -> None:
    """What a resumed sweep already holds, into its runs: the stored baselines (not measured again)
    and the sweep's fastest ok trial so far (the best to beat, and a contender when the best few
    are measured again)."""
    for run in runs:
        baselines = store.stored_baselines(sweep_id, run.workload, topology, environment)
        if baselines:
            run.baselines = {b.name: b for b in baselines}
            run.baselines_state = "done"
        run.best = store.sweep_best(sweep_id, run.workload, topology, environment, mode=run.mode)
        if run.best is not None and run.confirm is not None:
            run.confirm.observe(run.best)


def summarize_runs(
    store: TrialStore,
    sweep_id: int,
    runs: Sequence[WorkloadRun],
    topology: Topology,
    environment: Environment,
) -> list[WorkloadSummary]:
    """The closing summary: per workload, the sweep's own fastest ok trial in its mode (whatever its
    source; trials stored before a resume included), or the declared winner where the best few
    were measured again."""
    return [
        WorkloadSummary.of(
            run,
            store.sweep_best(sweep_id, run.workload, topology, environment, mode=run.mode),
            verdict=run.confirm.verdict() if run.confirm is not None else None,
        )
        for run in runs
    ]


def close_runs(runs: Sequence[WorkloadRun]) -> None:
    """Release what the strategies hold (their studies' connections)."""
    for run in runs:
        try:
            run.strategy.close()
        except Exception as e:  # closing must not hide the sweep's own outcome
            log.debug("closing the strategy of %s failed: %s", run.workload, e)
