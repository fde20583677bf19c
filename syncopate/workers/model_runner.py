"""The `model` runner: the cost model answers instead of GPUs.

Every number it returns is a prediction and is stored with source `predicted`, never mixed with
measurements (`best` and `lookup` read measured rows only). Beside the device time it predicts
the host time to enqueue a call (:mod:`syncopate.cost_model.host_time`, a lead per template) and
the eager time of back-to-back calls, max(device, host). A candidate the topology cannot run
(the copy engine across nodes) comes back as `compile_error` with the reason. Its options are the
:class:`~syncopate.cost_model.calibration.Calibration` to predict from.

It needs no GPU and no process group; `syncopate tune --runner model` runs it in the coordinator's
process (:mod:`syncopate.autotuner.offline`), and it also runs in a gang of CPU actors like the
fixture.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from typing import Any

from syncopate.errors import ConfigError
from syncopate.search_space import Candidate, Topology, Workload
from syncopate.workers.outcomes import BaselineOutcome, CandidateOutcome, DeviceInfo
from syncopate.workers.runner import Runner, RunnerSpec

__all__ = ["ModelRunner"]


class ModelRunner(Runner):
    """Predicts baselines and candidates with :class:`~syncopate.cost_model.model.CostModel`."""

    name = "model"
    source = "predicted"
    dist_backend = "gloo"
    cpus_per_rank = 0.0

    def __init__(self, spec: RunnerSpec) -> None:
        super().__init__(spec)
        if spec.topology is None:
            raise ConfigError(
                "runner model predicts for a topology named in the config: set `topology:` to a key such as "
                "H200x2-nvlink (or pass --topology), not `detect`"
            )
        if spec.options is None:
            raise ConfigError("runner model needs a calibration (RunnerSpec.options)")
        from syncopate.cost_model.model import CostModel

        self.calibration: Any = spec.options
        self.model = CostModel(spec.options)
        self._rank = 0

    def bind_device(self, rank: int, gpu_ids: Sequence[int]) -> DeviceInfo:
        self._rank = rank
        return DeviceInfo(
            model=self.spec.topology.gpu_model,
            uuid=f"COSTMODEL-{socket.gethostname()}-{rank}",
            index=rank,
            name="cost model",
        )

    def setup(self, rank: int, world_size: int, group: Any) -> None:
        self._rank = rank

    def topology(self) -> Topology:
        return self.spec.topology

    def baselines(self, workload: Workload) -> list[BaselineOutcome]:
        from syncopate.cost_model.host_time import baseline_host_us, eager_us

        detail = f"predicted by the cost model ({self.calibration.describe()})"
        out = []
        for name, us in self.model.baselines(workload, self.spec.topology).items():
            host = baseline_host_us(name, self.spec.topology.world_size)
            out.append(
                BaselineOutcome(
                    name=name,
                    samples_us=(us,),
                    detail=detail,
                    host_us=host,
                    eager_us=None if host is None else eager_us(us, host),
                )
            )
        out.append(BaselineOutcome(name="torch_async_tp", detail="torch's fused op is not modelled"))
        return out

    def run(self, workload: Workload, candidate: Candidate, deadline_s: float) -> CandidateOutcome:
        p = self.model.predict(workload, self.spec.topology, candidate)
        if not p.feasible:
            return CandidateOutcome(
                status="compile_error",
                error=f"cannot run here: {p.reason}",
                extra={"prediction": p.to_dict()},
            )
        from syncopate.cost_model.host_time import candidate_host_us, eager_us

        host = candidate_host_us(workload, self.spec.topology.world_size, candidate)
        return CandidateOutcome(
            status="ok",
            samples_us=(p.time_us,),
            eager_us=eager_us(p.time_us, host),
            host_us=host,
            max_rel_error=None,
            extra={"prediction": p.to_dict(), "calibration": self.calibration.source},
        )
