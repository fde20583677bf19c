"""`syncopate.moe.lookup_moe` (defined here, beside :mod:`.lookups`, which it shares its sources
and cache with): the best measured configuration of a MoE op for a workload and topology, at job
start.

```python
from syncopate.moe import lookup_moe
from syncopate.search_space import MoeWorkload

w = MoeWorkload(kind="a2a_gemm", tokens=4096, hidden=2048, ffn=768, experts=128, top_k=8)
result = lookup_moe(w, "H200x4-nvswitch")           # mode="eager"
result.candidate, result.match, result.reason
```

A function of its own, beside :func:`syncopate.lookup`: that one takes a GEMM shape (M, N, K) and
a dense kind, while a MoE workload is seven parameters and a routing, and its candidates are
:class:`~syncopate.search_space.moe_workload.MoeCandidate`. It reads the same sources
(:func:`~syncopate.results_db.readers.open_source`: a SQLite file read-only, a server, or an export
file) and serves by the same rule (:func:`~syncopate.records.pick`: the fastest tuned trial in the
mode, unless `unfused`'s trial there is faster). The ladder, first rung that answers wins (`match`):

1. `exact`: this workload (every parameter, the routing's seed included), topology and environment;
2. `nearest_tokens`: same kind, expert shapes (hidden, ffn, experts, top_k), routing distribution
   and dtype, on this topology and environment, at the stored token count nearest by
   |ln(T/T')| (the same routing seed first);
3. `other_environment`: the same on this topology under another environment fingerprint (logged
   as a warning);
4. `other_topology`: the closest stored topology of the same GPU count and nodes
   (:func:`~syncopate.results_db.lookups.topology_distance`), any environment (logged);
5. `cost_model`: the MoE cost model's pick (:mod:`syncopate.cost_model.moe`) among the candidates
   of :func:`~syncopate.search_space.moe_workload.moe_space` on the default backends, ranked in the
   mode (device time, or the larger of device and host time in mode eager), from the calibrations
   the database holds for the topology, else the documented defaults. As on the dense ladder, only
   a calibration measured on the topology (`syncopate calibrate`) lets it serve a plan other than
   `unfused`: otherwise its result serves `unfused` and says what the model would have picked;
6. `default`: `unfused` (torch's all_to_all_single and grouped GEMM), where nothing above answers
   (a GPU model the cost model has no figures for).

A stored configuration is served only where it can run on the asked world size
(:func:`~syncopate.search_space.moe_workload.check_moe_candidate`). `MoELayer` checks a served
plan other than `unfused` against `unfused` on its first calls and keeps the faster. Answers are
cached for the life of the process (see
:func:`~syncopate.results_db.lookups.clear_cache`, which clears these too).
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from typing import Any

from syncopate.errors import ConfigError, describe
from syncopate.records import DEFAULT_MODE, Environment, check_mode
from syncopate.search_space import MoeWorkload, Topology
from syncopate.search_space.moe_workload import (
    MOE_DEFAULT_BACKENDS,
    MoeCandidate,
    check_moe_candidate,
    moe_space,
)

__all__ = ["MOE_MATCHES", "MoeLookupResult", "clear_moe_cache", "lookup_moe"]

log = logging.getLogger(__name__)

MOE_MATCHES: tuple[str, ...] = (
    "exact",
    "nearest_tokens",
    "other_environment",
    "other_topology",
    "cost_model",
    "default",
)
"""The rungs of the MoE ladder, best first."""


@dataclass(frozen=True, kw_only=True, slots=True)
class MoeLookupResult:
    """What :func:`lookup_moe` found, and why."""

    candidate: MoeCandidate
    match: str
    """One of :data:`MOE_MATCHES`."""
    trial_id: int | None
    time_us: float | None
    """The trial's device time (median), µs (None for `default`)."""
    workload: MoeWorkload
    topology: Topology
    measured_on: MoeWorkload | None = None
    measured_topology: Topology | None = None
    environment: Environment | None = None
    eager_us: float | None = None
    mode: str = DEFAULT_MODE
    objective: str = ""
    guard: str = ""
    database: str = ""
    reason: str = ""
    predicted_us: float | None = None
    """The cost model's prediction of the candidate in the mode, µs (`cost_model` only)."""

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "candidate": self.candidate.to_dict(),
            "match": self.match,
            "mode": self.mode,
            "objective": self.objective,
            "reason": self.reason,
            "trial_id": self.trial_id,
            "time_us": self.time_us,
        }
        if self.trial_id is not None:
            d["eager_us"] = self.eager_us
        if self.measured_on is not None:
            d["measured_on"] = self.measured_on.key()
        if self.measured_topology is not None:
            d["measured_topology"] = self.measured_topology.key()
        if self.environment is not None:
            d["environment"] = self.environment.key()
        if self.guard:
            d["guard"] = self.guard
        if self.predicted_us is not None:
            d["predicted_us"] = self.predicted_us
        return d


