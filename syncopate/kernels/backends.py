"""Communication backends: how chunks move while the fused GEMM runs.

The op forks side streams from the caller's stream, launches its kernel on the caller's stream,
then lets the backend enqueue the communication of the call on the side streams, and joins them.
The kernel goes first on purpose: a stream wait for a signal the kernel raises, enqueued before
the kernel, could otherwise hold the kernel back where two streams share one hardware queue. Four backends,
chosen by the candidate's `backend`:

- `copy_engine`: copy-engine copies (`cuMemcpyDtoDAsync`) straight into the peers' symmetric
  buffers, each followed by a stream write of the epoch into the receiver's signal word. Only
  copies and stream memory operations go on the side streams, so no SM is needed.
- `sm_copy` (SM-driven): `comm_sms` programs of `chunk_copy_kernel` store chunks into the peers'
  symmetric buffers and raise the receivers' signals from the GPU threads.
- `nvshmem`: the same job lists (`gather_jobs`, `scatter_jobs`), moved by `comm_sms` programs of
  `nvshmem_copy_kernel` with NVSHMEM puts and gets and signalled with an NVSHMEM put of the word,
  on buffers in NVSHMEM symmetric memory (`syncopate.use_nvshmem()`).
- `nccl`: NCCL send/receive pairs per (step, split) on a side stream, each arrival followed by a
  stream write of its signal; the fused kernel leaves `comm_sms` SMs free for NCCL's kernels.

The host work of a call that may synchronize (the copier's job tables and its first load) is done
by `stage_gather` / `stage_scatter` before the fused kernel is launched: an allocation or a module
load is an implicit synchronization point, and one made while the kernel spins would hold the side
streams back until the kernel ends, which waits for them. What they return only enqueues.

Before a rank writes into a peer's buffer it waits until that peer has entered the same call
(`ENTERED_BASE + peer` of its own pad reaches the epoch): the peer's previous call has then
finished reading its buffers. Each rank announces its entry into every pad when a call starts.
"""

from __future__ import annotations

import abc
import functools
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from syncopate.errors import ConfigError
from syncopate.kernels import streamops
from syncopate.kernels.context import OverlapContext, kept_allocations
from syncopate.kernels.launch import launch_chunk_copy, stage_chunk_copy
from syncopate.kernels.tables import ENTERED_BASE, LOCAL_BASE, READY_BASE, recv_offset
from syncopate.search_space import Candidate, ChunkPlan, Transfer

__all__ = [
    "CommBackend",
    "CopyJob",
    "GatherCall",
    "ScatterCall",
    "BACKEND_IMPLS",
    "announce_entry",
    "backend_for",
    "gather_jobs",
    "scatter_jobs",
    "nccl_exchange",
    "nvshmem_pes",
    "stage_gathered_copy",
]


SCALE_BYTES = 4
"""Bytes of one row's FP8 scale (float32) in a gathered A's scale buffer."""


@dataclass
class GatherCall:
    """One all-gather of rows of A: this rank's shard `a_local` (rows [r0, r1)) into `a_full` everywhere."""

    ctx: OverlapContext
    plan: ChunkPlan
    candidate: Candidate
    epoch: int
    main: torch.cuda.Stream
    a_local: torch.Tensor
    a_full: Any  # SymmetricBuffer
    r0: int
    row_bytes: int
    spin_limit: int = 0
    copy_own: bool = True
    """Whether this rank's shard is copied into its rows of the gathered buffer: a tile reads own rows
    from there (the kernel reads the rest from the shard), or the gathered A is returned from there
    after the call (with bounded waits; else `stage_gathered_copy` takes the shard's rows itself)."""
    programs: dict | None = None
    """Where the backend keeps the stream programs it records for calls like this one (a prepared
    call's); None: recorded for this call only."""
    scale: Any = None  # SymmetricBuffer
    """FP8 rows' scales ([M, 1] float32, this rank's rows in place before the call's sends): each
    transfer's scale rows go to the peer before its rows' word is raised (copy engine only)."""


