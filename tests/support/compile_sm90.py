"""Compile the fused kernels for a Hopper GPU (sm_90) on a machine without one.

The interpreter runs the kernels' logic but not what only the compiler sees: the TMA descriptor
path, the PTX acquire waits, register-heavy epilogues, and whatever a Triton release changed in its
front end. This script points Triton at an sm_90 target, makes every launch a compile-only warm-up,
and compiles the variants the tuner launches on GPUs (TMA and pointer paths, the consumer's last wave
cut in K, K-major B, producer epilogues in column halves and on whole tiles of 16 columns, pointer
and TMA epilogues, reduce-scatter and all-reduce, the consumer and producer in Gluon, the SM-driven
copier, a captured call's entry, the decomposed all-reduce's last pull). Run it in a fresh
process without TRITON_INTERPRET; it prints one line per variant and exits 1 if any fails.

    python tests/support/compile_sm90.py
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
import triton
from sm90_target import compile_each, compiled

from syncopate.kernels import fp8_cast, launch  # noqa: E402
from syncopate.kernels.tables import PAD_WORDS, consumer_tables, plan_for, producer_tables  # noqa: E402
from syncopate.search_space import Candidate, block_bounds  # noqa: E402

CPU = torch.device("cpu")
FP8, OUT = torch.float8_e4m3fn, torch.bfloat16
tma_on = {"value": True}
launch.use_tma = lambda *tensors: tma_on["value"]
launch.compiled_for_gpu = lambda t: True


def _scales(dtype, rows: int, cols: int, tensor_wise: bool = False):
    """FP8 launches' (A's [rows, 1], B's [1, cols]) scales (B's one element with `tensor_wise`); None otherwise."""
    if dtype != FP8:
        return None
    return torch.ones(rows, 1), torch.ones(1 if tensor_wise else (1, cols))


def consumer(c: Candidate, dtype, kmajor: bool, m=4160, n=1024, k=1024, own=False, tensor_wise=False):
    """A consumer launch; `own`: rank 0's leading tiles read its shard."""
    plan = plan_for("ag_gemm", c.template, 2, m, c.num_splits, c.block_m)
    a = torch.empty(m, k, dtype=dtype)
    b = torch.empty(n, k, dtype=dtype).t() if kmajor else torch.empty(k, n, dtype=dtype)
    out = torch.empty(m, n, dtype=OUT if dtype == FP8 else dtype)
    tables = consumer_tables(plan, 0, n, c, CPU)
    lo, hi = block_bounds(m, 2, 0)
    if own and tables.own_tiles == 0:
        raise AssertionError("no tile of the order reads the shard")
    launch.launch_consumer(
        a,
        b,
        out,
        tables,
        c,
        3,
        torch.zeros(PAD_WORDS, dtype=torch.int32),
        torch.zeros(1, dtype=torch.int32),
        132,
        1 << 20,
        a_own=a[lo:hi].clone() if own else None,
        own_row0=lo,
        scales=_scales(dtype, m, n, tensor_wise),
    )


def producer(kind: str, c: Candidate, dtype, kmajor: bool, m=4160, n=1024, k=1536, ws=2, tensor_wise=False):
    all_reduce = kind == "gemm_ar"
    plan = plan_for(kind, c.template, ws, m, c.num_splits, c.block_m)
    lo, hi = block_bounds(m, ws, 0)
    a = torch.empty(m, k, dtype=dtype)
    b = torch.empty(n, k, dtype=dtype).t() if kmajor else torch.empty(k, n, dtype=dtype)
    part = OUT if dtype == FP8 else dtype  # the partials' dtype
    send, recv = torch.empty(m, n, dtype=part), torch.empty(m, n, dtype=part)
    out = torch.empty(m if all_reduce else hi - lo, n, dtype=part)
    reduced = torch.empty(m, n, dtype=part) if all_reduce else None
    pad = torch.zeros(PAD_WORDS, dtype=torch.int32)
    launch.launch_producer(
        a,
        b,
        send,
        out,
        reduced,
        recv,
        0 if all_reduce else lo,
        producer_tables(plan, 0, n, c, all_reduce, CPU),
        c,
        3,
        pad,
        torch.zeros(4096, dtype=torch.int64),
        torch.zeros(ws, dtype=torch.int64),
        ws,
        0,
        torch.zeros(1, dtype=torch.int32),
        132,
        1 << 20,
        scales=_scales(dtype, m, n, tensor_wise),
    )


