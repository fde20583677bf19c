"""The small grids of candidates `syncopate bench` measures per workload, and the `seeded` strategy
starts from: a few tile configurations, splits and comm SMs per backend, and the cuBLAS templates."""

from __future__ import annotations

import dataclasses
import itertools

from syncopate.search_space.candidate import Candidate
from syncopate.search_space.space import (
    FP8_TEMPLATES,
    NCCL_MIN_SMS,
    STATIONARY_MIN_ROWS,
    a_stationary_candidate,
    c_stationary_candidate,
    check_candidate,
    decomposed_candidate,
    decomposed_offered,
    gluon_refusal,
    guard_candidates,
)
from syncopate.search_space.topology import Topology
from syncopate.search_space.workload import Workload

__all__ = ["GRIDS", "bench_grid"]

GRIDS: tuple[str, ...] = ("small", "tiny")
"""The grids by name: `small` (1-8 splits, two tile configurations) and `tiny` (the part of it that
won the LLaMA suites, plus the cuBLAS templates: what `seeded` searches first; its second tile
configuration too where the first's tiles fill fewer than two waves of the GPU's SMs)."""


def bench_grid(workload: Workload, topology: Topology, grid: str, backends) -> list[Candidate]:
    """The candidates `syncopate bench` tries per workload: the guards first (the untuned default
    and `unfused`, which a served configuration must beat: `guard_candidates`), then a small grid
    per backend, each fused one also in the Gluon kernels where they run it (for `fp8`, FP8 tiles
    and the templates of FP8_TEMPLATES only)."""
    ws = topology.world_size
    templates = ["direct"] if ws <= 2 else ["direct", "ring"]
    splits = [1, 2, 4, 8] if grid != "tiny" else [2, 4]
    if grid == "tiny" and workload.kind == "ag_gemm" and ws >= 4:
        # With four ranks and more, one chunk a rank is already a pipeline (ws - 1 transfers to
        # overlap): the all-gather tries it too (results/llama_tp4-sweep.db has the comparison).
        splits = [1, *splits]
    wide, narrow = (128, 256, 64, 8, 3), (128, 128, 64, 8, 4)
    if workload.scaled:  # FP8 tiles step twice as deep in K (FP8_TILE_CONFIGS)
        wide, narrow = (128, 256, 128, 8, 3), (128, 128, 128, 4, 4)
    tiles = [wide, narrow] if grid != "tiny" else [wide]
    if grid == "tiny" and _tile_waves(workload, topology, 128, 256) < 2:
        # so few 128x256 tiles that SMs sit idle (few tokens, many ranks): the narrower tile too
        tiles.append(narrow)
    comm = {"copy_engine": [0], "sm_copy": [32, 64], "nvshmem": [16, 32], "nccl": [NCCL_MIN_SMS]}
    # Producers also try kept chunks interleaved with the sent ones (an all-reduce then gathers
    # reduced chunks while the GEMM runs); check_candidate keeps it to the direct plan.
    orders = ["arrival"] if workload.kind == "ag_gemm" else ["arrival", "kept_interleaved"]
    out = []
    for backend, template, s, (bm, bn, bk, w, st), order in itertools.product(
        backends, templates, splits, tiles, orders
    ):
        for sms in comm[backend]:
            c = Candidate(
                backend=backend,
                template=template,
                num_splits=s,
                tile_order=order,
                comm_sms=sms,
                block_m=bm,
                block_n=bn,
                block_k=bk,
                group_m=8,
                num_warps=w,
                num_stages=st,
            )
            try:
                check_candidate(c, workload, topology)
            except Exception:
                continue
            if workload.shape.m // ws // s < bm:
                continue
            out.append(c)
            if gluon_refusal(c, workload, topology) is None:  # the same tiles in the Gluon kernels
                out.append(dataclasses.replace(c, kernel="gluon"))
    if workload.kind == "ag_gemm" and "copy_engine" in backends:  # B and the products moved instead of A
        out += [
            a_stationary_candidate(s) for s in (1, 2) if workload.shape.m // ws // s >= STATIONARY_MIN_ROWS
        ]
    if workload.kind == "gemm_rs" and "copy_engine" in backends:  # A's rows and B moved instead of partials
        out.append(c_stationary_candidate())
    if workload.kind == "gemm_ar" and "copy_engine" in backends:
        out += [
            c_stationary_candidate(s) for s in (2, 4) if workload.shape.m // ws // s >= STATIONARY_MIN_ROWS
        ]
    # cuBLAS GEMMs: a reduction's row chunks pushed once computed, an all-gather's shards as they land
    if "copy_engine" in backends and (workload.kind != "ag_gemm" or ws > 1):
        tried = (2, 4, 8) if workload.kind != "ag_gemm" else sorted({1, 2, 4, ws - 1, 2 * (ws - 1)})
        out += [
            decomposed_candidate(s)
            for s in tried
            if decomposed_offered(workload.kind, ws, workload.shape.m // ws, s)
        ]
    if workload.scaled:  # fp8 runs on the fused and the scaled-GEMM templates only
        out = [c for c in out if c.template in FP8_TEMPLATES]
    guards = list(dict.fromkeys(guard_candidates(workload, topology).values()))  # fp8's default is unfused
    return guards + [c for c in out if c not in guards]


def _tile_waves(workload: Workload, topology: Topology, block_m: int, block_n: int) -> float:
    """Waves of the GPU's SMs a rank's fused GEMM fills with block_m x block_n output tiles: its
    output is [M, N / ws] for an all-gather's GEMM, [M, N] (the partial sums) for a reduction's."""
    shape = workload.shape
    cols = shape.n // topology.world_size if workload.kind == "ag_gemm" else shape.n
    tiles = -(-shape.m // block_m) * -(-cols // block_n)
    return tiles / topology.spec.sm_count
