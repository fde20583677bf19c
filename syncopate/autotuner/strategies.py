"""Search strategies: what to measure next, per workload.

A strategy is built for one :class:`SearchProblem` (a workload on a topology, the space's
restrictions, and the candidates already stored for it) and asked for candidates until it has
none left. Every strategy proposes the problem's guards first (:meth:`SearchProblem.guards`: the
untuned default candidate and the `unfused` template, which a served configuration may never be
slower than), whatever the space and the budget, so that every new sweep measures them beside its
candidates; they count against `max_trials`. `grid`, `seeded` and `random` fix their plan up
front, so a resumed sweep proposes the same candidates and skips the stored ones; a resume with a
larger budget keeps what is stored and adds only as many as the budget has room for, so
`max_trials` stays the count of trials in all. The Optuna-based ones (`optuna-tpe`,
`model-guided`, in :mod:`syncopate.autotuner.optuna_strategies`) learn through
:meth:`Strategy.tell` and keep their study in the results database.

Pure Python: nothing here imports torch or ray.
"""

from __future__ import annotations

import importlib
import random
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

from syncopate.errors import ConfigError, RuntimeUnavailableError
from syncopate.records import Environment, TrialRecord
from syncopate.search_space import (
    BACKENDS,
    Candidate,
    MoeWorkload,
    SpaceOptions,
    Topology,
    Workload,
    bench_grid,
    guard_candidates,
    space,
    space_refusal,
)
from syncopate.search_space.moe_workload import MOE_DEFAULT_BACKENDS, moe_space

__all__ = [
    "AVAILABLE_STRATEGIES",
    "GridStrategy",
    "RandomStrategy",
    "SearchProblem",
    "SeededStrategy",
    "Strategy",
    "StudyContinued",
    "make_strategy",
    "strategy_class",
]


@dataclass(frozen=True, kw_only=True, slots=True)
class SearchProblem:
    """One workload on one topology, the space's restrictions, and what is already stored."""

    workload: Workload
    topology: Topology
    options: SpaceOptions = field(default_factory=SpaceOptions)
    done: frozenset[str] = frozenset()
    """Keys of candidates already measured for this workload in this sweep (a resumed sweep)."""
    environment: Environment | None = None
    """The environment the trials are measured under (names the Optuna study)."""
    storage: str | None = None
    """Database URL of the Optuna study (the results database); None keeps the study in memory."""
    calibration: Any = None
    """The cost model's :class:`~syncopate.cost_model.calibration.Calibration` (model-guided), or a
    :class:`~syncopate.cost_model.model.CostModel` to share its predictions between problems."""
    model_top_k: int | None = None
    """How many of the cost model's best candidates model-guided measures first (None: its default)."""
    measurable: Any = None
    """Which candidates the runner can measure at all, `(workload, candidate) -> bool` (a replay
    answers only what its stored sweep holds); None: any."""
    moe_space: tuple[tuple[str, ...], tuple[int, ...]] | None = None
    """A MoE workload's space: (backends, chunks) of :func:`~syncopate.search_space.moe_space`
    (None: its defaults)."""

    def candidates(self) -> list[Candidate]:
        """The valid candidates, in the space's deterministic order."""
        if isinstance(self.workload, MoeWorkload):
            backends, chunks = self.moe_space or (MOE_DEFAULT_BACKENDS, (1, 2, 4))
            return moe_space(self.workload, self.topology.world_size, backends=backends, chunks=chunks)
        return space(self.workload, self.topology, self.options)

    def guards(self) -> list[Candidate]:
        """The references measured first, in or out of the space
        (:func:`~syncopate.search_space.guard_candidates`: the untuned default, the unfused
        template), those the runner can measure."""
        found = guard_candidates(self.workload, self.topology).values()
        return [c for c in found if self.measurable is None or self.measurable(self.workload, c)]


@dataclass(frozen=True, kw_only=True, slots=True)
class StudyContinued:
    """A persistent study that a strategy carries on from earlier runs."""

    name: str
    trials: int
    """Trials the study held from other sweeps when this run opened it (told values and failures)."""
    best_us: float | None
    """The fastest of their values (None: none of them succeeded)."""


