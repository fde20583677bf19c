"""The search space of a workload on a topology: valid candidates, enumerated or as distributions.

Constraints are solved before anything is sampled: the dims the kind shards divide by the world
size, chunks are at least one tile tall (for one candidate: its blocks can be cut into chunks at
tile boundaries, as the plan cuts them), the tile configuration fits the GPU's shared memory and
register file, communication leaves SMs for the GEMM, and no tile order can deadlock the call
(:mod:`syncopate.search_space.liveness` models one call; tests/test_liveness.py runs it over the
space's kinds, templates, splits, orders, world sizes, shapes, grids and backends).
`check_candidate` applies the same rules to one candidate and says which one fails.

Pure Python: Optuna is imported only by :func:`optuna_distributions`.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from dataclasses import dataclass, field, fields
from typing import Any

from syncopate.errors import ConfigError
from syncopate.search_space.candidate import (
    BACKENDS,
    DEFAULT_BACKENDS,
    KERNELS,
    Candidate,
    check_pow2,
    gluon_refusal_of,
    unknown_backend,
)
from syncopate.search_space.chunk_plan import (
    A_STATIONARY,
    C_STATIONARY,
    CANDIDATE_TEMPLATES,
    COPY_ENGINE_KINDS,
    DECOMPOSED,
    PLANLESS_KINDS,
    UNFUSED,
    block_bounds,
    chunk_bounds,
    gather_parts,
    gather_splits_refusal,
    gather_takes,
)
from syncopate.search_space.chunk_plan import (
    TEMPLATES as PLAN_TEMPLATES,
)
from syncopate.search_space.moe_workload import MoeWorkload, moe_guards
from syncopate.search_space.tile_order import CONSUMER_ORDERS, PRODUCER_ORDERS
from syncopate.search_space.topology import Topology
from syncopate.search_space.workload import Workload

__all__ = [
    "TileConfig",
    "TILE_CONFIGS",
    "SpaceOptions",
    "space",
    "space_size",
    "check_candidate",
    "optuna_distributions",
    "candidate_from_params",
    "default_candidate",
    "SHORT_TILES",
    "MIN_CHUNK_BYTES",
    "MAX_DEFAULT_CHUNKS",
    "a_stationary_candidate",
    "c_stationary_candidate",
    "decomposed_candidate",
    "decomposed_offered",
    "decomposed_splits",
    "tile_orders_for",
    "NCCL_MIN_SMS",
    "FP8_TEMPLATES",
    "FP8_GATHER_BACKENDS",
    "FP8_TILE_CONFIGS",
    "gluon_refusal",
]

FP8_TEMPLATES: tuple[str, ...] = (*PLAN_TEMPLATES, DECOMPOSED, UNFUSED)
"""The templates that run an `fp8` workload: the fused Triton kernels (FP8 tiles, each tile's sum
scaled as `torch._scaled_mm` scales it) and the cuBLAS templates whose GEMMs are `torch._scaled_mm`
calls. The stationary templates take 16- and 32-bit operands only."""

FP8_GATHER_BACKENDS: tuple[str, ...] = ("copy_engine",)
"""The backends that move an FP8 all-gather's rows in the fused templates: each chunk's scale rows
go beside its rows, before its word is raised (a reduction moves bf16 partials, on every backend)."""

NCCL_MIN_SMS = 64
"""SMs the fused kernel leaves free for NCCL. NCCL's kernels need SMs of their own while the fused
kernel's programs wait for the chunks they bring; with fewer free SMs they wait for SMs those
programs hold, and the call times out or hangs."""


MAX_COMM_SMS = 128
"""The most SMs a candidate may give to communication."""


@dataclass(frozen=True, slots=True)
class TileConfig:
    """BLOCK_M × BLOCK_N × BLOCK_K with its warps and pipeline depth."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n", "block_k", "num_warps"):
            check_pow2(name, getattr(self, name), f"tile config {self.key()}: {name}")
        if (
            isinstance(self.num_stages, bool)
            or not isinstance(self.num_stages, int)
            or not 1 <= self.num_stages <= 8
        ):
            raise ConfigError(
                f"tile config {self.key()}: num_stages={self.num_stages!r} must be an integer in [1, 8]"
            )

    def key(self) -> str:
        return f"{self.block_m}x{self.block_n}x{self.block_k}w{self.num_warps}s{self.num_stages}"

    @classmethod
    def from_key(cls, key: str) -> TileConfig:
        try:
            dims, rest = key.split("w")
            warps, stages = rest.split("s")
            bm, bn, bk = (int(x) for x in dims.split("x"))
            warps, stages = int(warps), int(stages)
        except ValueError:
            raise ConfigError(
                f"tile config {key!r} does not parse: expected BMxBNxBKwWARPSsSTAGES such as 128x256x64w8s3"
            ) from None
        return cls(bm, bn, bk, warps, stages)

    @classmethod
    def of(cls, c: Candidate) -> TileConfig:
        return cls(c.block_m, c.block_n, c.block_k, c.num_warps, c.num_stages)


