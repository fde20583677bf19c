"""Noise-aware winners: the best few candidates are measured once more before one is declared.

When a workload's search is over, the candidates whose times in the sweep's mode lie within the
noise of the best (at most `top_k` of them, the best always among them) are measured again. The
time is the one the mode ranks by (:func:`~syncopate.records.rank_key`: device time in mode
`graph`, eager time in mode `eager` where measured). The noise is the widest relative spread
(p80 − p20) / median of the device samples among them, and never less than `min_noise`. The winner
is the contender with the lowest pooled time, first measurement and re-measurements together: the
median over all device samples (device time), or over the eager figures of each measurement (eager
time). A single lucky measurement thus cannot win alone. Nor can a winner slower in the mode than
a guard's trial (the untuned default, the unfused template): then that guard is declared.

Re-measurements are stored as trials of a companion sweep, named after the sweep with
:data:`CONFIRM_SUFFIX` (a trial's identity includes its sweep, so the first measurement stays as it
was); :func:`companion_sweep` makes or resumes it.

Pure Python.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING

from syncopate.records import DEFAULT_MODE, GUARDS, OBJECTIVE_EAGER, TrialRecord, figure, objective, rank_key
from syncopate.search_space import Candidate

if TYPE_CHECKING:
    from syncopate.autotuner.store import TrialStore

__all__ = ["CONFIRM_SUFFIX", "Confirmation", "Verdict", "companion_sweep"]

CONFIRM_SUFFIX = "+confirm"
"""The companion sweep of sweep NAME that holds its re-measurements is NAME+confirm."""


def companion_sweep(store: TrialStore, name: str, sweep_id: int, resumed: bool) -> int:
    """The id of the companion sweep of sweep `sweep_id` (named `name`): on a resumed sweep the
    companion it already has, marked `running` again; else a new one (never the companion of an
    older sweep of the same name)."""
    companion = name + CONFIRM_SUFFIX
    if resumed:
        found = store.latest_sweep(companion)
        if found is not None and found.config.get("confirms") == sweep_id:
            store.resume_sweep(found.sweep_id)
            return found.sweep_id
    return store.start_sweep(companion, {"confirms": sweep_id, "sweep": name})


@dataclass(frozen=True, kw_only=True, slots=True)
class Verdict:
    """The declared winner of a workload."""

    trial: TrialRecord
    """Its first trial."""
    pooled_median_us: float
    """Its time in the objective, pooled over its measurements (see the module docstring)."""
    samples: int
    """How many times were pooled (device samples, or eager figures)."""
    contenders: int
    """Candidates that were within noise of the best and measured again."""
    changed: bool
    """True when the fastest single measurement was not the winner after re-measuring."""
    objective: str = "device"
    """What ranked the winner: `device`, `eager` or `device (no eager measurement)`."""
    guard: str = ""
    """`default` or `unfused` where that guard was declared, being faster than the contenders."""

    @property
    def candidate(self) -> Candidate:
        return self.trial.candidate


class Confirmation:
    """Chooses the contenders, hands them out for re-measuring, and declares the winner."""

    def __init__(
        self,
        top_k: int = 3,
        min_noise: float = 0.01,
        *,
        mode: str = DEFAULT_MODE,
        guards: dict[str, str] | None = None,
    ) -> None:
        self.top_k = top_k
        self.min_noise = min_noise
        self.mode = mode
        self.guards = dict(guards or {})
        """Guard name → candidate key (:data:`~syncopate.records.GUARDS`)."""
        self._trials: dict[str, TrialRecord] = {}
        self._extra: dict[str, list[float]] = {}
        self._extra_eager: dict[str, list[float]] = {}
        self._queue: list[Candidate] | None = None
        self._out: set[str] = set()

    def _key(self, t: TrialRecord) -> tuple[int, float]:
        return rank_key(self.mode, t.median_us, t.eager_us)

    def observe(self, trial: TrialRecord) -> None:
        """Every finished trial of the search (failures are ignored)."""
        if trial.status == "ok" and trial.median_us is not None:
            self._trials[trial.candidate.key()] = trial

    def contenders(self) -> list[TrialRecord]:
        """The ok trials within noise of the best in the mode, best first, at most `top_k`."""
        ranked = sorted(self._trials.values(), key=self._key)[: self.top_k]
        if not ranked:
            return []
        noise = self.min_noise
        for t in ranked:
            if t.p20_us is not None and t.p80_us is not None and t.median_us:
                noise = max(noise, (t.p80_us - t.p20_us) / t.median_us)
        klass, best = self._key(ranked[0])
        limit = best * (1 + 2 * noise)
        return [t for t in ranked if self._key(t)[0] == klass and self._key(t)[1] <= limit]

    def next(self) -> Candidate | None:
        """The next candidate to measure again (the contenders are fixed at the first call); None
        when every one has been handed out."""
        if self.top_k <= 0:
            return None
        if self._queue is None:
            self._queue = [t.candidate for t in self.contenders()]
        while self._queue:
            c = self._queue.pop(0)
            if c.key() not in self._out:
                self._out.add(c.key())
                return c
        return None

    def record(self, trial: TrialRecord) -> None:
        """A re-measurement (a failed one counts for nothing)."""
        if trial.status == "ok" and trial.median_us is not None:
            samples = list(trial.samples_us) or [trial.median_us]
            self._extra.setdefault(trial.candidate.key(), []).extend(samples)
            if trial.eager_us is not None:
                self._extra_eager.setdefault(trial.candidate.key(), []).append(trial.eager_us)

    def _pooled(self, t: TrialRecord, objective_name: str) -> list[float]:
        """The times of `t` pooled in the objective: its first measurement's and its re-measurements'."""
        key = t.candidate.key()
        if objective_name == OBJECTIVE_EAGER:
            return [t.eager_us, *self._extra_eager.get(key, [])] if t.eager_us is not None else []
        return (list(t.samples_us) or [t.median_us]) + self._extra.get(key, [])

    def verdict(self) -> Verdict | None:
        """The winner: the contender with the lowest pooled time in the mode (the fastest single
        trial when nothing was re-measured), or a guard faster than it; None without an ok trial."""
        if not self._trials:
            return None
        fastest = min(self._trials.values(), key=self._key)
        obj = objective(self.mode, fastest.eager_us)
        measured_again = [self._trials[k] for k in self._extra if k in self._trials]
        measured_again = [t for t in measured_again if self._pooled(t, obj)]
        if not measured_again:
            best, pooled = fastest, self._pooled(fastest, obj)
            figure_us = figure(obj, fastest.median_us, fastest.eager_us)
        else:
            best = min(measured_again, key=lambda t: statistics.median(self._pooled(t, obj)))
            pooled = self._pooled(best, obj)
            figure_us = statistics.median(pooled)
        guard = ""
        for name in GUARDS:
            t = self._trials.get(self.guards.get(name, ""))
            if t is None or t is best:
                continue
            us = statistics.median(self._pooled(t, obj)) if self._pooled(t, obj) else None
            if us is not None and us < figure_us:
                best, pooled, figure_us, guard = t, self._pooled(t, obj), us, name
        for name, key in self.guards.items():
            if guard == "" and best.candidate.key() == key:
                guard = name
        return Verdict(
            trial=best,
            pooled_median_us=figure_us,
            samples=len(pooled),
            contenders=len(measured_again),
            changed=best.candidate.key() != fastest.candidate.key(),
            objective=obj,
            guard=guard,
        )
