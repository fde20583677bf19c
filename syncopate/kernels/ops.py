"""The public fused ops: all-gather + GEMM, GEMM + reduce-scatter, GEMM + all-reduce.

| op                       | a (per rank)   | b (per rank)    | returns            |
|--------------------------|----------------|-----------------|--------------------|
| `all_gather_matmul`      | A[M/ws, K]     | B[K, N/ws]      | out[M, N/ws]       |
| `matmul_reduce_scatter`  | A[M, K/ws]     | B[K/ws, N]      | out[M/ws, N]       |
| `matmul_all_reduce`      | A[M, K/ws]     | B[K/ws, N]      | out[M, N]          |

`b` may be row-major or the transpose of a row-major [N, K] matrix (`weight.t()` of an
nn.Linear). With `config=None` an op asks `syncopate.lookup` once per (workload, group) and keeps
the answer. Contexts (symmetric buffers, signals, streams) are kept per (group, kind, shape,
dtype) in a `ContextRegistry` until `close_contexts()`.

Under `torch.compile` a call is traced as one node, `torch.ops.syncopate.*` (`fullgraph=True`
works; `out=` and `spin_limit` are refused there). A call can be captured in a CUDA graph once one
like it (same shapes, dtype, group and config) has run outside the capture: that call makes the
context (a collective) and compiles the kernel. A captured call starts by clearing the signal pads
with the group met before and after (`OverlapContext.begin_call`), as its replays repeat its
epoch; every rank must replay its graphs in the same order, as it would make the calls. A first
call keeps what it allocates out of torch.compile's CUDA graph pool (`kept_allocations`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from typing import Any

import torch
import torch.distributed as dist

from syncopate.errors import ConfigError, describe
from syncopate.kernels import a_stationary, c_stationary, decomposed, decomposed_gather
from syncopate.kernels.a_stationary import AStationaryPlan, a_stationary_buffers
from syncopate.kernels.c_stationary import CStationaryPlan, b_moves_kmajor, c_stationary_buffers
from syncopate.kernels.decomposed import DecomposedPlan, decomposed_buffers
from syncopate.kernels.backends import GatherCall, ScatterCall, backend_for, stage_gathered_copy
from syncopate.kernels.context import OverlapContext, kept_allocations
from syncopate.kernels.launch import launch_consumer, launch_producer, own_shard_readable
from syncopate.kernels.library import OP_NAMES, config_text, register, unfused
from syncopate.kernels.tables import consumer_tables, plan_for, producer_tables
from syncopate.search_space import (
    A_STATIONARY,
    C_STATIONARY,
    DECOMPOSED,
    UNFUSED,
    Candidate,
    Topology,
    Workload,
    block_bounds,
    canonical_dtype,
    check_candidate,
)

__all__ = [
    "all_gather_matmul",
    "gather_buffer",
    "matmul_reduce_scatter",
    "matmul_all_reduce",
    "ContextRegistry",
    "close_contexts",
    "get_context",
    "call_context",
]

log = logging.getLogger(__name__)

register()  # torch.ops.syncopate: what torch.compile traces the ops as

_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


class ContextRegistry:
    """Contexts and looked-up configurations, per group and shape. One per process by default."""

    def __init__(self) -> None:
        self._contexts: dict[tuple, OverlapContext] = {}
        self._configs: dict[tuple, Candidate] = {}
        self._topologies: dict[str, Topology] = {}
        self.prepared: dict[tuple, Any] = {}
        """Validated calls: (group, kind, shapes, strides, dtype, device, config) → what a call needs
        (with the stream programs its backend records, `streamops.kept_program`)."""
        self._lock = threading.Lock()

    def context(self, group, key: tuple, buffers: dict[str, tuple[tuple[int, ...], torch.dtype]]) -> OverlapContext:
        full = (group.group_name,) + key
        ctx = self._contexts.get(full)
        if ctx is None or ctx.closed:
            ctx = OverlapContext.create(group, buffers)
            self._contexts[full] = ctx
        return ctx

    def topology(self, group) -> Topology:
        topo = self._topologies.get(group.group_name)
        if topo is None:
            topo = Topology.detect(group)
            self._topologies[group.group_name] = topo
        return topo

    def config(self, workload: Workload, group) -> Candidate:
        key = (group.group_name, workload.key())
        cand = self._configs.get(key)
        if cand is None:
            import syncopate

            result = syncopate.lookup(workload.shape, self.topology(group), kind=workload.kind, dtype=workload.dtype)
            cand = result.candidate
            self._configs[key] = cand
            log.info("using %s for %s (%s)", cand.short(), workload, result.match)
        return cand

    def close(self, group=None) -> None:
        with self._lock:
            for key in list(self._contexts):
                if group is None or key[0] == group.group_name:
                    self._contexts.pop(key).close()
            self.prepared.clear()


_REGISTRY = ContextRegistry()

_COMM_FIRST = os.environ.get("SYNCOPATE_COMM_FIRST", "1") == "1"
"""The all-gather enqueues its side-stream work before its kernel (SYNCOPATE_COMM_FIRST=0: after).

