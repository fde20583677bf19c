"""How the pieces of a pipelined MoE op move: one `PieceExchange` a call, made by its backend.

A call asks its exchange for the buffer rows are received into (`buffer`), posts the plan's
exchanges in order (`post`: dispatch posts them all at once, combine each once its piece's GEMM
has been enqueued), makes the caller's stream wait for a piece's rows before its GEMM (`wait`),
and ends with `finish` (the caller's stream, or the host on the CPU, waits for every transfer).

- `nccl` (:class:`P2PExchange`): each exchange is one `batch_isend_irecv` of its send and its
  receive. On CUDA the batches go on a side stream: a batch of combine first waits there for its
  piece's GEMM (an event of the caller's stream), and after each batch the side stream records an
  event that the caller's stream waits on before that piece's GEMM. On the CPU (gloo) the batches
  are posted asynchronously and the host waits for a piece's batch before its GEMM.
- `copy_engine` (:class:`CopyEngineExchange`, CUDA only): copy-engine copies straight into the
  peer's symmetric buffer at the rows the piece takes there (the layout's `counts` say where), each
  followed by a stream write of the call's epoch into the peer's signal word for (source, chunk);
  a second side stream waits for this rank's words and records an event a piece, as above. Before
  a rank writes into a peer's buffer it waits until that peer has entered the call (the peer's
  previous call has read its buffer): the entry protocol of the fused ops
  (`syncopate.kernels.backends`). Only copies and stream memory operations go on the side
  streams: no SM is spent on communication.
- `nvshmem` (:class:`NvshmemExchange`, CUDA only, in a process whose symmetric memory is NVSHMEM's):
  the same buffers, rows, signal words, entry protocol and waits as `copy_engine`; a piece is moved
  by `comm_sms` programs of an NVSHMEM copier on the first side stream (each a contiguous share by
  a block put, then a quiet), the last of which raises the receiver's word with an NVSHMEM put.
  The copier runs beside the caller's GEMMs on SMs of its own; the side stream waits for the
  peer's entry before it starts, so no program spins for it.

Buffers and tensors a transfer reads are kept referenced until `finish`, after which the caller's
stream is ordered after every transfer, so the caching allocator never hands their memory to the
caller's stream while a side stream still uses it.
"""

from __future__ import annotations

import abc
import logging
import threading

import torch
import torch.distributed as dist

from syncopate.errors import ConfigError
from syncopate.moe.plan import PiecePlan
from syncopate.search_space.moe_workload import MOE_BACKENDS

__all__ = [
    "CopyEngineExchange",
    "MoeContexts",
    "NvshmemExchange",
    "P2PExchange",
    "PieceExchange",
    "close_moe_contexts",
    "cuda_only",
    "owns_buffer",
]

log = logging.getLogger(__name__)


class PieceExchange(abc.ABC):
    """The transfers of one pipelined call (module docstring)."""

    owns_buffer: bool = True
    """Whether `buffer` is a tensor of the call's own, which the caller may keep (else it is the
    context's, overwritten by the next call of this kind: `copy_out` what is kept)."""

    def __init__(self, plan: PiecePlan, group, device: torch.device, width: int, dtype: torch.dtype) -> None:
        self.plan, self.group, self.device, self.width, self.dtype = plan, group, device, width, dtype
        self.cuda = device.type == "cuda"
        self.kept: list[torch.Tensor] = []

    @abc.abstractmethod
    def buffer(self, rows: int) -> torch.Tensor:
        """[rows, width]: where this rank receives (dispatch: the expert side; combine: the token side)."""

    @abc.abstractmethod
    def post(self, i: int, send: torch.Tensor | None, recv: torch.Tensor) -> None:
        """Post exchange `i`: `send` (exactly its rows to send; None where it sends nothing) to its
        send peer, and its receive into its rows of `recv` (`buffer`'s). Work on the caller's stream
        enqueued before this call is done before the send starts."""

    @abc.abstractmethod
    def wait(self, i: int) -> None:
        """Make the caller's stream (on the CPU: the host) wait until exchange `i` has received."""

    @abc.abstractmethod
    def finish(self) -> None:
        """Make the caller's stream (on the CPU: the host) wait for every transfer of the call."""

    def copy_out(self, i: int, recv: torch.Tensor, into: torch.Tensor) -> None:
        """Copy exchange `i`'s received rows from `recv` into the same rows of `into` once they are
        in (off the caller's stream where possible). Default: nothing to do where `recv` is `into`."""
        if recv.data_ptr() != into.data_ptr():
            self.wait(i)
            lo, hi = self.plan.exchanges[i].recv_rows
            into[lo:hi].copy_(recv[lo:hi])


