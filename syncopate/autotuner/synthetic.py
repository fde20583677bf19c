"""A synthetic ground truth: an exhaustive sweep made up, for comparing strategies on the CPU while
no measured one exists. Labelled synthetic wherever it goes.

It is deliberately *not* the cost model: the times are those the cost model predicts under a
calibration perturbed at random (each backend's transfer curves, each tile configuration's rate,
every fixed cost and slowdown), times a log-normal factor per candidate (structure the model has
no term for), with a little measurement jitter on the samples and a few failed candidates; the
host time per call is the template's lead (:mod:`syncopate.cost_model.host_time`) times a
log-normal factor, and the eager time the larger of the two. It holds the space and the guards
(the untuned default, the unfused template), which every strategy measures first. A strategy that
finds the best here has shown it searches well; what the cost model's ranking is worth on real GPUs
only a measured sweep can tell.

Pure Python.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace

from syncopate.cost_model.calibration import Calibration, Curve, GemmRate, OpCosts, TransferModel
from syncopate.cost_model.calibration_defaults import default_calibration
from syncopate.cost_model.host_time import candidate_host_us
from syncopate.cost_model.model import CostModel
from syncopate.records import Environment, TrialRecord
from syncopate.search_space import SpaceOptions, Topology, Workload, guard_candidates, space
from syncopate.workers.replay_runner import StoredSweep

__all__ = ["synthetic_environment", "perturbed_calibration", "synthetic_sweep"]


def synthetic_environment(gpu_model: str) -> Environment:
    """The environment synthetic trials are stamped with: no library version at all."""
    from syncopate.version import __version__

    return Environment(
        syncopate=__version__,
        torch="synthetic",
        triton="synthetic",
        cuda="synthetic",
        nccl="synthetic",
        driver="synthetic",
        gpu_model=gpu_model,
    )


def perturbed_calibration(
    base: Calibration, rng: random.Random, *, transfer_sigma: float = 0.25, gemm_sigma: float = 0.12
) -> Calibration:
    """`base` with every part moved at random (log-normal factors; fixed costs ×0.5 … ×2)."""

    def factor(sigma: float) -> float:
        return math.exp(rng.gauss(0.0, sigma))

    transfers = {}
    for key, t in base.transfers.items():
        scale = factor(transfer_sigma)
        curves = {
            sms: Curve(sizes=c.sizes, us=tuple(us * scale * factor(0.05) for us in c.us))
            for sms, c in t.curves.items()
        }
        curves = {sms: Curve(sizes=c.sizes, us=tuple(sorted(c.us))) for sms, c in curves.items()}
        transfers[key] = TransferModel(
            backend=t.backend, scope=t.scope, curves=curves, call_us=t.call_us * rng.uniform(0.5, 2.0)
        )
    gemm = {
        key: GemmRate(
            tile=key,
            tflops_by_sms={s: v * factor(gemm_sigma) for s, v in g.tflops_by_sms.items()},
            tile_overhead_us=g.tile_overhead_us * rng.uniform(0.5, 2.0),
        )
        for key, g in base.gemm.items()
    }
    c = base.costs
    costs = OpCosts(
        launch_us=c.launch_us * rng.uniform(0.5, 2.0),
        wait_us=c.wait_us * rng.uniform(0.5, 3.0),
        local_copy_gbps=c.local_copy_gbps * factor(0.2),
        hbm_gbps=c.hbm_gbps * factor(0.1),
        overlap_slowdown={b: rng.uniform(0.0, 0.12) for b in c.overlap_slowdown},
    )
    origin = {k: "default, perturbed at random (synthetic ground truth)" for k in base.origin}
    return replace(base, transfers=transfers, gemm=gemm, costs=costs, origin=origin)


def synthetic_sweep(
    workloads: list[Workload],
    topology: Topology,
    *,
    seed: int = 0,
    options: SpaceOptions | None = None,
    candidate_sigma: float = 0.05,
    jitter: float = 0.01,
    fail_rate: float = 0.01,
    repetitions: int = 10,
) -> StoredSweep:
    """An exhaustive synthetic sweep of `workloads` on `topology` (see the module docstring)."""
    rng = random.Random(f"synthetic/{seed}/{topology.key()}")
    truth = CostModel(perturbed_calibration(default_calibration(topology), rng))
    env = synthetic_environment(topology.gpu_model)
    label = (
        f"SYNTHETIC ground truth (seed {seed}): the cost model under a randomly perturbed calibration, × a "
        f"log-normal factor per candidate (sigma {candidate_sigma}); not a measurement"
    )
    sweep = StoredSweep(label=label, topology=topology, environment=env, synthetic=True)
    for w in workloads:
        table = sweep.trials.setdefault(w.key(), {})
        held = {c.key(): c for c in space(w, topology, options)}
        for c in guard_candidates(w, topology).values():
            held.setdefault(c.key(), c)
        for cand in held.values():
            r = random.Random(f"{seed}/{w.key()}/{cand.key()}")
            p = truth.predict(w, topology, cand)
            if not p.feasible:
                table[cand.key()] = TrialRecord(
                    workload=w,
                    topology=topology,
                    environment=env,
                    candidate=cand,
                    status="compile_error",
                    source="fixture",
                    error=p.reason,
                )
                continue
            if r.random() < fail_rate:
                status = r.choice(("compile_error", "wrong_result", "timeout"))
                table[cand.key()] = TrialRecord(
                    workload=w,
                    topology=topology,
                    environment=env,
                    candidate=cand,
                    status=status,
                    source="fixture",
                    error=f"synthetic {status}",
                )
                continue
            true_us = p.time_us * math.exp(r.gauss(0.0, candidate_sigma))
            samples = sorted(true_us * math.exp(r.gauss(0.0, jitter)) for _ in range(repetitions))
            n = len(samples)
            median = (samples[(n - 1) // 2] + samples[n // 2]) / 2
            host = candidate_host_us(w, topology.world_size, cand) * math.exp(r.gauss(0.0, 0.1))
            table[cand.key()] = TrialRecord(
                workload=w,
                topology=topology,
                environment=env,
                candidate=cand,
                status="ok",
                source="fixture",
                median_us=median,
                p20_us=samples[int(0.2 * (n - 1))],
                p80_us=samples[int(math.ceil(0.8 * (n - 1)))],
                samples_us=tuple(samples),
                eager_us=max(median, host),
                host_us=host,
            )
        sweep.baselines[w.key()] = truth.baselines(w, topology)
    return sweep