@dataclass
class ScatterCall:
    """The communication of one reduce-scatter (and, for all-reduce, the gather of reduced rows)."""

    ctx: OverlapContext
    plan: ChunkPlan
    candidate: Candidate
    epoch: int
    main: torch.cuda.Stream
    send: torch.Tensor
    recv: Any  # SymmetricBuffer
    n_cols: int
    elem: int
    out: torch.Tensor | None = None
    reduced: Any = None  # SymmetricBuffer, all-reduce only
    spin_limit: int = 0
    programs: dict | None = None
    """As `GatherCall.programs`."""


class CommBackend(abc.ABC):
    """How chunks move. Implementations enqueue work on the side streams they are given."""

    name: str

    def reserved_sms(self, candidate: Candidate) -> int:
        """SMs the fused kernel must leave free for this backend's communication."""
        return candidate.comm_sms

    def check_context(self, ctx: OverlapContext) -> None:
        """Raise ConfigError where this backend cannot move chunks between `ctx`'s buffers. Called
        when a call program is made on `ctx`, before any of its calls enqueues anything."""

    @abc.abstractmethod
    def start_gather(self, call: GatherCall, streams: list[torch.cuda.Stream]) -> None:
        """Enqueue the all-gather of `call` on `streams` (three, forked from the caller's stream)."""

    @abc.abstractmethod
    def start_scatter(self, call: ScatterCall, streams: list[torch.cuda.Stream]) -> None:
        """Enqueue the reduce-scatter (and all-reduce gather) of `call` on `streams` (three)."""

    def stage_gather(self, call: GatherCall, streams: list[torch.cuda.Stream]) -> Callable[[], None]:
        """Do the host work of `start_gather` that may synchronize; return what enqueues the rest."""
        return functools.partial(self.start_gather, call, streams)

    def stage_scatter(self, call: ScatterCall, streams: list[torch.cuda.Stream]) -> Callable[[], None]:
        """Do the host work of `start_scatter` that may synchronize; return what enqueues the rest."""
        return functools.partial(self.start_scatter, call, streams)


def announce_entry(stream: torch.cuda.Stream, ctx: OverlapContext, epoch: int) -> None:
    """Tell every rank (this one too) on `stream` that this rank has entered call `epoch`."""
    for p in range(ctx.world_size):
        ctx.write_signal(stream, p, ENTERED_BASE + ctx.rank, epoch)


def _record_entry(program: streamops.Program, ctx: OverlapContext, stream: torch.cuda.Stream) -> None:
    """`announce_entry`, recorded in `program`."""
    for p in range(ctx.world_size):
        ctx.raise_signal(program, stream, p, ENTERED_BASE + ctx.rank)


def _own_rows_in_place(call: GatherCall) -> bool:
    """Whether this rank's shard already is its rows of the gathered buffer (`gather_buffer`)."""
    return call.a_local.data_ptr() == call.a_full.peer_ptrs[call.ctx.rank] + call.r0 * call.row_bytes


def _record_own_chunks(
    program: streamops.Program, call: GatherCall, stream: torch.cuda.Stream, in_place: bool
) -> None:
    """Put this rank's shard into its gathered buffer chunk by chunk (copy engine), raising
    `LOCAL_BASE + split` after each; a shard already in place only has its words raised. Nothing
    where no one reads the copy (`call.copy_own`)."""
    if not call.copy_own:
        return
    ctx, rank = call.ctx, call.ctx.rank
    base = call.a_full.peer_ptrs[rank]
    for j, (lo, hi) in enumerate(call.plan.chunk_bounds[rank]):
        if not in_place:
            program.copy(
                stream,
                base + lo * call.row_bytes,
                (lo - call.r0) * call.row_bytes,
                (hi - lo) * call.row_bytes,
                src_base=program.A,
            )
        ctx.raise_signal(program, stream, rank, LOCAL_BASE + j)


