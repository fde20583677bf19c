"""Compile the `fused` MoE kernels (`syncopate.moe.kernels`) for a Hopper GPU (sm_90) on a machine
without one, at the shapes and tile configurations `moe_space` tries (Qwen3-30B-A3B's expert layer:
hidden 2048, expert ffn 768), bf16, the dispatch also reading its peers' rows by index
(`fused_dedup`), the gathered top-k sum's three kernels (own rows read apart),
the row scatter, the `dedup` template's segment sum (weighted and not), the routing's pair stats
and expert orders, the SwiGLU's two, and the `nvshmem` backend's put and copier in plain mode
(their NVSHMEM mode links NVSHMEM's device library, which only a GPU machine has).
Run it in a fresh process without TRITON_INTERPRET; it prints one line per variant and exits 1 if
any fails.

    python tests/support/compile_moe_sm90.py
"""

from __future__ import annotations

import sys

import torch
import triton.language as tl
from sm90_target import compile_each

from syncopate.moe.kernels import (  # noqa: E402
    COMBINE_WORDS,
    DISPATCH_WORDS,
    launch_combine,
    launch_dispatch,
    launch_expert_orders,
    launch_gathered_sum,
    launch_gathered_sum_grads,
    launch_pair_stats,
    launch_scatter_rows,
    launch_segment_sum,
    launch_swiglu,
    launch_swiglu_grad,
)
from syncopate.search_space.moe_workload import MOE_TILE_CONFIGS  # noqa: E402

HIDDEN, FFN, EL = 2048, 768, 32
BF16 = torch.bfloat16


def dispatch(tiles: dict, gather: bool = False) -> None:
    send = torch.empty(4096, HIDDEN, dtype=BF16)
    w = torch.empty(EL, HIDDEN, 2 * FFN, dtype=BF16)
    h = torch.empty(4096, 2 * FFN, dtype=BF16)
    table = torch.zeros(64, DISPATCH_WORDS, dtype=torch.int32)
    pad, error = torch.zeros(2048, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    tokens = torch.zeros(4096, dtype=torch.int64)
    index = torch.zeros(4096, dtype=torch.int32) if gather else None  # fused_dedup: rows read by index
    launch_dispatch(
        send, tokens, send, w, h, table, pad, error, epoch=3, programs=132, recv_index=index, **tiles
    )


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


def gathered_sum(which: str) -> None:
    tokens, top_k = 4096, 8
    rows = torch.empty(tokens * top_k, HIDDEN, dtype=BF16)
    index = torch.zeros(tokens * top_k, dtype=torch.int64)
    gates = torch.empty(tokens, top_k, dtype=torch.float32)
    grad = torch.empty(tokens, HIDDEN, dtype=BF16)
    own = (torch.empty(1024, HIDDEN, dtype=BF16), 2048)
    if which == "sum":
        launch_gathered_sum(rows, index, gates, grad, own)
    elif which == "rows":
        launch_gathered_sum_grads(grad, rows, index, index, gates, torch.empty_like(rows), None)
    else:
        launch_gathered_sum_grads(grad, rows, index, index, gates, None, torch.empty_like(gates), own)


def scatter_rows() -> None:
    rows = torch.empty(4096, 2 * FFN, dtype=BF16)
    launch_scatter_rows(torch.empty_like(rows), torch.zeros(4096, dtype=torch.int64), rows)


def segment_sum(weighted: bool) -> None:
    rows = torch.empty(4096 * 8, HIDDEN, dtype=BF16)
    order = torch.zeros(4096 * 8, dtype=torch.int64)
    starts = torch.zeros(8193, dtype=torch.int64)
    weights = torch.empty(4096 * 8, dtype=torch.float32) if weighted else None
    launch_segment_sum(rows, order, starts, 8, weights, torch.empty(8192, HIDDEN, dtype=BF16))


def swiglu(which: str) -> None:
    h = torch.empty(4096, 2 * FFN, dtype=BF16)
    if which == "forward":
        launch_swiglu(h, torch.empty(4096, FFN, dtype=BF16))
    else:
        launch_swiglu_grad(torch.empty(4096, FFN, dtype=BF16), h, torch.empty_like(h))


def pair_stats() -> None:
    keys = torch.zeros(4096 * 8, dtype=torch.int64)
    launch_pair_stats(keys, keys, 8, 128)


def expert_orders() -> None:
    launch_expert_orders(torch.zeros(4, 64, dtype=torch.int64), 32768)


def nvshmem_put() -> None:
    from types import SimpleNamespace

    from syncopate.kernels.nvshmem_copy import launch_nvshmem_put

    rows, pad = torch.empty(4096, HIDDEN, dtype=BF16), torch.zeros(2048, dtype=torch.int32)
    buf = SimpleNamespace(local=rows, peer_ptrs=[rows.data_ptr()] * 2)
    ctx = SimpleNamespace(
        device=torch.device("cpu"),
        rank=0,
        buffers={"rows": buf},
        signals=SimpleNamespace(local=pad, peer_ptrs=[pad.data_ptr()] * 2),
        counters=torch.zeros(4096, dtype=torch.int64),
        error=torch.zeros(1, dtype=torch.int32),
    )
    launch_nvshmem_put(ctx, None, rows[:512], rows.data_ptr(), 1, 1, signal=3, epoch=5, programs=16)


def nvshmem_copier() -> None:
    from syncopate.kernels.nvshmem_copy import NVSHMEM_WARPS, nvshmem_copy_kernel

    i64, i32 = torch.zeros(16, dtype=torch.int64), torch.zeros(16, dtype=torch.int32)
    nvshmem_copy_kernel[(16,)](
        i64, i64, i64, i64, i32, i32, i32, i32, i32, 4, i32, i64, i32, i32, i64, 5, i32,
        NUM_PROGRAMS=16, BLOCK=4096, ELEM=tl.bfloat16, ELEM_BYTES=2, MAX_SPIN=0, NVSHMEM=False,
        num_warps=NVSHMEM_WARPS,
    )  # fmt: skip


def variants():
    for tiles in MOE_TILE_CONFIGS:
        label = "{block_m}x{block_n}x{block_k} w{num_warps} s{num_stages}".format(**tiles)
        yield f"dispatch {label}", lambda tiles=tiles: dispatch(tiles)
        yield f"dispatch gather {label}", lambda tiles=tiles: dispatch(tiles, gather=True)
        yield f"combine {label}", lambda tiles=tiles: combine(tiles)
    for which in ("sum", "rows", "gates"):
        yield f"gathered-sum {which}", lambda which=which: gathered_sum(which)
    yield "scatter rows", scatter_rows
    for weighted in (True, False):
        yield (
            f"segment sum {'weighted' if weighted else 'unit'}",
            lambda weighted=weighted: segment_sum(weighted),
        )
    yield "pair stats", pair_stats
    yield "expert orders", expert_orders
    for which in ("forward", "backward"):
        yield f"swiglu {which}", lambda which=which: swiglu(which)
    yield "nvshmem put (plain)", nvshmem_put
    yield "nvshmem copier (plain)", nvshmem_copier


def main() -> int:
    def describe(kernel) -> str:
        ptx = kernel.asm["ptx"]
        return (
            f"{len(kernel.asm['cubin'])} bytes of sm_90 code, {kernel.metadata.shared} B shared memory, "
            f"{ptx.count('ld.global.sys.acquire')} acquire loads, {ptx.count('wgmma.mma_async')} wgmma"
        )

    return compile_each(variants(), describe)


if __name__ == "__main__":
    sys.exit(main())
