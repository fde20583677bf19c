"""The GPU runner: one rank of a gang timing fused kernels through the kernels' harness.

Runs inside a gang actor whose environment carries `RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES=1`
(see :mod:`syncopate.workers.env`): every GPU of the node stays visible, and the rank selects the
one Ray assigned with `torch.cuda.set_device(ray.get_gpu_ids()[0])` before NCCL starts.

The harness (:class:`syncopate.measure.harness.Harness`) allocates one workload's inputs, measures
its baselines and runs candidates (build, verify against the reference, time); it reduces across
the group itself, so every rank returns the same result. One harness is kept per gang for the
current workload and replaced when the workload changes. A MoE workload (kinds `a2a_gemm`,
`gemm_a2a`) gets :class:`syncopate.measure.moe.MoeHarness` instead, with the same contract.

:class:`CpuRunner` (`runner: cpu`) runs the MoE harness on gloo ranks on the CPU: the candidates
that run there (`unfused`, `pipelined` on `nccl`, which is gloo there) are checked and timed by
the wall clock, the others recorded as refused. It checks a MoE sweep end to end without a GPU;
its times are no GPU's, so it stores them with source `fixture` (never served by lookup).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Sequence
from typing import Any

from syncopate.errors import ConfigError, RuntimeUnavailableError
from syncopate.platform import detect_topology, gpu_model_of
from syncopate.search_space import Candidate, MoeWorkload, Topology, Workload
from syncopate.workers.outcomes import BaselineOutcome, CandidateOutcome, DeviceInfo
from syncopate.workers.runner import Runner, RunnerSpec

__all__ = ["CpuRunner", "GpuRunner"]

log = logging.getLogger(__name__)


def _device_uuid(torch: Any, index: int) -> str:
    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    if uuid:
        text = str(uuid)
        return text if text.startswith("GPU-") else f"GPU-{text}"
    try:
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
        try:
            value = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(index))
            return value.decode() if isinstance(value, bytes) else str(value)
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return "unknown"


class GpuRunner(Runner):
    """Times candidates on this rank's GPU with :class:`syncopate.measure.harness.Harness`."""

    name = "gpu"
    source = "measured"
    dist_backend = "nccl"
    cpus_per_rank = 1.0

    def __init__(self, spec: RunnerSpec) -> None:
        super().__init__(spec)
        self._group: Any = None
        self._harness_cls: Any = None
        self._harness: Any = None
        self._workload: Workload | None = None

    def bind_device(self, rank: int, gpu_ids: Sequence[int]) -> DeviceInfo:
        import torch

        host = socket.gethostname()
        if not gpu_ids:
            raise RuntimeUnavailableError(f"rank {rank} on {host}: Ray assigned this actor no GPU")
        if not torch.cuda.is_available():
            raise RuntimeUnavailableError(
                f"rank {rank} on {host}: Ray assigned GPU {gpu_ids[0]}, "
                f"but torch {torch.__version__} sees no "
                f"CUDA device there: run the workers on GPU nodes with a CUDA build of torch"
            )
        index = int(gpu_ids[0])
        if index >= torch.cuda.device_count():
            raise RuntimeUnavailableError(
                f"rank {rank} on {host}: Ray assigned GPU {index}, "
                f"but torch sees {torch.cuda.device_count()} device(s): "
                f"start the Ray node with RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES=1 in its environment"
            )
        torch.cuda.set_device(index)
        props = torch.cuda.get_device_properties(index)
        return DeviceInfo(
            model=gpu_model_of(props.name), uuid=_device_uuid(torch, index), index=index, name=props.name
        )

    def setup(self, rank: int, world_size: int, group: Any) -> None:
        try:
            from syncopate.measure.harness import Harness
        except ImportError as e:
            raise RuntimeUnavailableError(
                f"runner gpu needs syncopate.measure.harness, which this installation lacks ({e}): "
                f"install a build of syncopate that includes the kernels"
            ) from None
        self._harness_cls = Harness
        self._group = group

    def _harness_for(self, workload: Workload | MoeWorkload) -> Any:
        if self._workload != workload:
            self._close_harness()
            if isinstance(workload, MoeWorkload):
                from syncopate.measure.moe import MoeHarness

                self._harness = MoeHarness(workload, self._group, self.spec.timing)
            else:
                self._harness = self._harness_cls(workload, self._group, self.spec.timing)
            self._workload = workload
        return self._harness

    def baselines(self, workload: Workload) -> list[BaselineOutcome]:
        return [
            BaselineOutcome(
                name=b.name,
                samples_us=tuple(float(x) for x in b.samples_us),
                detail=str(b.detail or ""),
                eager_us=b.eager_us,
                host_us=b.host_us,
            )
            for b in self._harness_for(workload).measure_baselines()
        ]

    def run(self, workload: Workload, candidate: Candidate, deadline_s: float) -> CandidateOutcome:
        result = self._harness_for(workload).run_candidate(candidate, deadline_s)
        return CandidateOutcome(
            status=result.status,
            samples_us=tuple(float(x) for x in result.samples_us),
            eager_us=result.eager_us,
            host_us=result.host_us,
            max_rel_error=result.max_rel_error,
            error=str(result.error or ""),
            healthy=result.status != "crash",
        )

    def topology(self) -> Topology:
        return detect_topology(self._group)

    def _close_harness(self) -> None:
        if self._harness is not None:
            try:
                self._harness.close()
            except Exception:
                log.exception("closing the harness of %s failed", self._workload)
        self._harness = None
        self._workload = None

    def close(self) -> None:
        self._close_harness()


class CpuRunner(GpuRunner):
    """The MoE harness on gloo ranks on the CPU, wall-clock times (module docstring). Measures the
    MoE kinds only: the dense kinds' kernels need a GPU, and `syncopate tune` refuses a sweep that
    lists them with this runner before anything starts."""

    name = "cpu"
    source = "fixture"
    dist_backend = "gloo"
    cpus_per_rank = 0.0

    def bind_device(self, rank: int, gpu_ids: Sequence[int]) -> DeviceInfo:
        topology = self.spec.topology
        index = int(gpu_ids[0]) if gpu_ids else rank
        return DeviceInfo(
            model=topology.gpu_model if topology is not None else "cpu",
            uuid=f"CPU-{socket.gethostname()}-{index}",
            index=index,
            name="cpu",
        )

    def setup(self, rank: int, world_size: int, group: Any) -> None:
        self._group = group

    def _harness_for(self, workload: Workload | MoeWorkload) -> Any:
        if not isinstance(workload, MoeWorkload):
            raise ConfigError(
                f"runner cpu measures the MoE kinds only (a2a_gemm, gemm_a2a), not {workload.kind}: use runner "
                f"gpu, or cpu-fixture for synthetic times"
            )
        if self._workload != workload:
            from syncopate.measure.moe import MoeHarness

            self._close_harness()
            self._harness = MoeHarness(workload, self._group, self.spec.timing, torch_device("cpu"))
            self._workload = workload
        return self._harness

    def topology(self) -> Topology:
        return Runner.topology(self)


def torch_device(name: str) -> Any:
    import torch

    return torch.device(name)