class P2PExchange(PieceExchange):
    """`nccl`: send/receive pairs of the group's backend (NCCL on CUDA, gloo on the CPU)."""

    def __init__(self, plan, group, device, width, dtype, contexts: MoeContexts) -> None:
        super().__init__(plan, group, device, width, dtype)
        self.works: dict[int, list] = {}
        self.main = self.side = None
        if self.cuda:
            self.main = torch.cuda.current_stream(device)
            self.side, self.events = contexts.side_stream(device, len(plan.exchanges) + 2)
            self.side.wait_stream(self.main)
        self._peer = (
            {p: dist.get_global_rank(group, p) for p in range(plan.world_size)} if group is not None else {}
        )

    def buffer(self, rows: int) -> torch.Tensor:
        return torch.empty(rows, self.width, dtype=self.dtype, device=self.device)

    def post(self, i: int, send: torch.Tensor | None, recv: torch.Tensor) -> None:
        x = self.plan.exchanges[i]
        ops = []
        tag = x.step * 64 + x.chunk  # gloo matches by tag; NCCL by order
        if send is not None and x.sends:
            self.kept.append(send)
            ops.append(dist.P2POp(dist.isend, send, self._peer[x.send_peer], self.group, tag))
        if x.receives:
            ops.append(
                dist.P2POp(
                    dist.irecv,
                    recv[x.recv_rows[0] : x.recv_rows[1]],
                    self._peer[x.recv_peer],
                    self.group,
                    tag,
                )
            )
        if not ops:
            return
        if not self.cuda:
            self.works[i] = dist.batch_isend_irecv(ops)
            return
        main = self.main
        if send is not None:  # combine: the piece was just computed on the caller's stream
            ready = self.events[-1]
            ready.record(main)
            self.side.wait_event(ready)
        with torch.cuda.stream(self.side):
            for work in dist.batch_isend_irecv(ops):
                work.wait()  # the side stream waits for the transfer
            self.events[i].record(self.side)
        self.works[i] = []

    def wait(self, i: int) -> None:
        if i not in self.works:
            return
        if self.cuda:
            self.main.wait_event(self.events[i])
        else:
            for work in self.works.pop(i):
                work.wait()

    def finish(self) -> None:
        if self.cuda:
            self.main.wait_stream(self.side)
        else:
            for i in list(self.works):
                self.wait(i)
        self.kept.clear()