Both orders are deadlock-free for a consumer, whose side streams wait only on peers. On two H200s
the kernel-first order met an illegal-instruction fault in two runs whose grids held 128x128 tiles
or SM-driven copies, and the side-work-first order ran clean in every run; it stays the default
until that fault is understood. Producers (reduce-scatter, all-reduce) always launch the kernel
first: their side streams wait for signals the kernel raises."""


_OWN_SHARD = os.environ.get("SYNCOPATE_OWN_SHARD", "1") == "1"
"""The all-gather's GEMM reads this rank's own rows from the caller's shard (SYNCOPATE_OWN_SHARD=0:
from the gathered buffer, after the shard's copy there, as before; for measurements). On one H200
with the peer's chunks landing at the two-H200 link's pace (`benchmarks/gpu_single.py paced`) it
took the per-rank GEMMs of the TP=2 ag_gemm shapes 3–12 % faster."""


_GATHERED_OVERLAP = os.environ.get("SYNCOPATE_GATHERED_OVERLAP", "1") == "1"
"""`return_gathered` copies the gathered A out on a side stream while the GEMM runs: its own rows
from the shard at once, the peers' once they are in (SYNCOPATE_GATHERED_OVERLAP=0: the shard copied
into the gathered buffer as well, and the buffer copied out after the call, on the caller's stream,
as before; for measurements)."""


def close_contexts(group=None) -> None:
    """Free the symmetric buffers of every context (of `group` only, if given). Collective. CUDA
    graphs holding calls of those contexts must not be replayed afterwards."""
    _REGISTRY.close(group)


def get_context(kind: str, group, shape: tuple[int, ...], dtype: torch.dtype) -> OverlapContext:
    """The context the ops use for `kind` on `group` (created on first use)."""
    return _REGISTRY.context(group, (kind,) + tuple(shape) + (str(dtype),), _buffers(kind, shape, dtype, dist.get_world_size(group)))


def call_context(kind: str, a, b, group=None, config: Candidate | dict | None = None) -> OverlapContext | None:
    """The context that calls of `kind` with operands like `a` and `b` and this config use, once one
    such call has been made (None before, and for template `unfused`, which needs none)."""
    key = _call_key(kind, a, b, group, config)
    prep = _REGISTRY.prepared.get(key) if key is not None else None
    return None if prep is None else prep[0]


_A_STATIONARY_KIND = "ag_gemm/a_stationary"
"""The context of all-gather matmuls that move B and the products (`kernels/a_stationary.py`)."""
_C_STATIONARY_KIND = {"gemm_rs": "gemm_rs/c_stationary", "gemm_ar": "gemm_ar/c_stationary"}
"""The contexts of matmul reduce-scatters and all-reduces that move A's rows and B
(`kernels/c_stationary.py`)."""
_DECOMPOSED_KIND = {"ag_gemm": "ag_gemm/decomposed", "gemm_rs": "gemm_rs/decomposed", "gemm_ar": "gemm_ar/decomposed"}
"""The contexts of the ops cut into cuBLAS GEMMs over row pieces (`kernels/decomposed.py`,
`kernels/decomposed_gather.py`)."""


def _buffers(kind: str, shape: tuple[int, ...], dtype: torch.dtype, ws: int) -> dict:
    if kind == _A_STATIONARY_KIND:
        m_local, n_local, k = shape
        return a_stationary_buffers(ws, m_local, n_local, k, dtype)
    if kind in _C_STATIONARY_KIND.values():
        m, n, k_local = shape
        return c_stationary_buffers(ws, m, n, k_local, dtype, all_reduce=kind.startswith("gemm_ar"))
    if kind == _DECOMPOSED_KIND["ag_gemm"]:
        m_local, k = shape
        return decomposed_gather.gather_buffers(ws, m_local, k, dtype)
    if kind in _DECOMPOSED_KIND.values():
        m, n = shape
        return decomposed_buffers(ws, m, n, dtype, all_reduce=kind.startswith("gemm_ar"))
    if kind == "ag_gemm":
        m, k = shape
        return {"a_full": ((m, k), dtype)}
    m, n = shape
    rows = ws * -(-m // ws)
    bufs = {"recv": ((rows, n), dtype)}
    if kind == "gemm_ar":
        bufs["reduced"] = ((m, n), dtype)
    return bufs


def _check_tensor(name: str, t: Any) -> None:
    if not isinstance(t, torch.Tensor):
        raise ConfigError(f"{name} must be a torch.Tensor, got {describe(t)}")
    if t.dim() != 2:
        raise ConfigError(f"{name} must be 2-D, got shape {tuple(t.shape)}")
    if t.dtype not in _DTYPES:
        raise ConfigError(f"{name} has dtype {t.dtype}: accepted are bfloat16, float16, float32")


def _group(group) -> Any:
    """The process group a call runs on (None: the default one), checked."""
    if not dist.is_initialized():
        raise ConfigError("torch.distributed is not initialised: call init_process_group first")
    if group is None:
        return dist.group.WORLD
    if not isinstance(group, dist.ProcessGroup):
        raise ConfigError(
            f"group must be a torch.distributed ProcessGroup (or None: the default group), got "
            f"{type(group).__name__} {group!r}"
        )
    return group


def _parse_config(config: Candidate | dict | None) -> Candidate | None:
    """The candidate a call's `config` names (None: look it up), checked on its own."""
    if config is None or isinstance(config, Candidate):
        return config
    if isinstance(config, dict):
        return Candidate.from_dict(config)
    raise ConfigError(f"config must be a Candidate, a dict or None, got {describe(config)}")