def _distance(a: MoeWorkload, b: MoeWorkload) -> tuple[float, int, str]:
    return (abs(math.log(a.tokens / b.tokens)), int(a.routing.seed != b.routing.seed), b.key())


class _MoeLadder:
    def __init__(self, source: Any, workload: MoeWorkload, topology: Topology, env: Environment, mode: str):
        self.source, self.workload, self.topology, self.env, self.mode = source, workload, topology, env, mode
        alike = workload.expert_key()
        self.refs = sorted(
            (
                r
                for r in source.moe_workloads(workload.kind, workload.dtype)
                if r.workload.expert_key() == alike
            ),
            key=lambda r: _distance(workload, r.workload),
        )

    def climb(self) -> MoeLookupResult:
        topo, env_key = self.topology, self.env.key()
        for ref in self.refs:
            match = "exact" if ref.workload == self.workload else "nearest_tokens"
            found = self._answer(ref, topo, env_key, "same", match)
            if found is not None:
                return found
        for ref in self.refs:
            found = self._answer(ref, topo, env_key, "other", "other_environment")
            if found is not None:
                log.warning("lookup_moe %s on %s: %s", self.workload, topo.key(), found.reason)
                return found
        if self.refs:
            from syncopate.results_db.lookups import topology_distance

            others = sorted(
                (
                    t
                    for t in self.source.topologies()
                    if t.world_size == topo.world_size and t.nodes == topo.nodes and t.key() != topo.key()
                ),
                key=lambda t: topology_distance(topo, t),
            )
            for other in others:
                for ref in self.refs:
                    found = self._answer(ref, other, env_key, "any", "other_topology")
                    if found is not None:
                        log.warning("lookup_moe %s on %s: %s", self.workload, topo.key(), found.reason)
                        return found
        where = self.source.shown or "the database"
        modelled, why_not = self._cost_model()
        if modelled is not None:
            return modelled
        held = (
            f"{len(self.refs)} workload(s) of the same kind, expert shapes and routing distribution are stored, "
            f"but no measured trial of them on {topo.key()} or a topology of {topo.world_size} GPUs runs here"
            if self.refs
            else f"nothing of {self.workload.kind} with these expert shapes and routing is measured in {where}"
        )
        return MoeLookupResult(
            candidate=MoeCandidate(),
            match="default",
            trial_id=None,
            time_us=None,
            workload=self.workload,
            topology=topo,
            mode=self.mode,
            database=self.source.shown,
            reason=f"{held}: unfused, torch's own path ({why_not}); `syncopate tune` with a `moe:` section "
            "measures this workload",
        )

    def _cost_model(self) -> tuple[MoeLookupResult | None, str]:
        """The MoE cost model's answer (module docstring), or None and why it cannot answer."""
        from syncopate.errors import CalibrationError

        try:
            from syncopate.cost_model.moe import MoeCostModel
        except ImportError as e:
            return None, f"the cost model is not available: {e}"
        from syncopate.results_db.lookups import guarded_pick, source_calibration

        try:
            calibration = source_calibration(self.source, self.topology, self.env)
        except CalibrationError as e:
            return None, f"no cost model answers: {e}"
        ws = self.topology.world_size
        space = moe_space(self.workload, ws, backends=MOE_DEFAULT_BACKENDS)
        ranked = MoeCostModel(calibration).rank(self.workload, space, ws, self.mode)
        if not ranked:
            return None, f"no candidate of {len(space)} the cost model ranks can run on {ws} ranks"
        best, predicted = ranked[0]
        unfused = next((p.time_us(self.mode) for c, p in ranked if c == MoeCandidate()), None)
        among = f"the MoE cost model's pick among {len(ranked)} candidates"
        best, score, pick = guarded_pick(
            among, self.mode, calibration, (best, predicted.time_us(self.mode)), (MoeCandidate(), unfused)
        )
        return MoeLookupResult(
            candidate=best,
            match="cost_model",
            trial_id=None,
            time_us=None,
            workload=self.workload,
            topology=self.topology,
            mode=self.mode,
            objective="device (predicted)" if self.mode == "graph" else "eager (predicted)",
            database=self.source.shown,
            reason=f"nothing of {self.workload.kind} with these expert shapes and routing is measured for "
            f"{self.topology.key()}: {pick}",
            predicted_us=score,
        ), ""

    def _answer(self, ref: Any, topology: Topology, env_key: str, environment: str, match: str):
        served = self.source.served(ref, topology, env_key, environment=environment, mode=self.mode)
        if served is None:
            return None
        candidate = MoeCandidate() if served.guard == "unfused" else served.hit.candidate
        try:
            check_moe_candidate(candidate, self.topology.world_size)
        except ConfigError as e:
            log.debug("trial %d does not fit %s: %s", served.hit.trial_id, self.topology.key(), e)
            return None
        hit = served.hit
        measured = ref.workload
        if match == "exact":
            why = (
                f"measured: trial {hit.trial_id} of this workload on {topology.key()} under this environment"
            )
        elif match == "nearest_tokens":
            why = (
                f"no trial of this workload on {topology.key()} under this environment; nearest measured "
                f"{measured.key()} (tokens {measured.tokens}), trial {hit.trial_id}"
            )
        elif match == "other_environment":
            why = (
                f"nothing measured on {topology.key()} under this environment ({self.env.short()}); trial "
                f"{hit.trial_id} of {measured.key()} under another ({hit.environment.short()})"
            )
        else:
            why = (
                f"nothing measured on {self.topology.key()}; closest measured topology {topology.key()}: trial "
                f"{hit.trial_id} of {measured.key()}, under {hit.environment.short()}"
            )
        if served.guard:
            why += f"; unfused is served: no tuned candidate measured there is as fast in mode {self.mode}"
        return MoeLookupResult(
            candidate=candidate,
            match=match,
            trial_id=hit.trial_id,
            time_us=hit.median_us,
            workload=self.workload,
            topology=self.topology,
            measured_on=measured,
            measured_topology=topology,
            environment=hit.environment,
            eager_us=hit.eager_us,
            mode=self.mode,
            objective=served.objective,
            guard=served.guard,
            database=self.source.shown,
            reason=why,
        )


