"""The coordinator: sweep configs, strategies, the store seam, one sweep loop that runs its tasks
on Ray gangs or in this process, resume.

Importing this package imports neither torch nor ray; the gangs import ray when they connect.
The strategies prune and seed with the cost model (:mod:`syncopate.cost_model`, whose main names are
re-exported here); the Optuna strategies import Optuna when built.
"""

from syncopate.autotuner.cluster import Cluster, check_reachable, connect, gang_capacity, gang_shape
from syncopate.autotuner.confirm import Confirmation, Verdict
from syncopate.autotuner.coordinator import Coordinator, Executor, SweepProgress, WorkloadRun
from syncopate.autotuner.gangs import GangExecutor, check_gang_members
from syncopate.autotuner.in_process import LocalExecutor
from syncopate.autotuner.store import SWEEP_STATUSES, ResultsDBStore, TrialStore, open_store
from syncopate.autotuner.strategies import (
    AVAILABLE_STRATEGIES,
    GridStrategy,
    RandomStrategy,
    SearchProblem,
    Strategy,
    make_strategy,
    strategy_class,
)
from syncopate.autotuner.sweep import (
    RUNNERS,
    STRATEGIES,
    FixtureConfig,
    Sweep,
    TimingConfig,
    load_sweep,
    parse_sweep,
)
from syncopate.autotuner.tune import TuneOptions, TuneResult, run_tune
from syncopate.cost_model import Calibration, CostModel, Prediction, default_calibration, resolve_calibration

__all__ = [
    "AVAILABLE_STRATEGIES",
    "RUNNERS",
    "STRATEGIES",
    "SWEEP_STATUSES",
    "Calibration",
    "Cluster",
    "Confirmation",
    "Coordinator",
    "CostModel",
    "Executor",
    "FixtureConfig",
    "GangExecutor",
    "GridStrategy",
    "LocalExecutor",
    "Prediction",
    "RandomStrategy",
    "ResultsDBStore",
    "SearchProblem",
    "Strategy",
    "Sweep",
    "SweepProgress",
    "TimingConfig",
    "TrialStore",
    "TuneOptions",
    "TuneResult",
    "Verdict",
    "WorkloadRun",
    "check_gang_members",
    "check_reachable",
    "connect",
    "default_calibration",
    "gang_capacity",
    "gang_shape",
    "load_sweep",
    "make_strategy",
    "open_store",
    "parse_sweep",
    "resolve_calibration",
    "run_tune",
    "strategy_class",
]
