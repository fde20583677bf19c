"""Noise-aware winners: the best few candidates are measured once more before one is declared.

When a workload's search is over, the candidates whose medians lie within the noise of the best
(at most `top_k` of them, the best always among them) are measured again. The noise is the
widest relative spread (p80 − p20) / median among them, and never less than `min_noise`. The
winner is the contender with the lowest median over all its samples, first measurement and
re-measurement pooled. A single lucky measurement thus cannot win alone.

Re-measurements are stored as trials of a companion sweep, named after the sweep with
:data:`CONFIRM_SUFFIX` (a trial's identity includes its sweep, so the first measurement stays as it
was); :func:`companion_sweep` makes or resumes it.

Pure Python.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING

from syncopate.records import TrialRecord
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
    """Median over every sample of it, re-measurements included."""
    samples: int
    contenders: int
    """Candidates that were within noise of the best and measured again."""
    changed: bool
    """True when the fastest single measurement was not the winner after re-measuring."""

    @property
    def candidate(self) -> Candidate:
        return self.trial.candidate


class Confirmation:
    """Chooses the contenders, hands them out for re-measuring, and declares the winner."""

    def __init__(self, top_k: int = 3, min_noise: float = 0.01) -> None:
        self.top_k = top_k
        self.min_noise = min_noise
        self._trials: dict[str, TrialRecord] = {}
        self._extra: dict[str, list[float]] = {}
        self._queue: list[Candidate] | None = None
        self._out: set[str] = set()

    def observe(self, trial: TrialRecord) -> None:
        """Every finished trial of the search (failures are ignored)."""
        if trial.status == "ok" and trial.median_us is not None:
            self._trials[trial.candidate.key()] = trial

    def contenders(self) -> list[TrialRecord]:
        """The ok trials within noise of the best, best first, at most `top_k`."""
        ranked = sorted(self._trials.values(), key=lambda t: t.median_us)[: self.top_k]
        if not ranked:
            return []
        noise = self.min_noise
        for t in ranked:
            if t.p20_us is not None and t.p80_us is not None and t.median_us:
                noise = max(noise, (t.p80_us - t.p20_us) / t.median_us)
        limit = ranked[0].median_us * (1 + 2 * noise)
        return [t for t in ranked if t.median_us <= limit]

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

    def verdict(self) -> Verdict | None:
        """The winner: the contender with the lowest pooled median (the fastest single trial when
        nothing was re-measured); None without an ok trial."""
        if not self._trials:
            return None
        fastest = min(self._trials.values(), key=lambda t: t.median_us)
        measured_again = [self._trials[k] for k in self._extra if k in self._trials]
        if not measured_again:
            return Verdict(trial=fastest, pooled_median_us=fastest.median_us, samples=len(fastest.samples_us),
                           contenders=0, changed=False)

        def pooled(t: TrialRecord) -> list[float]:
            return (list(t.samples_us) or [t.median_us]) + self._extra[t.candidate.key()]

        best = min(measured_again, key=lambda t: statistics.median(pooled(t)))
        samples = pooled(best)
        return Verdict(trial=best, pooled_median_us=statistics.median(samples), samples=len(samples),
                       contenders=len(measured_again), changed=best.candidate.key() != fastest.candidate.key())
