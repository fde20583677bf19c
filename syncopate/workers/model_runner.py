"""The `model` runner: the cost model answers instead of GPUs.

Every number it returns is a prediction and is stored with source `predicted`, never mixed with
measurements (`best` and `lookup` read measured rows only). Beside the device time it predicts
the host time to enqueue a call (:mod:`syncopate.cost_model.host_time`, a lead per template) and
the eager time of back-to-back calls, max(device, host). A candidate the topology cannot run
(the copy engine across nodes) comes back as `compile_error` with the reason. Its options are the
:class:`~syncopate.cost_model.calibration.Calibration` to predict from. The MoE kinds (`a2a_gemm`,
`gemm_a2a`) are predicted by :class:`~syncopate.cost_model.moe.MoeCostModel` from the same
calibration, their baselines the harness's (`torch_seq` as `unfused`, the all-to-all alone on NCCL
and on the copy engine, the grouped GEMM alone).

It needs no GPU and no process group; `syncopate tune --runner model` runs it in the coordinator's
process (:mod:`syncopate.autotuner.offline`), and it also runs in a gang of CPU actors like the
fixture.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from typing import Any

from syncopate.errors import ConfigError
from syncopate.search_space import Candidate, MoeWorkload, Topology, Workload
from syncopate.search_space.moe_workload import MoeCandidate
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
        from syncopate.cost_model.moe import MoeCostModel

        self.calibration: Any = spec.options
        self.model = CostModel(spec.options)
        self.moe_model = MoeCostModel(spec.options)
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
        if isinstance(workload, MoeWorkload):
            return self._moe_baselines(workload, detail)
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

    def _moe_baselines(self, workload: MoeWorkload, detail: str) -> list[BaselineOutcome]:
        from syncopate.cost_model.moe import routing_stats

        ws = self.spec.topology.world_size
        model = self.moe_model
        s = routing_stats(workload, ws)
        k, n = (
            (workload.hidden, 2 * workload.ffn)
            if workload.kind == "a2a_gemm"
            else (workload.ffn, workload.hidden)
        )
        out_bytes = s.pair_rows_out * workload.hidden * workload.element_bytes
        torch_seq = model.predict(workload, MoeCandidate(), ws)
        times = {
            "torch_seq": (torch_seq.device_us, torch_seq.host_us),
            "comm_alone": (model.a2a_us("nccl", out_bytes), None),
            "gemm_alone": (model.gemm_us(s.expert_rows, k, n), None),
        }
        if self.calibration.has_transfer("copy_engine") and self.spec.topology.nodes == 1:
            times["comm_alone_copy_engine"] = (model.a2a_us("copy_engine", out_bytes), None)
        return [
            BaselineOutcome(
                name=name,
                samples_us=(us,),
                detail=detail,
                host_us=host,
                eager_us=None if host is None else max(us, host),
            )
            for name, (us, host) in times.items()
        ]

    def _run_moe(self, workload: MoeWorkload, candidate: MoeCandidate) -> CandidateOutcome:
        topo = self.spec.topology
        if candidate.backend != "nccl" and topo.nodes > 1:
            return CandidateOutcome(
                status="compile_error",
                error=f"cannot run here: backend {candidate.backend} moves rows within one node, {topo.key()} has "
                f"{topo.nodes}",
            )
        try:
            p = self.moe_model.predict(workload, candidate, topo.world_size)
        except ConfigError as e:
            return CandidateOutcome(status="compile_error", error=f"cannot run here: {e}")
        return CandidateOutcome(
            status="ok",
            samples_us=(p.device_us,),
            eager_us=p.eager_us,
            host_us=p.host_us,
            max_rel_error=None,
            extra={"prediction": p.to_dict(), "calibration": self.calibration.source},
        )

    def run(self, workload: Workload, candidate: Candidate, deadline_s: float) -> CandidateOutcome:
        if isinstance(workload, MoeWorkload):
            return self._run_moe(workload, candidate)
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
