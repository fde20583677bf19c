"""Optuna-based strategies: `optuna-tpe`, and `model-guided` (the cost model's picks first).

One Optuna study per workload, topology and environment, named
`syncopate/{workload key}/{topology key}/{environment key}`, in the results database (the
problem's `storage` URL; Optuna's tables sit beside Syncopate's) or in memory. A study remembers
every candidate told to it, so a resumed or repeated sweep goes on where the last one stopped and
never proposes a candidate the study has a value for. A study records the fingerprint of the
search space it was made over; opening it over another space raises StudyMismatchError and
changes nothing.

The space is sampled define-by-run, so that no parameter is drawn where it means nothing:
`backend`, then `comm_sms_{backend}` (not for the copy engine), `template`, `num_splits`,
`tile_config`, `tile_order`, `group_m` for the swizzled orders, then `kernel` (where the space
has Gluon twins). A draw the space does not hold
(too many splits for a tile height, say) or one already tried is told as failed, and its nearest
untried neighbour is measured instead.

The guards (the untuned default and the unfused template) are measured first in every sweep: the
ones the study holds no value for are enqueued in it (`enqueue_trial`), so TPE learns from them;
the others (outside the space, or told to the study by an earlier sweep) are measured beside the
study, which is not told of them again.

`model-guided` ranks the whole space with the cost model, enqueues `model_top_k` of its best
(`enqueue_trial`; the best of each promising family first, see :func:`_diverse_top`) so they are
measured first, then lets TPE search around them; a TPE proposal the cost model calls clearly
losing is not measured (see :class:`ModelPruner`).
"""

from __future__ import annotations

import hashlib
import logging
import math
import random
import statistics
import warnings
from typing import Any

from syncopate.autotuner.strategies import SearchProblem, Strategy, StudyContinued
from syncopate.errors import ConfigError, StudyMismatchError
from syncopate.records import TrialRecord
from syncopate.search_space import Candidate, TileConfig, space_refusal

__all__ = ["ModelGuidedStrategy", "ModelPruner", "OptunaTPEStrategy", "space_fingerprint", "study_name"]

log = logging.getLogger(__name__)

_SWIZZLED = ("arrival", "swizzle")


def study_name(problem: SearchProblem) -> str:
    """`syncopate/{workload}/{topology}/{environment}`: one study per workload, topology, environment."""
    env = problem.environment.key() if problem.environment is not None else "any"
    return f"syncopate/{problem.workload.key()}/{problem.topology.key()}/{env}"


def space_fingerprint(candidates: list[Candidate]) -> str:
    """16 hex digits over the sorted candidate keys: equal exactly when the spaces are."""
    blob = "\n".join(sorted(c.key() for c in candidates))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def candidate_params(c: Candidate) -> dict[str, Any]:
    """The define-by-run parameters that name `c` (what `enqueue_trial` takes)."""
    params: dict[str, Any] = {"backend": c.backend}
    if c.backend != "copy_engine":
        params[f"comm_sms_{c.backend}"] = c.comm_sms
    params.update(
        template=c.template,
        num_splits=c.num_splits,
        tile_config=TileConfig.of(c).key(),
        tile_order=c.tile_order,
    )
    if c.tile_order in _SWIZZLED:
        params["group_m"] = c.group_m
    params["kernel"] = c.kernel
    return params


