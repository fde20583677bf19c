"""Stream-ordered signal writes, waits and copy-engine copies through the CUDA driver API.

These enqueue work that uses no SM: `cuStreamWriteValue32` (with the default flag it first makes
the stream's earlier writes visible), `cuStreamWaitValue32` with the wrap-safe GEQ comparison,
and `cuMemcpyDtoDAsync`, which the copy engines execute. Addresses may point to a peer's
symmetric memory mapped into this process. The driver is called through ctypes, and each write,
wait or copy costs the host microseconds, which matters when a fused op enqueues dozens of them
(`benchmarks/op_host.py` measures a call's host time): a `Program` records a call's once and runs
them again each call, its writes and waits in a row on one stream in one `cuStreamBatchMemOp`.

A stream wait cannot time out. Inside `watching()` every wait enqueued is also recorded, so a
caller that bounds a call (SYNCOPATE_SPIN_LIMIT) can tell, when the call has not finished in time,
which words its streams still wait for, and release them (`syncopate.kernels.ops`).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import threading
from collections.abc import Callable, Iterator

from syncopate.errors import RuntimeUnavailableError

__all__ = ["Program", "kept_program", "write_value", "wait_value", "copy_async", "available", "watching"]

_WAIT_GEQ = 0x0
_WRITE_DEFAULT = 0x0


class _Driver:
    def __init__(self, lib: ctypes.CDLL) -> None:
        def fn(*names):
            for name in names:
                f = getattr(lib, name, None)
                if f is not None:
                    f.restype = ctypes.c_int
                    return f
            raise RuntimeUnavailableError(f"the CUDA driver lacks {names[0]}: update the NVIDIA driver")

        self.write = fn("cuStreamWriteValue32_v2", "cuStreamWriteValue32")
        self.write.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
        self.wait = fn("cuStreamWaitValue32_v2", "cuStreamWaitValue32")
        self.wait.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
        self.copy = fn("cuMemcpyDtoDAsync_v2", "cuMemcpyDtoDAsync")
        self.copy.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p]
        self.mem_ops = getattr(lib, "cuStreamBatchMemOp_v2", None)
        """Several stream writes and waits in one call (`Program`); None where the driver lacks it."""
        if self.mem_ops is not None:
            self.mem_ops.restype = ctypes.c_int
            self.mem_ops.argtypes = [ctypes.c_void_p, ctypes.c_uint, ctypes.c_void_p, ctypes.c_uint]


class MemOp(ctypes.Structure):
    """One `CUstreamBatchMemOpParams` of a wait or write of a 32-bit value: the union's 48 bytes,
    laid out as its `waitValue` / `writeValue` members are (operation, address, value, flags,
    alias)."""

    _fields_ = [
        ("operation", ctypes.c_uint32),
        ("_pad0", ctypes.c_uint32),
        ("address", ctypes.c_uint64),
        ("value", ctypes.c_uint64),
        ("flags", ctypes.c_uint32),
        ("_pad1", ctypes.c_uint32),
        ("alias", ctypes.c_uint64),
        ("_pad2", ctypes.c_uint64),
    ]


MEM_OP_WAIT_VALUE_32, MEM_OP_WRITE_VALUE_32 = 1, 2
MEM_OPS_A_BATCH = 255
"""Most operations one `cuStreamBatchMemOp` takes (fewer than 256)."""


@functools.cache
def _driver() -> _Driver:
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        raise RuntimeUnavailableError(
            "the CUDA driver library (libcuda.so.1) cannot be loaded: the copy_engine backend needs an NVIDIA GPU"
        ) from None
    return _Driver(lib)


def available() -> bool:
    try:
        _driver()
        return True
    except RuntimeUnavailableError:
        return False


_watch = threading.local()
"""`waits`: the list `watching` records this thread's stream waits in, or None."""


@contextlib.contextmanager
def watching() -> Iterator[list[tuple[int, int]]]:
    """Record every stream wait this thread enqueues inside, as (address, value), in the list
    yielded, in the order enqueued."""
    outer = getattr(_watch, "waits", None)
    waits: list[tuple[int, int]] = []
    _watch.waits = waits
    try:
        yield waits
    finally:
        _watch.waits = outer
        if outer is not None:
            outer.extend(waits)


def _check(err: int, what: str) -> None:
    if err != 0:
        raise RuntimeError(f"{what} failed with CUDA driver error {err}")


def write_value(stream: int, address: int, value: int) -> None:
    """Enqueue `*(int32*)address = value` on `stream`, after the stream's earlier writes are visible."""
    _check(_driver().write(stream, address, value & 0xFFFFFFFF, _WRITE_DEFAULT), "cuStreamWriteValue32")


def wait_value(stream: int, address: int, value: int) -> None:
    """Enqueue a wait on `stream` until `(int32)(*address - value) >= 0`."""
    _check(_driver().wait(stream, address, value & 0xFFFFFFFF, _WAIT_GEQ), "cuStreamWaitValue32")
    waits = getattr(_watch, "waits", None)
    if waits is not None:
        waits.append((address, value & 0xFFFFFFFF))