def lookup_moe(
    workload: MoeWorkload,
    topology: Topology | str | None = None,
    *,
    db: str | os.PathLike[str] | None = None,
    environment: Environment | None = None,
    mode: str = DEFAULT_MODE,
) -> MoeLookupResult:
    """The configuration to run for `workload` on `topology` (see the module docstring).

    topology: a Topology, its key, or None to detect the current one. db: a database URL, a SQLite
    path or an export file (None: SYNCOPATE_DB, else the per-user default). environment: the
    fingerprint to match (None: this process's). mode: `eager` (the default) or `graph`.
    """
    from syncopate.environment import GLUON_VAR
    from syncopate.results_db.lookups import _resolver
    from syncopate.results_db.urls import ENV_VAR

    if not isinstance(workload, MoeWorkload):
        raise ConfigError(f"lookup_moe takes a MoeWorkload, got {describe(workload)}")
    mode = check_mode(mode)
    topo = _resolver.topology(topology)
    workload.check_world_size(topo.world_size)
    env = Environment.current() if environment is None else environment
    if not isinstance(env, Environment):
        raise ConfigError(f"environment {env!r} is not an Environment")
    raw = (workload, topo.key(), str(db) if db is not None else None, env.key(), mode)
    raw += (os.environ.get(ENV_VAR) if db is None else None, os.environ.get(GLUON_VAR))
    with _resolver._lock:  # the dense lookups' sources, detected topology and lock
        found = _resolver.moe_answers.get(raw)
        if found is None:
            found = _MoeLadder(_resolver.source(db), workload, topo, env, mode).climb()
            _resolver.moe_answers[raw] = found
        return found


def clear_moe_cache() -> None:
    """Forget every cached answer and close the sources lookups have opened (`clear_cache`: MoE and
    dense lookups share them)."""
    from syncopate.results_db.lookups import clear_cache

    clear_cache()