TILE_CONFIGS: tuple[TileConfig, ...] = (
    TileConfig(128, 256, 64, 8, 3),
    TileConfig(128, 256, 64, 8, 4),
    TileConfig(256, 128, 64, 8, 3),
    TileConfig(128, 128, 64, 8, 4),
    TileConfig(128, 128, 64, 4, 4),
    TileConfig(128, 128, 64, 8, 5),
    TileConfig(128, 128, 128, 8, 3),
    TileConfig(128, 64, 64, 4, 4),
    TileConfig(64, 128, 64, 4, 4),
)
"""Tile configurations searched by default: shapes that keep Hopper's tensor cores busy."""

FP8_TILE_CONFIGS: tuple[TileConfig, ...] = (
    TileConfig(128, 256, 128, 8, 3),
    TileConfig(256, 128, 128, 8, 3),
    TileConfig(128, 128, 128, 4, 4),
    TileConfig(128, 128, 128, 8, 4),
    TileConfig(128, 256, 64, 8, 5),
    TileConfig(128, 128, 256, 8, 3),
    TileConfig(128, 64, 128, 4, 4),
    TileConfig(64, 128, 128, 4, 4),
)
"""Tile configurations an `fp8` workload searches where `space.tile_configs` is left at its default:
a K step of twice the bf16 tiles' elements (the same bytes; Hopper's FP8 MMA steps 32 deep)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SpaceOptions:
    """Restrictions of the search space (the `space:` section of a sweep config)."""

    backends: tuple[str, ...] = DEFAULT_BACKENDS
    """Backends to search (`nvshmem` only where named: its tuner workers must run with NVSHMEM
    symmetric memory, where torch async-TP, a baseline, does not run)."""
    templates: tuple[str, ...] = CANDIDATE_TEMPLATES
    """Plan templates to search (`ring` is the same plan as `direct` on two GPUs and is skipped there;
    `a_stationary` only for ag_gemm over the copy engine; `unfused`, one candidate a workload, whatever
    the backends)."""
    num_splits: tuple[int, ...] = (1, 2, 4, 8)
    """Chunks per block (for the decomposed all-gather, the values it cannot take rounded down to
    one it can: :func:`decomposed_splits`)."""
    tile_orders: tuple[str, ...] = ("arrival", "arrival_colmajor", "swizzle", "row_major")
    """Tile orders (those that fit the kind's role are kept; `kept_interleaved` is opt-in)."""
    comm_sms: dict[str, tuple[int, ...]] = field(
        default_factory=lambda: {
            "copy_engine": (0,),
            "sm_copy": (16, 32, 64),
            "nvshmem": (16, 32, 64),
            "nccl": (NCCL_MIN_SMS,),
        }
    )
    """SMs given to communication, per backend."""
    tile_configs: tuple[TileConfig, ...] = TILE_CONFIGS
    """Tile configurations."""
    group_m: tuple[int, ...] = (4, 8)
    """GROUP_M values for the swizzled orders (the others use 1)."""
    kernels: tuple[str, ...] = KERNELS
    """Kernel code of the fused candidates (`gluon` only where :func:`gluon_refusal` has nothing
    against it: on Hopper, 16-bit operands, a tile the Gluon kernels take)."""

    def __post_init__(self) -> None:
        if not self.kernels or any(k not in KERNELS for k in self.kernels):
            raise ConfigError(
                f"space.kernels={list(self.kernels)!r}: give one or more of {', '.join(KERNELS)}"
            )
        for b in self.backends:
            if b not in BACKENDS:
                raise ConfigError(unknown_backend(b, " in space.backends"))
        for t in self.templates:
            if t not in CANDIDATE_TEMPLATES:
                raise ConfigError(
                    f"unknown plan template {t!r} in space.templates: accepted are "
                    f"{', '.join(CANDIDATE_TEMPLATES)}"
                )
        known_orders = set(CONSUMER_ORDERS) | set(PRODUCER_ORDERS)
        for o in self.tile_orders:
            if o not in known_orders:
                raise ConfigError(
                    f"unknown tile order {o!r} in space.tile_orders: accepted are {', '.join(sorted(known_orders))}"
                )
        for n in self.num_splits:
            if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 64:
                raise ConfigError(f"space.num_splits value {n!r} must be an integer in [1, 64]")
        for b, counts in self.comm_sms.items():
            if b not in BACKENDS:
                raise ConfigError(unknown_backend(b, " in space.comm_sms"))
            for n in counts:
                if isinstance(n, bool) or not isinstance(n, int):
                    raise ConfigError(f"space.comm_sms.{b} value {n!r} must be an integer")
                if b == "copy_engine" and n != 0:
                    raise ConfigError(
                        f"space.comm_sms.copy_engine value {n} must be 0: the copy engine spends no SM"
                    )
                if b != "copy_engine" and not 1 <= n <= MAX_COMM_SMS:
                    raise ConfigError(
                        f"space.comm_sms.{b} value {n} must be an SM count in [1, {MAX_COMM_SMS}]"
                    )
        for g in self.group_m:
            check_pow2("group_m", g, "space.group_m")
        if not self.tile_configs:
            raise ConfigError("space.tile_configs is empty: give at least one tile configuration")


def tile_orders_for(kind: str) -> tuple[str, ...]:
    """Tile orders that make sense for the kind's role (consumer for ag_gemm, producer otherwise)."""
    return CONSUMER_ORDERS if kind == "ag_gemm" else PRODUCER_ORDERS


def _smem_bytes(tc: TileConfig, elem: int, out_elem: int) -> int:
    """Shared memory of a fused kernel's tile: its operand pipeline (`elem` bytes an element) and
    its output tile (`out_elem` bytes an element)."""
    pipeline = tc.num_stages * (tc.block_m + tc.block_n) * tc.block_k * elem
    epilogue = tc.block_m * tc.block_n * out_elem
    return pipeline + epilogue


def _fp8_gather_refusal(workload: Workload, template: str, backend: str) -> str | None:
    """Why a fused template cannot gather `workload`'s FP8 rows on `backend` (None where it can, or
    where the workload is no FP8 all-gather): only FP8_GATHER_BACKENDS move their row scales."""
    if not workload.scaled or workload.kind != "ag_gemm" or template not in PLAN_TEMPLATES:
        return None
    if backend in FP8_GATHER_BACKENDS:
        return None
    return (
        f"backend {backend!r} does not move an fp8 all-gather's row scales in template {template!r}: "
        f"accepted are {', '.join(FP8_GATHER_BACKENDS)} (or template decomposed or unfused)"
    )


def _rows_per_block(workload: Workload, world_size: int) -> int:
    """The smallest block of the communicated tensor (rows per rank)."""
    return min(
        hi - lo for lo, hi in (block_bounds(workload.shape.m, world_size, b) for b in range(world_size))
    )


_ROW_ORDERS = ("row_major", "swizzle")


def _deadlocking_order(kind: str, order: str, world_size: int, backend: str) -> str | None:
    """Why `order` can deadlock a `kind` call here (None: it cannot).

    A producer order that ignores when chunks leave puts the rows a rank keeps among the rows it
    sends, so a program waits for partials while later entries of it hold chunks that peers wait
    for. On two ranks with queues that send each chunk once it is ready the peer finishes first and
    it ends (tests/test_liveness.py checks every grid); with more ranks a rank's in-order send queue
    waits for a chunk such a program holds, and NCCL pairs each send with the receive of the same
    step, so the receive waits for the send.
    """
    if kind == "ag_gemm" or order not in _ROW_ORDERS or (world_size == 2 and backend != "nccl"):
        return None
    why = f"world size {world_size}" if world_size != 2 else "backend nccl pairs each send with a receive"
    return (
        f"tile order {order!r} can deadlock {kind} ({why}): a program waits for partials while it "
        f"holds rows a peer waits for; accepted for {kind} are 'arrival' and 'arrival_colmajor' (and "
        f"'kept_interleaved' on direct plans), and "
        f"{' and '.join(repr(o) for o in _ROW_ORDERS)} only on two ranks with backend copy_engine, sm_copy or nvshmem"
    )


def a_stationary_candidate(num_splits: int) -> Candidate:
    """The all-gather matmul that moves B and the products instead of A (:data:`A_STATIONARY`),
    each product sent in `num_splits` row chunks. Its GEMMs are cuBLAS's: the tile fields keep
    :class:`Candidate`'s defaults."""
    return Candidate(
        backend="copy_engine", template=A_STATIONARY, num_splits=num_splits, tile_order="arrival"
    )


def c_stationary_candidate(num_splits: int = 1) -> Candidate:
    """The matmul reduce-scatter or all-reduce that moves A's rows and B instead of partial
    products (:data:`C_STATIONARY`); an all-reduce gathers the blocks in `num_splits` chunks each (a
    reduce-scatter takes 1). Its GEMMs are cuBLAS's: the other fields keep :class:`Candidate`'s
    defaults."""
    return Candidate(
        backend="copy_engine", template=C_STATIONARY, num_splits=num_splits, tile_order="arrival"
    )


def decomposed_candidate(num_splits: int = 2) -> Candidate:
    """The op cut into cuBLAS GEMMs over row pieces (:data:`DECOMPOSED`): a reduction's blocks in
    `num_splits` row chunks, each partial pushed by the copy engine once computed; an all-gather's
    peers' rows in `num_splits` GEMMs as their shards land. The other fields keep
    :class:`Candidate`'s defaults."""
    return Candidate(backend="copy_engine", template=DECOMPOSED, num_splits=num_splits, tile_order="arrival")


def unfused_candidate() -> Candidate:
    """The matmul and the group's whole collective in sequence (:data:`UNFUSED`); the other fields
    keep :class:`Candidate`'s defaults."""
    return Candidate(backend="nccl", template=UNFUSED, num_splits=1, tile_order="arrival", comm_sms=0)


STATIONARY_MIN_ROWS = 128
"""Fewest rows of an a_stationary product chunk, of a c_stationary rank's block or of a decomposed
chunk the space offers (a GEMM of fewer rows leaves most SMs idle)."""


def decomposed_splits(kind: str, world_size: int, wanted) -> list[int]:
    """The splits the space tries template `decomposed` with, from the space's `num_splits`: those
    values for a reduction; for an all-gather, each value it cannot take (more than ws-1 and not a
    multiple of ws-1) rounded down to a multiple of ws-1, so that (1, 2, 4, 8) on four ranks tries
    1, 2, 3 (a GEMM as each shard lands) and 6 (each shard in two parts): rounding keeps the finer
    cuts the space asked for, rather than dropping them."""
    peers = world_size - 1
    out: list[int] = []
    for s in wanted:
        if kind == "ag_gemm" and s >= 1 and not gather_takes(world_size, s):
            s = s // peers * peers
        if s not in out:
            out.append(s)
    return out


def decomposed_offered(kind: str, world_size: int, rows: int, splits: int) -> bool:
    """Whether the space (and `syncopate bench`'s grids) offer template `decomposed` with `splits`
    for blocks of `rows` rows: chunks of a reduction's block, or parts of an all-gather's shard, of
    STATIONARY_MIN_ROWS rows or more, with splits the all-gather takes on that many ranks."""
    if kind != "ag_gemm":
        return rows // splits >= STATIONARY_MIN_ROWS
    return (
        gather_splits_refusal(world_size, splits, rows) is None
        and rows // gather_parts(world_size, splits) >= STATIONARY_MIN_ROWS
    )


def _check_planless(c: Candidate, workload: Workload) -> None:
    kinds = PLANLESS_KINDS[c.template]
    if workload.kind not in kinds:
        raise ConfigError(f"template {c.template} is for {' and '.join(kinds)}, not {workload.kind}")
    if c.template in COPY_ENGINE_KINDS and c.backend != "copy_engine":
        raise ConfigError(f"template {c.template} moves its data with the copy engine, not {c.backend}")
    if c.template == UNFUSED:
        ref = unfused_candidate()
    elif c.template == A_STATIONARY:
        ref = a_stationary_candidate(c.num_splits)
    elif c.template == DECOMPOSED:
        ref = decomposed_candidate(c.num_splits)
    else:
        ref = c_stationary_candidate(c.num_splits if workload.kind == "gemm_ar" else 1)
    off = [
        f"{f.name}={getattr(c, f.name)!r}"
        for f in fields(Candidate)
        if getattr(c, f.name) != getattr(ref, f.name)
    ]
    if off:
        raise ConfigError(
            f"template {c.template} runs cuBLAS GEMMs: its fields keep {ref.to_dict()}; got {', '.join(off)}"
        )


def gluon_refusal(c: Candidate, workload: Workload, topology: Topology) -> str | None:
    """Why the Gluon kernels cannot run candidate `c`'s tiles on this workload and topology (None
    where they can): they are Hopper code (sm_90), take 16-bit operands (and FP8 in the reductions'
    kernel) and a tile their wgmma
    layout takes, and fill num_stages - 1 K steps ahead (their shared memory, the operand buffers
    and the output tile, is what :func:`check_candidate` allows every fused candidate)."""
    return _gluon_refusal(TileConfig.of(c), workload, topology)


@functools.lru_cache(maxsize=4096)
def _gluon_refusal(tc: TileConfig, workload: Workload, topology: Topology) -> str | None:
    if topology.spec.arch != 90:
        return f"the Gluon kernels run on Hopper GPUs (sm_90), not on {topology.gpu_model}"
    if workload.scaled and workload.kind == "ag_gemm":
        return "the Gluon all-gather kernel takes bf16 and fp16 operands, not fp8 (its gemm_rs and gemm_ar kernel does)"
    if not workload.scaled and workload.element_bytes != 2:
        return f"the Gluon kernels take bf16, fp16 and fp8 operands, not {workload.dtype}"
    k = workload.local_gemm(topology.world_size)[2]
    return gluon_refusal_of(tc.block_m, tc.block_k, tc.num_warps, tc.num_stages, k, workload.element_bytes)


def check_candidate(candidate: Candidate, workload: Workload, topology: Topology) -> None:
    """Raise ConfigError naming the first rule `candidate` breaks for this workload and topology."""
    ws = topology.world_size
    workload.check_world_size(ws)
    c = candidate
    rows = _rows_per_block(workload, ws)
    if workload.scaled and c.template not in FP8_TEMPLATES:
        raise ConfigError(
            f"template {c.template!r} does not run fp8 operands (its cuBLAS GEMMs take bf16, fp16 and fp32); "
            f"fp8 runs on templates {', '.join(FP8_TEMPLATES)}"
        )
    refusal = _fp8_gather_refusal(workload, c.template, c.backend)
    if refusal:
        raise ConfigError(refusal)
    if c.template in PLANLESS_KINDS:
        _check_planless(c, workload)
        if c.num_splits > rows:
            raise ConfigError(f"num_splits={c.num_splits} exceeds the {rows} rows each rank's block has")
        refusal = (
            c.template == DECOMPOSED
            and workload.kind == "ag_gemm"
            and gather_splits_refusal(ws, c.num_splits, rows)
        )
        if refusal:
            raise ConfigError(refusal)
        return
    if c.num_splits > rows:
        raise ConfigError(f"num_splits={c.num_splits} exceeds the {rows} rows each rank's block has")
    try:
        chunk_bounds(workload.shape.m, ws, c.num_splits, c.block_m)
    except ConfigError as e:
        raise ConfigError(f"chunks are cut at multiples of block_m={c.block_m} rows: {e}") from None
    tc = TileConfig.of(c)
    smem = _smem_bytes(tc, workload.element_bytes, workload.output_bytes)
    limit = topology.spec.smem_per_block_kb * 1024
    if smem > limit:
        raise ConfigError(
            f"tile {tc.key()} needs {smem // 1024} KiB of shared memory in {workload.dtype}; "
            f"{topology.gpu_model} allows {limit // 1024} KiB per block"
        )
    acc_regs = c.block_m * c.block_n // (c.num_warps * 32)
    if acc_regs > 128:
        raise ConfigError(
            f"tile {c.block_m}x{c.block_n} with {c.num_warps} warps keeps {acc_regs} accumulator registers "
            f"per thread; at most 128 fit beside the rest"
        )
    if c.backend == "nccl" and c.comm_sms < NCCL_MIN_SMS:
        raise ConfigError(
            f"backend nccl needs comm_sms >= {NCCL_MIN_SMS}, got {c.comm_sms}: with fewer free SMs NCCL's kernels "
            f"cannot all run beside the fused kernel's waiting programs"
        )
    if c.comm_sms > topology.sm_count // 2:
        raise ConfigError(
            f"comm_sms={c.comm_sms} leaves too few of {topology.sm_count} SMs for the GEMM: "
            f"use at most {topology.sm_count // 2}"
        )
    if c.tile_order not in tile_orders_for(workload.kind):
        raise ConfigError(
            f"tile order {c.tile_order!r} does not fit {workload.kind}: accepted are "
            f"{', '.join(tile_orders_for(workload.kind))}"
        )
    if c.tile_order == "kept_interleaved" and c.template != "direct":
        raise ConfigError(f"tile order 'kept_interleaved' needs template 'direct', not {c.template!r}")
    refusal = _deadlocking_order(workload.kind, c.tile_order, ws, c.backend)
    if refusal:
        raise ConfigError(refusal)
    if c.kernel == "gluon":
        refusal = gluon_refusal(c, workload, topology)
        if refusal:
            raise ConfigError(f"kernel 'gluon': {refusal}; kernel 'triton' runs everywhere")


def _templates_for(options: SpaceOptions, world_size: int) -> list[str]:
    out = list(options.templates)
    if world_size <= 2 and "ring" in out and "direct" in out:
        out.remove("ring")
    return out


def _iter_space(workload: Workload, topology: Topology, options: SpaceOptions):
    ws = topology.world_size
    workload.check_world_size(ws)
    rows = _rows_per_block(workload, ws)
    orders = [o for o in options.tile_orders if o in tile_orders_for(workload.kind)]
    limit = topology.spec.smem_per_block_kb * 1024
    given = options.tile_configs
    if workload.scaled and given == TILE_CONFIGS:
        given = FP8_TILE_CONFIGS
    tile_configs = [
        tc
        for tc in given
        if _smem_bytes(tc, workload.element_bytes, workload.output_bytes) <= limit
        and tc.block_m * tc.block_n // (tc.num_warps * 32) <= 128
    ]
    stationary = not workload.scaled  # the stationary templates' GEMMs take no FP8
    if (
        stationary
        and A_STATIONARY in options.templates
        and workload.kind == "ag_gemm"
        and "copy_engine" in options.backends
    ):
        for splits in options.num_splits:
            if rows // splits >= STATIONARY_MIN_ROWS:
                yield a_stationary_candidate(splits)
    if (
        stationary
        and C_STATIONARY in options.templates
        and workload.kind != "ag_gemm"
        and "copy_engine" in options.backends
    ):
        for splits in options.num_splits if workload.kind == "gemm_ar" else (1,):
            if rows // splits >= STATIONARY_MIN_ROWS:
                yield c_stationary_candidate(splits)
    if DECOMPOSED in options.templates and "copy_engine" in options.backends:
        for splits in decomposed_splits(workload.kind, ws, options.num_splits):
            if decomposed_offered(workload.kind, ws, rows, splits):
                yield decomposed_candidate(splits)
    if UNFUSED in options.templates:
        yield unfused_candidate()
    gluon = {
        tc: "gluon" in options.kernels and _gluon_refusal(tc, workload, topology) is None
        for tc in tile_configs
    }
    for backend in options.backends:
        if _fp8_gather_refusal(workload, "direct", backend):  # every fused template alike
            continue
        sms = options.comm_sms.get(backend, (0,) if backend == "copy_engine" else (8,))
        sms = [s for s in sms if (s == 0) == (backend == "copy_engine") and s <= topology.sm_count // 2]
        for template, splits, order, tc, comm_sms in itertools.product(
            _templates_for(options, ws), options.num_splits, orders, tile_configs, sms
        ):
            if template in PLANLESS_KINDS or (template == "bidirectional_ring" and splits < 2):
                continue
            if order == "kept_interleaved" and template != "direct":
                continue
            if rows // splits < tc.block_m:
                continue
            if _deadlocking_order(workload.kind, order, ws, backend):
                continue
            groups = options.group_m if order in ("arrival", "swizzle") else (1,)
            for group_m in groups:
                c = Candidate(
                    backend=backend,
                    template=template,
                    num_splits=splits,
                    tile_order=order,
                    comm_sms=comm_sms,
                    block_m=tc.block_m,
                    block_n=tc.block_n,
                    block_k=tc.block_k,
                    group_m=group_m,
                    num_warps=tc.num_warps,
                    num_stages=tc.num_stages,
                )
                # in each kernel code of the options that runs it (`gluon`: see gluon_refusal)
                if "triton" in options.kernels:
                    yield c
                if gluon[tc]:
                    yield dataclasses.replace(c, kernel="gluon")


def space(workload: Workload, topology: Topology, options: SpaceOptions | None = None) -> list[Candidate]:
    """Every valid candidate for `workload` on `topology`, in a deterministic order."""
    return list(_iter_space(workload, topology, options or SpaceOptions()))


def space_size(workload: Workload, topology: Topology, options: SpaceOptions | None = None) -> int:
    return sum(1 for _ in _iter_space(workload, topology, options or SpaceOptions()))


_COLLECTIVE_NAMES = {"ag_gemm": "all-gather", "gemm_rs": "reduce-scatter", "gemm_ar": "all-reduce"}


def too_short_for_tiles(workload: Workload, topology: Topology) -> str | None:
    """Why no tile of the space fits `workload`'s blocks on `topology` (fewer rows a rank than the
    smallest tile's), or None where one does."""
    rows = _rows_per_block(workload, topology.world_size)
    smallest = min(tc.block_m for tc in TILE_CONFIGS)
    if rows >= smallest:
        return None
    return (
        f"each rank's block has {rows} row(s), fewer than the smallest tile's {smallest} (M must be at least "
        f"{smallest * topology.world_size}); at this size only template 'unfused' (a matmul, then the whole "
        f"{_COLLECTIVE_NAMES[workload.kind]}) runs: keep it in space.templates"
    )


def empty_space_message(workload: Workload, topology: Topology, options: SpaceOptions | None = None) -> str:
    """Why `workload` has no candidate on `topology` under `options`, and what to change."""
    options = options or SpaceOptions()
    short = too_short_for_tiles(workload, topology)
    if short:
        return f"no candidate fits {workload} on {topology}: {short}"
    default = space_size(workload, topology)
    if options != SpaceOptions() and default:
        return (
            f"the `space:` section leaves no candidate for {workload} on {topology} (the default space "
            f"has {default}): widen it, e.g. smaller tile_configs or fewer num_splits"
        )
    return f"no candidate fits {workload} on {topology}"


def space_refusal(
    workload: Workload, topology: Topology, options: SpaceOptions, candidates: list[Candidate]
) -> str | None:
    """Why a search over `candidates` (the space under `options`) should not start: none at all
    (:func:`empty_space_message`), or the `space:` section fencing off every fused candidate the
    default space has, leaving only the unfused one. None where the search can go on."""
    if not candidates:
        return empty_space_message(workload, topology, options)
    if options == SpaceOptions() or any(c.template != UNFUSED for c in candidates):
        return None
    fused = sum(1 for c in _iter_space(workload, topology, SpaceOptions()) if c.template != UNFUSED)
    if not fused:
        return None  # too short for any tile: the unfused candidate is the space
    return (
        f"the `space:` section leaves no candidate for {workload} on {topology} but the unfused one (the default "
        f"space has {fused} fused): widen it, e.g. smaller tile_configs or fewer num_splits"
    )


SHORT_TILES: tuple[tuple[TileConfig, float], ...] = (
    (TileConfig(128, 256, 64, 8, 3), 1.0),
    (TileConfig(128, 128, 64, 4, 4), 1.12),
    (TileConfig(64, 128, 64, 4, 4), 1.6),
)
"""The default's tiles for a GEMM too short to fill the GPU with 128×256 (or 128×128) tiles, largest
first, each with its time per unit of tile area against the first's (measured on whole waves of
tiles: smaller tiles reuse less of each load). The default takes the tile whose waves over the
GPU's SMs cost least (waves × area × that factor), the larger on a tie: at a few hundred rows a
large tile leaves most SMs idle, so smaller tiles finish sooner despite their lower rate."""


MIN_CHUNK_BYTES = {"ag_gemm": 8 << 20, "gemm_rs": 6 << 20, "gemm_ar": 6 << 20}
"""The default's smallest chunk of a block, and MAX_DEFAULT_CHUNKS its most chunks a call
(splits × peers). A chunk costs a fixed time besides its bytes (a copy's start and the stream
waits and writes between copies), and an all-gather's GEMM starts on the rank's own rows without
waiting, so fewer, larger chunks win until a block is tens of MiB. tests/test_space.py checks,
with the cost model under the default calibration, that the default's splits stay near the
model's best over a grid of shapes on two and eight GPUs, and that the TP=2 suite keeps 4 splits."""
MAX_DEFAULT_CHUNKS = 8


def default_candidate(workload: Workload, topology: Topology) -> Candidate:
    """The documented default: copy engine, direct plan, arrival order; 4 splits, fewer where a
    block is short (under 128 rows a chunk), its chunks would fall under MIN_CHUNK_BYTES, or the
    call would move more than MAX_DEFAULT_CHUNKS chunks; 128×256×64 tiles with 8 warps and 3 stages
    (128×128 with 4 stages where N is narrow), and where those tiles would not fill every SM once,
    the tile of SHORT_TILES whose waves over the SMs cost least (128×128 or 64×128 with 4 warps
    and 4 stages at a few hundred rows). For `fp8`, `unfused`: torch's own scaled path, which a
    tuned configuration must beat."""
    if workload.scaled:
        return unfused_candidate()
    rows = _rows_per_block(workload, topology.world_size)
    m, n_cols, _ = workload.local_gemm(topology.world_size)
    sms = max(1, topology.sm_count)

    def tiles(tc: TileConfig) -> int:
        return -(-m // tc.block_m) * -(-n_cols // tc.block_n)

    def cost(entry: tuple[TileConfig, float]) -> float:
        tc, per_area = entry
        return -(-tiles(tc) // sms) * tc.block_m * tc.block_n * per_area

    tile = TileConfig(128, 256, 64, 8, 3) if n_cols >= 2048 else TileConfig(128, 128, 64, 8, 4)
    if tiles(tile) < sms:
        tile = min(SHORT_TILES, key=cost)[0]  # min keeps the first, the larger tile, on a tie
    block_bytes = rows * workload.comm_row_bytes()
    peers = max(1, topology.world_size - 1)
    splits = 4
    while splits > 1 and (
        rows // splits < 128
        or block_bytes / splits < MIN_CHUNK_BYTES[workload.kind]
        or splits * peers > MAX_DEFAULT_CHUNKS
    ):
        splits //= 2
    return Candidate(
        backend="copy_engine",
        template="direct",
        num_splits=splits,
        tile_order="arrival",
        comm_sms=0,
        block_m=tile.block_m,
        block_n=tile.block_n,
        block_k=tile.block_k,
        group_m=8,
        num_warps=tile.num_warps,
        num_stages=tile.num_stages,
    )


def guard_candidates(workload: Workload, topology: Topology) -> dict[str, Candidate]:
    """The references every sweep measures first and a served configuration is never slower than,
    by name (`syncopate.records.GUARDS`): `default`, :func:`default_candidate`, and `unfused`,
    :func:`unfused_candidate`; each only where it is valid for the workload and topology, the
    default only where its chunks hold a tile's rows (as the space asks of every tiled candidate).
    A MoE workload's: `unfused` only (:func:`~syncopate.search_space.moe_workload.moe_guards`)."""
    if isinstance(workload, MoeWorkload):
        return moe_guards()
    out = {}
    rows = _rows_per_block(workload, topology.world_size)
    for name, make in (("default", default_candidate), ("unfused", lambda w, t: unfused_candidate())):
        try:
            c = make(workload, topology)
            check_candidate(c, workload, topology)
        except ConfigError:
            continue
        if c.template not in PLANLESS_KINDS and rows // c.num_splits < c.block_m:
            continue
        out[name] = c
    return out


def optuna_distributions(
    workload: Workload, topology: Topology, options: SpaceOptions | None = None
) -> dict[str, Any]:
    """Optuna distributions over the space's fields (categorical; combinations are checked by
    :func:`candidate_from_params`)."""
    from optuna.distributions import CategoricalDistribution

    cands = space(workload, topology, options)
    if not cands:
        raise ConfigError(f"the search space of {workload} on {topology} is empty")
    values: dict[str, set] = {}
    for c in cands:
        for name, v in (
            ("backend", c.backend),
            ("template", c.template),
            ("num_splits", c.num_splits),
            ("tile_order", c.tile_order),
            ("comm_sms", c.comm_sms),
            ("tile_config", TileConfig.of(c).key()),
            ("group_m", c.group_m),
            ("kernel", c.kernel),
        ):
            values.setdefault(name, set()).add(v)
    return {name: CategoricalDistribution(sorted(v, key=str)) for name, v in values.items()}


def candidate_from_params(params: dict[str, Any]) -> Candidate:
    """The candidate named by a parameter dict as produced from :func:`optuna_distributions`."""
    tc = TileConfig.from_key(params["tile_config"])
    return Candidate(
        backend=params["backend"],
        template=params["template"],
        num_splits=int(params["num_splits"]),
        tile_order=params["tile_order"],
        comm_sms=int(params["comm_sms"]),
        block_m=tc.block_m,
        block_n=tc.block_n,
        block_k=tc.block_k,
        group_m=int(params["group_m"]),
        num_warps=tc.num_warps,
        num_stages=tc.num_stages,
        kernel=params.get("kernel", "triton"),
    )