class CopyEngineExchange(PieceExchange):
    """`copy_engine`: copies into the peers' symmetric buffers, signalled by stream writes."""

    owns_buffer = False

    def __init__(self, plan, group, device, width, dtype, contexts: MoeContexts, rows_needed: int) -> None:
        super().__init__(plan, group, device, width, dtype)
        from syncopate.kernels import streamops
        from syncopate.kernels.tables import ENTERED_BASE

        self._streamops, self._entered = streamops, ENTERED_BASE
        self.ctx = contexts.symmetric(group, plan.kind, width, dtype, rows_needed)
        self.epoch = self.ctx.begin_call()
        self.main = self.ctx.current_stream()
        self.push, self.arrive = self.ctx.fork(self.main, 2)
        self.events = self.ctx.kept_events(("moe", plan.kind), len(plan.exchanges) + 1)
        self.rows = self.ctx.buffers["rows"]
        self.row_bytes = width * torch.empty((), dtype=dtype).element_size()
        self.entered: set[int] = set()
        self.arrived: set[int] = set()
        for p in range(plan.world_size):  # this rank has entered the call: peers may write into it
            self.ctx.write_signal(self.push, p, ENTERED_BASE + self.ctx.rank, self.epoch)

    def word(self, source: int, chunk: int) -> int:
        """The pad word that says rank `source`'s chunk `chunk` has landed here."""
        return source * self.plan.chunks + chunk

    def buffer(self, rows: int) -> torch.Tensor:
        return self.rows.local[:rows]

    def post(self, i: int, send: torch.Tensor | None, recv: torch.Tensor) -> None:
        x, ctx, so = self.plan.exchanges[i], self.ctx, self._streamops
        if send is not None and x.sends:
            if x.send_at < 0:
                raise ConfigError(
                    "backend copy_engine writes rows where the peer keeps them, which takes every rank's "
                    "counts: make the layout with exchange_layout (or Routing.layout)"
                )
            ready = self.events[-1]
            ready.record(self.main)
            self.push.wait_event(ready)
            self.kept.append(send)
            if x.send_peer not in self.entered:  # the peer has read what the last call put there
                entered = ctx.signal_address(ctx.rank, self._entered + x.send_peer)
                so.wait_value(self.push.cuda_stream, entered, self.epoch)
                self.entered.add(x.send_peer)
            lo, hi = x.send_rows
            if not send.is_contiguous() or send.shape[0] != hi - lo:
                raise ValueError(
                    f"exchange {i} sends rows [{lo}, {hi}): got a tensor of shape {tuple(send.shape)}"
                )
            self._move(send, x.send_peer, x.send_at, self.word(ctx.rank, x.chunk))
        if x.receives:
            landed = ctx.signal_address(ctx.rank, self.word(x.recv_peer, x.chunk))
            so.wait_value(self.arrive.cuda_stream, landed, self.epoch)
            self.events[i].record(self.arrive)
            self.arrived.add(i)

    def _move(self, send: torch.Tensor, peer: int, row: int, word: int) -> None:
        """On the push stream: `send`'s rows into rank `peer`'s buffer from its row `row` on, then
        word `word` of its pad raised to the call's epoch."""
        self._streamops.copy_async(
            self.push.cuda_stream,
            self.rows.peer_ptrs[peer] + row * self.row_bytes,
            send.data_ptr(),
            send.shape[0] * self.row_bytes,
        )
        self.ctx.write_signal(self.push, peer, word, self.epoch)

    def wait(self, i: int) -> None:
        if i in self.arrived:
            self.main.wait_event(self.events[i])

    def copy_out(self, i: int, recv: torch.Tensor, into: torch.Tensor) -> None:
        """On the waiting side stream, right after the rows are in (copy engine, no SM)."""
        if i not in self.arrived:
            return
        lo, hi = self.plan.exchanges[i].recv_rows
        self.kept.append(into)
        self._streamops.copy_async(
            self.arrive.cuda_stream,
            into.data_ptr() + lo * self.row_bytes,
            recv.data_ptr() + lo * self.row_bytes,
            (hi - lo) * self.row_bytes,
        )

    def finish(self) -> None:
        self.ctx.join(self.main, [self.push, self.arrive])
        self.kept.clear()


_NVSHMEM_SEEN = False
"""Whether a context of this process has had NVSHMEM memory (the process check is then skipped)."""


class NvshmemExchange(CopyEngineExchange):
    """`nvshmem`: `copy_engine`'s exchange with each piece put by an NVSHMEM copier kernel."""

    def __init__(
        self, plan, group, device, width, dtype, contexts: MoeContexts, rows_needed: int, comm_sms: int
    ):
        from syncopate.kernels.backends import nvshmem_pes
        from syncopate.kernels.nvshmem_copy import launch_nvshmem_put, stage_nvshmem_put
        from syncopate.kernels.symmetric_memory import nvshmem_refusal, process_refusal

        global _NVSHMEM_SEEN
        if not _NVSHMEM_SEEN:  # before the call begins on any buffer; a process's memory stays
            why = process_refusal(instead="copy_engine")
            if why is not None:
                raise ConfigError(why)
        super().__init__(plan, group, device, width, dtype, contexts, rows_needed)
        why = nvshmem_refusal(self.ctx.memory, instead="copy_engine")  # ranks sharing a GPU
        if why is not None:
            raise ConfigError(why)
        _NVSHMEM_SEEN = True
        self._put, self.comm_sms = launch_nvshmem_put, comm_sms
        stage_nvshmem_put(self.ctx, self.push, dtype, comm_sms)  # before the call enqueues a wait
        self.pes = nvshmem_pes(self.ctx)[0]

    def _move(self, send: torch.Tensor, peer: int, row: int, word: int) -> None:
        self._put(
            self.ctx,
            self.push,
            send,
            self.rows.peer_ptrs[self.ctx.rank] + row * self.row_bytes,
            peer,
            self.pes[peer],
            word,
            self.epoch,
            self.comm_sms,
        )


def _capacity(rows: int) -> int:
    """Rows a symmetric buffer is made for: the next power of two (at least 1024), so that routings
    whose largest receive varies a little share one buffer."""
    return max(1024, 1 << max(0, rows - 1).bit_length())