class _Choices:
    """The values each parameter takes in a space (sorted, so distributions never change)."""

    def __init__(self, candidates: list[Candidate]) -> None:
        values: dict[str, set] = {}
        for c in candidates:
            for name, v in candidate_params(c).items():
                values.setdefault(name, set()).add(v)
        self.values = {name: sorted(v, key=lambda x: (str(type(x)), x)) for name, v in values.items()}

    def suggest(self, trial: Any) -> Candidate | None:
        """Draw a candidate on `trial`; None when the combination is not a valid candidate."""

        def pick(name: str) -> Any:
            choices = self.values[name]
            return trial.suggest_categorical(name, choices) if len(choices) > 1 else choices[0]

        backend = pick("backend")
        sms = pick(f"comm_sms_{backend}") if backend != "copy_engine" else 0
        template, splits, tile, order = (
            pick("template"),
            pick("num_splits"),
            pick("tile_config"),
            pick("tile_order"),
        )
        group_m = pick("group_m") if order in _SWIZZLED and "group_m" in self.values else 1
        kernel = pick("kernel")
        tc = TileConfig.from_key(tile)
        try:
            return Candidate(
                backend=backend,
                template=template,
                num_splits=splits,
                tile_order=order,
                comm_sms=sms,
                block_m=tc.block_m,
                block_n=tc.block_n,
                block_k=tc.block_k,
                group_m=group_m,
                num_warps=tc.num_warps,
                num_stages=tc.num_stages,
                kernel=kernel,
            )
        except ConfigError:
            return None


def _quiet_optuna() -> Any:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


