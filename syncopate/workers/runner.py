"""The runner plugin: what a gang actor calls to bind its device, measure baselines and run
candidates.

A runner lives inside one gang actor (one rank). The actor calls, in this order:

1. :meth:`Runner.bind_device` with the GPU ids Ray assigned, before any process group exists;
2. :meth:`Runner.setup` once the torch.distributed group of the gang is formed;
3. :meth:`Runner.baselines` once per workload and :meth:`Runner.run` once per candidate, any
   number of times, in any workload order;
4. :meth:`Runner.close` when the gang is shut down (not when it is killed).

Implementations: `gpu` (:mod:`syncopate.workers.gpu_runner`, the kernels' timing harness),
`cpu-fixture` (:mod:`syncopate.workers.fixture_runner`, a deterministic stand-in for tests),
`model` (:mod:`syncopate.workers.model_runner`, the cost model's predictions) and `replay`
(:mod:`syncopate.workers.replay_runner`, a stored sweep answering again).
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from syncopate.errors import ConfigError
from syncopate.records import Environment
from syncopate.search_space import Candidate, Topology, Workload
from syncopate.workers.outcomes import BaselineOutcome, CandidateOutcome, DeviceInfo

__all__ = ["Runner", "RunnerSpec", "AVAILABLE_RUNNERS", "IN_PROCESS_RUNNERS", "runner_class", "make_runner"]

AVAILABLE_RUNNERS: dict[str, str] = {
    "gpu": "syncopate.workers.gpu_runner:GpuRunner",
    "cpu-fixture": "syncopate.workers.fixture_runner:FixtureRunner",
    "cpu": "syncopate.workers.gpu_runner:CpuRunner",
    "model": "syncopate.workers.model_runner:ModelRunner",
    "replay": "syncopate.workers.replay_runner:ReplayRunner",
}
"""Runner name → `module:Class`. Modules are imported on first use (the GPU one needs the kernels)."""

IN_PROCESS_RUNNERS: tuple[str, ...] = ("model", "replay")
"""Runners that need neither GPUs nor Ray: `syncopate tune` runs them in its own process."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunnerSpec:
    """Everything a gang actor needs to build its runner; picklable, sent to every rank."""

    name: str
    """A key of :data:`AVAILABLE_RUNNERS`."""
    timing: Any
    """The sweep's timing settings (:class:`syncopate.autotuner.sweep.TimingConfig`)."""
    topology: Topology | None = None
    """The configured topology; None when it is detected on the gang."""
    options: Any = None
    """Runner-specific settings: the fixture's planted faults
    (:class:`syncopate.autotuner.sweep.FixtureConfig`); unused by the GPU runner."""


class Runner(ABC):
    """One rank's way of measuring: binds a device, then times baselines and candidates."""

    name: ClassVar[str]
    """The name sweeps use (`runner: gpu`)."""
    source: ClassVar[str] = "measured"
    """The :data:`~syncopate.records.SOURCES` label of what this runner produces."""
    dist_backend: ClassVar[str] = "nccl"
    """The torch.distributed backend of the gang's process group."""
    cpus_per_rank: ClassVar[float] = 1.0
    """Ray CPUs reserved beside each GPU."""

    def __init__(self, spec: RunnerSpec) -> None:
        self.spec = spec

    @abstractmethod
    def bind_device(self, rank: int, gpu_ids: Sequence[int]) -> DeviceInfo:
        """Select this rank's device among `gpu_ids` (what `ray.get_gpu_ids()` returned) and
        describe it. Called first, before the process group exists; raise
        :class:`~syncopate.errors.RuntimeUnavailableError` when the device cannot be used."""

    @abstractmethod
    def setup(self, rank: int, world_size: int, group: Any) -> None:
        """Called once the gang's process group `group` is formed."""

    @abstractmethod
    def baselines(self, workload: Workload) -> list[BaselineOutcome]:
        """Time the reference ops of `workload` (identical on every rank)."""

    @abstractmethod
    def run(self, workload: Workload, candidate: Candidate, deadline_s: float) -> CandidateOutcome:
        """Build, verify and time `candidate` on `workload`; identical status on every rank.

        Failures the runner recognises come back as an outcome with their status; an exception
        is classified by :func:`~syncopate.workers.outcomes.classify_exception`. A candidate still
        running `deadline_s` seconds after it started may be killed with its gang."""

    def close(self) -> None:
        """Free what :meth:`setup` and the workloads allocated. Called on an orderly shutdown only."""

    def environment(self, device: DeviceInfo) -> Environment:
        """The environment fingerprint of this rank, with the GPU model of its device."""
        from syncopate.environment import current_environment

        return replace(current_environment(), gpu_model=device.model)

    def topology(self) -> Topology:
        """The topology of the gang, read off the hardware (for `topology: detect`)."""
        raise ConfigError(
            f"runner {self.name} cannot detect the topology: give `topology: KEY` in the sweep config"
        )


def runner_class(name: str) -> type[Runner]:
    """The runner class registered as `name`; ConfigError naming the accepted ones otherwise."""
    target = AVAILABLE_RUNNERS.get(name)
    if target is None:
        raise ConfigError(f"unknown runner {name!r}: accepted are {', '.join(AVAILABLE_RUNNERS)}")
    module, cls = target.split(":")
    return getattr(importlib.import_module(module), cls)


def make_runner(spec: RunnerSpec) -> Runner:
    """Build the runner `spec` names."""
    return runner_class(spec.name)(spec)
