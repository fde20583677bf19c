"""Triton pointed at a Hopper GPU (sm_90) on a machine without one, every launch a compile-only
warm-up: what the `compile_*sm90.py` scripts compile the kernels with. Import it before the kernels'
modules, in a fresh process without TRITON_INTERPRET; `compiled` collects every compiled kernel."""

from __future__ import annotations

import os
import sys
import time
import traceback

import torch

if os.environ.get("TRITON_INTERPRET", "0") == "1":
    sys.exit(f"{os.path.basename(sys.argv[0])}: unset TRITON_INTERPRET; it compiles for a GPU target")

import triton.runtime.jit as jit
from triton.backends.compiler import GPUTarget
from triton.runtime import driver


class _Sm90:
    """Just enough of a driver for Triton to compile (never launch) for an H100/H200."""

    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_active_torch_device(self):
        return torch.device("cpu")


driver.set_active(_Sm90())
_run = jit.JITFunction.run
compiled = []


def _compile_only(self, *args, grid, warmup, **kwargs):
    kernel = _run(self, *args, grid=grid, warmup=True, **kwargs)
    compiled.append(kernel)
    return kernel


jit.JITFunction.run = _compile_only


def compile_each(variants, describe) -> int:
    """Compile each (name, build) of `variants` (`build()` launches one kernel, which compiles it):
    a line per variant, `ok` with `describe(kernel)` or `FAIL` with the traceback, then how many
    failed; the exit code, 1 if any did."""
    failed = 0
    for name, build in variants:
        t0 = time.perf_counter()
        try:
            compiled.clear()
            build()
            (kernel,) = compiled
            print(f"ok    {name}: {describe(kernel)} ({time.perf_counter() - t0:.1f} s)", flush=True)
        except Exception:
            failed += 1
            print(f"FAIL  {name}\n{traceback.format_exc()}", flush=True)
    import triton

    print(f"triton {triton.__version__}: {failed} of the variants failed to compile for sm_90")
    return 1 if failed else 0