class OptunaTPEStrategy(Strategy):
    """TPE over the space, in a persistent Optuna study (see the module docstring)."""

    name = "optuna-tpe"

    def __init__(self, problem: SearchProblem, *, max_trials: int | None, seed: int) -> None:
        super().__init__(problem, max_trials=max_trials, seed=seed)
        candidates = problem.candidates()
        refusal = space_refusal(problem.workload, problem.topology, problem.options, candidates)
        if refusal:
            raise ConfigError(refusal)
        self._by_key = {c.key(): c for c in candidates}
        self._order = [c.key() for c in candidates]
        self._params = {c.key(): candidate_params(c) for c in candidates}
        self._pruned: set[str] = set()
        self._choices = _Choices(candidates)
        self._rng = random.Random(f"{seed}/{problem.workload.key()}/{problem.topology.key()}")
        guards = problem.guards()
        self._guard_keys = {g.key() for g in guards}
        outside = {g.key() for g in guards if g.key() not in self._by_key}
        size = len(candidates) + len(outside)
        self._planned = min(max_trials or size, size)
        self.study = self._open_study(space_fingerprint(candidates), seed)
        self.values: dict[str, float] = {}
        """Candidate key → value of every completed trial in the study (this sweep's and earlier)."""
        self._failed: set[str] = set()
        abandoned = []
        for t in self.study.get_trials(deepcopy=False):
            key = t.user_attrs.get("candidate_key")
            if key not in self._by_key:
                continue
            if t.state.name == "COMPLETE" and not t.user_attrs.get("duplicate"):
                self.values[key] = float(t.value)
            elif t.state.name == "FAIL" and "status" in t.user_attrs:
                self._failed.add(key)
            elif t.state.name == "RUNNING":
                abandoned.append(t.number)
        for number in abandoned:  # proposed by a run that ended before their trial was told
            self.study.tell(number, state=_quiet_optuna().trial.TrialState.FAIL, skip_if_finished=True)
        self._done = set(problem.done) & (set(self._by_key) | outside)
        earlier = [self.values.get(k) for k in (set(self.values) | self._failed) - self._done]
        ok = [v for v in earlier if v is not None]
        self._continued = (
            StudyContinued(name=self.study.study_name, trials=len(earlier), best_us=min(ok) if ok else None)
            if earlier
            else None
        )
        self._proposed: set[str] = set()
        self._pending: dict[str, Any] = {}
        todo = [g for g in guards if g.key() not in problem.done]
        self._planned = max(self._planned, len(self._done) + len(todo))
        known = set(self.values) | self._failed
        self._beside = [g for g in todo if g.key() in outside or g.key() in known]
        """Guards to measure without telling the study (outside its space, or already in it)."""
        self._enqueue_guards([g for g in todo if g not in self._beside])
        if self.values or self._done:
            log.info(
                "%s: study %s holds %d value(s); %d stored in this sweep",
                problem.workload,
                self.study.study_name,
                len(self.values),
                len(self._done),
            )

    # -- the study ------------------------------------------------------------------------------

    def _waiting(self) -> set[str]:
        """Keys of the candidates enqueued in the study and not asked yet (by an earlier run, too)."""
        return {
            t.user_attrs.get("candidate_key")
            for t in self.study.get_trials(deepcopy=False)
            if t.state.name == "WAITING"
        }

    def _enqueue_guards(self, guards: list[Candidate]) -> None:
        waiting = self._waiting()
        for g in guards:
            if g.key() not in waiting:
                self.study.enqueue_trial(
                    candidate_params(g), user_attrs={"candidate_key": g.key(), "seeded_by": "guard"}
                )

    def _sampler(self, seed: int) -> Any:
        optuna = _quiet_optuna()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.TPESampler(
                seed=seed,
                n_startup_trials=max(4, min(10, self._planned // 10)),
                multivariate=True,
                group=True,
                constant_liar=True,
            )

    def _open_study(self, fingerprint: str, seed: int) -> Any:
        optuna = _quiet_optuna()
        name = study_name(self.problem)
        storage = self.problem.storage
        if storage is not None:
            storage = optuna.storages.RDBStorage(storage, skip_compatibility_check=False)
        study = optuna.create_study(
            study_name=name,
            storage=storage,
            sampler=self._sampler(seed),
            direction="minimize",
            load_if_exists=True,
        )
        stored = study.user_attrs.get("space_fingerprint")
        if stored is None:
            study.set_user_attr("space_fingerprint", fingerprint)
            study.set_user_attr("space_size", len(self._by_key))
            study.set_user_attr("workload", self.problem.workload.to_dict())
            study.set_user_attr("topology", self.problem.topology.key())
        elif stored != fingerprint:
            where = self.problem.storage or "memory"
            raise StudyMismatchError(
                f"Optuna study {name!r} in {where} was made over another search space "
                f"({study.user_attrs.get('space_size')} "
                f"candidates, fingerprint {stored}; this config's space has {len(self._by_key)}, fingerprint "
                f"{fingerprint}). Nothing was changed: restore the `space:` section it was made with, or remove the "
                f"study (`optuna delete-study --storage URL --study-name '{name}'`) to start it over"
            )
        return study

    # -- Strategy -------------------------------------------------------------------------------

    @property
    def continued(self) -> StudyContinued | None:
        return self._continued

    @property
    def planned(self) -> int:  # a resume with a budget below what is stored stands for what is stored
        return max(self._planned, len(self._done))

    @property
    def remaining(self) -> int:
        beside = len(self._beside)
        untried = len(set(self._by_key) - self._seen())
        return beside + max(0, min(self._planned - len(self._done) - len(self._proposed) - beside, untried))

    def _seen(self) -> set[str]:
        return self._done | self._proposed | set(self.values) | self._failed | self._pruned

    def ask(self, n: int = 1) -> list[Candidate]:
        out: list[Candidate] = []
        while len(out) < n and self._beside:
            g = self._beside.pop(0)
            self._proposed.add(g.key())
            out.append(g)
        while len(out) < n and self.remaining > 0:
            cand = self._propose()
            if cand is None:
                break
            out.append(cand)
        return out

    def tell(self, trial: TrialRecord) -> None:
        key = trial.candidate.key()
        number = self._pending.pop(key, None)  # the Optuna trial proposed for it
        if number is None:
            return
        optuna = _quiet_optuna()
        if trial.status == "ok" and trial.median_us is not None:
            self.study.tell(number, trial.median_us, skip_if_finished=True)
            self.values[key] = trial.median_us
        else:
            number.set_user_attr("status", trial.status)
            self.study.tell(number, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
            self._failed.add(key)

    def close(self) -> None:
        storage = getattr(self.study, "_storage", None)
        engine = getattr(getattr(storage, "engine", None), "dispose", None)
        if engine is not None:
            engine()

    # -- proposing ------------------------------------------------------------------------------

    def _accept(self, trial: Any, cand: Candidate) -> Candidate:
        key = cand.key()
        trial.set_user_attr("candidate_key", key)
        self._pending[key] = trial
        self._proposed.add(key)
        return cand

    def _losing(self, key: str) -> str:
        """Why candidate `key` must not be measured ('' when it may be): the model-guided pruner's hook."""
        return ""

    def _propose(self) -> Candidate | None:
        """TPE's next candidate. A draw the space does not hold, one already tried, or one the
        pruner rejects is told as such, and its nearest untried neighbour (fewest parameters
        changed) is measured instead, through `enqueue_trial`: at most two study trials per
        measurement, and the search stays where TPE pointed."""
        optuna = _quiet_optuna()
        seen = self._seen()
        trial = self.study.ask()
        cand = self._choices.suggest(trial)
        key = cand.key() if cand is not None else None
        if key is not None and key in self._by_key and key not in seen and not self._losing(key):
            return self._accept(trial, cand)
        if key is None or key not in self._by_key:
            trial.set_user_attr("invalid", True)
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
        elif key in seen:
            trial.set_user_attr("candidate_key", key)
            trial.set_user_attr("duplicate", True)
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
        else:
            trial.set_user_attr("candidate_key", key)
            trial.set_user_attr("pruned_by_model", self._losing(key))
            self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            self._pruned.add(key)
            seen.add(key)
        target = self._by_key[key] if key in self._by_key else None
        near = self._nearest_untried(trial.params, seen, target)
        if near is None:
            return None
        self.study.enqueue_trial(candidate_params(near), user_attrs={"neighbour_of": trial.number})
        return self._accept(self.study.ask(), near)

    def _nearest_untried(
        self, params: dict[str, Any], seen: set[str], target: Candidate | None
    ) -> Candidate | None:
        """The untried candidate whose parameters differ least from `params` (ties at random), one
        the pruner does not reject where there is any."""
        drawn = candidate_params(target) if target is not None else params
        best: list[str] = []
        fallback: list[str] = []
        best_d = fallback_d = math.inf
        for key in self._order:
            if key in seen:
                continue
            d = sum(1 for name, v in self._params[key].items() if drawn.get(name) != v)
            if self._losing(key):
                if d < fallback_d:
                    fallback, fallback_d = [key], d
                elif d == fallback_d:
                    fallback.append(key)
                continue
            if d < best_d:
                best, best_d = [key], d
            elif d == best_d:
                best.append(key)
        pool = best or fallback
        return self._by_key[self._rng.choice(pool)] if pool else None


def _diverse_top(ranked: list, k: int) -> list:
    """The model's `k` seeds: the best prediction of each family (backend, SMs, tile configuration,
    kernel) in order of that prediction, among families predicted within 1.5× of the best; then the
    next best of each, and so on. Calibration errors tend to move whole families, so the seeds measure
    each promising family before TPE chooses between them."""
    if not ranked:
        return []
    families: dict[tuple, list] = {}
    for p in ranked:
        c = p.candidate
        families.setdefault(
            (c.backend, c.comm_sms, c.block_m, c.block_n, c.block_k, c.num_warps, c.num_stages, c.kernel), []
        ).append(p)
    limit = ranked[0].time_us * 1.5
    groups = [g for g in families.values() if g[0].time_us <= limit]
    out: list = []
    depth = 0
    while len(out) < k and any(len(g) > depth for g in groups):
        out += [g[depth] for g in groups if len(g) > depth][: k - len(out)]
        depth += 1
    chosen = {p.candidate.key() for p in out}
    out += [p for p in ranked if p.candidate.key() not in chosen][: k - len(out)]
    return out


class ModelPruner:
    """Says which proposals are clearly losing, from the cost model and the trials so far.

    The model's error is learnt as the ratio measured / predicted over the `ok` trials told; a
    proposal is clearly losing when its prediction times the median ratio exceeds the best
    measurement by more than `margin` plus three times the spread (median absolute deviation of
    the log ratio) of that error. Until `min_trials` trials are told nothing is pruned.

    Why not prune on repetitions: a trial's cost is its compilation and correctness check (seconds);
    its 20 timed repetitions take milliseconds on the GPU and are timed inside one call, so stopping
    them early saves nothing. A candidate the model calls losing is instead never built.
    """

    def __init__(self, margin: float = 0.15, min_trials: int = 8) -> None:
        self.margin = margin
        self.min_trials = min_trials
        self._log_ratios: list[float] = []
        self._best: float = math.inf
        self._threshold: float | None = None

    def observe(self, predicted_us: float, measured_us: float) -> None:
        if predicted_us > 0 and math.isfinite(predicted_us) and measured_us > 0:
            self._log_ratios.append(math.log(measured_us / predicted_us))
            self._best = min(self._best, measured_us)
            self._threshold = self._compute()

    def threshold(self) -> float | None:
        """Predictions above this (µs) are clearly losing; None while too few trials are told."""
        return self._threshold

    def _compute(self) -> float | None:
        if len(self._log_ratios) < self.min_trials:
            return None
        center = statistics.median(self._log_ratios)
        spread = statistics.median(abs(x - center) for x in self._log_ratios)
        return self._best * (1 + self.margin) * math.exp(3 * spread) / math.exp(center)

    def losing(self, predicted_us: float) -> bool:
        limit = self.threshold()
        return limit is not None and predicted_us > limit


class ModelGuidedStrategy(OptunaTPEStrategy):
    """The cost model's best candidates first, then TPE around them (see the module docstring)."""

    name = "model-guided"

    def __init__(self, problem: SearchProblem, *, max_trials: int | None, seed: int) -> None:
        super().__init__(problem, max_trials=max_trials, seed=seed)
        from syncopate.cost_model.model import CostModel

        given = problem.calibration
        if given is None:
            from syncopate.cost_model.calibration import resolve_calibration

            given = resolve_calibration(problem.topology, problem.environment)
            log.warning(
                "model-guided on %s without a calibration given: %s", problem.topology, given.describe()
            )
        model = given if isinstance(given, CostModel) else CostModel(given)
        self.calibration = model.calibration
        ranked = model.rank(problem.workload, problem.topology, [self._by_key[k] for k in self._order])
        self.predicted = {p.candidate.key(): p.time_us for p in ranked}
        self.pruner = ModelPruner()
        top_k = problem.model_top_k or max(8, min(32, self._planned // 5))
        seen = self._seen() | self._guard_keys  # the guards are measured first anyway
        seeds = _diverse_top(
            [p for p in ranked if p.feasible and p.candidate.key() not in seen], min(top_k, self._planned)
        )
        waiting = self._waiting()
        for p in seeds:
            key = p.candidate.key()
            if key in waiting:
                continue
            self.study.enqueue_trial(
                candidate_params(p.candidate),
                user_attrs={"candidate_key": key, "seeded_by": "cost model", "predicted_us": p.time_us},
            )
        self._seeded = {p.candidate.key() for p in seeds}
        for key, value in self.values.items():
            self.pruner.observe(self.predicted.get(key, math.inf), value)

    def _losing(self, key: str) -> str:
        if key in self._seeded or key in self._guard_keys:
            return ""
        predicted = self.predicted.get(key, math.inf)
        if not math.isfinite(predicted):
            return "infeasible"
        return "clearly losing" if self.pruner.losing(predicted) else ""

    @property
    def pruned(self) -> frozenset[str]:
        """Keys of the candidates the cost model kept from being measured (clearly losing, or
        unable to run here)."""
        return frozenset(self._pruned)

    def tell(self, trial: TrialRecord) -> None:
        super().tell(trial)
        if trial.status == "ok" and trial.median_us is not None:
            self.pruner.observe(self.predicted.get(trial.candidate.key(), math.inf), trial.median_us)
