"""The `nvshmem` backend's copier: the SM copier's job lists, moved with NVSHMEM device calls.

Shape symbols

| symbol | meaning                                                                 |
|--------|-------------------------------------------------------------------------|
| J      | jobs of one call (a chunk each), run in order by every program          |
| P      | programs (`comm_sms`); each moves a contiguous share of every job       |
| S      | a job's share: ceil(elems / P) rounded up to BLOCK elements             |

A job names its remote side by its *local* symmetric address (the same offset in this rank's own
buffer) and the remote PE, as NVSHMEM takes them: a push (`PUSH`) puts from any local memory to the
PE's buffer (`nvshmemx_putmem_block`), a pull (`PULL`: an all-reduce's reduced chunk) gets from the
PE's buffer (`nvshmemx_getmem_block`), a job within this rank (`LOCAL`) is a plain copy. Each
program quiets its transfers (`nvshmem_quiet`: complete at the target) before it counts itself in
the job (acquire-release), so the last program to count knows every share is there; it then
fences and raises the receiver's int32 signal word with `nvshmem_int_p`. The pads hold int32 words
that the fused kernels poll: NVSHMEM's signal operations write 64-bit words and would clobber the
neighbouring slot; one 4-byte put after a fence writes exactly the word, ordered after the data
(the quiets completed it), and reaches the word whatever NVSHMEM transport serves the PE.

`NVSHMEM=False` runs the same body with plain loads and stores through the same address arithmetic:
the remote side's peer-mapped address is its local one plus the job's `delta`, and the signal a
release store into the peer's pad, as `chunk_copy_kernel` does. The interpreter tests run that
mode on the CPU (the job split, the address translation, the counters); only the CUDA build takes
the NVSHMEM calls, linked against `libnvshmem_device.bc` by torch's `requires_nvshmem`, applied
when the kernel is first launched (it looks for the library, absent where no GPU is).
"""

from __future__ import annotations

import contextlib
import functools

import torch
import triton
import triton.language as tl
from triton.language import core

from syncopate.kernels.launch import (
    COPY_BLOCK,
    COPY_COUNTER_BASE,
    TL_DTYPES,
    compiled_for_gpu,
    copy_job_tables,
    run_kept,
)
from syncopate.kernels.tables import ENTERED_BASE
from syncopate.kernels.triton_kernels import _wait_at_least

__all__ = [
    "LOCAL",
    "NVSHMEM_WARPS",
    "PULL",
    "PUSH",
    "launch_nvshmem_copy",
    "launch_nvshmem_put",
    "stage_nvshmem_put",
    "nvshmem_copy_kernel",
    "nvshmem_put_kernel",
    "stage_nvshmem_copy",
]

LOCAL, PUSH, PULL = 0, 1, 2
"""Job kinds: both sides in this rank's memory; the destination on the job's PE; the source there."""
_LOCAL, _PUSH, _PULL = tl.constexpr(LOCAL), tl.constexpr(PUSH), tl.constexpr(PULL)

NVSHMEM_WARPS = 16
"""Warps of a copier program: a block-scoped put moves its share with every thread of the block."""


@core.extern
def _putmem_block(dest, source, size_bytes, pe, _semantic=None):
    """`nvshmemx_putmem_block(dest, source, bytes, pe)`: every thread of the program, one put."""
    return core.extern_elementwise(
        "",
        "",
        [dest, source, size_bytes, pe],
        {
            (core.dtype("int64"), core.dtype("int64"), core.dtype("int64"), core.dtype("int32")): (
                "nvshmemx_putmem_block",
                core.dtype("int32"),
            )
        },
        is_pure=False,
        _semantic=_semantic,
    )


@core.extern
def _getmem_block(dest, source, size_bytes, pe, _semantic=None):
    """`nvshmemx_getmem_block(dest, source, bytes, pe)`: returns once the data is here."""
    return core.extern_elementwise(
        "",
        "",
        [dest, source, size_bytes, pe],
        {
            (core.dtype("int64"), core.dtype("int64"), core.dtype("int64"), core.dtype("int32")): (
                "nvshmemx_getmem_block",
                core.dtype("int32"),
            )
        },
        is_pure=False,
        _semantic=_semantic,
    )