def _start_own(call: GatherCall, streams: list[torch.cuda.Stream]) -> Callable[[], None]:
    """What enqueues the shard's own chunks (`streams[2]`) and this rank's entry (`streams[0]`) of a
    gather whose chunks another backend moves."""
    in_place = _own_rows_in_place(call)

    def record(p: streamops.Program) -> None:
        _record_own_chunks(p, call, streams[2], in_place)
        _record_entry(p, call.ctx, streams[0])

    program = streamops.kept_program(call.programs, ("own", call.copy_own, in_place), record)
    return functools.partial(program.run, call.epoch, call.a_local.data_ptr())


def stage_gathered_copy(call: GatherCall, stream: torch.cuda.Stream) -> Callable[[torch.Tensor], None]:
    """What copies the whole gathered A into a caller's tensor on `stream` (one of the call's side
    streams, joined with the others), enqueued after the kernel, while the GEMM runs: this rank's
    rows from its shard at once, then, once every peer chunk's arrival word has risen (every
    backend raises them in this rank's pad), the peers' rows from the gathered buffer, in one copy
    before the shard's rows and one after."""
    ctx, plan, rank = call.ctx, call.plan, call.ctx.rank
    rows = call.a_full.local.shape[0]
    r1 = call.r0 + call.a_local.shape[0]

    def record(p: streamops.Program) -> None:
        p.copy(
            stream, call.r0 * call.row_bytes, 0, (r1 - call.r0) * call.row_bytes, dst_base=p.OUT, src_base=p.A
        )
        for t in plan.recvs(rank, "gather"):
            p.wait(stream, ctx.signal_address(rank, t.signal))
        base = call.a_full.peer_ptrs[rank]
        for lo, hi in ((0, call.r0), (r1, rows)):
            if hi > lo:
                p.copy(
                    stream,
                    lo * call.row_bytes,
                    base + lo * call.row_bytes,
                    (hi - lo) * call.row_bytes,
                    dst_base=p.OUT,
                )

    program = streamops.kept_program(call.programs, ("gathered",), record)
    return lambda gathered: program.run(call.epoch, call.a_local.data_ptr(), gathered.data_ptr())


def _arrival_slot(plan: ChunkPlan, rank: int, phase: str) -> dict[tuple[int, int], int]:
    return {t.chunk: t.signal for t in plan.recvs(rank, phase)}


def _mark_ready(program: streamops.Program, ctx: OverlapContext, stream: torch.cuda.Stream) -> None:
    """With the context's timeline on: an event on `stream` where a chunk's copy can start."""
    if ctx.timeline is not None:
        program.hook(lambda state: state.__setitem__(stream.cuda_stream, ctx.timeline.record(stream)))


def _mark_copied(
    program: streamops.Program, ctx: OverlapContext, stream: torch.cuda.Stream, label: str, t: Transfer
) -> None:
    """With the context's timeline on: mark transfer `t`'s copy, from its `_mark_ready` to now on `stream`."""
    if ctx.timeline is not None:
        program.hook(
            lambda state: ctx.timeline.mark(
                label, t.chunk, t.rows, state.get(stream.cuda_stream), ctx.timeline.record(stream)
            )
        )