def _check_inputs(a: torch.Tensor, b: torch.Tensor, group, config=None) -> tuple[Any, int, int]:
    """Shapes, dtypes, layouts, devices, group and config of a call, checked before anything is
    launched."""
    _check_tensor("a", a)
    _check_tensor("b", b)
    if a.dtype != b.dtype:
        raise ConfigError(f"a has dtype {a.dtype} but b has {b.dtype}: they must match")
    if not a.is_contiguous():
        raise ConfigError(f"a must be contiguous (row-major); got strides {a.stride()} for shape {tuple(a.shape)}")
    if a.shape[1] != b.shape[0]:
        raise ConfigError(f"a is {tuple(a.shape)} and b is {tuple(b.shape)}: a's columns must equal b's rows")
    if not (b.is_contiguous() or (b.stride(0) == 1 and b.stride(1) == b.shape[0])):
        raise ConfigError(
            f"b must be row-major or the transpose of a row-major matrix; got strides {b.stride()} for {tuple(b.shape)}"
        )
    group = _group(group)
    _parse_config(config)
    for name, t in (("a", a), ("b", b)):
        if not t.is_cuda:
            raise ConfigError(f"{name} is on {t.device}: the fused ops need CUDA tensors")
    device = torch.device("cuda", torch.cuda.current_device())
    for name, t in (("a", a), ("b", b)):
        if t.device != device:
            raise ConfigError(f"{name} is on {t.device} but this rank's device is {device}: call torch.cuda.set_device")
    return group, dist.get_rank(group), dist.get_world_size(group)


