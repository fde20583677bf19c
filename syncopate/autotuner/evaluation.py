"""How good a strategy and the cost model are, against an exhaustive sweep (measured, or synthetic).

- :func:`trials_to_target`: run a strategy against the sweep (every answer replayed from it) and
  count the trials until one is within `tolerance` of the sweep's best;
- :func:`spearman`: the rank correlation of two lists (ties get their mean rank);
- :func:`model_agreement`: the cost model's Spearman correlation with the sweep per workload, and
  how far its own pick is from the best.

Pure Python.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from syncopate.autotuner.strategies import SearchProblem, make_strategy
from syncopate.records import TrialRecord
from syncopate.search_space import SpaceOptions, Workload
from syncopate.workers.replay_runner import StoredSweep

__all__ = ["ModelAgreement", "Outcome", "model_agreement", "spearman", "trials_to_target"]


def _ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2
        i = j + 1
    return ranks


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman's rank correlation of paired lists (NaN when either is constant or shorter than 2)."""
    if len(a) != len(b):
        raise ValueError(f"spearman needs paired lists, got {len(a)} and {len(b)} values")
    if len(a) < 2:
        return math.nan
    ra, rb = _ranks(a), _ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    va = sum((x - ma) ** 2 for x in ra)
    vb = sum((y - mb) ** 2 for y in rb)
    return cov / math.sqrt(va * vb) if va and vb else math.nan


@dataclass(frozen=True, kw_only=True, slots=True)
class Outcome:
    """One strategy run against an exhaustive sweep."""

    strategy: str
    seed: int
    workload: str
    trials: int | None
    """Trials until the first within tolerance of the best (None: not within the cap)."""
    total: int
    """Trials of the exhaustive sweep (every candidate of the space)."""
    cap: int

    @property
    def fraction(self) -> float:
        """trials / total; inf when the target was not reached within the cap."""
        return self.trials / self.total if self.trials is not None else math.inf


def trials_to_target(
    name: str,
    sweep: StoredSweep,
    workload: Workload,
    *,
    seed: int,
    tolerance: float = 0.03,
    cap: float = 0.5,
    options: SpaceOptions | None = None,
    calibration: Any = None,
) -> Outcome:
    """Run strategy `name` (Optuna in memory) with every answer replayed from `sweep`; count trials
    until one's median is within `tolerance` of the sweep's best median, up to `cap` × the sweep."""
    table = sweep.trials[workload.key()]
    ok = [t.median_us for t in table.values() if t.status == "ok"]
    best = min(ok)
    total = len(table)
    limit = max(1, math.ceil(cap * total))
    problem = SearchProblem(
        workload=workload,
        topology=sweep.topology,
        options=options or SpaceOptions(),
        environment=sweep.environment,
        calibration=calibration,
    )
    budget = total if name in ("grid", "seeded", "random") else limit
    strategy = make_strategy(name, problem, max_trials=budget, seed=seed)
    try:
        for n in range(1, limit + 1):
            asked = strategy.ask(1)
            if not asked:
                break
            trial = table.get(asked[0].key())
            if trial is None:
                trial = TrialRecord(
                    workload=workload,
                    topology=sweep.topology,
                    environment=sweep.environment,
                    candidate=asked[0],
                    status="crash",
                    source="fixture",
                    error="not in the sweep",
                )
            strategy.tell(trial)
            if trial.status == "ok" and trial.median_us <= best * (1 + tolerance):
                return Outcome(
                    strategy=name, seed=seed, workload=workload.key(), trials=n, total=total, cap=limit
                )
    finally:
        strategy.close()
    return Outcome(strategy=name, seed=seed, workload=workload.key(), trials=None, total=total, cap=limit)


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelAgreement:
    """The cost model against one workload's exhaustive sweep."""

    workload: str
    spearman: float
    """Rank correlation of predicted and measured medians over the ok trials."""
    pick_gap: float
    """The measured median of the model's pick over the best measured, minus one."""
    candidates: int


def model_agreement(model: Any, sweep: StoredSweep, workload: Workload) -> ModelAgreement:
    """Compare `model` (a :class:`~syncopate.cost_model.model.CostModel`) with the sweep."""
    ok = [t for t in sweep.trials[workload.key()].values() if t.status == "ok"]
    predicted = [model.predict(workload, sweep.topology, t.candidate).time_us for t in ok]
    measured = [t.median_us for t in ok]
    pick = min(range(len(ok)), key=lambda i: predicted[i])
    best = min(measured)
    return ModelAgreement(
        workload=workload.key(),
        spearman=spearman(predicted, measured),
        pick_gap=measured[pick] / best - 1,
        candidates=len(ok),
    )