@core.extern
def _int_p(dest, value, pe, _semantic=None):
    """`nvshmem_int_p(dest, value, pe)`: one int32 put to the word at local symmetric address `dest`."""
    return core.extern_elementwise(
        "",
        "",
        [dest, value, pe],
        {
            (core.dtype("int64"), core.dtype("int32"), core.dtype("int32")): (
                "nvshmem_int_p",
                core.dtype("int32"),
            )
        },
        is_pure=False,
        _semantic=_semantic,
    )


@core.extern
def _quiet(_semantic=None):
    """`nvshmem_quiet()`: this thread's puts are complete at their targets."""
    return core.extern_elementwise(
        "", "", [], {(): ("nvshmem_quiet", core.dtype("int32"))}, is_pure=False, _semantic=_semantic
    )


@core.extern
def _fence(_semantic=None):
    """`nvshmem_fence()`: this thread's earlier puts to a PE are ordered before its later ones."""
    return core.extern_elementwise(
        "", "", [], {(): ("nvshmem_fence", core.dtype("int32"))}, is_pure=False, _semantic=_semantic
    )


@triton.jit
def _copy_range(src, dst, lo, hi, ELEM: tl.constexpr, BLOCK: tl.constexpr):
    """Elements [lo, hi) of ELEM from address `src` to address `dst` by plain loads and stores."""
    s = src.to(tl.pointer_type(ELEM))
    d = dst.to(tl.pointer_type(ELEM))
    offs = tl.arange(0, BLOCK)
    for start in range(lo, hi, BLOCK):
        idx = start + offs
        ok = idx < hi
        tl.store(d + idx, tl.load(s + idx, mask=ok), mask=ok)


@triton.jit(do_not_specialize=["epoch", "NUM_JOBS"])
def nvshmem_copy_kernel(
    job_src_ptr,
    job_dst_ptr,
    job_elems_ptr,
    job_delta_ptr,
    job_wait_ptr,
    job_signal_ptr,
    job_peer_ptr,
    job_pe_ptr,
    job_kind_ptr,
    NUM_JOBS,
    local_signal_ptr,
    peer_signal_ptrs,
    peer_pes_ptr,
    free_ptr,
    counter_ptr,
    epoch,
    error_ptr,
    NUM_PROGRAMS: tl.constexpr,
    BLOCK: tl.constexpr,
    ELEM: tl.constexpr,
    ELEM_BYTES: tl.constexpr,
    MAX_SPIN: tl.constexpr,
    NVSHMEM: tl.constexpr,
):
    """Job j moves `job_elems[j]` elements of ELEM from `job_src[j]` to `job_dst[j]` once
    `free[job_peer[j]] >= epoch` (the peer has entered this call) and, unless `job_wait[j]` is -1,
    `local_signal[job_wait[j]] >= epoch` (the chunk is ready here). The remote side of a PUSH
    (destination) or PULL (source) is given by its local symmetric address, on PE `job_pe[j]`;
    plain mode reaches it at that address plus `job_delta[j]`. Program p moves elements
    [p*S, (p+1)*S) of the job, counts itself in `counter[j]` once its share is complete at the
    destination, and the last program resets the counter and, unless `job_signal[j]` is -1, sets
    word `job_signal[j]` of peer `job_peer[j]`'s pad to `epoch` (on PE `peer_pes[job_peer[j]]`).
    Jobs run in order, as the SM copier's."""
    pid = tl.program_id(0)
    for j in range(0, NUM_JOBS):
        peer = tl.load(job_peer_ptr + j)
        _wait_at_least(free_ptr + peer, epoch, error_ptr, MAX_SPIN)
        wait_slot = tl.load(job_wait_ptr + j)
        if wait_slot >= 0:
            _wait_at_least(local_signal_ptr + wait_slot, epoch, error_ptr, MAX_SPIN)
        src = tl.load(job_src_ptr + j)
        dst = tl.load(job_dst_ptr + j)
        n = tl.load(job_elems_ptr + j)
        kind = tl.load(job_kind_ptr + j)
        pe = tl.load(job_pe_ptr + j)
        delta = tl.load(job_delta_ptr + j)
        _move_share(src, dst, n, delta, kind, pe, pid, NUM_PROGRAMS, BLOCK, ELEM, ELEM_BYTES, NVSHMEM)
        signal = tl.load(job_signal_ptr + j)
        peer_pad = tl.load(peer_signal_ptrs + peer)
        _count_then_signal(
            counter_ptr + j,
            signal,
            local_signal_ptr.to(tl.int64),
            peer_pad,
            tl.load(peer_pes_ptr + peer),
            epoch,
            NUM_PROGRAMS,
            NVSHMEM,
        )