class MoeContexts:
    """Per process: the side stream and events of the `nccl` exchanges per device, and the
    symmetric contexts of the `copy_engine` ones per (group, kind, width, dtype), each made for
    as many rows as the largest receive so far needed (all ranks know it from the layout's counts,
    so all make a new one at the same call). `close()` releases them."""

    def __init__(self) -> None:
        self._streams: dict = {}
        self._contexts: dict = {}
        self._lock = threading.Lock()

    def side_stream(self, device: torch.device, events: int) -> tuple[torch.cuda.Stream, list]:
        with self._lock:
            stream, pool = self._streams.get(device.index, (None, []))
            if stream is None:
                stream = torch.cuda.Stream(device=device)
            if len(pool) < events:
                pool = pool + [torch.cuda.Event() for _ in range(events - len(pool))]
            self._streams[device.index] = (stream, pool)
            return stream, pool

    def symmetric(self, group, kind: str, width: int, dtype: torch.dtype, rows: int):
        from syncopate.kernels.context import OverlapContext

        key = (group.group_name, kind, width, dtype)
        ctx = self._contexts.get(key)
        if ctx is not None and not ctx.closed and ctx.buffers["rows"].local.shape[0] >= rows:
            return ctx
        if ctx is not None:
            ctx.close()
        capacity = _capacity(rows)
        log.debug("MoE %s context for %d rows of width %d (%s)", kind, capacity, width, dtype)
        ctx = OverlapContext.create(group, {"rows": ((capacity, width), dtype)}, num_streams=2)
        self._contexts[key] = ctx
        return ctx

    def of(self, group) -> list:
        """The open symmetric contexts of `group`."""
        return [c for k, c in self._contexts.items() if k[0] == group.group_name and not c.closed]

    def close(self, group=None) -> None:
        """Release the symmetric contexts (of `group`, or all) and the side streams (collective for
        the contexts: every rank of a group closes them together)."""
        for key in list(self._contexts):
            if group is None or key[0] == group.group_name:
                self._contexts.pop(key).close()
        if group is None:
            self._streams.clear()


class _JobBound(threading.local):
    limit = 0


job_bound = _JobBound()
"""`limit`: the spin limit SYNCOPATE_SPIN_LIMIT sets the fused kernels of this thread's MoE call in
flight (`syncopate.moe.ops`), 0 outside one."""

CONTEXTS = MoeContexts()
"""The process's MoE contexts (`close_moe_contexts` releases them)."""


def close_moe_contexts(group=None) -> None:
    """Release the pipelined MoE ops' symmetric buffers and streams (of `group`, or all)."""
    CONTEXTS.close(group)


def owns_buffer(backend: str) -> bool:
    """Whether the rows a call of `backend` receives are its own (else the context's buffer, which
    the next call of the same kind overwrites)."""
    return {"nccl": P2PExchange, "copy_engine": CopyEngineExchange, "nvshmem": NvshmemExchange}[
        backend
    ].owns_buffer


def cuda_only(backend: str, device: torch.device) -> str:
    """Why backend `backend` (`copy_engine`, `nvshmem`) cannot move rows of tensors on `device`."""
    how = "copies rows" if backend == "copy_engine" else "puts rows"
    return (
        f"backend {backend} {how} into CUDA symmetric memory: it needs CUDA tensors, got tensors on "
        f"{device.type}; use backend 'nccl' there"
    )


def open_exchange(
    backend: str,
    plan: PiecePlan,
    group,
    device: torch.device,
    width: int,
    dtype: torch.dtype,
    rows_needed: int,
    comm_sms: int = 16,
) -> PieceExchange:
    """The exchange of one call; `rows_needed`, the most rows any rank receives in it (the symmetric
    buffers' backends), `comm_sms` the copier's programs (`nvshmem`)."""
    if backend == "nccl":
        return P2PExchange(plan, group, device, width, dtype, CONTEXTS)
    if backend in ("copy_engine", "nvshmem") and device.type != "cuda":
        raise ConfigError(cuda_only(backend, device))
    if backend == "copy_engine":
        return CopyEngineExchange(plan, group, device, width, dtype, CONTEXTS, rows_needed)
    if backend == "nvshmem":
        return NvshmemExchange(plan, group, device, width, dtype, CONTEXTS, rows_needed, comm_sms)
    raise ConfigError(f"unknown MoE backend {backend!r}: accepted are {', '.join(MOE_BACKENDS)}")
