"""The `cpu-fixture` runner: a cheap, deterministic stand-in for the GPU runner, for tests.

It runs the whole gang machinery (Ray actors with declared GPU resources, a gloo process group,
the coordinator's watchdog) without a GPU. Its numbers are synthetic and stored with source
`fixture`, never `measured`.

Times, in µs, for a workload on ws ranks (`gemm` at 600 TFLOP/s, `comm` at 150 GB/s):

| name            | time                                                                |
|-----------------|---------------------------------------------------------------------|
| gemm_alone      | flops / ws / 600e12                                                 |
| comm_alone      | bytes communicated per rank / 150e9                                 |
| torch_seq       | gemm + comm                                                         |
| torch_async_tp  | 0.97 × torch_seq (ag_gemm and gemm_rs only)                         |
| a candidate     | bound + (seq − bound) × (0.1 + 1.2 u), u ∈ [0, 1) from the candidate |
|                 | key and the workload key; bound = max(gemm, comm)                   |

Each repetition is jittered by ±1 % per rank, and the ranks reduce their samples with a gloo
`all_reduce(MAX)`, as the GPU harness reduces over ranks.

Host time per call (`host_us`) is the host-time lead of the candidate's template
(:mod:`syncopate.cost_model.host_time`) × (0.9 + 0.2 u'), u' from the candidate key, the workload key
and the rank; its eager time (`eager_us`) is max(median device time, host time) × (1 + 0.01 u''):
back-to-back calls wait for the slower of the two. Baselines get the same from their own leads.
So the fixture's eager ranking differs from its device ranking wherever a template's host time
exceeds its device time, as on GPUs.

Planted faults (the sweep's `fixture:` section, by candidate key): `hang` sleeps forever on every
rank; `crash` makes the last rank end its own process (`os._exit`), leaving the others in the
collective; `fail` returns a wrong result, or raises a compilation error, an out-of-memory error
or an unexpected exception.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import sys
import time
from collections.abc import Sequence
from typing import Any

from syncopate.cost_model.host_time import baseline_host_us, candidate_host_us
from syncopate.search_space import Candidate, Topology, Workload
from syncopate.workers.outcomes import BaselineOutcome, CandidateOutcome, DeviceInfo, summarize
from syncopate.workers.runner import Runner, RunnerSpec

__all__ = ["FixtureRunner", "PlantedFault", "candidate_host_time", "fixture_times"]

log = logging.getLogger(__name__)

CRASH_EXIT_CODE = 70
"""Exit code of a rank that ends its process for a planted crash."""

_GEMM_FLOPS = 600e12
_COMM_BYTES_PER_S = 150e9


class PlantedFault(RuntimeError):
    """An error the fixture raises on purpose; it carries the trial status it stands for."""

    def __init__(self, trial_status: str, message: str) -> None:
        super().__init__(message)
        self.trial_status = trial_status


def _unit(*parts: object) -> float:
    """A deterministic number in [0, 1) from `parts`."""
    digest = hashlib.sha256("/".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def fixture_times(workload: Workload, world_size: int) -> dict[str, float]:
    """Synthetic times (µs) of the baselines of `workload` on `world_size` ranks."""
    ws = world_size
    s = workload.shape
    gemm = workload.flops / ws / _GEMM_FLOPS * 1e6
    if workload.kind == "ag_gemm":
        moved = (ws - 1) / ws * s.m * s.k * workload.element_bytes
    else:
        moved = (ws - 1) / ws * s.m * s.n * workload.element_bytes * (2 if workload.kind == "gemm_ar" else 1)
    comm = moved / _COMM_BYTES_PER_S * 1e6
    times = {"gemm_alone": gemm, "comm_alone": comm, "torch_seq": gemm + comm}
    if workload.kind in ("ag_gemm", "gemm_rs"):
        times["torch_async_tp"] = 0.97 * (gemm + comm)
    return times


def candidate_time(workload: Workload, candidate: Candidate, world_size: int) -> float:
    """Synthetic time (µs) of `candidate` on `workload`."""
    t = fixture_times(workload, world_size)
    bound = max(t["gemm_alone"], t["comm_alone"])
    return bound + (t["torch_seq"] - bound) * (0.1 + 1.2 * _unit(candidate.key(), workload.key()))


def candidate_host_time(workload: Workload, candidate: Candidate, world_size: int, rank: int = 0) -> float:
    """Synthetic host time (µs) to enqueue one call of `candidate` on `rank`."""
    lead = candidate_host_us(workload, world_size, candidate)
    return lead * (0.9 + 0.2 * _unit("host", candidate.key(), workload.key(), rank))


def _eager(samples: tuple[float, ...], host_us: float, *salt: object) -> float:
    """Synthetic eager time per call: the slower of the median device time and the host's."""
    stats = summarize(samples)
    device = stats[0] if stats else 0.0
    return max(device, host_us) * (1 + 0.01 * _unit("eager", *salt))