@triton.jit
def _move_share(src, dst, n, delta, kind, pe, pid, NUM_PROGRAMS, BLOCK, ELEM, ELEM_BYTES, NVSHMEM):
    """Program `pid`'s contiguous share of a job of `n` elements from `src` to `dst` (the remote
    side, by kind, at its local symmetric address on PE `pe`; plain mode: at that plus `delta`),
    complete at the destination when it returns."""
    share = (n + NUM_PROGRAMS - 1) // NUM_PROGRAMS
    share = (share + BLOCK - 1) // BLOCK * BLOCK
    lo = tl.minimum(pid * share, n)
    hi = tl.minimum(lo + share, n)
    if NVSHMEM:
        if hi > lo:
            if kind == _LOCAL:
                _copy_range(src, dst, lo, hi, ELEM, BLOCK)
            else:
                offset = lo.to(tl.int64) * ELEM_BYTES  # NVSHMEM takes 64-bit sizes
                nbytes = (hi - lo).to(tl.int64) * ELEM_BYTES
                if kind == _PUSH:
                    _putmem_block(dst + offset, src + offset, nbytes, pe)
                else:
                    _getmem_block(dst + offset, src + offset, nbytes, pe)
        _quiet()
    else:
        src += delta * (kind == _PULL).to(tl.int64)
        dst += delta * (kind == _PUSH).to(tl.int64)
        if hi > lo:
            _copy_range(src, dst, lo, hi, ELEM, BLOCK)


@triton.jit
def _count_then_signal(counter, signal, local_pad, peer_pad, peer_pe, epoch, NUM_PROGRAMS, NVSHMEM):
    """Count this program in the job's `counter`; the last one resets it and, unless `signal` is
    -1, sets word `signal` of the receiver's pad to `epoch`: an NVSHMEM put to the word at its local
    symmetric address (`local_pad`, int64) on PE `peer_pe`, or a release store at the receiver's
    peer-mapped pad `peer_pad` (int64) in plain mode."""
    done = tl.atomic_add(counter, 1, sem="acq_rel", scope="sys") + 1
    if done == NUM_PROGRAMS:
        tl.atomic_xchg(counter, 0, sem="relaxed", scope="gpu")
        if signal >= 0:
            if NVSHMEM:
                _fence()
                _int_p(local_pad + signal * 4, epoch, peer_pe)
            else:
                sig = peer_pad.to(tl.pointer_type(tl.int32))
                tl.atomic_xchg(sig + signal, epoch, sem="release", scope="sys")


_PUT_ARGS = (
    "counter_ptr",
    "error_ptr",
    "src",
    "dst",
    "elems",
    "delta",
    "pe",
    "entered_addr",
    "signal",
    "local_pad",
    "peer_pad",
    "epoch",
)
"""`nvshmem_put_kernel`'s arguments before its constants: two tensors, then integers that change
from call to call (none specialized on, every one replaced at a relaunch)."""