class CopyEngineBackend(CommBackend):
    name = "copy_engine"

    def reserved_sms(self, candidate: Candidate) -> int:
        return 0

    def start_gather(self, call: GatherCall, streams: list[torch.cuda.Stream]) -> None:
        self.stage_gather(call, streams)()

    def start_scatter(self, call: ScatterCall, streams: list[torch.cuda.Stream]) -> None:
        self.stage_scatter(call, streams)()

    def stage_gather(self, call: GatherCall, streams: list[torch.cuda.Stream]) -> Callable[[], None]:
        in_place = _own_rows_in_place(call)
        key = ("gather", call.copy_own, in_place, call.ctx.timeline is not None)
        program = streamops.kept_program(
            call.programs, key, lambda p: self._record_gather(p, call, streams, in_place)
        )
        return functools.partial(program.run, call.epoch, call.a_local.data_ptr())

    def stage_scatter(self, call: ScatterCall, streams: list[torch.cuda.Stream]) -> Callable[[], None]:
        key = ("scatter", call.ctx.timeline is not None)
        program = streamops.kept_program(call.programs, key, lambda p: self._record_scatter(p, call, streams))
        return functools.partial(
            program.run, call.epoch, 0, call.out.data_ptr() if call.out is not None else 0
        )

    @staticmethod
    def _record_gather(
        p: streamops.Program, call: GatherCall, streams: list[torch.cuda.Stream], in_place: bool
    ) -> None:
        ctx, plan = call.ctx, call.plan
        _record_own_chunks(p, call, streams[2], in_place)
        _record_entry(p, ctx, streams[0])
        arrived = _arrival_slot(plan, ctx.rank, "gather")
        waited: set[tuple[int, int]] = set()
        for t in plan.sends(ctx.rank, "gather"):
            s = streams[t.stream]
            if (t.stream, t.dst) not in waited:
                p.wait(s, ctx.signal_address(ctx.rank, ENTERED_BASE + t.dst))
                waited.add((t.stream, t.dst))
            if t.block == ctx.rank:
                src, src_base = (t.row_start - call.r0) * call.row_bytes, p.A
            else:  # forwarding a chunk received earlier in this call
                p.wait(s, ctx.signal_address(ctx.rank, arrived[t.chunk]))
                src, src_base = call.a_full.peer_ptrs[ctx.rank] + t.row_start * call.row_bytes, 0
            _mark_ready(p, ctx, s)
            if call.scale is not None:  # the rows' scales, from this rank's (own, or arrived with the chunk)
                p.copy(
                    s,
                    call.scale.peer_ptrs[t.dst] + t.row_start * SCALE_BYTES,
                    call.scale.peer_ptrs[ctx.rank] + t.row_start * SCALE_BYTES,
                    t.rows * SCALE_BYTES,
                )
            p.copy(
                s,
                call.a_full.peer_ptrs[t.dst] + t.row_start * call.row_bytes,
                src,
                t.rows * call.row_bytes,
                src_base=src_base,
            )
            ctx.raise_signal(p, s, t.dst, t.signal)
            _mark_copied(p, ctx, s, f"gather to {t.dst}", t)

    @staticmethod
    def _record_scatter(p: streamops.Program, call: ScatterCall, streams: list[torch.cuda.Stream]) -> None:
        ctx, plan = call.ctx, call.plan
        row_bytes = call.n_cols * call.elem
        _record_entry(p, ctx, streams[0])
        waited: set[tuple[int, int]] = set()
        for i, t in enumerate(plan.sends(ctx.rank, "reduce")):
            s = streams[t.stream]
            if (t.stream, t.dst) not in waited:
                p.wait(s, ctx.signal_address(ctx.rank, ENTERED_BASE + t.dst))
                waited.add((t.stream, t.dst))
            p.wait(s, ctx.signal_address(ctx.rank, READY_BASE + i))
            _mark_ready(p, ctx, s)
            src = call.send.data_ptr() + t.row_start * row_bytes
            dst = (
                call.recv.peer_ptrs[t.dst]
                + (recv_offset(plan, ctx.rank, t.block, call.n_cols) + t.row_start * call.n_cols) * call.elem
            )
            p.copy(s, dst, src, t.rows * row_bytes)
            ctx.raise_signal(p, s, t.dst, t.signal)
            _mark_copied(p, ctx, s, f"partial to {t.dst}", t)
        if call.reduced is not None:
            s = streams[2]
            for t in plan.recvs(ctx.rank, "gather"):
                p.wait(s, ctx.signal_address(ctx.rank, t.signal))
                _mark_ready(p, ctx, s)
                p.copy(
                    s,
                    t.row_start * row_bytes,
                    call.reduced.peer_ptrs[t.src] + t.row_start * row_bytes,
                    t.rows * row_bytes,
                    dst_base=p.OUT,
                )
                _mark_copied(p, ctx, s, f"reduced from {t.src}", t)