class FixtureRunner(Runner):
    """Deterministic synthetic times over a gloo group, with planted hangs, crashes and errors."""

    name = "cpu-fixture"
    source = "fixture"
    dist_backend = "gloo"
    cpus_per_rank = 0.0

    def __init__(self, spec: RunnerSpec) -> None:
        super().__init__(spec)
        self._options = spec.options
        self._rank = 0
        self._world_size = 1
        self._group: Any = None
        self._device: DeviceInfo | None = None

    def _models(self) -> list[str]:
        models = list(getattr(self._options, "gpu_models", None) or [])
        if models:
            return models
        return [self.spec.topology.gpu_model if self.spec.topology is not None else "H200"]

    def bind_device(self, rank: int, gpu_ids: Sequence[int]) -> DeviceInfo:
        models = self._models()
        index = int(gpu_ids[0]) if gpu_ids else rank
        self._device = DeviceInfo(
            model=models[rank % len(models)],
            uuid=f"FIXTURE-{socket.gethostname()}-{index}",
            index=index,
            name="cpu-fixture",
        )
        return self._device

    def setup(self, rank: int, world_size: int, group: Any) -> None:
        self._rank, self._world_size, self._group = rank, world_size, group

    def topology(self) -> Topology:
        """As the GPU runner detects it, with a collective over the gang: every rank's host name
        (so that a caller asking only some ranks hangs here as it would on GPUs)."""
        import torch.distributed as dist

        hosts: list[str | None] = [None] * self._world_size
        dist.all_gather_object(hosts, socket.gethostname())
        model = self._device.model if self._device else self._models()[0]
        nodes = len(set(hosts))
        return Topology(world_size=self._world_size, nodes=nodes, gpu_model=model, interconnect="nvlink")

    def _samples(self, base_us: float, *salt: object) -> tuple[float, ...]:
        from syncopate.kernels.ranks import slowest

        reps = int(self.spec.timing.repetitions)
        local = [base_us * (1 + 0.02 * (_unit(*salt, rep, self._rank) - 0.5)) for rep in range(reps)]
        return tuple(slowest(local, self._group))

    def baselines(self, workload: Workload) -> list[BaselineOutcome]:
        times = fixture_times(workload, self._world_size)
        out = []
        for name, t in times.items():
            samples = self._samples(t, "baseline", name, workload.key())
            lead = baseline_host_us(name, self._world_size)
            host = (
                None if lead is None else lead * (0.9 + 0.2 * _unit("host", name, workload.key(), self._rank))
            )
            eager = None if host is None else _eager(samples, host, name, workload.key(), self._rank)
            out.append(
                BaselineOutcome(name=name, samples_us=samples, detail="fixture", eager_us=eager, host_us=host)
            )
        if "torch_async_tp" not in times:
            out.append(
                BaselineOutcome(
                    name="torch_async_tp", detail=f"torch has no fused async-TP op for {workload.kind}"
                )
            )
        return out

    def run(self, workload: Workload, candidate: Candidate, deadline_s: float) -> CandidateOutcome:
        key = candidate.key()
        opts = self._options
        if opts is not None and key in opts.hang:
            log.warning("fixture: candidate %s hangs (planted)", key)
            while True:
                time.sleep(3600)
        if opts is not None and key in opts.crash and self._rank == self._world_size - 1:
            print(
                f"fixture: rank {self._rank} ends its process for candidate {key} (planted crash)",
                file=sys.stderr,
                flush=True,
            )
            os._exit(CRASH_EXIT_CODE)
        if opts is not None and opts.delay_s:
            time.sleep(opts.delay_s)
        failure = opts.fail.get(key) if opts is not None else None
        if failure == "compile_error":
            raise PlantedFault("compile_error", f"fixture: candidate {key} does not compile (planted)")
        if failure == "oom":
            raise MemoryError(f"fixture: candidate {key} ran out of memory (planted)")
        if failure == "error":
            raise RuntimeError(f"fixture: candidate {key} raised an unexpected error (planted)")
        if failure == "wrong_result":
            return CandidateOutcome(
                status="wrong_result",
                max_rel_error=0.5,
                error=f"max relative error 0.5 exceeds 1e-2 (fixture: planted wrong result for {key})",
            )
        samples = self._samples(candidate_time(workload, candidate, self._world_size), key, workload.key())
        host = candidate_host_time(workload, candidate, self._world_size, self._rank)
        eager = _eager(samples, host, key, workload.key(), self._rank)
        return CandidateOutcome(
            status="ok", samples_us=samples, eager_us=eager, host_us=host, max_rel_error=0.0
        )

    def close(self) -> None:
        self._group = None
