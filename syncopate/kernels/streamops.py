"""Stream-ordered signal writes, waits and copy-engine copies through the CUDA driver API.

These enqueue work that uses no SM: `cuStreamWriteValue32` (with the default flag it first makes
the stream's earlier writes visible), `cuStreamWaitValue32` with the wrap-safe GEQ comparison,
and `cuMemcpyDtoDAsync`, which the copy engines execute. Addresses may point to a peer's
symmetric memory mapped into this process.
"""

from __future__ import annotations

import functools

from syncopate.errors import RuntimeUnavailableError

__all__ = ["write_value", "wait_value", "copy_async", "available"]


@functools.cache
def _driver():
    try:
        from cuda.bindings import driver
    except ImportError:
        try:
            from cuda import cuda as driver  # older cuda-python layout
        except ImportError:
            raise RuntimeUnavailableError(
                "the copy_engine backend needs the CUDA driver bindings: pip install cuda-bindings "
                "(or cuda-python) matching your CUDA version"
            ) from None
    return driver


def available() -> bool:
    try:
        _driver()
        return True
    except RuntimeUnavailableError:
        return False


def _check(result, what: str) -> None:
    err = result[0] if isinstance(result, tuple) else result
    if int(err) != 0:
        raise RuntimeError(f"{what} failed with CUDA driver error {int(err)} ({err})")


def write_value(stream: int, address: int, value: int) -> None:
    """Enqueue `*(int32*)address = value` on `stream`, after the stream's earlier writes are visible."""
    d = _driver()
    _check(
        d.cuStreamWriteValue32(d.CUstream(stream), d.CUdeviceptr(address), value & 0xFFFFFFFF,
                               d.CUstreamWriteValue_flags.CU_STREAM_WRITE_VALUE_DEFAULT),
        "cuStreamWriteValue32",
    )


def wait_value(stream: int, address: int, value: int) -> None:
    """Enqueue a wait on `stream` until `(int32)(*address - value) >= 0`."""
    d = _driver()
    _check(
        d.cuStreamWaitValue32(d.CUstream(stream), d.CUdeviceptr(address), value & 0xFFFFFFFF,
                              d.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ),
        "cuStreamWaitValue32",
    )


def copy_async(stream: int, dst: int, src: int, nbytes: int) -> None:
    """Enqueue a copy-engine copy of `nbytes` from `src` to `dst` on `stream`."""
    d = _driver()
    _check(d.cuMemcpyDtoDAsync(d.CUdeviceptr(dst), d.CUdeviceptr(src), nbytes, d.CUstream(stream)), "cuMemcpyDtoDAsync")
