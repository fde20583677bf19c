"""Topologies: how many GPUs of which model, joined how.

A topology has a canonical key, `{GPU}x{world_size}-{interconnect}` with `-{nodes}n` appended when it
spans several nodes: `H200x2-nvlink`, `H100x8-nvswitch`, `H200x16-nvswitch-2n`. Keys parse back into
the same value. The GPU table below supplies what the search space and the cost model need (SM
count, shared memory per block, memory); :func:`syncopate.platform.detect_topology` reads the real
values off the machine.

Pure Python: nothing here imports torch at import time.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from syncopate.errors import ConfigError

__all__ = ["GpuSpec", "GPUS", "INTERCONNECTS", "Topology", "topology_key"]


@dataclass(frozen=True, kw_only=True, slots=True)
class GpuSpec:
    """Datasheet figures of a GPU model; leads for the cost model, replaced by calibrations."""

    name: str
    """Short model name as used in topology keys (`H200`)."""
    sm_count: int
    """Streaming multiprocessors."""
    memory_gb: float
    """Device memory in GB."""
    smem_per_block_kb: int
    """Largest shared memory one block may opt into, in KiB."""
    bf16_tflops: float
    """Dense bf16 matrix rate, TFLOP/s."""
    hbm_gbps: float
    """Device memory bandwidth, GB/s."""
    arch: int = 0
    """Compute capability as major * 10 + minor (90: Hopper's sm_90); 0 where unknown."""


GPUS: dict[str, GpuSpec] = {
    g.name: g
    for g in (
        GpuSpec(
            name="H200",
            sm_count=132,
            memory_gb=141,
            smem_per_block_kb=227,
            bf16_tflops=989,
            hbm_gbps=4800,
            arch=90,
        ),
        GpuSpec(
            name="H100",
            sm_count=132,
            memory_gb=80,
            smem_per_block_kb=227,
            bf16_tflops=989,
            hbm_gbps=3350,
            arch=90,
        ),
        GpuSpec(
            name="H800",
            sm_count=132,
            memory_gb=80,
            smem_per_block_kb=227,
            bf16_tflops=989,
            hbm_gbps=3350,
            arch=90,
        ),
        GpuSpec(
            name="H20",
            sm_count=78,
            memory_gb=96,
            smem_per_block_kb=227,
            bf16_tflops=148,
            hbm_gbps=4000,
            arch=90,
        ),
        GpuSpec(
            name="B200",
            sm_count=148,
            memory_gb=180,
            smem_per_block_kb=227,
            bf16_tflops=2250,
            hbm_gbps=8000,
            arch=100,
        ),
        GpuSpec(
            name="A100",
            sm_count=108,
            memory_gb=80,
            smem_per_block_kb=163,
            bf16_tflops=312,
            hbm_gbps=2039,
            arch=80,
        ),
        GpuSpec(
            name="L40S",
            sm_count=142,
            memory_gb=48,
            smem_per_block_kb=99,
            bf16_tflops=362,
            hbm_gbps=864,
            arch=89,
        ),
    )
}
"""Known GPU models, by the name used in topology keys."""

INTERCONNECTS: dict[str, float] = {"nvlink": 450.0, "nvswitch": 450.0, "pcie": 50.0}
"""Interconnect classes and their nominal bandwidth per direction per GPU, GB/s (a lead)."""

_KEY = re.compile(r"^(?P<gpu>[A-Za-z0-9]+?)x(?P<ws>\d+)-(?P<ic>[a-z]+)(?:-(?P<nodes>\d+)n)?$")


def topology_key(key: str) -> str:
    """`key` checked as a topology key, GPUxN-INTERCONNECT[-Mn], without asking that its GPU be one
    of :data:`GPUS` (keys of detected GPUs of other models are stored too); its canonical spelling."""
    match = _KEY.match(key.strip()) if isinstance(key, str) else None
    if match is None:
        raise ConfigError(
            f"topology key {key!r} does not parse: expected GPUxN-INTERCONNECT[-Mn] such as "
            f"H200x2-nvlink or H100x16-nvswitch-2n (interconnects: {', '.join(INTERCONNECTS)})"
        )
    if match["ic"] not in INTERCONNECTS:
        raise ConfigError(
            f"unknown interconnect {match['ic']!r} in topology key {key!r}: accepted are "
            f"{', '.join(INTERCONNECTS)}"
        )
    gpu = match["gpu"].upper() if match["gpu"].upper() in GPUS else match["gpu"]
    nodes = int(match["nodes"] or 1)
    return f"{gpu}x{int(match['ws'])}-{match['ic']}" + (f"-{nodes}n" if nodes > 1 else "")


@dataclass(frozen=True, kw_only=True, slots=True)
class Topology:
    """World size, node layout, GPU model and interconnect of a set of GPUs that run one op."""

    world_size: int
    """GPUs taking part in the op (the process group's size)."""
    gpu_model: str
    """GPU model name, a key of :data:`GPUS` or a name read off the device."""
    interconnect: str = "nvlink"
    """`nvlink` (direct links), `nvswitch` or `pcie` within a node."""
    nodes: int = 1
    """Nodes the world spans."""
    sm_count: int = 0
    """SMs per GPU; 0 takes the model's figure from :data:`GPUS`."""
    memory_gb: float = 0.0
    """Memory per GPU in GB; 0 takes the model's figure."""
    link_gbps: float = 0.0
    """Bandwidth per direction per GPU, GB/s; 0 takes the interconnect's nominal figure."""
    gpus_per_node: int = field(init=False)
    """World size over nodes."""

    def __post_init__(self) -> None:
        if (
            isinstance(self.world_size, bool)
            or not isinstance(self.world_size, int)
            or not 1 <= self.world_size <= 4096
        ):
            raise ConfigError(f"topology world_size={self.world_size!r} must be an integer in [1, 4096]")
        if not isinstance(self.nodes, int) or self.nodes < 1 or self.world_size % self.nodes:
            raise ConfigError(
                f"topology nodes={self.nodes!r} must be a positive integer dividing world_size={self.world_size}"
            )
        if self.interconnect not in INTERCONNECTS:
            raise ConfigError(
                f"unknown interconnect {self.interconnect!r}: accepted are {', '.join(INTERCONNECTS)}"
            )
        if not re.fullmatch(r"[A-Za-z0-9]+", self.gpu_model or ""):
            raise ConfigError(f"GPU model {self.gpu_model!r} must be letters and digits, such as H200")
        if (
            isinstance(self.sm_count, bool)
            or not isinstance(self.sm_count, int)
            or not 0 <= self.sm_count <= 1024
        ):
            raise ConfigError(
                f"topology sm_count={self.sm_count!r} must be an integer in [1, 1024] (0: the model's)"
            )
        for name, most in (("memory_gb", 4096.0), ("link_gbps", 100000.0)):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
                or not 0 <= value <= most
            ):
                raise ConfigError(
                    f"topology {name}={value!r} must be a number in (0, {most:g}] (0: the nominal figure)"
                )
        spec = GPUS.get(self.gpu_model)
        if spec is None and (self.sm_count <= 0 or self.memory_gb <= 0):
            raise ConfigError(
                f"unknown GPU model {self.gpu_model!r}: known are {', '.join(GPUS)}; "
                f"for another model give sm_count and memory_gb"
            )
        if self.sm_count <= 0:
            object.__setattr__(self, "sm_count", spec.sm_count)
        if self.memory_gb <= 0:
            object.__setattr__(self, "memory_gb", spec.memory_gb)
        if self.link_gbps <= 0:
            object.__setattr__(self, "link_gbps", INTERCONNECTS[self.interconnect])
        object.__setattr__(self, "gpus_per_node", self.world_size // self.nodes)

    @property
    def spec(self) -> GpuSpec:
        """The GPU's datasheet figures (the table's, or built from the detected values)."""
        known = GPUS.get(self.gpu_model)
        if known is not None:
            return known
        return GpuSpec(
            name=self.gpu_model,
            sm_count=self.sm_count,
            memory_gb=self.memory_gb,
            smem_per_block_kb=99,
            bf16_tflops=100.0,
            hbm_gbps=1000.0,
        )

    def key(self) -> str:
        """Canonical key such as `H200x2-nvlink`."""
        suffix = f"-{self.nodes}n" if self.nodes > 1 else ""
        return f"{self.gpu_model}x{self.world_size}-{self.interconnect}{suffix}"

    @classmethod
    def from_key(cls, key: str) -> Topology:
        """Parse a canonical key back into a topology."""
        match = _KEY.match(key.strip()) if isinstance(key, str) else None
        if match is None:
            raise ConfigError(
                f"topology key {key!r} does not parse: expected GPUxN-INTERCONNECT[-Mn] such as "
                f"H200x2-nvlink or H100x16-nvswitch-2n (interconnects: {', '.join(INTERCONNECTS)})"
            )
        gpu = match["gpu"].upper()
        if gpu not in GPUS:
            raise ConfigError(
                f"topology key {key!r} names unknown GPU {match['gpu']!r}: known are {', '.join(GPUS)}"
            )
        return cls(
            world_size=int(match["ws"]),
            gpu_model=gpu,
            interconnect=match["ic"],
            nodes=int(match["nodes"] or 1),
        )

    @classmethod
    def of(cls, value: Topology | str) -> Topology:
        """A topology from a `Topology` or its key."""
        if isinstance(value, Topology):
            return value
        if isinstance(value, str):
            return cls.from_key(value)
        raise ConfigError(f"topology {value!r} is neither a Topology nor a key such as H200x2-nvlink")

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key(),
            "world_size": self.world_size,
            "gpu_model": self.gpu_model,
            "interconnect": self.interconnect,
            "nodes": self.nodes,
            "gpus_per_node": self.gpus_per_node,
            "sm_count": self.sm_count,
            "memory_gb": self.memory_gb,
            "link_gbps": self.link_gbps,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Topology:
        """A topology from :meth:`to_dict`'s mapping (world_size and gpu_model required)."""
        if not isinstance(d, dict):
            raise ConfigError(f"topology {d!r} must be a mapping with world_size and gpu_model")
        missing = [k for k in ("world_size", "gpu_model") if k not in d]
        if missing:
            raise ConfigError(f"topology {d!r} lacks {' and '.join(missing)}: give world_size and gpu_model")
        return cls(
            world_size=d["world_size"],
            gpu_model=d["gpu_model"],
            interconnect=d.get("interconnect", "nvlink"),
            nodes=d.get("nodes", 1),
            sm_count=d.get("sm_count", 0),
            memory_gb=d.get("memory_gb", 0.0),
            link_gbps=d.get("link_gbps", 0.0),
        )

    def __str__(self) -> str:
        return self.key()
