"""Host time to enqueue one call, by template: the term that makes an eager job's time.

A job that calls the ops eagerly, back to back, waits for whichever is slower per call: the GPU's
work or the host's enqueueing of it; so a call's eager time is about max(device time, host time)
(:func:`eager_us`). Replayed from CUDA graphs, the host is off the path and only the device time
counts. The cost model predicts device time; this module adds the host's, so that the `model`
runner and the lookup's cost-model rung can rank in mode `eager` too.

The figures are leads: host time per call on one H100 host at 8192x11008x4096, GPU kept busy
(DESIGN.md, "What a job saw on H100s"): torch's unfused AG+GEMM 123-153 µs and GEMM+RS 131-139;
Syncopate's Triton templates 208-265; decomposed AG+GEMM 324 (2 ranks) / 401 (4); GEMM+RS
c_stationary 349 / 574, decomposed 426 / 755; torch async-TP's GEMM+RS 520 / 764. Each template
is a fixed cost plus a cost per peer (a copy-engine template enqueues copies and stream waits per
peer), fitted to the two world sizes; a chunked Triton template over the copy engine adds a small
cost per chunk. The GPU harness measures the real figure of every trial (`host_us`, `eager_us`).

Pure Python.
"""

from __future__ import annotations

from syncopate.search_space import (
    A_STATIONARY,
    C_STATIONARY,
    DECOMPOSED,
    UNFUSED,
    Candidate,
    Workload,
)

__all__ = ["BASELINE_HOST_US", "TEMPLATE_HOST_US", "baseline_host_us", "candidate_host_us", "eager_us"]

TEMPLATE_HOST_US: dict[str, tuple[float, float]] = {
    UNFUSED: (130.0, 4.0),
    "triton": (195.0, 0.0),
    A_STATIONARY: (286.0, 38.0),
    f"{DECOMPOSED}/ag_gemm": (286.0, 38.0),
    f"{DECOMPOSED}/reduce": (262.0, 164.0),
    C_STATIONARY: (237.0, 112.0),
}
"""(fixed µs, µs per peer) of one call's host time, by template (`triton`: the fused Triton
templates direct, ring and bidirectional_ring; `decomposed` apart for the all-gather and the
reductions)."""

CHUNK_HOST_US: dict[str, float] = {"copy_engine": 4.0, "nccl": 10.0, "sm_copy": 0.0, "nvshmem": 0.0}
"""Host µs per chunk a fused Triton template enqueues, by backend: a copy and a stream write per
chunk and peer for the copy engine, a collective call per chunk for NCCL, nothing for SM-driven
transfers (`sm_copy`, `nvshmem`: the kernel moves them)."""

BASELINE_HOST_US: dict[str, tuple[float, float]] = {
    "torch_seq": (130.0, 4.0),
    "torch_async_tp": (398.0, 122.0),
    "gemm_alone": (20.0, 0.0),
    "comm_alone": (30.0, 0.0),
    "comm_alone_copy_engine": (30.0, 8.0),
}
"""(fixed µs, µs per peer) of one call of each baseline (torch's fused async-TP op from its
GEMM+RS figures; a lone GEMM or collective: one launch, a lead)."""


def _fit(fixed_per_peer: tuple[float, float], world_size: int) -> float:
    fixed, per_peer = fixed_per_peer
    return fixed + per_peer * max(0, world_size - 1)


def candidate_host_us(workload: Workload, world_size: int, candidate: Candidate) -> float:
    """Host µs to enqueue one call of `candidate` on `workload` over `world_size` ranks (a lead;
    see the module docstring)."""
    ws = world_size
    template = candidate.template
    if template == DECOMPOSED:
        template = f"{DECOMPOSED}/{'ag_gemm' if workload.kind == 'ag_gemm' else 'reduce'}"
    if template in TEMPLATE_HOST_US:
        return _fit(TEMPLATE_HOST_US[template], ws)
    chunks = candidate.num_splits * max(0, ws - 1)
    return _fit(TEMPLATE_HOST_US["triton"], ws) + CHUNK_HOST_US.get(candidate.backend, 0.0) * chunks


def baseline_host_us(name: str, world_size: int) -> float | None:
    """Host µs to enqueue one call of baseline `name` over `world_size` ranks (None for a baseline
    without a lead)."""
    found = BASELINE_HOST_US.get(name)
    return None if found is None else _fit(found, world_size)


def eager_us(device_us: float, host_us: float) -> float:
    """A call's time back to back with the host on the path: the slower of the two."""
    return max(device_us, host_us)