class Strategy(ABC):
    """Proposes candidates of one workload; learns from every finished trial."""

    name: ClassVar[str]

    def __init__(self, problem: SearchProblem, *, max_trials: int | None, seed: int) -> None:
        self.problem = problem
        self.max_trials = max_trials
        self.seed = seed

    @abstractmethod
    def ask(self, n: int = 1) -> list[Candidate]:
        """Up to `n` candidates never proposed before and not in `problem.done`; an empty list
        when the strategy has nothing left to propose."""

    def tell(self, trial: TrialRecord) -> None:
        """Called with every finished trial of this workload (failures too), in arrival order."""

    def close(self) -> None:
        """Called once when the sweep ends (releases a study's database connections)."""

    @property
    def continued(self) -> StudyContinued | None:
        """The study this strategy carries on from other sweeps, which it does not propose again
        (None: it starts from nothing but this sweep's own stored trials)."""
        return None

    @property
    @abstractmethod
    def planned(self) -> int:
        """How many trials this strategy stands for in all, the stored ones included (for progress)."""

    @property
    @abstractmethod
    def remaining(self) -> int:
        """How many of those are still to be proposed."""


class _PlannedStrategy(Strategy):
    """A strategy whose whole plan is fixed at construction; stored candidates are skipped.

    The guards come first, then the plan over the rest of the space, made for the budget the
    guards leave (`_budget`). The stored candidates (guards included) count against `max_trials`:
    where a resumed sweep holds some that this budget's plan does not (it was started with another
    budget), the plan's others are thinned, evenly, to the room left, and where it holds as many as
    the budget or more, nothing but the guards not yet stored is proposed.
    """

    def __init__(self, problem: SearchProblem, *, max_trials: int | None, seed: int) -> None:
        super().__init__(problem, max_trials=max_trials, seed=seed)
        candidates = problem.candidates()
        moe = isinstance(problem.workload, MoeWorkload)
        refusal = (
            None if moe else space_refusal(problem.workload, problem.topology, problem.options, candidates)
        )
        if refusal:
            raise ConfigError(refusal)
        guards = problem.guards()
        first = {c.key() for c in guards}
        rest = [c for c in candidates if c.key() not in first]
        self._budget = None if max_trials is None else max(0, max_trials - len(guards))
        self._stored = sum(c.key() in problem.done for c in guards + rest)
        guards_todo = [c for c in guards if c.key() not in problem.done]
        todo = [c for c in self._make_plan(rest) if c.key() not in problem.done]
        if max_trials is not None:
            todo = _evenly(todo, max(0, max_trials - self._stored - len(guards_todo)))
        self._todo = guards_todo + todo
        self._next = 0

    @abstractmethod
    def _make_plan(self, candidates: list[Candidate]) -> list[Candidate]:
        """The candidates (the space but the guards) to measure on a fresh sweep, in order, at most
        `_budget` of them; a larger budget's plan must hold as much of a smaller one's as it can, so
        that a resume with more trials extends it."""

    def ask(self, n: int = 1) -> list[Candidate]:
        out = self._todo[self._next : self._next + n]
        self._next += len(out)
        return out

    @property
    def planned(self) -> int:
        return self._stored + len(self._todo)

    @property
    def remaining(self) -> int:
        return len(self._todo) - self._next


