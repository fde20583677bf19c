"""Plan templates behind one interface, and the call programs they prepare.

A call's path: `ops` finds the call program of its (kind, shapes, dtype, group, config), made once
by the template the config names (`TEMPLATES`), and the program enqueues the call with the
caller's tensors bound. Everything a call can work out from its shapes alone (context, chunk plan,
device tables, stream programs, the kernel's compiled launch) is worked out in `prepare` or at
the program's first call, so that a call's host time is binding tensors and enqueueing.

| template             | kinds                      | what moves                                    | GEMM     |
|----------------------|----------------------------|-----------------------------------------------|----------|
| `direct`, `ring`, `bidirectional_ring` | all three | A's rows / partial products, chunk by chunk | Triton (fused) |
| `a_stationary`       | ag_gemm                    | B's shards out, products back                 | cuBLAS   |
| `c_stationary`       | gemm_rs, gemm_ar           | the peers' A rows and B, then reduced blocks  | cuBLAS   |
| `decomposed`         | all three                  | shards / partials as each GEMM piece ends     | cuBLAS   |
| `unfused`            | all three                  | the group's whole collective                  | cuBLAS   |

FP8 operands (`syncopate.kernels.scaled`) run on the fused templates (the kernels' tiles in FP8,
each tile's sum scaled; an all-gather's scale rows go with its rows, on the copy engine) and on
`unfused` and `decomposed` (`torch._scaled_mm` calls with each piece's scale rows); check_candidate
refuses the stationary templates.

Every template passes the same conformance suite (`tests/test_templates.py` on the CPU,
`tests/test_gpu_ops.py` on GPUs).
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from syncopate.errors import ConfigError
from syncopate.kernels import a_stationary, c_stationary, decomposed, decomposed_gather
from syncopate.kernels.backends import GatherCall, ScatterCall, backend_for, stage_gathered_copy
from syncopate.kernels.c_stationary import b_moves_kmajor
from syncopate.kernels.context import OverlapContext
from syncopate.kernels.launch import launch_consumer, launch_producer, own_shard_readable
from syncopate.kernels.library import _ALL_GATHER as ALL_GATHER
from syncopate.kernels.library import _REDUCE_SCATTER as REDUCE_SCATTER
from syncopate.kernels.library import unfused
from syncopate.kernels.scaled import FP8, OUT_DTYPE, Scales, column_major
from syncopate.kernels.tables import consumer_tables, plan_for, producer_tables
from syncopate.search_space import (
    A_STATIONARY,
    C_STATIONARY,
    DECOMPOSED,
    UNFUSED,
    Candidate,
    block_bounds,
)
from syncopate.search_space import (
    TEMPLATES as PLAN_TEMPLATES,
)

__all__ = [
    "CONTEXTS",
    "CallProgram",
    "CallSpec",
    "Template",
    "TEMPLATES",
    "fused_buffers",
    "fused_context_key",
    "template_for",
]

OP_NAMES = {
    "ag_gemm": "all_gather_matmul",
    "gemm_rs": "matmul_reduce_scatter",
    "gemm_ar": "matmul_all_reduce",
}


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class CallSpec:
    """What a call program is made for: the op, its operands' shapes and layout, the group, the config.

    Shapes are per rank (`a_shape`, `b_shape` as the caller passes them); `m`, `n`, `k` are the
    global GEMM dims of the workload."""

    kind: str
    """`ag_gemm`, `gemm_rs` or `gemm_ar`."""
    group: Any
    """The torch.distributed process group."""
    rank: int
    world_size: int
    a_shape: tuple[int, int]
    b_shape: tuple[int, int]
    dtype: torch.dtype
    device: torch.device
    candidate: Candidate

    @property
    def m(self) -> int:
        return self.a_shape[0] * self.world_size if self.kind == "ag_gemm" else self.a_shape[0]

    @property
    def n(self) -> int:
        return self.b_shape[1] * self.world_size if self.kind == "ag_gemm" else self.b_shape[1]

    @property
    def out_shape(self) -> tuple[int, int]:
        """This rank's output: [M, N/ws] (all-gather), [M/ws, N] (reduce-scatter), [M, N] (all-reduce)."""
        if self.kind == "ag_gemm":
            return (self.m, self.b_shape[1])
        return (self.m // self.world_size if self.kind == "gemm_rs" else self.m, self.n)

    @property
    def op(self) -> str:
        return OP_NAMES[self.kind]

    @property
    def out_dtype(self) -> torch.dtype:
        """The output's dtype (and the reduced partials'): bf16 for FP8 operands, else theirs."""
        return OUT_DTYPE if self.dtype == FP8 else self.dtype


class CallProgram(abc.ABC):
    """One op's call with fixed shapes, dtype, group and config: a call binds its tensors."""

    spec: CallSpec
    context: OverlapContext | None = None
    """The symmetric buffers, signals and streams it runs on (None where it needs none)."""
    returns_gathered: ClassVar[bool] = False
    """Whether an all-gather program also fills the gathered A (`gathered=`) itself."""

    @abc.abstractmethod
    def __call__(
        self,
        a: torch.Tensor,
        b: torch.Tensor,
        out: torch.Tensor,
        *,
        capturing: bool = False,
        spin_limit: int = 0,
        gathered: torch.Tensor | None = None,
        scales: Scales | None = None,
    ) -> None:
        """Enqueue one call on the caller's stream writing `out` (and, for an all-gather program
        that `returns_gathered`, `gathered`). `capturing`: the call is being captured in a CUDA
        graph. `spin_limit` > 0 bounds the kernels' waits (a tuning run's guard). `scales`: FP8
        operands' (a_scale, b_scale), checked (only the templates that run FP8 get them)."""

    def bind(self, gathered: bool = False, enqueue=None, scaled: bool = False) -> Callable[..., Any]:
        """The program as a function of (a, b) alone, for calls that pass nothing else (no `out`, no
        bounded waits, not being captured), and with `scaled`, of (a, b, scales) for FP8 operands:
        it makes the output (and, with `gathered`, the gathered A of an all-gather that
        `returns_gathered`) and enqueues the call, returning what the op returns. What `ops` keeps
        for the fast path of such calls, after one of them has been checked; the tensors it is
        given have the spec's shapes, dtypes and device (and the scales those of the checked
        call's). `enqueue(a, b, out, gathered=None, scales=None)` enqueues the call (None: the
        program itself; `ops` passes its launch choice)."""
        spec = self.spec
        enqueue = self if enqueue is None else enqueue
        shape = spec.out_shape
        if scaled:
            out_dtype = spec.out_dtype

            def call_scaled(a, b, scales):
                out = a.new_empty(shape, dtype=out_dtype)
                enqueue(a, b, out, scales=scales)
                return out

            return call_scaled
        if not gathered:

            def call(a, b):
                out = a.new_empty(shape)
                enqueue(a, b, out)
                return out

            return call
        full_shape = (spec.m, spec.a_shape[1])

        def call_gathered(a, b):
            out, full = a.new_empty(shape), a.new_empty(full_shape)
            enqueue(a, b, out, gathered=full)
            return out, full

        return call_gathered


class Template(abc.ABC):
    """A plan template: which kinds it serves, and the call program it prepares for a spec."""

    name: str
    kinds: frozenset[str]

    def supports(self, kind: str) -> bool:
        return kind in self.kinds

    @abc.abstractmethod
    def prepare(self, spec: CallSpec, b: torch.Tensor) -> CallProgram:
        """The call program of `spec` (collective: every rank of the group prepares it together; it
        may make the group's symmetric buffers). `b` is this rank's B, for its layout."""

    def context_key(self, spec: CallSpec) -> tuple:
        """What the program's context is kept under besides the group: programs of one template with
        equal keys share a context (its buffers are sized by it)."""
        return (spec.kind, self.name, spec.a_shape, spec.b_shape[1], spec.dtype)

    def buffers(self, spec: CallSpec) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """The symmetric buffers (name → shape, dtype) the program's context holds."""
        return {}


# Contexts ------------------------------------------------------------------------------------------


class ContextCache:
    """Contexts per (group, template key), shared by the programs whose buffers they size."""

    def __init__(self) -> None:
        self._contexts: dict[tuple, OverlapContext] = {}

    def get(self, group, key: tuple, buffers: dict) -> OverlapContext:
        full = (group.group_name,) + key
        ctx = self._contexts.get(full)
        if ctx is None or ctx.closed:
            ctx = OverlapContext.create(group, buffers)
            self._contexts[full] = ctx
        return ctx

    def close(self, group=None) -> None:
        for key in list(self._contexts):
            if group is None or key[0] == group.group_name:
                self._contexts.pop(key).close()


CONTEXTS = ContextCache()
"""The process's contexts (`ops.close_contexts` closes them)."""


def fused_context_key(kind: str, m: int, cols: int, dtype: torch.dtype) -> tuple:
    """The context key of the fused templates: the kind, M, and K (all-gather) or N (the others)."""
    return (kind, "fused", m, cols, dtype)


def fused_buffers(kind: str, m: int, cols: int, dtype: torch.dtype, ws: int) -> dict:
    """The fused templates' symmetric buffers: the gathered A [M, K] of an all-gather (FP8: its
    bytes, uint8, and its rows' scales `a_scale` [M, 1]); the received partials (M rounded up to ws
    blocks, N) of the others, and an all-reduce's reduced rows [M, N]."""
    if kind == "ag_gemm":
        if dtype == FP8:
            return {"a_full": ((m, cols), torch.uint8), "a_scale": ((m, 1), torch.float32)}
        return {"a_full": ((m, cols), dtype)}
    bufs = {"recv": ((ws * -(-m // ws), cols), dtype)}
    if kind == "gemm_ar":
        bufs["reduced"] = ((m, cols), dtype)
    return bufs


def _context(template: Template, spec: CallSpec) -> OverlapContext:
    return CONTEXTS.get(spec.group, template.context_key(spec), template.buffers(spec))


def _kept(ctx: OverlapContext, key: tuple, build):
    value = ctx.cache.get(key)
    if value is None:
        value = ctx.cache[key] = build()
    return value


def b_layout_on_every_rank(b: torch.Tensor, group, op: str) -> bool:
    """Whether this rank's B is pushed K-major (`b_moves_kmajor`), checked to be so on every rank of
    `group` (collective): a template that moves B reads a peer's B in this rank's layout."""
    kmajor = b_moves_kmajor(b)
    ws = dist.get_world_size(group)
    if ws > 1:
        layouts = [None] * ws
        dist.all_gather_object(layouts, kmajor, group=group)
        if len(set(layouts)) > 1:
            said = ", ".join(
                f"rank {q}: {'weight.t() (K-major)' if x else 'row-major'}" for q, x in enumerate(layouts)
            )
            raise ConfigError(
                f"{op}: b's layout differs between ranks ({said}); this config moves B between "
                f"ranks, so pass b the same way on every rank"
            )
    return kmajor


# unfused --------------------------------------------------------------------------------------------


class UnfusedProgram(CallProgram):
    """The group's collective and torch's matmul in sequence (`library.unfused`), written into the
    call's tensors; an all-gather that returns the gathered A gathers straight into it."""

    returns_gathered = True

    def __init__(self, spec: CallSpec) -> None:
        self.spec = spec

    def __call__(self, a, b, out, *, capturing=False, spin_limit=0, gathered=None, scales=None) -> None:
        if gathered is None:
            unfused(self.spec.kind, a, b, self.spec.group, out=out, scales=scales)
            return
        ALL_GATHER(gathered, a, group=self.spec.group)
        torch.matmul(gathered, b, out=out)

    def bind(self, gathered=False, enqueue=None, scaled=False):
        """torch's collective and matmul with nothing in between but the output's allocation: the
        shapes and the group are the spec's, worked out once (`library.unfused` on unscaled operands,
        whose output these calls leave to the matmul or the collective; with `scaled`, FP8 operands,
        `library.unfused` with the call's scales); never replayed, so `enqueue` is not taken."""
        spec, group = self.spec, self.spec.group
        if scaled:
            kind = spec.kind

            def scaled_call(a, b, scales):
                return unfused(kind, a, b, group, scales=scales)

            return scaled_call
        if spec.kind == "ag_gemm":
            full_shape = (spec.m, spec.a_shape[1])
            if gathered:

                def gather_mm_gathered(a, b):
                    full = a.new_empty(full_shape)
                    ALL_GATHER(full, a, group=group)
                    return full @ b, full

                return gather_mm_gathered

            def gather_mm(a, b):
                full = a.new_empty(full_shape)
                ALL_GATHER(full, a, group=group)
                return full @ b

            return gather_mm
        if spec.kind == "gemm_rs":
            out_shape = spec.out_shape

            def mm_scatter(a, b):
                partial = a @ b
                out = partial.new_empty(out_shape)
                REDUCE_SCATTER(out, partial, group=group)
                return out

            return mm_scatter

        def mm_reduce(a, b):
            out = a @ b
            dist.all_reduce(out, group=group)
            return out

        return mm_reduce


class UnfusedTemplate(Template):
    name = UNFUSED
    kinds = frozenset(OP_NAMES)

    def prepare(self, spec, b):
        return UnfusedProgram(spec)


# Fused Triton kernels (direct, ring, bidirectional_ring) -----------------------------------------


class FusedGatherProgram(CallProgram):
    """All-gather + GEMM in one persistent Triton kernel consuming A's chunks as they land; the
    backend moves them on side streams. The GEMM reads this rank's own rows from the caller's
    shard (no copy first) wherever a descriptor fits it."""

    returns_gathered = True

    def __init__(self, spec: CallSpec, ctx: OverlapContext) -> None:
        c = spec.candidate
        self.spec, self.context = spec, ctx
        m_local, k = spec.a_shape
        self.plan = plan_for("ag_gemm", c.template, spec.world_size, spec.m, c.num_splits, c.block_m)
        n_local = spec.b_shape[1]
        self.tables = _kept(
            ctx, ("c", n_local, c), lambda: consumer_tables(self.plan, spec.rank, n_local, c, ctx.device)
        )
        self.backend = backend_for(c)
        self.backend.check_context(ctx)
        self.a_full = ctx.buffers["a_full"]
        self.rows = self.a_full.local  # the gathered A as the kernel reads it
        self.scale = ctx.buffers.get("a_scale")
        """FP8: the gathered rows' scales, [M, 1] float32 (moved with the rows by the copy engine)."""
        if self.scale is not None:  # on the copy engine only (`check_candidate` refuses the others)
            self.rows = self.rows.view(FP8)
        self.programs: dict = {}
        """The stream programs the backend records for these calls (`streamops.kept_program`)."""
        self.launches: dict = {}
        """The kernel's compiled launches, by what varies between calls (`launch_consumer`'s memo)."""
        self._readable: dict = {}
        self.sms = ctx.sm_count - self.backend.reserved_sms(c)
        self.r0 = spec.rank * m_local
        self.row_bytes = k * spec.dtype.itemsize

    def _own(self, a, b, out):
        """`a` where the kernel can read the own rows from it (on the TMA path, a descriptor must
        fit it: 16-byte aligned), else None; worked out once per alignment of the three tensors."""
        key = (a.data_ptr() % 16, b.data_ptr() % 16, out.data_ptr() % 16)
        readable = self._readable.get(key)
        if readable is None:
            readable = self._readable[key] = own_shard_readable(self.rows, b, out, a)
        return a if readable else None

    def __call__(self, a, b, out, *, capturing=False, spin_limit=0, gathered=None, scales=None) -> None:
        ctx, tables = self.context, self.tables
        if scales is not None:
            b = column_major(b)  # the kernel reads an FP8 B K-major, as torch._scaled_mm does
            own_scale = self.scale.local[self.r0 : self.r0 + a.shape[0]]
            sa = scales[0]  # row-wise as it is, a tensor-wise one on every row; before the sends read it
            own_scale.copy_(sa if sa.shape == own_scale.shape else sa.reshape(1, 1).expand(own_scale.shape))
            scales = (self.scale.local, scales[1])
        own = self._own(a, b, out)
        # The gathered A goes out on a side stream while the GEMM runs, except with bounded waits
        # (a stream wait is not bounded, and a chunk that never comes would hold it): then from the
        # gathered buffer after the call.
        overlap = gathered is not None and not spin_limit
        main = ctx.current_stream()
        epoch = ctx.begin_call(main if capturing else None)
        streams = ctx.fork(main, 3)
        call = GatherCall(
            ctx=ctx,
            plan=self.plan,
            candidate=self.spec.candidate,
            epoch=epoch,
            main=main,
            a_local=a,
            a_full=self.a_full,
            r0=self.r0,
            row_bytes=self.row_bytes,
            spin_limit=spin_limit,
            copy_own=(gathered is not None and not overlap) or tables.own_rows_later or own is None,
            programs=self.programs,
            scale=self.scale,
        )
        enqueue = self.backend.stage_gather(call, streams)  # what may allocate, before the kernel runs
        copy_out = stage_gathered_copy(call, streams[2]) if overlap else None
        # The side streams' work first: a consumer's side streams wait only on peers, and the
        # kernel-first order has met an illegal-instruction fault (`benchmarks/probe_faults.py`
        # runs the ops one synchronized call at a time to find such faults).
        enqueue()
        launch_consumer(
            self.rows,
            b,
            out,
            tables,
            self.spec.candidate,
            epoch,
            ctx.signals.local,
            ctx.error,
            self.sms,
            spin_limit,
            cache=ctx.cache,
            a_own=own,
            own_row0=self.r0,
            memo=self.launches,
            scales=scales,
        )
        if copy_out is not None:
            copy_out(gathered)  # after the kernel: its waits cannot hold the launch back
        ctx.join(main, streams)
        if gathered is not None and copy_out is None:
            gathered.copy_(self.rows)


class FusedScatterProgram(CallProgram):
    """GEMM + reduce-scatter (or all-reduce) in one persistent Triton kernel producing partial tiles
    in send order; the backend moves each chunk once the kernel raises its ready word."""

    def __init__(self, spec: CallSpec, ctx: OverlapContext) -> None:
        c = spec.candidate
        self.spec, self.context = spec, ctx
        m, n = spec.m, spec.n
        self.all_reduce = spec.kind == "gemm_ar"
        self.plan = plan_for(spec.kind, c.template, spec.world_size, m, c.num_splits, c.block_m)
        self.tables = _kept(
            ctx, ("p", n, c), lambda: producer_tables(self.plan, spec.rank, n, c, self.all_reduce, ctx.device)
        )
        # the partial products, in the output's dtype (bf16 for FP8 operands)
        self.send = _kept(
            ctx, ("send",), lambda: torch.empty((m, n), dtype=spec.out_dtype, device=spec.device)
        )
        self.backend = backend_for(c)
        self.backend.check_context(ctx)
        self.programs: dict = {}
        self.launches: dict = {}
        self.sms = ctx.sm_count - self.backend.reserved_sms(c)
        self.out_row0 = 0 if self.all_reduce else block_bounds(m, spec.world_size, spec.rank)[0]
        self.recv = ctx.buffers["recv"]
        self.reduced = ctx.buffers.get("reduced")

    def __call__(self, a, b, out, *, capturing=False, spin_limit=0, gathered=None, scales=None) -> None:
        ctx, spec = self.context, self.spec
        if scales is not None:  # the kernel reads an FP8 B K-major, as torch._scaled_mm does
            b = column_major(b)
            scales = (scales[0], scales[1])
        main = ctx.current_stream()
        epoch = ctx.begin_call(main if capturing else None)
        streams = ctx.fork(main, 3)
        reduced = self.reduced
        # What may allocate is done before the kernel is launched; the waits for its chunks are
        # enqueued after it (they wait for words the kernel raises).
        enqueue = self.backend.stage_scatter(
            ScatterCall(
                ctx=ctx,
                plan=self.plan,
                candidate=spec.candidate,
                epoch=epoch,
                main=main,
                send=self.send,
                recv=self.recv,
                n_cols=spec.n,
                elem=spec.out_dtype.itemsize,
                out=out,
                reduced=reduced,
                spin_limit=spin_limit,
                programs=self.programs,
            ),
            streams,
        )
        launch_producer(
            a,
            b,
            self.send,
            out,
            reduced.local if reduced is not None else None,
            self.recv.local,
            self.out_row0,
            self.tables,
            spec.candidate,
            epoch,
            ctx.signals.local,
            ctx.counters,
            ctx.peer_signal_ptrs,
            spec.world_size,
            spec.rank,
            ctx.error,
            self.sms,
            spin_limit,
            cache=ctx.cache,
            memo=self.launches,
            scales=scales,
        )
        enqueue()
        ctx.join(main, streams)


class FusedTemplate(Template):
    """A chunk-plan template run by the fused Triton kernels (`TEMPLATES` of the search space)."""

    kinds = frozenset(OP_NAMES)

    def __init__(self, name: str) -> None:
        self.name = name

    def context_key(self, spec):
        # Every chunked plan of a shape shares one context (their buffers are the same), and
        # `ops.gather_buffer` finds the all-gather's under this key too.
        return fused_context_key(
            spec.kind, spec.m, spec.a_shape[1] if spec.kind == "ag_gemm" else spec.n, spec.dtype
        )

    def buffers(self, spec):
        if spec.kind == "ag_gemm":
            return fused_buffers(spec.kind, spec.m, spec.a_shape[1], spec.dtype, spec.world_size)
        # a reduction's buffers hold partial products, in the output's dtype
        return fused_buffers(spec.kind, spec.m, spec.n, spec.out_dtype, spec.world_size)

    def prepare(self, spec, b):
        ctx = _context(self, spec)
        if spec.kind == "ag_gemm":
            return FusedGatherProgram(spec, ctx)
        return FusedScatterProgram(spec, ctx)


# cuBLAS templates --------------------------------------------------------------------------------


class _CublasProgram(CallProgram):
    """A cuBLAS template's call: its module's `run(ctx, plan, a, b, out, captured, …)`."""

    def __init__(self, spec: CallSpec, ctx: OverlapContext, plan, run) -> None:
        self.spec, self.context, self.plan, self._run = spec, ctx, plan, run

    def __call__(self, a, b, out, *, capturing=False, spin_limit=0, gathered=None, scales=None) -> None:
        self._run(self.context, self.plan, a, b, out, capturing)


class AStationaryTemplate(Template):
    """B's shards go to every rank; each rank sends back its rows' products with the peers' columns."""

    name = A_STATIONARY
    kinds = frozenset({"ag_gemm"})

    def buffers(self, spec):
        m_local, k = spec.a_shape
        return a_stationary.a_stationary_buffers(spec.world_size, m_local, spec.b_shape[1], k, spec.dtype)

    def prepare(self, spec, b):
        ctx = _context(self, spec)
        m_local, k = spec.a_shape
        plan = a_stationary.AStationaryPlan.of(
            spec.candidate,
            spec.rank,
            spec.world_size,
            m_local,
            spec.b_shape[1],
            k,
            b_layout_on_every_rank(b, spec.group, spec.op),
        )
        return _CublasProgram(spec, ctx, plan, a_stationary.run)


class CStationaryTemplate(Template):
    """Each rank receives the peers' columns of A for its rows and their rows of B, and computes its
    own output block (an all-reduce then gathers the blocks)."""

    name = C_STATIONARY
    kinds = frozenset({"gemm_rs", "gemm_ar"})

    def buffers(self, spec):
        return c_stationary.c_stationary_buffers(
            spec.world_size, spec.m, spec.n, spec.a_shape[1], spec.dtype, all_reduce=spec.kind == "gemm_ar"
        )

    def prepare(self, spec, b):
        ctx = _context(self, spec)
        kmajor = b_layout_on_every_rank(b, spec.group, spec.op)
        plan = c_stationary.CStationaryPlan.of(
            spec.rank,
            spec.world_size,
            spec.m,
            spec.n,
            spec.a_shape[1],
            spec.kind == "gemm_ar",
            spec.candidate.num_splits,
            kmajor,
        )
        return _CublasProgram(spec, ctx, plan, c_stationary.run)


class _DecomposedScatterProgram(_CublasProgram):
    def __call__(self, a, b, out, *, capturing=False, spin_limit=0, gathered=None, scales=None) -> None:
        decomposed.run(self.context, self.plan, a, b, out, capturing, spin_limit, scales=scales)


class _DecomposedGatherProgram(_CublasProgram):
    returns_gathered = True

    def __call__(self, a, b, out, *, capturing=False, spin_limit=0, gathered=None, scales=None) -> None:
        decomposed_gather.run(self.context, self.plan, a, b, out, capturing, gathered=gathered, scales=scales)


class DecomposedTemplate(Template):
    """cuBLAS GEMMs over row pieces, each piece's communication started as soon as its GEMM ends."""

    name = DECOMPOSED
    kinds = frozenset(OP_NAMES)

    def buffers(self, spec):
        if spec.kind == "ag_gemm":
            return decomposed_gather.gather_buffers(
                spec.world_size, spec.a_shape[0], spec.a_shape[1], spec.dtype
            )
        return decomposed.decomposed_buffers(  # the partials in the output's dtype (bf16 for FP8)
            spec.world_size, spec.m, spec.n, spec.out_dtype, all_reduce=spec.kind == "gemm_ar"
        )

    def context_key(self, spec):
        return (
            spec.kind,
            self.name,
            spec.a_shape if spec.kind == "ag_gemm" else (spec.m, spec.n),
            spec.dtype,
        )

    def prepare(self, spec, b):
        ctx = _context(self, spec)
        c = spec.candidate
        if spec.kind == "ag_gemm":
            plan = decomposed_gather.GatherPlan.of(spec.rank, spec.world_size, spec.a_shape[0], c.num_splits)
            return _DecomposedGatherProgram(spec, ctx, plan, None)
        plan = decomposed.DecomposedPlan.of(
            spec.rank, spec.world_size, spec.m, spec.n, spec.kind == "gemm_ar", c.num_splits
        )
        decomposed.prepare(ctx, plan)
        return _DecomposedScatterProgram(spec, ctx, plan, None)


TEMPLATES: dict[str, Template] = {
    t.name: t
    for t in (
        *(FusedTemplate(name) for name in PLAN_TEMPLATES),
        AStationaryTemplate(),
        CStationaryTemplate(),
        DecomposedTemplate(),
        UnfusedTemplate(),
    )
}
"""Every plan template a candidate may name, by name."""


def template_for(candidate: Candidate, kind: str) -> Template:
    """The template `candidate` names, checked to serve `kind`."""
    template = TEMPLATES.get(candidate.template)
    if template is None:
        raise ConfigError(f"no runtime template {candidate.template!r}: accepted are {', '.join(TEMPLATES)}")
    if not template.supports(kind):
        raise ConfigError(
            f"template {candidate.template!r} does not serve {kind}: it serves "
            f"{', '.join(sorted(template.kinds))}"
        )
    return template