class CopyJob(NamedTuple):
    """One job of a copier backend: `elems` elements from `src` to `dst` (addresses as this process
    maps them: a peer's buffer at its peer-mapped address) once the peer has entered the call and,
    unless `wait` is -1, word `wait` of this rank's pad has risen; then, unless `signal` is -1, word
    `signal` of rank `peer`'s pad raised. `remote` is the rank whose memory one side lies in (-1:
    both are this rank's), `pull` says it is the source (else the destination), and `buffer` is the
    symmetric buffer that side lies in."""

    src: int
    dst: int
    elems: int
    wait: int
    signal: int
    peer: int
    remote: int = -1
    pull: bool = False
    buffer: Any = None

    def sm_copy(self) -> tuple[int, int, int, int, int, int]:
        """The job as `chunk_copy_kernel` takes it."""
        return (self.src, self.dst, self.elems, self.wait, self.signal, self.peer)

    def nvshmem(self, rank: int, pes: list[int]) -> tuple[int, ...]:
        """The job as `nvshmem_copy_kernel` takes it (rank `rank` of a group whose PEs are `pes`):
        the remote side by its local symmetric address (the same offset in this rank's own copy of
        its buffer), the PE it is on, and the distance to its peer-mapped address."""
        from syncopate.kernels.nvshmem_copy import LOCAL, PULL, PUSH

        if self.remote < 0 or self.remote == rank:
            return (self.src, self.dst, self.elems, 0, self.wait, self.signal, self.peer, pes[rank], LOCAL)
        delta = self.buffer.peer_ptrs[self.remote] - self.buffer.peer_ptrs[rank]
        src, dst = (self.src - delta, self.dst) if self.pull else (self.src, self.dst - delta)
        kind = PULL if self.pull else PUSH
        return (src, dst, self.elems, delta, self.wait, self.signal, self.peer, pes[self.remote], kind)


def gather_jobs(call: GatherCall) -> list[CopyJob]:
    """A copier's jobs for the all-gather of `call`: each chunk this rank sends, in plan order, from
    its shard (or, forwarding, from its gathered buffer once the chunk has arrived there) into the
    receiver's gathered buffer, raising the chunk's arrival word there."""
    ctx, plan = call.ctx, call.plan
    arrived = _arrival_slot(plan, ctx.rank, "gather")
    elem = call.a_local.element_size()
    jobs = []
    for t in plan.sends(ctx.rank, "gather"):
        if t.block == ctx.rank:
            src, wait = call.a_local.data_ptr() + (t.row_start - call.r0) * call.row_bytes, -1
        else:
            src, wait = call.a_full.peer_ptrs[ctx.rank] + t.row_start * call.row_bytes, arrived[t.chunk]
        dst = call.a_full.peer_ptrs[t.dst] + t.row_start * call.row_bytes
        jobs.append(
            CopyJob(
                src, dst, t.rows * call.row_bytes // elem, wait, t.signal, t.dst, t.dst, False, call.a_full
            )
        )
    return jobs


