"""Values the results-database tests store: environments, topologies, workloads, trials."""

from __future__ import annotations

from syncopate.records import BaselineRecord, Environment, TrialRecord
from syncopate.search_space import Shape, Topology, Workload, space

ENV = Environment(
    syncopate="0.1.0",
    torch="2.11.0",
    triton="3.6.0",
    cuda="13.0",
    nccl="2.28.3",
    driver="580.0",
    gpu_model="H200",
)
OTHER_ENV = Environment(
    syncopate="0.1.0",
    torch="2.10.0",
    triton="3.5.0",
    cuda="12.9",
    nccl="2.27.0",
    driver="575.0",
    gpu_model="H200",
)
TOPO = Topology.from_key("H200x2-nvlink")
OTHER_TOPO = Topology.from_key("H100x8-nvswitch")


def workload(
    m: int = 8192, n: int = 4096, k: int = 8192, kind: str = "ag_gemm", dtype: str = "bf16"
) -> Workload:
    return Workload(kind=kind, shape=Shape(m=m, n=n, k=k), dtype=dtype)


W = workload()
CANDIDATES = space(W, TOPO)[:64]


def trial(
    i: int = 0,
    *,
    w: Workload = W,
    env: Environment = ENV,
    topo: Topology = TOPO,
    status: str = "ok",
    median_us: float | None = None,
    source: str = "measured",
    **extra,
) -> TrialRecord:
    if median_us is None and status == "ok":
        median_us = 1000.0 + i
    return TrialRecord(
        workload=w,
        topology=topo,
        environment=env,
        candidate=CANDIDATES[i],
        status=status,
        source=source,
        median_us=median_us,
        **extra,
    )


def baseline(
    name: str, median_us: float, *, w: Workload = W, env: Environment = ENV, topo: Topology = TOPO
) -> BaselineRecord:
    return BaselineRecord(workload=w, topology=topo, environment=env, name=name, median_us=median_us)