@triton.jit(do_not_specialize=list(_PUT_ARGS[2:]))
def nvshmem_put_kernel(
    counter_ptr,
    error_ptr,
    src,
    dst,
    elems,
    delta,
    pe,
    entered_addr,
    signal,
    local_pad,
    peer_pad,
    epoch,
    NUM_PROGRAMS: tl.constexpr,
    BLOCK: tl.constexpr,
    ELEM: tl.constexpr,
    ELEM_BYTES: tl.constexpr,
    MAX_SPIN: tl.constexpr,
    NVSHMEM: tl.constexpr,
):
    """One push job from scalar arguments (no job table): `elems` elements of ELEM from address
    `src` to the local symmetric address `dst` on PE `pe` (plain mode: at `dst + delta`), once the
    int32 word at `entered_addr` is at least `epoch` (the receiver has entered the call); then word
    `signal` of the receiver's pad (`local_pad`: this rank's own pad, whose address NVSHMEM
    translates; `peer_pad`: the receiver's, peer-mapped, for plain mode) is set to `epoch`, as
    `nvshmem_copy_kernel` does for each of its jobs. `counter_ptr` is one word, zero between calls
    (launches that share it run in order on one stream)."""
    pid = tl.program_id(0)
    # Integers small enough come as 32-bit values (a null source of an empty put, a short delta):
    # addresses and distances are 64-bit here.
    src, dst, delta = src.to(tl.int64), dst.to(tl.int64), delta.to(tl.int64)
    local_pad, peer_pad = local_pad.to(tl.int64), peer_pad.to(tl.int64)
    _wait_at_least(entered_addr.to(tl.int64).to(tl.pointer_type(tl.int32)), epoch, error_ptr, MAX_SPIN)
    push = tl.full((), _PUSH, tl.int32)  # a value, as a job table's kind is
    _move_share(src, dst, elems, delta, push, pe, pid, NUM_PROGRAMS, BLOCK, ELEM, ELEM_BYTES, NVSHMEM)
    _count_then_signal(counter_ptr, signal, local_pad, peer_pad, pe, epoch, NUM_PROGRAMS, NVSHMEM)


@functools.cache
def _linked(kernel):
    """`kernel` linked against NVSHMEM's device library, its modules initialized for NVSHMEM as
    Triton loads them (torch's `requires_nvshmem`): made at its first launch on a GPU."""
    from torch.distributed._symmetric_memory import _nvshmem_triton

    return _nvshmem_triton.requires_nvshmem(kernel)


_PUT_RELAUNCHES: dict = {}
"""Compiled puts kept for relaunch (`launch.run_kept`): every integer of a put changes per call."""


def launch_nvshmem_put(
    ctx,
    stream: torch.cuda.Stream | None,
    send: torch.Tensor,
    dst: int,
    peer: int,
    pe: int,
    signal: int,
    epoch: int,
    programs: int,
    spin_limit: int = 0,
) -> None:
    """Put `send` (contiguous) with `programs` programs of `nvshmem_put_kernel` on `stream`, to the
    local symmetric address `dst` of a buffer of the context, on the PE `pe` of the group's rank
    `peer`, once that rank has entered call `epoch` (its entry word in this rank's pad); then raise
    word `signal` of its pad to `epoch`. NVSHMEM puts where the context's memory is NVSHMEM's (on a
    GPU), else plain stores at the peer-mapped address (the interpreter). `dst` must lie in a buffer
    of the context (its peer-mapped address is found by the buffer's offset)."""
    nvshmem = compiled_for_gpu(ctx.signals.local)
    delta = _peer_delta(ctx, dst, peer)
    pads = ctx.signals.peer_ptrs
    args = (
        ctx.counters[COPY_COUNTER_BASE:],
        ctx.error,
        send.data_ptr(),
        dst,
        send.numel(),
        delta,
        pe,
        pads[ctx.rank] + 4 * (ENTERED_BASE + peer),
        signal,
        pads[ctx.rank],
        pads[peer],
        epoch,
    )
    kwargs = dict(
        NUM_PROGRAMS=programs,
        BLOCK=COPY_BLOCK,
        ELEM=TL_DTYPES[send.dtype],
        ELEM_BYTES=send.element_size(),
        MAX_SPIN=spin_limit,
        NVSHMEM=nvshmem,
        num_warps=NVSHMEM_WARPS,
    )
    kernel = _linked(nvshmem_put_kernel) if nvshmem else nvshmem_put_kernel
    with torch.cuda.stream(stream) if ctx.device.type == "cuda" else contextlib.nullcontext():
        run_kept(_PUT_RELAUNCHES, kernel, "put", (programs,), _PUT_ARGS, args, kwargs, _PUT_ARGS[2:])


_PUTS_LOADED: set[tuple] = set()
"""Variants of the put loaded in this process (`stage_nvshmem_put`)."""


