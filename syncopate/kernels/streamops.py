"""Stream-ordered signal writes, waits and copy-engine copies through the CUDA driver API.

These enqueue work that uses no SM: `cuStreamWriteValue32` (with the default flag it first makes
the stream's earlier writes visible), `cuStreamWaitValue32` with the wrap-safe GEQ comparison,
and `cuMemcpyDtoDAsync`, which the copy engines execute. Addresses may point to a peer's
symmetric memory mapped into this process. The driver is called through ctypes: a call costs
about a microsecond of host time, which matters when a fused op enqueues dozens of them.
"""

from __future__ import annotations

import ctypes
import functools
import os

from syncopate.errors import RuntimeUnavailableError

__all__ = ["write_value", "wait_value", "copy_async", "available"]

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


class _BindingsDriver:
    """The same three calls through the `cuda.bindings` package (SYNCOPATE_DRIVER_CALLS=bindings)."""

    def __init__(self) -> None:
        from cuda.bindings import driver as d

        self.d = d

    def write(self, stream, address, value, flags):
        d = self.d
        return int(d.cuStreamWriteValue32(d.CUstream(stream), d.CUdeviceptr(address), value, flags)[0])

    def wait(self, stream, address, value, flags):
        d = self.d
        return int(d.cuStreamWaitValue32(d.CUstream(stream), d.CUdeviceptr(address), value, flags)[0])

    def copy(self, dst, src, nbytes, stream):
        d = self.d
        return int(d.cuMemcpyDtoDAsync(d.CUdeviceptr(dst), d.CUdeviceptr(src), nbytes, d.CUstream(stream))[0])


@functools.cache
def _driver() -> _Driver:
    if os.environ.get("SYNCOPATE_DRIVER_CALLS") == "bindings":
        return _BindingsDriver()
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


def _check(err: int, what: str) -> None:
    if err != 0:
        raise RuntimeError(f"{what} failed with CUDA driver error {err}")


def write_value(stream: int, address: int, value: int) -> None:
    """Enqueue `*(int32*)address = value` on `stream`, after the stream's earlier writes are visible."""
    _check(_driver().write(stream, address, value & 0xFFFFFFFF, _WRITE_DEFAULT), "cuStreamWriteValue32")


def wait_value(stream: int, address: int, value: int) -> None:
    """Enqueue a wait on `stream` until `(int32)(*address - value) >= 0`."""
    _check(_driver().wait(stream, address, value & 0xFFFFFFFF, _WAIT_GEQ), "cuStreamWaitValue32")


def copy_async(stream: int, dst: int, src: int, nbytes: int) -> None:
    """Enqueue a copy-engine copy of `nbytes` from `src` to `dst` on `stream`."""
    _check(_driver().copy(dst, src, nbytes, stream), "cuMemcpyDtoDAsync")