def copier(dtype):
    pad = torch.zeros(PAD_WORDS, dtype=torch.int32)
    ctx = SimpleNamespace(
        device=CPU,
        signals=SimpleNamespace(local=pad),
        peer_signal_ptrs=torch.zeros(2, dtype=torch.int64),
        counters=torch.zeros(4096, dtype=torch.int64),
        error=torch.zeros(1, dtype=torch.int32),
    )
    launch.launch_chunk_copy(ctx, None, [(0, 0, 1024, -1, 3, 1)], 32, 3, dtype, 1 << 20)


def pull():
    pad = torch.zeros(PAD_WORDS, dtype=torch.int32)
    ctx = SimpleNamespace(
        device=CPU, signals=SimpleNamespace(local=pad), cache={}, error=torch.zeros(1, dtype=torch.int32)
    )
    src, dst = torch.zeros(512, 4096, dtype=torch.bfloat16), torch.zeros(512, 4096, dtype=torch.bfloat16)
    launch.launch_pull(ctx, None, src, dst, 600, 3, spin_limit=1 << 20)


def graph_entry(world: int):
    pad = torch.zeros(PAD_WORDS, dtype=torch.int32)
    ctx = SimpleNamespace(
        device=CPU,
        signals=SimpleNamespace(local=pad),
        rank=0,
        world_size=world,
        peer_signal_ptrs=torch.zeros(world, dtype=torch.int64),
    )
    launch.launch_graph_entry(ctx, None)


def fp8_amax(reduce_contiguous: bool):
    """The quantization's amax kernel, reducing along a row-major tensor's rows or its columns."""
    v = torch.zeros(8192, 4096, dtype=torch.bfloat16)
    keep, red = (8192, 4096) if reduce_contiguous else (4096, 8192)
    strides = (4096, 1) if reduce_contiguous else (1, 4096)
    bk, br = fp8_cast._amax_tiles(*strides)
    amax = torch.zeros(keep, dtype=torch.int32)
    fp8_cast.amax_kernel[(1,)](v, amax, keep, red, *strides, 256, BK=bk, BR=br, num_warps=4)


def fp8_slices(cols: int):
    """The quantization's one-pass kernel on a row-major bf16 tensor's rows of `cols` elements."""
    v = torch.zeros(64, cols, dtype=torch.bfloat16)
    out = torch.empty(64, cols, dtype=torch.float8_e4m3fn)
    scale = torch.zeros(64, dtype=torch.float32)
    chunk = min(fp8_cast.SLICE_CHUNK, triton.next_power_of_2(cols))
    meta = {"CHUNK": chunk, "ONE_CHUNK": cols <= chunk, "num_warps": 8}
    fp8_cast.slice_kernel[(1,)](v, out, scale, cols, cols, cols, 1e-12, 1 / 448, **meta)


def fp8_cast_tiles(per_row: bool, out_strides: tuple[int, int]):
    """The quantization's cast kernel on a row-major bf16 tensor, into FP8 of `out_strides`."""
    v = torch.zeros(8192, 4096, dtype=torch.bfloat16)
    out = torch.empty_strided((8192, 4096), out_strides, dtype=torch.float8_e4m3fn)
    amax = torch.zeros(8192 if per_row else 4096, dtype=torch.int32)
    scale = torch.zeros(amax.shape, dtype=torch.float32)
    args = (v, out, amax, scale, 8192, 4096, 4096, 1, *out_strides, 1e-12, 448.0)
    fp8_cast.cast_kernel[(1,)](*args, PER_ROW=per_row, BLOCK=fp8_cast._CAST_BLOCK, num_warps=4)


def gluon(build, kernel="gluon_producer_kernel"):
    """`build` with the Gluon kernels (SYNCOPATE_GLUON=1), checking that `kernel` is what compiled."""
    saved = os.environ.get("SYNCOPATE_GLUON")
    os.environ["SYNCOPATE_GLUON"] = "1"
    try:
        build()
        names = [k.name for k in compiled]
        if names != [kernel]:
            raise AssertionError(f"expected {kernel} to compile, got {names}")
    finally:
        if saved is None:
            del os.environ["SYNCOPATE_GLUON"]
        else:
            os.environ["SYNCOPATE_GLUON"] = saved