def scatter_jobs(call: ScatterCall) -> list[CopyJob]:
    """A copier's jobs for the reduce-scatter of `call`: each partial chunk once the fused kernel
    raised its ready word, into the receiver's receive buffer, raising its arrival word there; for
    an all-reduce then each reduced chunk, pulled from its owner's buffer into the output once the
    owner raised its word here."""
    ctx, plan = call.ctx, call.plan
    row_bytes = call.n_cols * call.elem
    jobs = []
    for i, t in enumerate(plan.sends(ctx.rank, "reduce")):
        src = call.send.data_ptr() + t.row_start * row_bytes
        dst = (
            call.recv.peer_ptrs[t.dst]
            + (recv_offset(plan, ctx.rank, t.block, call.n_cols) + t.row_start * call.n_cols) * call.elem
        )
        jobs.append(
            CopyJob(src, dst, t.rows * call.n_cols, READY_BASE + i, t.signal, t.dst, t.dst, False, call.recv)
        )
    if call.reduced is not None:
        for t in plan.recvs(ctx.rank, "gather"):
            src = call.reduced.peer_ptrs[t.src] + t.row_start * row_bytes
            dst = call.out.data_ptr() + t.row_start * row_bytes
            jobs.append(
                CopyJob(src, dst, t.rows * call.n_cols, t.signal, -1, ctx.rank, t.src, True, call.reduced)
            )
    return jobs


class SmCopyBackend(CommBackend):
    """SM-driven copies by `comm_sms` programs of the chunk-copy kernel (the `sm_copy` backend)."""

    name = "sm_copy"

    def start_gather(self, call: GatherCall, streams: list[torch.cuda.Stream]) -> None:
        self.stage_gather(call, streams)()

    def start_scatter(self, call: ScatterCall, streams: list[torch.cuda.Stream]) -> None:
        self.stage_scatter(call, streams)()

    def _stage_jobs(self, ctx: OverlapContext, jobs: list[CopyJob], stream, call) -> Callable[[], None]:
        """Stage the copier for `jobs` (see `stage_chunk_copy`); return what launches it on `stream`."""
        dtype, sms = _dtype(call), call.candidate.comm_sms
        table = [j.sm_copy() for j in jobs]
        stage_chunk_copy(ctx, table, stream, sms, dtype, call.spin_limit)
        return functools.partial(
            launch_chunk_copy, ctx, stream, table, sms, call.epoch, dtype, call.spin_limit
        )

    def stage_gather(self, call: GatherCall, streams: list[torch.cuda.Stream]) -> Callable[[], None]:
        copy = self._stage_jobs(call.ctx, gather_jobs(call), streams[0], call)
        own = _start_own(call, streams)

        def enqueue() -> None:
            own()
            copy()

        return enqueue

    def stage_scatter(self, call: ScatterCall, streams: list[torch.cuda.Stream]) -> Callable[[], None]:
        ctx = call.ctx
        copy = self._stage_jobs(ctx, scatter_jobs(call), streams[0], call)
        entry = streamops.kept_program(call.programs, ("entry",), lambda p: _record_entry(p, ctx, streams[0]))

        def enqueue() -> None:
            entry.run(call.epoch)
            copy()

        return enqueue


class NvshmemBackend(SmCopyBackend):
    """The SM copier's job lists (same plans, waits, signal words and epochs) moved by `comm_sms`
    programs of `nvshmem_copy_kernel` with NVSHMEM puts and gets (the `nvshmem` backend). It needs
    the context's buffers in NVSHMEM symmetric memory (`syncopate.use_nvshmem()`)."""

    name = "nvshmem"

    def check_context(self, ctx: OverlapContext) -> None:
        from syncopate.kernels.symmetric_memory import nvshmem_refusal

        why = nvshmem_refusal(ctx.memory)
        if why is not None:
            raise ConfigError(why)

    def _stage_jobs(self, ctx: OverlapContext, jobs: list[CopyJob], stream, call) -> Callable[[], None]:
        from syncopate.kernels.nvshmem_copy import launch_nvshmem_copy, stage_nvshmem_copy

        self.check_context(ctx)
        dtype, sms = _dtype(call), call.candidate.comm_sms
        pes, pe_table = nvshmem_pes(ctx)
        table = [j.nvshmem(ctx.rank, pes) for j in jobs]
        stage_nvshmem_copy(ctx, table, stream, sms, dtype, pe_table, call.spin_limit)
        return functools.partial(
            launch_nvshmem_copy, ctx, stream, table, sms, call.epoch, dtype, pe_table, call.spin_limit
        )


