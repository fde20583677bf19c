"""Triton pointed at a Hopper GPU (sm_90) on a machine without one, every launch a compile-only
warm-up: what the `compile_*sm90.py` scripts compile the kernels with. Import it before the kernels'
modules, in a fresh process without TRITON_INTERPRET; `compiled` collects every compiled kernel."""

from __future__ import annotations

import os
import sys

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