def _candidate(config: Candidate | dict | None, workload: Workload, group) -> Candidate:
    cand = _parse_config(config)
    if cand is None:
        cand = _REGISTRY.config(workload, group)
    check_candidate(cand, workload, _REGISTRY.topology(group))
    check_backend_group(cand, group)
    return cand


def check_backend_group(cand: Candidate, group) -> None:
    """The `nccl` backend's chunks go through the group's own collectives: it needs NCCL there."""
    backend = str(dist.get_backend(group))
    if cand.backend == "nccl" and cand.template != UNFUSED and "nccl" not in backend:
        raise ConfigError(
            f"backend 'nccl' moves chunks with the group's NCCL collectives, but group {group.group_name!r} "
            f"uses {backend!r}: choose backend copy_engine or nvshmem, or make the group with backend='nccl'"
        )


def all_gather_matmul(
    a_shard: torch.Tensor,
    b: torch.Tensor,
    group=None,
    config: Candidate | dict | None = None,
    *,
    return_gathered: bool = False,
    out: torch.Tensor | None = None,
    spin_limit: int = 0,
):
    """out = all_gather(a_shard, dim 0) @ b, with the GEMM consuming rows of A as their chunks arrive.

    Returns the local output [M, N/ws] (and the gathered A [M, K] too with `return_gathered`).
    The GEMM reads this rank's own rows from `a_shard` itself, from the start of the call; the
    shard is copied into the gathered buffer only where a tile across the shard's edge reads it
    there (never when it already lives there: `gather_buffer`). The gathered A returned is a new
    tensor, filled on a side stream while the GEMM runs (`stage_gathered_copy`).
    `spin_limit` > 0 bounds every wait (a tuning run's guard against hangs; the context then raises
    a timeout on `check_error()`).
    A config with template `a_stationary` moves B and the products instead of A (its GEMMs are
    cuBLAS's, its stream waits are not bounded by `spin_limit`); with `return_gathered` the call
    takes the direct plan, which gathers A. Template `decomposed`: each shard pushed to every peer
    by the copy engine while the own rows' cuBLAS GEMM runs, then cuBLAS GEMMs over the peers' rows
    as they land (`num_splits` of them; the gathered A, where asked for, copied out on a side
    stream as they land). A config with template `unfused` runs the group's
    all-gather, then the matmul (what `lookup` serves where that measured fastest).
    """
    if torch.compiler.is_compiling():
        return _traced("ag_gemm", a_shard, b, group, config, out, spin_limit, return_gathered)
    capturing = _capturing(a_shard, "all_gather_matmul", spin_limit)
    key = _call_key("ag_gemm", a_shard, b, group, config)
    prep = _REGISTRY.prepared.get(key) if key is not None else None
    if prep is None:
        _refuse_first_capture("all_gather_matmul", capturing)
        prep = kept_allocations(lambda: _prepare_gather(a_shard, b, group, config), _device_of(a_shard))
        _REGISTRY.prepared[key] = prep
    ctx, plan, cand, tables, backend, rank, m_local, k, n_local, programs = prep
    if cand.template == UNFUSED:
        if out is not None:
            _check_out(out, (m_local * dist.get_world_size(group), n_local), a_shard.dtype)
        return unfused("ag_gemm", a_shard, b, group, gathered=return_gathered, out=out)
    if cand.template == A_STATIONARY and return_gathered:  # nothing gathers A there: the direct plan does
        return all_gather_matmul(a_shard, b, group, dataclasses.replace(cand, template="direct"),
                                 return_gathered=True, out=out, spin_limit=spin_limit)
    m = m_local * plan.world_size
    if out is None:
        out = torch.empty((m, n_local), dtype=a_shard.dtype, device=a_shard.device)
    else:
        _check_out(out, (m, n_local), a_shard.dtype)
    if cand.template == A_STATIONARY:
        a_stationary.run(ctx, plan, a_shard, b, out, capturing)
        return out
    if cand.template == DECOMPOSED:
        gathered = torch.empty((m, k), dtype=a_shard.dtype, device=a_shard.device) if return_gathered else None
        decomposed_gather.run(ctx, plan, a_shard, b, out, capturing, gathered=gathered)
        return out if gathered is None else (out, gathered)
    a_full = ctx.buffers["a_full"]
    own = a_shard if _OWN_SHARD and own_shard_readable(a_full.local, b, out, a_shard) else None
    # The gathered A goes out on a side stream while the GEMM runs (not with bounded waits: a stream
    # wait is not, and a chunk that never comes would hold it), else from the gathered buffer after.
    overlap = return_gathered and _GATHERED_OVERLAP and not spin_limit
    main = ctx.current_stream()
    epoch = ctx.begin_call(main if capturing else None)
    streams = ctx.fork(main, 3)
    call = GatherCall(
        ctx=ctx, plan=plan, candidate=cand, epoch=epoch, main=main, a_local=a_shard, a_full=a_full,
        r0=rank * m_local, row_bytes=k * a_shard.element_size(), spin_limit=spin_limit,
        copy_own=(return_gathered and not overlap) or tables.own_rows_later or own is None, programs=programs,
    )
    enqueue = backend.stage_gather(call, streams)  # what may allocate, before the kernel runs
    gathered = torch.empty_like(a_full.local) if return_gathered else None
    copy_out = stage_gathered_copy(call, streams[2]) if overlap else None
    if _COMM_FIRST:
        enqueue()
    launch_consumer(
        a_full.local, b, out, tables, cand, epoch, ctx.signals.local, ctx.error,
        ctx.sm_count - backend.reserved_sms(cand), spin_limit, cache=ctx.cache, a_own=own, own_row0=rank * m_local,
    )
    if not _COMM_FIRST:
        enqueue()
    if copy_out is not None:
        copy_out(gathered)  # after the kernel: its waits cannot hold the launch back
    ctx.join(main, streams)
    if not return_gathered:
        return out
    if copy_out is None:
        gathered.copy_(a_full.local)
    return out, gathered