def copy_async(stream: int, dst: int, src: int, nbytes: int) -> None:
    """Enqueue a copy-engine copy of `nbytes` from `src` to `dst` on `stream`."""
    _check(_driver().copy(dst, src, nbytes, stream), "cuMemcpyDtoDAsync")


_WRITE, _WAIT, _COPY, _HOOK, _BATCH = range(5)
_CALLS = ("cuStreamWriteValue32", "cuStreamWaitValue32", "cuMemcpyDtoDAsync", "", "cuStreamBatchMemOp")


class Program:
    """Stream writes, waits and copies recorded once and enqueued again on every call.

    A fused call's communication is the same list of driver calls every time but for the epoch
    each write and wait carries and two addresses: the caller's input (`A`) and output (`OUT`),
    which a copy may be relative to. Recording it once per prepared call leaves `run` a loop of
    driver calls, instead of working the transfers out of the plan again; where the driver has
    `cuStreamBatchMemOp`, writes and waits in a row on one stream go in one call (the entry words
    of a call, a signal and the next peer's wait). `hook`s run Python in place (the timeline's
    events); they get a dict that lives for one run.
    """

    A, OUT = 1, 2

    def __init__(self) -> None:
        self.ops: list[tuple] = []
        self._batched: list[tuple] | None = None
        self._waits: tuple[int, ...] | None = None

    def write(self, stream, address) -> None:
        """`*(int32*)address = epoch` on `stream` (any object with `cuda_stream`)."""
        self._add((_WRITE, stream.cuda_stream, address))

    def wait(self, stream, address) -> None:
        """Hold `stream` until `(int32)(*address - epoch) >= 0`."""
        self._add((_WAIT, stream.cuda_stream, address))

    def copy(self, stream, dst: int, src: int, nbytes: int, dst_base: int = 0, src_base: int = 0) -> None:
        """Copy `nbytes` to `dst` from `src`, each an address or, with a base (`A`, `OUT`), an offset."""
        self._add((_COPY, stream.cuda_stream, dst, dst_base, src, src_base, nbytes))

    def hook(self, fn) -> None:
        self._add((_HOOK, fn))

    def _add(self, op: tuple) -> None:
        self.ops.append(op)
        self._batched = None
        self._waits = None

    @property
    def waits(self) -> tuple[int, ...]:
        """The addresses the program's waits stand on, in order."""
        if self._waits is None:
            self._waits = tuple(op[2] for op in self.ops if op[0] == _WAIT)
        return self._waits

    def run(self, epoch: int, a: int = 0, out: int = 0) -> None:
        """Enqueue the program for the call of `epoch`, its input at `a` and its output at `out`."""
        d = _driver()
        value = epoch & 0xFFFFFFFF
        bases = (0, a, out)
        state: dict = {}
        for op in self._steps(d):
            kind = op[0]
            if kind == _BATCH:
                ops = op[2]
                for m in ops:
                    m.value = value
                err = d.mem_ops(op[1], len(ops), ops, 0)
            elif kind == _WRITE:
                err = d.write(op[1], op[2], value, _WRITE_DEFAULT)
            elif kind == _WAIT:
                err = d.wait(op[1], op[2], value, _WAIT_GEQ)
            elif kind == _COPY:
                err = d.copy(bases[op[3]] + op[2], bases[op[5]] + op[4], op[6], op[1])
            else:
                op[1](state)
                continue
            if err != 0:
                raise RuntimeError(f"{_CALLS[kind]} failed with CUDA driver error {err}")
        watched = getattr(_watch, "waits", None)
        if watched is not None:
            watched.extend((address, value) for address in self.waits)

    def _steps(self, driver) -> list[tuple]:
        """The operations as `run` makes them: where the driver batches stream memory operations,
        each run of two or more writes and waits in a row on one stream is one batch."""
        if getattr(driver, "mem_ops", None) is None:
            return self.ops
        if self._batched is None:
            steps: list[tuple] = []
            i = 0
            while i < len(self.ops):
                j = i
                while (
                    j < len(self.ops)
                    and j - i < MEM_OPS_A_BATCH
                    and self.ops[j][0] in (_WRITE, _WAIT)
                    and self.ops[j][1] == self.ops[i][1]
                ):
                    j += 1
                if j - i >= 2:
                    ops = (MemOp * (j - i))()
                    for m, (kind, _, address) in zip(ops, self.ops[i:j]):
                        m.operation = MEM_OP_WRITE_VALUE_32 if kind == _WRITE else MEM_OP_WAIT_VALUE_32
                        m.address = address
                        m.flags = _WRITE_DEFAULT if kind == _WRITE else _WAIT_GEQ
                    steps.append((_BATCH, self.ops[i][1], ops))
                    i = j
                else:
                    steps.append(self.ops[i])
                    i += 1
            self._batched = steps
        return self._batched


def kept_program(programs: dict | None, key, record: Callable[[Program], None]) -> Program:
    """The program `record` writes, kept in `programs` under `key` (a call's own where None)."""
    program = programs.get(key) if programs is not None else None
    if program is None:
        program = Program()
        record(program)
        if programs is not None:
            programs[key] = program
    return program
