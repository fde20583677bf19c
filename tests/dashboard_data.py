"""A small results database for the dashboard tests, with known answers.

| sweep | name | topology | environment | what |
|---|---|---|---|---|
| 1 | llama | H200x2-nvlink | ENV (torch 2.11) | W1: 3 ok + 3 failed measured, 1 predicted; |
| | | | | W2: 2 ok; W3 (fp16): 1 ok, no baselines |
| 2 | llama-upgrade | H200x2-nvlink | OTHER_ENV (torch 2.12) | W1: ok 420 (slower than 400); |
| | | | | W2: ok 320 (faster than 330) |
| 3 | h100 | H100x8-nvswitch | ENV | W2: two crashes, nothing ok |

Sweep 1's W1 baselines give speedups 600/400 = 1.5 over torch_seq and 480/400 = 1.2 over async-TP,
and the bound max(300, min(350, 250)) = 300, so 0.75 of the bound.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

from syncopate.records import BaselineRecord, Environment, TrialRecord
from syncopate.results_db import ResultsDB
from syncopate.search_space import Candidate, Shape, Topology, Workload

ENV = Environment(
    syncopate="0.1.0",
    torch="2.11.0+cu130",
    triton="3.6.0",
    cuda="13.0",
    nccl="2.28.3",
    driver="580.159.04",
    gpu_model="H200",
)
OTHER_ENV = Environment(
    syncopate="0.1.0",
    torch="2.12.0+cu130",
    triton="3.7.0",
    cuda="13.0",
    nccl="2.28.3",
    driver="580.159.04",
    gpu_model="H200",
)
TOPO = Topology.from_key("H200x2-nvlink")
H100 = Topology.from_key("H100x8-nvswitch")
W1 = Workload(kind="ag_gemm", shape=Shape(m=8192, n=2048, k=8192), dtype="bf16")
W2 = Workload(kind="gemm_rs", shape=Shape(m=8192, n=8192, k=2048), dtype="bf16")
W3 = Workload(kind="ag_gemm", shape=Shape(m=8192, n=4096, k=8192), dtype="fp16")
T0 = datetime(2026, 11, 22, 8, 0, tzinfo=timezone.utc)

CE2 = Candidate(backend="copy_engine", num_splits=2, tile_order="arrival")
CE4 = Candidate(backend="copy_engine", num_splits=4, tile_order="swizzle")
SM2 = Candidate(backend="sm_copy", num_splits=2, comm_sms=32, tile_order="arrival")
SM4 = Candidate(backend="sm_copy", num_splits=4, comm_sms=32, tile_order="swizzle")
NC2 = Candidate(backend="nccl", num_splits=2, comm_sms=64, tile_order="row_major")
NC4 = Candidate(backend="nccl", num_splits=4, comm_sms=64, tile_order="arrival")
CE8 = Candidate(backend="copy_engine", num_splits=8, tile_order="arrival_colmajor")

OOM_ERROR = "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
COMPILE_ERROR = "CompilationError: at 12:4: out of resources: shared memory, required 262144"


def _trial(
    w: Workload,
    c: Candidate,
    status: str = "ok",
    median: float | None = None,
    *,
    env: Environment = ENV,
    topo: Topology = TOPO,
    source: str = "measured",
    strategy: str = "random",
    error: str = "",
    minute: int = 0,
) -> TrialRecord:
    return TrialRecord(
        workload=w,
        topology=topo,
        environment=env,
        candidate=c,
        status=status,
        source=source,
        median_us=median,
        p20_us=None if median is None else median * 0.99,
        p80_us=None if median is None else median * 1.02,
        error=error,
        strategy=strategy,
        created_at=T0 + timedelta(minutes=minute),
    )


def _baselines(
    db: ResultsDB, sweep: int, w: Workload, env: Environment, topo: Topology, **times: float
) -> None:
    for name, us in times.items():
        db.record_baseline(
            sweep, BaselineRecord(workload=w, topology=topo, environment=env, name=name, median_us=us)
        )


def build(path: Path) -> str:
    """Write the fixture database as the SQLite file `path`; its URL."""
    return fill(f"sqlite:///{path}")


def fill(url: str) -> str:
    """Create the schema at `url` (an empty database) and store the fixture rows; the URL."""
    with ResultsDB.open(url, upgrade=True) as db:
        s1 = db.start_sweep("llama", {"workloads": 3}, host="gpu-a", started_at=T0)
        db.record_trials(
            s1,
            [
                _trial(W1, CE4, median=500.0, strategy="grid", minute=1),
                _trial(W1, CE2, median=400.0, strategy="grid", minute=2),
                _trial(W1, SM2, "oom", error=OOM_ERROR, strategy="grid", minute=3),
                _trial(W1, NC2, median=450.0, minute=4),
                _trial(W1, NC4, "oom", error=OOM_ERROR, minute=5),
                _trial(W1, CE8, "compile_error", error=COMPILE_ERROR, minute=6),
                _trial(W1, SM4, median=350.0, source="predicted", strategy="cost_model", minute=7),
                _trial(W2, CE2, median=340.0, minute=8),
                _trial(W2, CE4, median=330.0, minute=9),
                _trial(W3, CE2, median=800.0, minute=10),
            ],
        )
        _baselines(
            db,
            s1,
            W1,
            ENV,
            TOPO,
            torch_seq=600.0,
            torch_async_tp=480.0,
            gemm_alone=300.0,
            comm_alone=350.0,
            comm_alone_copy_engine=250.0,
        )
        _baselines(
            db,
            s1,
            W2,
            ENV,
            TOPO,
            torch_seq=532.0,
            torch_async_tp=470.4,
            gemm_alone=200.1,
            comm_alone=333.2,
            comm_alone_copy_engine=208.0,
        )
        db.finish_sweep(s1, "done", finished_at=T0 + timedelta(minutes=10))

        s2 = db.start_sweep("llama-upgrade", {}, host="gpu-b", started_at=T0 + timedelta(days=1))
        db.record_trials(
            s2,
            [
                _trial(W1, CE2, median=420.0, env=OTHER_ENV, minute=24 * 60 + 1),
                _trial(W2, CE4, median=320.0, env=OTHER_ENV, minute=24 * 60 + 2),
            ],
        )
        _baselines(db, s2, W1, OTHER_ENV, TOPO, torch_seq=610.0)
        db.finish_sweep(s2, "done", finished_at=T0 + timedelta(days=1, minutes=5))

        s3 = db.start_sweep("h100", {}, host="gpu-c", started_at=T0 + timedelta(days=2))
        db.record_trials(
            s3,
            [
                _trial(W2, CE2, "crash", error="illegal memory access", topo=H100, minute=48 * 60 + 1),
                _trial(W2, CE4, "crash", error="illegal memory access", topo=H100, minute=48 * 60 + 2),
            ],
        )
        db.finish_sweep(s3, "failed", finished_at=T0 + timedelta(days=2, minutes=3))
    return url


def build_empty(path: Path) -> str:
    """A database with the schema and nothing in it; its URL."""
    url = f"sqlite:///{path}"
    with ResultsDB.open(url, upgrade=True):
        pass
    return url