def _check_out(out: torch.Tensor, shape: tuple[int, int], dtype: torch.dtype) -> None:
    if tuple(out.shape) != shape or out.dtype != dtype or not out.is_contiguous():
        raise ConfigError(f"out must be a contiguous {dtype} tensor of shape {shape}, got {out.dtype} "
                          f"{tuple(out.shape)}{'' if out.is_contiguous() else ' (not contiguous)'}")


def _traced(kind: str, a, b, group, config, out, spin_limit: int, gathered: bool = False):
    """The call as torch.compile traces it: one node of its graph, `torch.ops.syncopate.*`
    (`syncopate.kernels.library`), run with the compiled graph (`out=` and bounded waits have no
    place there)."""
    op = OP_NAMES[kind]
    if out is not None or spin_limit:
        raise ConfigError(f"syncopate.{op} under torch.compile: out= and spin_limit are not supported there; "
                          f"call it without them (the compiled graph allocates the output)")
    name = (group or dist.group.WORLD).group_name
    traced = torch.ops.syncopate
    if gathered:
        return traced.all_gather_matmul_gathered(a, b, name, config_text(config))
    return getattr(traced, op)(a, b, name, config_text(config))


def _capturing(a, op: str, spin_limit: int) -> bool:
    """Whether this call is being captured in a CUDA graph; bounded waits are refused there: a
    replay's timeout could not be reported (nothing reads the error flag), only its wrong output."""
    if not (isinstance(a, torch.Tensor) and a.is_cuda and torch.cuda.is_current_stream_capturing()):
        return False
    if spin_limit:
        raise ConfigError(
            f"syncopate.{op}: spin_limit={spin_limit} bounds waits for a tuning run, which reports a timeout "
            f"after the call; a call captured in a CUDA graph cannot: capture it with spin_limit=0"
        )
    return True