def _dtype(call: GatherCall | ScatterCall) -> torch.dtype:
    """The element type a call's chunks are moved as."""
    return call.a_local.dtype if isinstance(call, GatherCall) else call.send.dtype


def nvshmem_pes(ctx: OverlapContext) -> tuple[list[int], torch.Tensor]:
    """The NVSHMEM PE of each rank of the context's group (its global rank), as a list and as the
    device table the copier takes; made once a context (an allocation: before a call's kernel)."""
    key = ("nvshmem_pes",)
    found = ctx.cache.get(key)
    if found is None:
        pes = [dist.get_global_rank(ctx.group, r) for r in range(ctx.world_size)]
        table = kept_allocations(lambda: torch.tensor(pes, dtype=torch.int32, device=ctx.device), ctx.device)
        found = ctx.cache[key] = (pes, table)
    return found


def nccl_exchange(
    plan: ChunkPlan,
    rank: int,
    phase: str,
    group,
    send_view: Callable[[Transfer], torch.Tensor],
    recv_view: Callable[[Transfer], torch.Tensor],
    before_send: Callable[[Transfer], None],
    on_arrival: Callable[[Transfer], None],
) -> None:
    """Run `phase` of the plan as NCCL (or gloo) send/receive pairs, one batch per (step, split).

    Each batch posts this rank's sends and receives of that step and split together (so that
    every pair matches on both sides), waits for them on the current stream, then calls
    `on_arrival` for each chunk received. `before_send` runs before a chunk is sent (a backend
    makes the stream wait there for the chunk to be ready).
    """

    def key(t: Transfer) -> tuple[int, int]:
        return (t.step, t.split)

    sends = sorted(plan.sends(rank, phase), key=key)
    recvs = sorted(plan.recvs(rank, phase), key=key)
    batches: dict[tuple[int, int], tuple[list[Transfer], list[Transfer]]] = {}
    for k, ts in itertools.groupby(sends, key=key):
        batches.setdefault(k, ([], []))[0].extend(ts)
    for k, ts in itertools.groupby(recvs, key=key):
        batches.setdefault(k, ([], []))[1].extend(ts)
    for k in sorted(batches):
        out_ts, in_ts = batches[k]
        ops = []
        for t in out_ts:
            before_send(t)
            ops.append(dist.P2POp(dist.isend, send_view(t), dist.get_global_rank(group, t.dst), group))
        for t in in_ts:
            ops.append(dist.P2POp(dist.irecv, recv_view(t), dist.get_global_rank(group, t.src), group))
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        for t in in_ts:
            on_arrival(t)


_NCCL_WARM: set[int] = set()
"""Process groups whose NCCL send/receive connections `_warm_nccl` has set up (by id)."""


def _warm_nccl(ctx: OverlapContext) -> None:
    """Set up NCCL's connections between every pair of ranks before a fused kernel first needs them.

    NCCL creates its communicator and each peer connection lazily, at the first operation that
    uses them; done inside a call, that setup (allocations, its own kernels) would run while the
    fused kernel spins on signals it has not delivered yet. One exchange of a word with every peer,
    waited for, does it up front. Every rank takes the same first NCCL call, so all come here.
    """
    if id(ctx.group) in _NCCL_WARM or ctx.world_size == 1:
        return
    word = torch.zeros(ctx.world_size, dtype=torch.int32, device=ctx.device)
    word[ctx.rank] = ctx.rank + 1
    ops = []
    for p in range(ctx.world_size):
        if p != ctx.rank:
            peer = dist.get_global_rank(ctx.group, p)
            ops.append(dist.P2POp(dist.isend, word[ctx.rank : ctx.rank + 1], peer, ctx.group))
            ops.append(dist.P2POp(dist.irecv, word[p : p + 1], peer, ctx.group))
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    if word.is_cuda:
        torch.cuda.synchronize(ctx.device)
    if word.tolist() != list(range(1, ctx.world_size + 1)):
        raise RuntimeError(f"NCCL warm-up exchange on rank {ctx.rank} received {word.tolist()}")
    _NCCL_WARM.add(id(ctx.group))


