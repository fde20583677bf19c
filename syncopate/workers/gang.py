"""A gang: one long-lived Ray actor per GPU of a topology, in one placement group, forming one
torch.distributed group, reused for every candidate of a sweep.

Life of a gang: :meth:`Gang.reserve` (the placement group) → :meth:`Gang.start` (actors, then a
`form` task: rendezvous, device binding, process group) → :meth:`Gang.formed` with the ranks'
descriptions → `baselines` and `trial` tasks, one at a time → on a hang or a crash,
:meth:`Gang.kill` and :meth:`Gang.start` again in the same placement group → :meth:`Gang.shutdown`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from syncopate.errors import ConfigError, RuntimeUnavailableError
from syncopate.search_space import Candidate, Topology, Workload
from syncopate.workers.actor import GangWorker
from syncopate.workers.env import actor_runtime_env
from syncopate.workers.runner import RunnerSpec, runner_class
from syncopate.workers.tasks import GangTask

__all__ = ["Gang", "PlacementPlan", "RUNNER_DEADLINE_FRACTION"]

log = logging.getLogger(__name__)

RUNNER_DEADLINE_FRACTION = 0.9
"""The runner's own deadline (bounded spin loops) as a fraction of the watchdog's: the kernel's
flag should fire before the gang is killed."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PlacementPlan:
    """The placement group a gang of a topology needs, and which bundle each rank takes."""

    bundles: tuple[dict[str, float], ...]
    strategy: str
    """`STRICT_PACK` on one node; `STRICT_SPREAD` over one bundle per node otherwise."""
    bundle_of_rank: tuple[int, ...]

    @classmethod
    def for_world(cls, world_size: int, nodes: int, cpus_per_rank: float) -> PlacementPlan:
        """One bundle per GPU packed on one node when `nodes` is 1; for N nodes, N bundles of
        world_size / N GPUs spread over N nodes, the ranks filling them in order."""
        if world_size < 1 or nodes < 1 or world_size % nodes:
            raise ConfigError(
                f"a gang of world size {world_size} cannot be spread evenly over {nodes} node(s)"
            )
        ws, g = world_size, world_size // nodes

        def bundle(gpus: int) -> dict[str, float]:
            b: dict[str, float] = {"GPU": float(gpus)}
            if cpus_per_rank:
                b["CPU"] = float(cpus_per_rank * gpus)
            return b

        if nodes == 1:
            return cls(
                bundles=tuple(bundle(1) for _ in range(ws)),
                strategy="STRICT_PACK",
                bundle_of_rank=tuple(range(ws)),
            )
        return cls(
            bundles=tuple(bundle(g) for _ in range(nodes)),
            strategy="STRICT_SPREAD",
            bundle_of_rank=tuple(r // g for r in range(ws)),
        )


class Gang:
    """World-size Ray actors, one per GPU, that measure together."""

    def __init__(
        self, index: int, world_size: int, spec: RunnerSpec, *, nodes: int = 1, setup_timeout_s: float = 300.0
    ) -> None:
        self.index = index
        self.world_size = world_size
        self.nodes = nodes
        self.spec = spec
        self.setup_timeout_s = setup_timeout_s
        self.plan = PlacementPlan.for_world(world_size, nodes, runner_class(spec.name).cpus_per_rank)
        self.actors: list[Any] = []
        self.members: list[dict[str, Any]] = []
        """What each rank said about itself when the gang formed (host, GPU, environment, ...)."""
        self.builds = 0
        """How many times actors were started for this gang."""
        self._pg: Any = None

    def reserve(self, timeout_s: float) -> None:
        """Create the placement group and wait until Ray has reserved its GPUs."""
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group

        self._pg = placement_group(
            list(self.plan.bundles), strategy=self.plan.strategy, name=f"syncopate-gang-{self.index}"
        )
        try:
            ray.get(self._pg.ready(), timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            remove_placement_group(self._pg)
            self._pg = None
            raise RuntimeUnavailableError(
                f"gang {self.index}: Ray could not reserve {self.world_size} GPUs "
                f"({self.plan.strategy}, bundles "
                f"{list(self.plan.bundles)}) within {timeout_s:.0f} s: other jobs hold them, or no node fits"
            ) from None

    def start(self) -> GangTask:
        """Start one actor per rank in the placement group and submit the `form` task."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if self._pg is None:
            raise RuntimeUnavailableError(f"gang {self.index} has no placement group: call reserve() first")
        self.builds += 1
        remote_cls = ray.remote(GangWorker)
        cpus = runner_class(self.spec.name).cpus_per_rank
        self.actors = [
            remote_cls.options(
                num_gpus=1,
                num_cpus=cpus,
                max_restarts=0,
                max_task_retries=0,
                runtime_env=actor_runtime_env(),
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=self._pg, placement_group_bundle_index=self.plan.bundle_of_rank[rank]
                ),
            ).remote(rank, self.world_size, self.spec, self.index, self.setup_timeout_s)
            for rank in range(self.world_size)
        ]
        self.members = []
        address = self.actors[0].rendezvous.remote()
        refs = [actor.setup.remote(address) for actor in self.actors]
        return GangTask(kind="form", gang=self, refs=refs, deadline_s=self.setup_timeout_s)

    def formed(self, members: list[dict[str, Any]]) -> None:
        """Record the ranks' descriptions once the `form` task finished."""
        self.members = sorted(members, key=lambda m: m["rank"])

    @property
    def gpu_models(self) -> list[str]:
        return [m["gpu_model"] for m in self.members]

    def submit_baselines(self, workload: Workload, deadline_s: float) -> GangTask:
        refs = [actor.baselines.remote(workload) for actor in self.actors]
        return GangTask(kind="baselines", gang=self, refs=refs, deadline_s=deadline_s, workload=workload)

    def submit_trial(self, workload: Workload, candidate: Candidate, deadline_s: float) -> GangTask:
        runner_deadline = deadline_s * RUNNER_DEADLINE_FRACTION
        refs = [actor.run.remote(workload, candidate, runner_deadline) for actor in self.actors]
        return GangTask(
            kind="trial", gang=self, refs=refs, deadline_s=deadline_s, workload=workload, candidate=candidate
        )

    def detect_topology(self, timeout_s: float) -> Topology:
        """The topology rank 0 reads off the hardware. Every rank is asked: detection gathers the
        ranks' host names, a collective that waits for all of them."""
        import ray

        try:
            answers = ray.get([actor.topology.remote() for actor in self.actors], timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise RuntimeUnavailableError(
                f"gang {self.index} did not report its topology within {timeout_s:.0f} s; "
                f"give the topology key in the sweep config (e.g. topology: H200x2-nvlink) instead of detect"
            ) from None
        return Topology.from_dict(answers[0])

    def provenance(self) -> dict[str, Any]:
        """Who measures on this gang: hosts, GPU UUIDs, actor ids, git revision, library versions, and
        the kernel switches its actors run with."""
        if not self.members:
            return {"gang": self.index, "build": self.builds}
        first = self.members[0]["provenance"]
        return {
            "runner": self.spec.name,
            "gang": self.index,
            "build": self.builds,
            "host": first.get("host"),
            "hosts": [m["host"] for m in self.members],
            "gpu_uuids": [m["gpu_uuid"] for m in self.members],
            "gpu_ids": [m["gpu_ids"] for m in self.members],
            "actor_ids": [m["actor_id"] for m in self.members],
            "node_ids": [m["node_id"] for m in self.members],
            "pids": [m["pid"] for m in self.members],
            "git": first.get("git"),
            "versions": self.members[0]["environment"],
            "switches": first.get("switches", {}),
        }

    def kill(self) -> None:
        """Kill every actor at once (a hung or crashed gang); the placement group stays reserved."""
        import ray

        for actor in self.actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception as exc:  # already dead: nothing left to kill
                log.debug("gang %d: killing an actor failed: %s", self.index, exc)
        self.actors = []
        self.members = []

    def shutdown(self, close_timeout_s: float = 10.0) -> None:
        """Close the runners politely (up to `close_timeout_s`; 0 skips it, for a gang that may be
        busy), kill the actors, free the placement group."""
        import ray
        from ray.util.placement_group import remove_placement_group

        if self.actors and self.members and close_timeout_s > 0:
            try:
                ray.get([a.close.remote() for a in self.actors], timeout=close_timeout_s)
            except Exception as exc:  # a gang that cannot close is killed below anyway
                log.debug("gang %d: closing failed: %s", self.index, exc)
        self.kill()
        if self._pg is not None:
            try:
                remove_placement_group(self._pg)
            except Exception as exc:  # the cluster may already be gone
                log.debug("gang %d: removing the placement group failed: %s", self.index, exc)
            self._pg = None