def _device_of(a) -> torch.device | None:
    return a.device if isinstance(a, torch.Tensor) else None


def _refuse_first_capture(op: str, capturing: bool) -> None:
    """The first call of a shape makes its context (symmetric memory, a collective that synchronizes)
    and compiles its kernel: neither can happen under a capture. Refused before anything is enqueued."""
    if capturing:
        raise ConfigError(
            f"syncopate.{op}: the first call with these shapes, dtype, group and config cannot be captured in a "
            f"CUDA graph (it makes the group's symmetric buffers and compiles the kernel); make one such call "
            f"before capturing, as torch.cuda.graph's warm-up does"
        )


def _call_key(kind: str, a, b, group, config) -> tuple | None:
    """What makes two calls the same once validated; None where the inputs need checking anyway."""
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and dist.is_initialized()):
        return None
    if not a.is_contiguous() or not (group is None or isinstance(group, dist.ProcessGroup)):
        return None
    name = (group or dist.group.WORLD).group_name
    conf = tuple(sorted(config.items())) if isinstance(config, dict) else config
    key = (kind, name, a.shape, a.dtype, a.device, b.shape, b.stride(), b.dtype, conf)
    try:
        hash(key)
    except TypeError:  # a config dict with a list in it: checked (and refused) the long way
        return None
    return key


def _b_layout_on_every_rank(b: torch.Tensor, group, op: str) -> bool:
    """Whether this rank's B is pushed K-major (`b_moves_kmajor`), checked to be so on every rank of
    `group` (collective; a shape's first call with a template that moves B): a peer's B is read in
    this rank's layout."""
    kmajor = b_moves_kmajor(b)
    ws = dist.get_world_size(group)
    if ws > 1:
        layouts = [None] * ws
        dist.all_gather_object(layouts, kmajor, group=group)
        if len(set(layouts)) > 1:
            said = ", ".join(f"rank {q}: {'weight.t() (K-major)' if x else 'row-major'}"
                             for q, x in enumerate(layouts))
            raise ConfigError(f"{op}: b's layout differs between ranks ({said}); this config moves B between "
                              f"ranks, so pass b the same way on every rank")
    return kmajor


def _prepare_gather(a_shard, b, group, config):
    """Validate an all-gather call once per (shapes, dtype, group, config): what every call needs."""
    group, rank, ws = _check_inputs(a_shard, b, group, config)
    m_local, k = a_shard.shape
    m, n_local = m_local * ws, b.shape[1]
    workload = Workload(kind="ag_gemm", shape=(m, n_local * ws, k), dtype=canonical_dtype(a_shard.dtype))
    cand = _candidate(config, workload, group)
    if cand.template == UNFUSED:  # no context: torch's collective and matmul
        return None, None, cand, None, None, rank, m_local, k, n_local, None
    if cand.template == A_STATIONARY:
        ctx = get_context(_A_STATIONARY_KIND, group, (m_local, n_local, k), a_shard.dtype)
        plan = AStationaryPlan.of(cand, rank, ws, m_local, n_local, k,
                                  _b_layout_on_every_rank(b, group, "all_gather_matmul"))
        return ctx, plan, cand, None, None, rank, m_local, k, n_local, None
    if cand.template == DECOMPOSED:
        ctx = get_context(_DECOMPOSED_KIND["ag_gemm"], group, (m_local, k), a_shard.dtype)
        plan = decomposed_gather.GatherPlan.of(rank, ws, m_local, cand.num_splits)
        return ctx, plan, cand, None, None, rank, m_local, k, n_local, None
    ctx = get_context("ag_gemm", group, (m, k), a_shard.dtype)
    plan = plan_for("ag_gemm", cand.template, ws, m, cand.num_splits, cand.block_m)
    tables = _tables(ctx, ("c", n_local, cand), lambda: consumer_tables(plan, rank, n_local, cand, ctx.device))
    return ctx, plan, cand, tables, backend_for(cand), rank, m_local, k, n_local, {}