def stage_nvshmem_put(ctx, stream: torch.cuda.Stream | None, dtype: torch.dtype, programs: int) -> None:
    """The put's first launch in this process for (device, dtype, programs), with nothing to move,
    made before a call enqueues any wait: Triton compiles it, loads it and NVSHMEM initializes its
    module there. A module load waits for the device; one made after a call had enqueued a wait for
    a peer's rows would wait for that peer, which may be loading its own put and waiting for this
    rank's rows."""
    variant = (ctx.device.index, dtype, programs)
    if ctx.device.type != "cuda" or variant in _PUTS_LOADED:
        return
    (buf, *_) = ctx.buffers.values()
    empty = torch.empty(0, dtype=dtype, device=ctx.device)
    launch_nvshmem_put(ctx, stream, empty, buf.peer_ptrs[ctx.rank], ctx.rank, 0, -1, 0, programs)
    _PUTS_LOADED.add(variant)


def _peer_delta(ctx, address: int, peer: int) -> int:
    """The distance from a local address inside one of the context's buffers to the same place in
    rank `peer`'s copy of that buffer."""
    for buf in ctx.buffers.values():
        lo = buf.peer_ptrs[ctx.rank]
        if lo <= address < lo + buf.local.numel() * buf.local.element_size():
            return buf.peer_ptrs[peer] - lo
    raise ValueError(f"address {address:#x} lies in none of the context's buffers")


_LOADED: set[tuple] = set()
"""Variants of the NVSHMEM copier compiled and loaded in this process (see `stage_nvshmem_copy`)."""


def stage_nvshmem_copy(
    ctx,
    jobs,
    stream: torch.cuda.Stream | None,
    programs: int,
    dtype: torch.dtype,
    pes: torch.Tensor,
    spin_limit: int = 0,
) -> None:
    """What `launch_nvshmem_copy` needs that may synchronize, done before a fused kernel runs: the job
    tables, and the copier's first launch in this process (no jobs), in which Triton compiles it,
    loads it and NVSHMEM initializes its module: a module load waits for the device, and one made
    while the fused kernel spins would wait for the kernel, which waits for the copies (see
    `launch.stage_chunk_copy`)."""
    if not jobs:
        return
    tables = copy_job_tables(ctx, jobs, stream, wide=4)
    variant = (str(ctx.device), programs, dtype, spin_limit)
    if variant in _LOADED or ctx.device.type != "cuda":
        return
    _run(ctx, stream, tables, 0, programs, 0, dtype, pes, spin_limit)
    _LOADED.add(variant)


def launch_nvshmem_copy(
    ctx,
    stream: torch.cuda.Stream | None,
    jobs,
    programs: int,
    epoch: int,
    dtype: torch.dtype,
    pes: torch.Tensor,
    spin_limit: int = 0,
) -> None:
    """Run `jobs` on `stream` with `programs` programs of `nvshmem_copy_kernel`. A job is (src, dst,
    elems, delta, wait, signal, peer, pe, kind); `pes[r]` is the PE of the group's rank r."""
    if not jobs:
        return
    tables = copy_job_tables(ctx, jobs, stream, wide=4)
    _run(ctx, stream, tables, len(jobs), programs, epoch, dtype, pes, spin_limit)


def _run(ctx, stream, tables, num_jobs: int, programs: int, epoch: int, dtype, pes, spin_limit: int) -> None:
    table, small = tables
    nvshmem = compiled_for_gpu(ctx.signals.local)
    kernel = _linked(nvshmem_copy_kernel) if nvshmem else nvshmem_copy_kernel
    with torch.cuda.stream(stream) if ctx.device.type == "cuda" else contextlib.nullcontext():
        kernel[(programs,)](
            table[0],
            table[1],
            table[2],
            table[3],
            small[0],
            small[1],
            small[2],
            small[3],
            small[4],
            num_jobs,
            ctx.signals.local,
            ctx.peer_signal_ptrs,
            pes,
            ctx.signals.local[ENTERED_BASE:],
            ctx.counters[COPY_COUNTER_BASE:],
            epoch,
            ctx.error,
            NUM_PROGRAMS=programs,
            BLOCK=COPY_BLOCK,
            ELEM=TL_DTYPES[dtype],
            ELEM_BYTES=dtype.itemsize,
            MAX_SPIN=spin_limit,
            NVSHMEM=nvshmem,
            num_warps=NVSHMEM_WARPS,
        )