def variants():
    big = dict(block_m=128, block_n=256, block_k=64, group_m=8, num_warps=8, num_stages=3)
    small = dict(block_m=128, block_n=128, block_k=64, group_m=4, num_warps=8, num_stages=4)
    narrow = dict(block_m=128, block_n=16, block_k=64, group_m=8, num_warps=4, num_stages=3)
    bf16, fp16 = torch.bfloat16, torch.float16
    yield "consumer tma 128x256 bf16", True, lambda: consumer(Candidate(num_splits=2, **big), bf16, False)
    yield (
        "consumer tma 128x128 fp16 b k-major",
        True,
        lambda: consumer(Candidate(num_splits=4, **small), fp16, True),
    )
    yield (
        "consumer pointers 128x128 bf16",
        False,
        lambda: consumer(Candidate(num_splits=1, **small), bf16, False),
    )
    # 5632 rows in 128×256 tiles: 176 tiles, 44 left over for the last wave, cut in K in three
    yield (
        "consumer tma 128x256 bf16 tail cut in K",
        True,
        lambda: consumer(Candidate(num_splits=2, **big), bf16, False, m=5632),
    )
    yield (
        "consumer pointers 128x256 fp16 tail cut in K",
        False,
        lambda: consumer(Candidate(num_splits=2, **big), fp16, True, m=5632),
    )
    yield (
        "gemm_rs tma 128x256 (split epilogue) bf16",
        True,
        lambda: producer("gemm_rs", Candidate(num_splits=2, **big), bf16, False),
    )
    yield (
        "gemm_rs pointers 128x128 fp16 b k-major",
        False,
        lambda: producer("gemm_rs", Candidate(num_splits=1, **small), fp16, True),
    )
    yield (
        "gemm_ar tma 128x128 bf16",
        True,
        lambda: producer("gemm_ar", Candidate(num_splits=4, **small), bf16, False),
    )
    yield (
        "gemm_rs pointers 128x16 whole-tile epilogue bf16",
        False,
        lambda: producer("gemm_rs", Candidate(num_splits=2, **narrow), bf16, False),
    )
    yield (
        "gemm_rs tma 128x256 tma epilogue bf16",
        True,
        lambda: producer("gemm_rs", Candidate(num_splits=4, **big), bf16, False, m=4096),
    )
    yield (
        "gemm_ar tma 128x128 tma epilogue fp16",
        True,
        lambda: producer("gemm_ar", Candidate(num_splits=2, **small), fp16, False, m=4096),
    )
    yield (
        "gemm_ar tma 128x16 whole-tile tma epilogue bf16",
        True,
        lambda: producer("gemm_ar", Candidate(num_splits=2, **narrow), bf16, False, m=4096),
    )
    yield (
        "gemm_rs gluon 128x256 bf16",
        True,
        lambda: gluon(lambda: producer("gemm_rs", Candidate(num_splits=4, **big), bf16, False, m=4096)),
    )
    yield (
        "gemm_ar gluon 128x128 fp16 b k-major",
        True,
        lambda: gluon(lambda: producer("gemm_ar", Candidate(num_splits=2, **small), fp16, True, m=4096)),
    )
    yield (
        "gemm_rs gluon 128x256 bf16 four ranks",
        True,
        lambda: gluon(lambda: producer("gemm_rs", Candidate(num_splits=2, **big), bf16, False, m=4096, ws=4)),
    )
    yield (
        "consumer gluon 128x256 bf16 own shard",
        True,
        lambda: gluon(
            lambda: consumer(Candidate(num_splits=2, **big), bf16, False, own=True), "gluon_consumer_kernel"
        ),
    )
    yield (
        "consumer gluon 128x128 fp16 b k-major",
        True,
        lambda: gluon(
            lambda: consumer(Candidate(num_splits=4, **small), fp16, True), "gluon_consumer_kernel"
        ),
    )
    f8 = dict(block_m=128, block_n=256, block_k=128, group_m=8, num_warps=8, num_stages=3)
    f8_small = dict(block_m=128, block_n=128, block_k=128, group_m=8, num_warps=4, num_stages=4)
    yield "consumer tma 128x256x128 fp8", True, lambda: consumer(Candidate(num_splits=2, **f8), FP8, True)
    yield (
        "consumer tma 128x256x128 fp8 own shard, tail cut in K, b tensor-wise",
        True,
        lambda: consumer(Candidate(num_splits=2, **f8), FP8, True, m=5632, own=True, tensor_wise=True),
    )
    yield (
        "consumer pointers 128x128x128 fp8",
        False,
        lambda: consumer(Candidate(num_splits=1, **f8_small), FP8, True),
    )
    yield (
        "gemm_rs tma 128x256x128 tma epilogue fp8",
        True,
        lambda: producer("gemm_rs", Candidate(num_splits=4, **f8), FP8, True, m=4096),
    )
    yield (
        "gemm_rs tma 128x128x128 (split epilogue) fp8 b tensor-wise",
        True,
        lambda: producer("gemm_rs", Candidate(num_splits=2, **f8_small), FP8, True, tensor_wise=True),
    )
    yield (
        "gemm_ar tma 128x256x128 tma epilogue fp8 four ranks",
        True,
        lambda: producer("gemm_ar", Candidate(num_splits=2, **f8), FP8, True, m=4096, ws=4),
    )
    yield (
        "gemm_rs pointers 128x128x128 fp8",
        False,
        lambda: producer("gemm_rs", Candidate(num_splits=1, **f8_small), FP8, True),
    )
    yield (
        "gemm_rs gluon 128x256x128 fp8",
        True,
        lambda: gluon(lambda: producer("gemm_rs", Candidate(num_splits=4, **f8), FP8, True, m=4096)),
    )
    yield (
        "gemm_ar gluon 128x128x128 fp8 b tensor-wise four ranks",
        True,
        lambda: gluon(
            lambda: producer(
                "gemm_ar", Candidate(num_splits=2, **f8_small), FP8, True, m=4096, ws=4, tensor_wise=True
            )
        ),
    )
    yield "chunk copier bf16", False, lambda: copier(bf16)
    yield "captured call's entry, two ranks", False, lambda: graph_entry(2)
    yield "decomposed all-reduce's last pull", False, pull
    yield "fp8 quantize slices of 7168", False, lambda: fp8_slices(7168)
    yield "fp8 quantize slices of 14336, in chunks", False, lambda: fp8_slices(14336)
    yield "fp8 quantize amax along rows", False, lambda: fp8_amax(True)
    yield "fp8 quantize amax along columns", False, lambda: fp8_amax(False)
    yield "fp8 quantize cast row-wise, same layout", False, lambda: fp8_cast_tiles(True, (4096, 1))
    yield "fp8 quantize cast column-wise, transposed", False, lambda: fp8_cast_tiles(False, (1, 8192))


def resources(cubin: bytes) -> str:
    """`N registers, M spill bytes` of the cubin's kernel, from Triton's bundled cuobjdump."""
    import re
    import subprocess
    import tempfile

    from triton.backends.nvidia import compiler as nvidia

    tool = Path(nvidia.__file__).parent / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run(
            [str(tool), "--dump-resource-usage", f.name], capture_output=True, text=True
        ).stdout
    regs = re.search(r"REG:(\d+)", out)
    stack = re.search(r"STACK:(\d+)", out)
    return f"{regs.group(1) if regs else '?'} registers, {stack.group(1) if stack else '?'} stack bytes"


def main() -> int:
    def built(tma, build):
        def run():
            tma_on["value"] = tma
            build()

        return run

    def describe(kernel) -> str:
        cubin, ptx = kernel.asm["cubin"], kernel.asm["ptx"]
        waits = ptx.count("ld.acquire") + ptx.count("ld.global.acquire")
        return (
            f"{len(cubin)} bytes of sm_90 code, {kernel.metadata.shared} B shared memory, "
            f"{waits} acquire loads, {resources(cubin)}"
        )

    return compile_each(((name, built(tma, build)) for name, tma, build in variants()), describe)


if __name__ == "__main__":
    sys.exit(main())