def _tables(ctx: OverlapContext, key: tuple, build):
    tables = ctx.cache.get(key)
    if tables is None:
        tables = ctx.cache[key] = build()
    return tables


def gather_buffer(a_shard_shape: tuple[int, int], dtype: torch.dtype, group=None) -> torch.Tensor:
    """This rank's rows of the gathered buffer `all_gather_matmul` uses for shards of this shape.

    Write the next shard there (e.g. as the `out=` of the op producing it) and the op never copies
    it; otherwise it copies a shard only where a tile across the shard's edge reads it from the
    buffer (the kernel reads the rest of its own rows from the shard itself). The view stays valid
    until `close_contexts()`.
    """
    group = _group(group)
    shape = tuple(a_shard_shape) if isinstance(a_shard_shape, (tuple, list, torch.Size)) else None
    if shape is None or len(shape) != 2 or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape):
        raise ConfigError(f"a_shard_shape {a_shard_shape!r} must be (rows, columns) of the shard, two positive integers")
    if dtype not in _DTYPES:
        raise ConfigError(f"dtype {dtype!r}: accepted are torch.bfloat16, torch.float16, torch.float32")
    ws, rank = dist.get_world_size(group), dist.get_rank(group)
    m_local, k = shape
    ctx = get_context("ag_gemm", group, (m_local * ws, k), dtype)
    return ctx.buffers["a_full"].local[rank * m_local : (rank + 1) * m_local]


def _prepare_scatter(kind: str, a, b, group, config):
    """Validate a reduce-scatter / all-reduce call once: what every call with these shapes needs."""
    group, rank, ws = _check_inputs(a, b, group, config)
    m, k_local = a.shape
    n = b.shape[1]
    workload = Workload(kind=kind, shape=(m, n, k_local * ws), dtype=canonical_dtype(a.dtype))
    workload.check_world_size(ws)
    cand = _candidate(config, workload, group)
    all_reduce = kind == "gemm_ar"
    if cand.template == UNFUSED:
        return None, None, cand, None, None, rank, ws, None, m if all_reduce else m // ws, None
    if cand.template == C_STATIONARY:
        ctx = get_context(_C_STATIONARY_KIND[kind], group, (m, n, k_local), a.dtype)
        kmajor = _b_layout_on_every_rank(b, group, OP_NAMES[kind])
        plan = CStationaryPlan.of(rank, ws, m, n, k_local, all_reduce, cand.num_splits, kmajor)
        return ctx, plan, cand, None, None, rank, ws, None, m if all_reduce else m // ws, None
    if cand.template == DECOMPOSED:
        ctx = get_context(_DECOMPOSED_KIND[kind], group, (m, n), a.dtype)
        plan = DecomposedPlan.of(rank, ws, m, n, all_reduce, cand.num_splits)
        decomposed.prepare(ctx, plan)
        return ctx, plan, cand, None, None, rank, ws, None, m if all_reduce else m // ws, None
    ctx = get_context(kind, group, (m, n), a.dtype)
    plan = plan_for(kind, cand.template, ws, m, cand.num_splits, cand.block_m)
    tables = _tables(ctx, ("p", n, cand), lambda: producer_tables(plan, rank, n, cand, all_reduce, ctx.device))
    send = _tables(ctx, ("send",), lambda: torch.empty((m, n), dtype=a.dtype, device=a.device))
    out_rows = m if all_reduce else m // ws
    return ctx, plan, cand, tables, backend_for(cand), rank, ws, send, out_rows, {}


