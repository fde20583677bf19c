"""One rank of a gang: a long-lived Ray actor owning one GPU, one runner and one process group.

The class is plain Python; :class:`syncopate.workers.gang.Gang` makes it a Ray actor with one GPU
of a placement-group bundle and the runtime_env of :mod:`syncopate.workers.env`. Methods are
called in order: :meth:`rendezvous` (rank 0 only), :meth:`setup`, then :meth:`baselines` and
:meth:`run` any number of times, and :meth:`close` on an orderly shutdown.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from datetime import timedelta
from typing import Any

from syncopate.errors import ConfigError
from syncopate.search_space import Candidate, Workload
from syncopate.workers.outcomes import BaselineOutcome, CandidateOutcome, classify_exception
from syncopate.workers.runner import Runner, RunnerSpec, make_runner

__all__ = ["GangWorker", "run_candidate"]

log = logging.getLogger(__name__)


def _format_exception(exc: BaseException) -> str:
    text = str(exc).strip() or repr(exc)
    return f"{type(exc).__name__}: {text}"


def run_candidate(
    runner: Runner, rank: int, workload: Workload, candidate: Candidate, deadline_s: float
) -> CandidateOutcome:
    """Build, verify and time one candidate on `runner`, as rank `rank`, stamped with the rank and
    its wall-clock start and end. An exception becomes its classified status
    (:func:`~syncopate.workers.outcomes.classify_exception`), not swallowed: the status and text are
    stored with the trial. Every place a runner runs calls this, a gang actor or this process."""
    started = time.time()
    try:
        outcome = runner.run(workload, candidate, deadline_s)
    except Exception as exc:  # classified, not swallowed: the status and text are stored with the trial
        status, healthy = classify_exception(exc)
        if not healthy:
            log.exception("rank %d: candidate %s raised", rank, candidate.key())
        outcome = CandidateOutcome(status=status, error=_format_exception(exc), healthy=healthy)
    return CandidateOutcome(
        status=outcome.status,
        samples_us=outcome.samples_us,
        eager_us=outcome.eager_us,
        host_us=outcome.host_us,
        max_rel_error=outcome.max_rel_error,
        error=outcome.error,
        healthy=outcome.healthy,
        started_at=started,
        finished_at=time.time(),
        rank=rank,
        extra=outcome.extra,
    )


class GangWorker:
    """Rank `rank` of a gang of `world_size`: binds its GPU, joins the gang's process group and
    runs what the coordinator asks through its runner."""

    def __init__(
        self, rank: int, world_size: int, spec: RunnerSpec, gang_index: int, setup_timeout_s: float
    ) -> None:
        if not 0 <= rank < world_size:
            raise ConfigError(f"rank {rank} is outside a world of size {world_size}")
        self.rank = rank
        self.world_size = world_size
        self.gang_index = gang_index
        self.spec = spec
        self.setup_timeout_s = setup_timeout_s
        self.runner = make_runner(spec)
        self._store: Any = None
        self._device = None

    def rendezvous(self) -> tuple[str, int]:
        """Rank 0 only: open the gang's TCP store on a free port of this node; return its address."""
        import ray
        import torch.distributed as dist

        host = ray.util.get_node_ip_address()
        self._store = dist.TCPStore(
            host,
            0,
            self.world_size,
            is_master=True,
            wait_for_workers=False,
            timeout=timedelta(seconds=self.setup_timeout_s),
        )
        return host, int(self._store.port)

    def setup(self, address: tuple[str, int]) -> dict[str, Any]:
        """Bind the device, join the process group at `address`, set the runner up; describe this rank."""
        import ray
        import torch.distributed as dist

        from syncopate.environment import provenance

        gpu_ids = [int(g) for g in ray.get_gpu_ids()]
        self._device = self.runner.bind_device(self.rank, gpu_ids)
        host, port = address
        if self._store is None:
            self._store = dist.TCPStore(
                host, port, self.world_size, is_master=False, timeout=timedelta(seconds=self.setup_timeout_s)
            )
        dist.init_process_group(
            self.runner.dist_backend,
            store=self._store,
            rank=self.rank,
            world_size=self.world_size,
            timeout=timedelta(seconds=self.setup_timeout_s),
        )
        self.runner.setup(self.rank, self.world_size, dist.group.WORLD)
        context = ray.get_runtime_context()
        return {
            "rank": self.rank,
            "host": socket.gethostname(),
            "ip": ray.util.get_node_ip_address(),
            "pid": os.getpid(),
            "actor_id": context.get_actor_id(),
            "node_id": context.get_node_id(),
            "gpu_ids": gpu_ids,
            "gpu_model": self._device.model,
            "gpu_uuid": self._device.uuid,
            "gpu_name": self._device.name,
            "environment": self.runner.environment(self._device).to_dict(),
            "provenance": provenance(),
        }

    def topology(self) -> dict[str, Any]:
        """The gang's topology as the runner reads it off the hardware."""
        return self.runner.topology().to_dict()

    def baselines(self, workload: Workload) -> list[BaselineOutcome]:
        """Time the reference ops of `workload`; exceptions propagate (the coordinator logs them)."""
        return self.runner.baselines(workload)

    def run(self, workload: Workload, candidate: Candidate, deadline_s: float) -> CandidateOutcome:
        """Build, verify and time one candidate (see :func:`run_candidate`)."""
        return run_candidate(self.runner, self.rank, workload, candidate, deadline_s)

    def close(self) -> None:
        """Close the runner and leave the process group."""
        import torch.distributed as dist

        try:
            self.runner.close()
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
