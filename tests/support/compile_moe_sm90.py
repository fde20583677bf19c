"""Compile the `fused` MoE kernels (`syncopate.moe.kernels`) for a Hopper GPU (sm_90) on a machine
without one, at the shapes and tile configurations `moe_space` tries (Qwen3-30B-A3B's expert layer:
hidden 2048, expert ffn 768), bf16. Run it in a fresh process without TRITON_INTERPRET; it prints
one line per variant and exits 1 if any fails.

    python tests/support/compile_moe_sm90.py
"""

from __future__ import annotations

import os
import sys
import time
import traceback

if os.environ.get("TRITON_INTERPRET", "0") == "1":
    sys.exit("compile_moe_sm90: unset TRITON_INTERPRET; it compiles for a GPU target")

import torch
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

from syncopate.moe.kernels import COMBINE_WORDS, DISPATCH_WORDS, launch_combine, launch_dispatch  # noqa: E402
from syncopate.search_space.moe_workload import MOE_TILE_CONFIGS  # noqa: E402

HIDDEN, FFN, EL = 2048, 768, 32
BF16 = torch.bfloat16


def dispatch(tiles: dict) -> None:
    send = torch.empty(4096, HIDDEN, dtype=BF16)
    w = torch.empty(EL, HIDDEN, 2 * FFN, dtype=BF16)
    h = torch.empty(4096, 2 * FFN, dtype=BF16)
    table = torch.zeros(64, DISPATCH_WORDS, dtype=torch.int32)
    pad, error = torch.zeros(2048, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    launch_dispatch(send, send, w, h, table, pad, error, epoch=3, programs=132, **tiles)


def combine(tiles: dict) -> None:
    h = torch.empty(4096, FFN, dtype=BF16)
    w = torch.empty(EL, FFN, HIDDEN, dtype=BF16)
    table = torch.zeros(64, COMBINE_WORDS, dtype=torch.int32)
    ptrs = torch.zeros(4, dtype=torch.int64)
    launch_combine(
        h, w, ptrs, HIDDEN, table, torch.zeros(16, dtype=torch.int32), torch.zeros(16, dtype=torch.int64),
        torch.zeros(2048, dtype=torch.int32), ptrs, torch.zeros(1, dtype=torch.int32),
        epoch=3, programs=132, **tiles,
    )  # fmt: skip


def variants():
    for tiles in MOE_TILE_CONFIGS:
        label = "{block_m}x{block_n}x{block_k} w{num_warps} s{num_stages}".format(**tiles)
        yield f"dispatch {label}", lambda tiles=tiles: dispatch(tiles)
        yield f"combine {label}", lambda tiles=tiles: combine(tiles)


def main() -> int:
    failed = 0
    for name, build in variants():
        t0 = time.perf_counter()
        try:
            compiled.clear()
            build()
            (kernel,) = compiled
            ptx = kernel.asm["ptx"]
            print(
                f"ok    {name}: {len(kernel.asm['cubin'])} bytes of sm_90 code, {kernel.metadata.shared} B "
                f"shared memory, {ptx.count('ld.global.sys.acquire')} acquire loads, "
                f"{ptx.count('wgmma.mma_async')} wgmma ({time.perf_counter() - t0:.1f} s)",
                flush=True,
            )
        except Exception:
            failed += 1
            print(f"FAIL  {name}\n{traceback.format_exc()}", flush=True)
    import triton

    print(f"triton {triton.__version__}: {failed} of the variants failed to compile for sm_90")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