def _evenly(items: list[Candidate], k: int) -> list[Candidate]:
    """`k` of `items` evenly spaced over them, in their order (all of them where k ≥ their count)."""
    n = len(items)
    if k >= n:
        return items
    return [items[i * n // k] for i in range(k)]


class GridStrategy(_PlannedStrategy):
    """Every candidate in the space's order; with `max_trials` below the space's size, that many
    evenly spaced over it (so a short grid still covers every backend)."""

    name = "grid"

    def _make_plan(self, candidates: list[Candidate]) -> list[Candidate]:
        return candidates if self._budget is None else _evenly(candidates, self._budget)


class SeededStrategy(_PlannedStrategy):
    """`syncopate bench`'s `tiny` grid first (those of its candidates the space holds: a tile
    configuration per backend, one to four splits, the cuBLAS templates), then the rest of the
    space as `grid` takes it, evenly spaced over what is left of `max_trials`; with a budget
    smaller than the seeds, the grid's Triton candidates first (evenly spaced where even they are
    too many), then its Gluon twins, evenly spaced over what is left.

    The seeds are the grid the suites were measured with, the cuBLAS templates among them: evenly
    spaced candidates of a large space can leave out a whole template or split count, and a run cut
    short has then measured neither (docs/search.md compares the strategies)."""

    name = "seeded"

    def _make_plan(self, candidates: list[Candidate]) -> list[Candidate]:
        by_key = {c.key(): c for c in candidates}  # the space's keys are unique, in its order
        seeds: dict[str, Candidate] = {}
        for c in bench_grid(self.problem.workload, self.problem.topology, "tiny", BACKENDS):
            key = c.key()
            if key in by_key:
                seeds.setdefault(key, by_key[key])
        triton = [c for c in seeds.values() if c.kernel == "triton"]
        twins = [c for c in seeds.values() if c.kernel != "triton"]
        rest = [c for key, c in by_key.items() if key not in seeds]
        if self._budget is None:
            return triton + twins + rest
        if len(triton) >= self._budget:
            return _evenly(triton, self._budget)
        if len(triton) + len(twins) >= self._budget:
            return triton + _evenly(twins, self._budget - len(triton))
        return triton + twins + _evenly(rest, self._budget - len(triton) - len(twins))


class RandomStrategy(_PlannedStrategy):
    """`max_trials` candidates drawn without replacement, seeded by the seed and the workload: the
    first of one shuffle of the space, so a larger budget draws the same ones and more."""

    name = "random"

    def _make_plan(self, candidates: list[Candidate]) -> list[Candidate]:
        rng = random.Random(f"{self.seed}/{self.problem.workload.key()}/{self.problem.topology.key()}")
        order = list(candidates)
        rng.shuffle(order)
        return order if self._budget is None else order[: self._budget]


AVAILABLE_STRATEGIES: dict[str, str] = {
    "grid": "syncopate.autotuner.strategies:GridStrategy",
    "seeded": "syncopate.autotuner.strategies:SeededStrategy",
    "random": "syncopate.autotuner.strategies:RandomStrategy",
    "optuna-tpe": "syncopate.autotuner.optuna_strategies:OptunaTPEStrategy",
    "model-guided": "syncopate.autotuner.optuna_strategies:ModelGuidedStrategy",
}
"""Strategy name → `module:Class`; the Optuna-based ones are imported on first use."""


def strategy_class(name: str) -> type[Strategy]:
    """The strategy class `name`; ConfigError naming the accepted ones for any other name."""
    target = AVAILABLE_STRATEGIES.get(name)
    if target is None:
        raise ConfigError(f"unknown strategy {name!r}: accepted are {', '.join(AVAILABLE_STRATEGIES)}")
    module, cls = target.split(":")
    try:
        return getattr(importlib.import_module(module), cls)
    except ImportError as e:
        raise RuntimeUnavailableError(
            f"strategy {name!r} needs a package this installation lacks ({e}): pip install optuna"
        ) from None


def make_strategy(name: str, problem: SearchProblem, *, max_trials: int | None, seed: int) -> Strategy:
    """Build strategy `name` for `problem`; ConfigError for a budget of zero or less. A MoE
    workload's space is a few dozen candidates at most, with no cost model or tile grid to seed or
    learn from: `random` shuffles it, every other strategy takes it in order (`grid`)."""
    if max_trials is not None and (isinstance(max_trials, bool) or max_trials <= 0):
        raise ConfigError(f"max_trials={max_trials!r} must be a positive number of trials")
    if isinstance(problem.workload, MoeWorkload):
        cls = RandomStrategy if name == "random" else GridStrategy
        strategy_class(name)  # an unknown name is refused all the same
        return cls(problem, max_trials=max_trials, seed=seed)
    return strategy_class(name)(problem, max_trials=max_trials, seed=seed)
