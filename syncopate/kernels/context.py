"""Runtime state of the fused ops: symmetric buffers, signal pads, side streams and the call epoch.

A context belongs to one process group and one set of buffer shapes. It is made by a factory
(`OverlapContext.create`, or the per-op caches in `syncopate.kernels.ops`), used by every call with
those shapes, and closed explicitly. Each call takes the next epoch with `begin_call()`; signals
only grow, so no call resets anything. A call captured in a CUDA graph is the exception: its
replays repeat the epoch it was captured with, so it takes GRAPH_EPOCH and starts by clearing the
pads, with the group met before and after (`graph_entry_kernel`). Symmetric memory comes from torch's
`torch.distributed._symmetric_memory` (its CUDA backend, or NVSHMEM where the process opted in:
`syncopate.kernels.symmetric_memory`); every rank maps every peer's buffers.
Ranks that share one GPU (two processes on a one-GPU machine, to check the ops with transfers
between processes; nothing overlaps there) exchange their buffers through CUDA IPC instead, which
torch's symmetric memory refuses for overlapping devices.
"""

from __future__ import annotations

import logging
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from syncopate.errors import CandidateTimeoutError, RuntimeUnavailableError
from syncopate.kernels.tables import PAD_WORDS, pad_word_meaning

__all__ = [
    "GRAPH_EPOCH",
    "IpcHandle",
    "OverlapContext",
    "SymmetricBuffer",
    "kept_allocations",
    "ranks_share_a_device",
    "record",
    "wait",
]

log = logging.getLogger(__name__)


GRAPH_EPOCH = 1
"""The epoch of every call captured in a CUDA graph (its pads cleared first)."""

_EVENT = getattr(torch._C, "_CudaEventBase", None)
_RECORD = getattr(_EVENT, "record", None)
_WAIT = getattr(_EVENT, "wait", None)


def record(event: torch.cuda.Event, stream: torch.cuda.Stream) -> None:
    """`event.record(stream)`, called below torch's Python wrapper: a call records and waits on a
    dozen events, and the wrappers' frames cost as much host time as the driver calls."""
    if _RECORD is None:
        event.record(stream)
    else:
        _RECORD(event, stream)


def wait(stream: torch.cuda.Stream, event: torch.cuda.Event) -> None:
    """`stream.wait_event(event)`, called below torch's Python wrappers (see `record`)."""
    if _WAIT is None:
        stream.wait_event(event)
    else:
        _WAIT(event, stream)


_SHARED_WARNED: set[str] = set()
"""Groups whose ranks share a GPU, said once a process."""


def kept_allocations(fn, device: torch.device | None, sync: bool = True):
    """fn()'s result, with what it allocates on `device` (a context, its tables) taken from the
    caching allocator's own pool.

    torch.compile's CUDA graphs (`mode="reduce-overhead"`) run a model's first calls with every
    allocation of the calling thread routed to the graph's private pool, and fail where a tensor
    allocated there outlives the call without being one of its outputs: what a first call keeps for
    the next ones would be. Those allocations are made on a helper thread, outside that routing,
    and with `sync` the device is synchronized there (for work fn enqueued on the helper's own
    stream; without it, fn orders its work on the streams it names). Under a CUDA graph capture
    (where allocating from another thread is refused) and off CUDA, fn runs here."""
    if device is None or device.type != "cuda" or torch.cuda.is_current_stream_capturing():
        return fn()
    done: dict[str, Any] = {}

    def run() -> None:
        try:
            with torch.cuda.device(device):
                done["value"] = fn()
                if sync:
                    torch.cuda.synchronize(device)
        except BaseException as e:  # noqa: BLE001 — raised again on the caller's thread
            done["error"] = e

    helper = threading.Thread(target=run, name="syncopate-allocations")
    helper.start()
    helper.join()
    if "error" in done:
        raise done["error"]
    return done["value"]


def enable_symm_mem(group_name: str) -> None:
    """Enable symmetric memory for a group on torch versions that need it (newer ones do it by
    themselves and warn that the call is deprecated: that warning is not shown)."""
    symm_mem = _symm_mem()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        try:
            symm_mem.enable_symm_mem_for_group(group_name)
        except Exception:  # a torch without it, or with every group already enabled
            pass


def _symm_mem():
    try:
        import torch.distributed._symmetric_memory as symm_mem
    except ImportError:
        raise RuntimeUnavailableError(
            f"torch {torch.__version__} has no symmetric memory; Syncopate's fused ops need torch >= 2.5 with CUDA"
        ) from None
    return symm_mem