class NcclBackend(CommBackend):
    name = "nccl"

    def stage_gather(self, call: GatherCall, streams: list[torch.cuda.Stream]) -> Callable[[], None]:
        _warm_nccl(call.ctx)
        return functools.partial(self.start_gather, call, streams)

    def stage_scatter(self, call: ScatterCall, streams: list[torch.cuda.Stream]) -> Callable[[], None]:
        _warm_nccl(call.ctx)
        return functools.partial(self.start_scatter, call, streams)

    def start_gather(self, call: GatherCall, streams: list[torch.cuda.Stream]) -> None:
        ctx, plan, e = call.ctx, call.plan, call.epoch
        _start_own(call, streams)()
        s = streams[0]
        a_full = call.a_full.local

        def send_view(t: Transfer) -> torch.Tensor:
            if t.block == ctx.rank:
                return call.a_local[t.row_start - call.r0 : t.row_end - call.r0]
            return a_full[t.row_start : t.row_end]

        def arrived(t: Transfer) -> None:
            ctx.write_signal(s, ctx.rank, t.signal, e)

        with torch.cuda.stream(s):
            nccl_exchange(
                plan,
                ctx.rank,
                "gather",
                ctx.group,
                send_view,
                lambda t: a_full[t.row_start : t.row_end],
                lambda t: None,
                arrived,
            )

    def start_scatter(self, call: ScatterCall, streams: list[torch.cuda.Stream]) -> None:
        ctx, plan, e = call.ctx, call.plan, call.epoch
        s = streams[0]
        announce_entry(s, ctx, e)  # an all-reduce producer stores kept rows once every peer has entered
        recv = call.recv.local.view(-1)
        n = call.n_cols
        send_index = {(t.chunk, t.step): i for i, t in enumerate(plan.sends(ctx.rank, "reduce"))}

        def recv_view(t: Transfer) -> torch.Tensor:
            start = recv_offset(plan, t.src, t.block, n) + t.row_start * n
            return recv[start : start + t.rows * n]

        def ready(word: int) -> None:
            streamops.wait_value(s.cuda_stream, ctx.signal_address(ctx.rank, word), e)

        def arrived(t: Transfer) -> None:
            ctx.write_signal(s, ctx.rank, t.signal, e)

        with torch.cuda.stream(s):
            nccl_exchange(
                plan,
                ctx.rank,
                "reduce",
                ctx.group,
                lambda t: call.send[t.row_start : t.row_end],
                recv_view,
                lambda t: ready(READY_BASE + send_index[(t.chunk, t.step)]),
                arrived,
            )
            if call.reduced is not None:
                ready_of = plan.kept_ready_words(ctx.rank)
                nccl_exchange(
                    plan,
                    ctx.rank,
                    "gather",
                    ctx.group,
                    lambda t: call.out[t.row_start : t.row_end],
                    lambda t: call.out[t.row_start : t.row_end],
                    lambda t: ready(READY_BASE + ready_of[plan.chunk_index(*t.chunk)]),
                    lambda t: None,
                )


BACKEND_IMPLS: dict[str, CommBackend] = {
    b.name: b for b in (CopyEngineBackend(), SmCopyBackend(), NvshmemBackend(), NcclBackend())
}


def backend_for(candidate: Candidate) -> CommBackend:
    return BACKEND_IMPLS[candidate.backend]