def _gemm_scatter(kind: str, a, b, group, config, out, spin_limit: int):
    if torch.compiler.is_compiling():
        return _traced(kind, a, b, group, config, out, spin_limit)
    op = OP_NAMES[kind]
    capturing = _capturing(a, op, spin_limit)
    key = _call_key(kind, a, b, group, config)
    prep = _REGISTRY.prepared.get(key) if key is not None else None
    if prep is None:
        _refuse_first_capture(op, capturing)
        prep = kept_allocations(lambda: _prepare_scatter(kind, a, b, group, config), _device_of(a))
        _REGISTRY.prepared[key] = prep
    ctx, plan, cand, tables, backend, rank, ws, send, out_rows, programs = prep
    m, n = a.shape[0], b.shape[1]
    all_reduce = kind == "gemm_ar"
    if out is None:
        out = torch.empty((out_rows, n), dtype=a.dtype, device=a.device)
    else:
        _check_out(out, (out_rows, n), a.dtype)
    if cand.template == UNFUSED:
        return unfused(kind, a, b, group, out=out)
    if cand.template in (C_STATIONARY, DECOMPOSED):
        if cand.template == C_STATIONARY:
            c_stationary.run(ctx, plan, a, b, out, capturing)
        else:
            decomposed.run(ctx, plan, a, b, out, capturing, spin_limit)
        return out
    main = ctx.current_stream()
    epoch = ctx.begin_call(main if capturing else None)
    reduced = ctx.buffers.get("reduced")
    streams = ctx.fork(main, 3)
    # What may allocate is done before the kernel is launched; the waits for its chunks are enqueued after it.
    enqueue = backend.stage_scatter(ScatterCall(
        ctx=ctx, plan=plan, candidate=cand, epoch=epoch, main=main, send=send, recv=ctx.buffers["recv"],
        n_cols=n, elem=a.element_size(), out=out, reduced=reduced,
        spin_limit=spin_limit, programs=programs,
    ), streams)
    launch_producer(
        a, b, send, out, reduced.local if reduced is not None else None, ctx.buffers["recv"].local,
        0 if all_reduce else block_bounds(m, ws, rank)[0], tables, cand, epoch, ctx.signals.local, ctx.counters,
        ctx.peer_signal_ptrs, ws, rank, ctx.error, ctx.sm_count - backend.reserved_sms(cand), spin_limit,
        cache=ctx.cache,
    )
    enqueue()
    ctx.join(main, streams)
    return out


def matmul_reduce_scatter(a, b, group=None, config: Candidate | dict | None = None, *, out=None, spin_limit: int = 0):
    """out = reduce_scatter(a @ b, dim 0): partial tiles leave for their owner as soon as they are done.

    a: A[M, K/ws], b: B[K/ws, N]; returns this rank's rows [M/ws, N] of the sum over ranks.
    A config with template `c_stationary` moves A's rows and B instead of partial products, and
    each rank computes its own rows (cuBLAS; its stream waits are not bounded by `spin_limit`).
    Template `decomposed`: cuBLAS GEMMs in row chunks, each chunk's partial pushed by the copy
    engine once computed, the own rows summed onto the peers' partials.
    Template `unfused`: the matmul, then the group's reduce-scatter.
    """
    return _gemm_scatter("gemm_rs", a, b, group, config, out, spin_limit)


def matmul_all_reduce(a, b, group=None, config: Candidate | dict | None = None, *, out=None, spin_limit: int = 0):
    """out = all_reduce(a @ b): reduce-scatter of partial tiles, then every rank takes each reduced block.

    a: A[M, K/ws], b: B[K/ws, N]; returns [M, N], the sum over ranks.
    With a config of template `c_stationary` each rank computes its own block from the peers' A rows
    and B (as `matmul_reduce_scatter` does), then every rank takes each block in `num_splits` chunks.
    Template `decomposed`: as for `matmul_reduce_scatter`, then every rank pulls each reduced chunk
    once made (the last ones by the SMs, whose waits `spin_limit` bounds; the stream waits it does not).
    Template `unfused`: the matmul, then the group's all-reduce.
    """
    return _gemm_scatter("gemm_ar", a, b, group, config, out, spin_limit)