@dataclass
class SymmetricBuffer:
    """A tensor in symmetric memory with the base address of every rank's copy."""

    local: torch.Tensor
    peer_ptrs: list[int]
    handle: Any

    def peer_view(self, rank: int) -> torch.Tensor:
        """This buffer as seen on `rank` (a tensor on the local device aliasing the peer's memory)."""
        return self.handle.get_buffer(rank, tuple(self.local.shape), self.local.dtype)


class IpcHandle:
    """The part of torch's symmetric-memory handle the ops use, for a buffer every rank of the group
    opened through CUDA IPC: ranks on one GPU, where torch's allocator refuses the rendezvous."""

    def __init__(self, views: list[torch.Tensor]):
        self.views = views
        self.buffer_ptrs = [v.data_ptr() for v in views]

    def get_buffer(self, rank: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return self.views[rank].view(dtype).view(shape)

    @classmethod
    def exchange(cls, local: torch.Tensor, group) -> IpcHandle:
        """Every rank's `local` opened in this process (collective over `group`)."""
        from torch.multiprocessing.reductions import reduce_tensor

        rank = dist.get_rank(group)
        shared = [None] * dist.get_world_size(group)
        dist.all_gather_object(shared, reduce_tensor(local), group=group)
        return cls([local if r == rank else rebuild(*args) for r, (rebuild, args) in enumerate(shared)])


def ranks_share_a_device(group, device: torch.device) -> bool:
    """Whether two ranks of `group` run on one GPU (collective: compares the devices' UUIDs)."""
    uuid = str(getattr(torch.cuda.get_device_properties(device), "uuid", device))
    uuids = [None] * dist.get_world_size(group)
    dist.all_gather_object(uuids, uuid, group=group)
    return len(set(uuids)) < len(uuids)


@dataclass
class Timeline:
    """Events the copy-engine backend records on its side streams, one pair per chunk it moves:
    once the chunk's wait passed (it is ready and the stream is free), and once its copy is done;
    the stationary templates add their GEMMs (from when their inputs are there to their end).
    Events come from a pool made beforehand, since creating one between the kernel's launch and its
    communication could synchronize. `marks` holds (label, chunk, rows, ready event, done event)."""

    pool: list
    marks: list = field(default_factory=list)

    @classmethod
    def make(cls, events: int = 256) -> Timeline:
        return cls(pool=[torch.cuda.Event(enable_timing=True) for _ in range(events)])

    def record(self, stream: torch.cuda.Stream):
        """An event of the pool recorded on `stream` now (None when the pool is spent)."""
        if not self.pool:
            return None
        event = self.pool.pop()
        event.record(stream)
        return event

    def mark(self, label: str, chunk, rows: int, ready, done) -> None:
        self.marks.append((label, chunk, rows, ready, done))

    def times_us(self, start) -> list[tuple[str, Any, int, float, float]]:
        """(label, chunk, rows, ready µs, done µs) after `start` (an event recorded before the call)."""
        return [
            (label, chunk, rows, start.elapsed_time(r) * 1e3, start.elapsed_time(d) * 1e3)
            for label, chunk, rows, r, d in self.marks
            if r is not None and d is not None
        ]


@dataclass
class OverlapContext:
    """Symmetric buffers, the signal pad, counters, side streams and the epoch of one group."""

    group: Any
    rank: int
    world_size: int
    device: torch.device
    buffers: dict[str, SymmetricBuffer]
    signals: SymmetricBuffer
    counters: torch.Tensor
    error: torch.Tensor
    streams: list[torch.cuda.Stream]
    peer_signal_ptrs: torch.Tensor
    sm_count: int
    epoch: int = 0
    closed: bool = False
    cache: dict = field(default_factory=dict)
    """Per-context caches of the ops: device tables per candidate, the send buffer."""
    remote_writes: bool = True
    """Whether a stream can write a peer's signal word directly; else through a local word and a copy."""
    sm_pulls: bool = True
    """Whether a kernel may wait on the SMs for a peer: every rank has a GPU of its own. Where ranks
    share one, a kernel spinning for a peer could hold the SMs that peer's GEMM needs."""
    scratch: torch.Tensor | None = None
    timeline: Timeline | None = None
    """When set, the copy-engine backend records an event around each chunk it moves (diagnostics)."""
    memory: str = "cuda"
    """What backs the buffers: `cuda` (torch's CUDA symmetric memory), `nvshmem` (NVSHMEM's, where
    the process opted in) or `ipc` (ranks sharing a GPU)."""
    _events: list = field(default_factory=list)
    """`fork`'s event, then `join`'s, one a side stream."""
    _callers: dict = field(default_factory=dict)
    """`current_stream`'s Stream objects by stream handle."""
    _kept: dict = field(default_factory=dict)
    """`kept_events`' events and `write_signal`'s programs, by key."""

    def __post_init__(self) -> None:
        if not self._events:
            self._events = [torch.cuda.Event() for _ in range(1 + len(self.streams))]

    @classmethod
    def create(
        cls, group, buffers: dict[str, tuple[tuple[int, ...], torch.dtype]], num_streams: int = 3
    ) -> OverlapContext:
        """Allocate the named symmetric buffers and a signal pad on every rank of `group` (collective)."""
        if not torch.cuda.is_available():
            raise RuntimeUnavailableError("the fused ops need a CUDA GPU; none is visible")
        symm_mem = _symm_mem()
        group = group or dist.group.WORLD
        device = torch.device("cuda", torch.cuda.current_device())
        name = group.group_name
        shared_device = dist.get_world_size(group) > 1 and ranks_share_a_device(group, device)
        if shared_device:
            if name not in _SHARED_WARNED:
                _SHARED_WARNED.add(name)
                log.warning(
                    "ranks of group %s share a GPU: buffers go through CUDA IPC; the ops are "
                    "correct there but nothing overlaps (one rank a GPU for speed)",
                    name,
                )
        else:
            from syncopate.kernels.symmetric_memory import apply_requested

            apply_requested()  # SYNCOPATE_SYMMETRIC_MEMORY, before this process's first allocation
            enable_symm_mem(name)

        def alloc(shape, dtype) -> SymmetricBuffer:
            if shared_device:
                t = torch.empty(shape, dtype=dtype, device=device)
                h = IpcHandle.exchange(t, group)
                return SymmetricBuffer(local=t, peer_ptrs=list(h.buffer_ptrs), handle=h)
            t = symm_mem.empty(shape, dtype=dtype, device=device)
            h = symm_mem.rendezvous(t, group=name)
            return SymmetricBuffer(local=t, peer_ptrs=list(h.buffer_ptrs), handle=h)

        bufs = {k: alloc(shape, dtype) for k, (shape, dtype) in buffers.items()}
        signals = alloc((PAD_WORDS,), torch.int32)
        signals.local.zero_()
        torch.cuda.synchronize()
        dist.barrier(group=group)
        ctx = cls(
            group=group,
            rank=dist.get_rank(group),
            world_size=dist.get_world_size(group),
            device=device,
            buffers=bufs,
            signals=signals,
            counters=torch.zeros(4096, dtype=torch.int64, device=device),
            error=torch.zeros(1, dtype=torch.int32, device=device),
            streams=[torch.cuda.Stream(device=device) for _ in range(num_streams)],
            peer_signal_ptrs=torch.tensor(signals.peer_ptrs, dtype=torch.int64, device=device),
            sm_count=torch.cuda.get_device_properties(device).multi_processor_count,
        )
        ctx.scratch = torch.zeros(64, dtype=torch.int32, device=device)
        ctx.sm_pulls = not shared_device
        if shared_device:
            ctx.memory = "ipc"
        else:
            from syncopate.kernels.symmetric_memory import process_memory

            ctx.memory = process_memory()
        ctx.remote_writes = ctx._probe_remote_writes()
        ctx._enter_graph_call(None)  # compiled and loaded here, never first under a capture
        torch.cuda.synchronize(device)
        log.debug(
            "context on rank %d: buffers %s, remote stream writes %s",
            ctx.rank,
            {k: tuple(v.local.shape) for k, v in bufs.items()},
            ctx.remote_writes,
        )
        return ctx

    def _probe_remote_writes(self) -> bool:
        """Try one stream write into the next rank's pad (a word nobody reads) and see if it works."""
        from syncopate.kernels import streamops

        if self.world_size == 1:
            return True
        peer = (self.rank + 1) % self.world_size
        try:
            streamops.write_value(self.streams[0].cuda_stream, self.signal_address(peer, PAD_WORDS - 1), 0)
            self.streams[0].synchronize()
            return True
        except Exception as e:
            log.info("stream writes to peer memory fail here (%s); signals go through a copy", e)
            return False

    def write_signal(self, stream: torch.cuda.Stream, rank: int, word: int, value: int) -> None:
        """Enqueue on `stream` (one of this context's) a write of `value` into `rank`'s pad word
        (a program recorded once per stream, rank and word)."""
        from syncopate.kernels import streamops

        streamops.kept_program(
            self._kept,
            ("signal", stream.cuda_stream, rank, word),
            lambda program: self.raise_signal(program, stream, rank, word),
        ).run(value)

    def kept_events(self, key, count: int) -> list[torch.cuda.Event]:
        """`count` events kept under `key` for a call's hand-overs between streams, recorded again by
        every call (as `fork`'s): a stream's wait is on what the event had recorded when the wait
        was enqueued, so a call may record an event its previous call's waits were enqueued on."""
        events = self._kept.get(("events", key))
        if events is None or len(events) < count:
            events = self._kept[("events", key)] = [torch.cuda.Event() for _ in range(count)]
        return events

    def raise_signal(self, program, stream: torch.cuda.Stream, rank: int, word: int) -> None:
        """Record in `program` (a `streamops.Program`) the write of the epoch into `rank`'s pad word
        on `stream` (one of this context's): a stream write, or where a stream cannot write a
        peer's memory, a write of a local word and a copy of it."""
        address = self.signal_address(rank, word)
        if rank == self.rank or self.remote_writes:
            program.write(stream, address)
            return
        slot = self.scratch.data_ptr() + 4 * self.streams.index(stream)
        program.write(stream, slot)
        program.copy(stream, address, slot, 4)

    def begin_call(self, captured_on: torch.cuda.Stream | None = None) -> int:
        """Take the epoch of the next call (1, 2, …); every rank makes the same calls in the same order.

        A call being captured in a CUDA graph on stream `captured_on` (the caller knows: the ops ask
        once a call) takes GRAPH_EPOCH instead, after a start that clears the pad on every rank
        (`graph_entry_kernel`); the epochs of calls outside a graph stay above it, so a word a
        replay raised never passes their waits."""
        if self.closed:
            raise RuntimeError("this context was closed; make a new one")
        if captured_on is not None:
            self._enter_graph_call(captured_on)
            self.epoch = max(self.epoch, GRAPH_EPOCH)
            return GRAPH_EPOCH
        self.epoch += 1
        return self.epoch

    def _enter_graph_call(self, stream: torch.cuda.Stream | None) -> None:
        from syncopate.kernels.launch import launch_graph_entry

        launch_graph_entry(self, stream)

    def signal_address(self, rank: int, word: int) -> int:
        """Address of int32 word `word` of `rank`'s signal pad, mapped in this process."""
        return self.signals.peer_ptrs[rank] + 4 * word

    def fork(
        self, main: torch.cuda.Stream, streams: int | list[torch.cuda.Stream]
    ) -> list[torch.cuda.Stream]:
        """Make side streams wait for everything enqueued on `main` so far: the first `streams` of
        this context's, or those given. The context's own events are recorded again each call
        rather than made anew, since making an event costs the host more than recording one: a wait
        is on the work the event had recorded when the wait was enqueued."""
        if isinstance(streams, int):
            streams = self.streams[:streams]
        event = self._events[0]
        record(event, main)
        for s in streams:
            wait(s, event)
        return streams

    def join(self, main: torch.cuda.Stream, streams: list[torch.cuda.Stream]) -> None:
        """Make `main` wait for the work enqueued on `streams` (side streams of this context's)."""
        events = self._events
        for i, s in enumerate(streams):
            event = events[1 + (i if self.streams[i] is s else self._stream_index(s))]
            record(event, s)
            wait(main, event)

    def _stream_index(self, stream: torch.cuda.Stream) -> int:
        for i, s in enumerate(self.streams):
            if s is stream or s.cuda_stream == stream.cuda_stream:
                return i
        raise ValueError(f"stream {stream} is not one of this context's")

    def stamp(self, stream: torch.cuda.Stream):
        """With the timeline on: an event recorded on `stream` now, the start of a `span`; else None."""
        return self.timeline.record(stream) if self.timeline is not None else None

    def span(self, label: str, chunk, rows: int, stream: torch.cuda.Stream, start) -> None:
        """With the timeline on: mark what `stream` did from `start` (a `stamp`) to now."""
        if self.timeline is not None:
            self.timeline.mark(label, chunk, rows, start, self.timeline.record(stream))

    def current_stream(self) -> torch.cuda.Stream:
        """The caller's current stream on this context's device. torch.cuda.current_stream() makes a
        new Stream object each call, a cost a call's host time feels (`benchmarks/op_host.py`); the
        raw handle is cheap to ask for, and one Stream object is kept per handle."""
        raw = torch._C._cuda_getCurrentRawStream(self.device.index)
        stream = self._callers.get(raw)
        if stream is None:
            if len(self._callers) >= 16:
                self._callers.clear()
            stream = self._callers[raw] = torch.cuda.current_stream(self.device)
        return stream

    def check_error(self) -> None:
        """Raise CandidateTimeoutError if a bounded wait ran out, naming the word it waited for
        (synchronises the device)."""
        code = int(self.error.item())
        if code:
            self.error.zero_()
            raise CandidateTimeoutError(
                f"a fused kernel waited longer than its spin limit for {self.waited_for(code)}"
            )

    def waited_for(self, code: int) -> str:
        """The word a timed-out wait stood on, from the error word's `code` (the low 32 bits of the
        word's address with the lowest bit set: `_timed_out` in triton_kernels.py): which rank's
        signal pad, which word and what it holds, what it reads now, and this rank's epoch."""
        low = code & 0xFFFFFFFE
        if code & 1 and low:
            found = _pad_word(self.signals, low, 0xFFFFFFFF)
            if found is not None:
                rank, word = found
                now = int(self.signals.peer_view(rank).view(torch.int32).view(-1)[word].item())
                return _said_of_word(rank, word, now, self.epoch, self.rank)
            for key, kept in self.cache.items():
                if isinstance(key, tuple) and key[:1] == ("tail",):
                    flags = kept[1]
                    offset = (low - flags.data_ptr()) & 0xFFFFFFFF
                    if offset < 4 * flags.numel():
                        return (
                            f"word {offset // 4} of the last wave's part words (a tile of the last "
                            f"wave cut in K: the program summing its parts waits for the others, "
                            f"which were waiting for a chunk themselves)"
                        )
            return f"a word at an address ending 0x{low:08x}, in no signal pad of this context"
        return "a chunk that never arrived"

    def release_waits(self, waits: list[tuple[int, int]]) -> list[str]:
        """The stream waits of `waits` (address, value: `streamops.watching`) whose word is still
        below its value, each named as `waited_for` names a word, and released: the value written
        to the word, so that the streams waiting on it go on (a late writer writes the same value
        again). Reads and writes go on a fresh stream, past any stream held by a wait."""
        from syncopate.kernels import streamops

        words = _waited_words(self.signals, waits)
        if not words:
            return []
        stream = torch.cuda.Stream(self.device)
        now = torch.empty(len(words), dtype=torch.int32, pin_memory=True)
        with torch.cuda.stream(stream):  # a pageable copy or .item() could queue behind a held stream
            for i, (_, rank, word) in enumerate(words.values()):
                pad = self.signals.peer_view(rank).view(torch.int32).view(-1)
                now[i : i + 1].copy_(pad[word : word + 1], non_blocking=True)
        stream.synchronize()
        said = []
        for (address, (value, rank, word)), read in zip(words.items(), now.tolist()):
            if ((read - value) & 0xFFFFFFFF) < 1 << 31:  # (int32)(read - value) >= 0: not held
                continue
            said.append(_said_of_word(rank, word, read, value, self.rank))
            streamops.write_value(stream.cuda_stream, address, value)
        stream.synchronize()
        return said

    def close(self) -> None:
        """Release the buffers (collective: every rank closes its context)."""
        if self.closed:
            return
        torch.cuda.synchronize(self.device)
        self.buffers.clear()
        self.cache.clear()
        self._kept.clear()
        self.closed = True


def _waited_words(signals, waits: list[tuple[int, int]]) -> dict[int, tuple[int, int, int]]:
    """{address: (value, rank, word)} of the signal-pad words of `signals` that `waits` (address,
    value) wait on, each with the latest value waited for (int32 order, wrapping): where several
    calls wait on one word (epochs e, e + 1, …), writing the latest releases them all."""
    words: dict[int, tuple[int, int, int]] = {}
    for address, value in waits:
        found = _pad_word(signals, address, (1 << 64) - 1)
        if found is None:
            continue
        kept = words.get(address)
        if kept is None or ((value - kept[0]) & 0xFFFFFFFF) < 1 << 31:
            words[address] = (value, *found)
    return words


def _pad_word(signals, address: int, mask: int) -> tuple[int, int] | None:
    """(rank, word) of the signal-pad word at `address` (compared under `mask`), or None."""
    for rank, base in enumerate(signals.peer_ptrs):
        offset = (address - base) & mask
        if offset < 4 * PAD_WORDS:
            return rank, offset // 4
    return None


def _said_of_word(rank: int, word: int, now: int, epoch: int, own_rank: int) -> str:
    """Word `word` of rank `rank`'s pad, reading `now`, as a wait of rank `own_rank` for `epoch`
    names it."""
    late = (
        "its writer has not reached this call"
        if ((now - epoch) & 0xFFFFFFFF) >= 1 << 31
        else "it has come up since: its writer was late, not absent"
    )
    return (
        f"word {word} of rank {rank}'s signal pad ({pad_word_meaning(word)}), which reads {now} "
        f"now against rank {own_rank}'s epoch {epoch} ({late})"
    )
