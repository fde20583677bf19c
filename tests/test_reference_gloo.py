"""Layer: gloo process groups on the CPU. The float32 reference the fused ops are checked against,
as built for a group without NCCL (ranks sharing one GPU): every rank's operands gathered through
the CPU, each rank's result equal to the whole product computed in one place. And the unfused
path's result in bf16 (the rounding a fused op is held to): the partials rounded to bf16 and summed
in rank order with a rounding after each addition, as NCCL reduces them."""

from __future__ import annotations

import io

import torch
import torch.distributed as dist
from support.gloo import run_gloo


def _operands(m: int, n: int, k: int):
    gen = torch.Generator().manual_seed(5)
    a = torch.randn(m, k, generator=gen)
    b = torch.randn(k, n, generator=gen)
    return a, b


def _worker(rank, ws, init, q):
    from syncopate.measure.reference import reference, reference_unfused

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=ws)
    try:
        m, n, k = 6 * ws, 5 * ws, 4 * ws
        a, b = _operands(m, n, k)
        rows, cols, inner = m // ws, n // ws, k // ws
        got = {
            # all-gather matmul: this rank's rows of A, this rank's columns of B
            "ag_gemm": reference(
                "ag_gemm",
                a[rank * rows : (rank + 1) * rows].bfloat16(),
                b[:, rank * cols : (rank + 1) * cols].bfloat16(),
                dist.group.WORLD,
            ),
            # reduce-scatter / all-reduce: this rank's columns of A and rows of B
            "gemm_rs": reference(
                "gemm_rs",
                a[:, rank * inner : (rank + 1) * inner].bfloat16(),
                b[rank * inner : (rank + 1) * inner].bfloat16(),
                dist.group.WORLD,
            ),
            "gemm_ar": reference(
                "gemm_ar",
                a[:, rank * inner : (rank + 1) * inner].bfloat16(),
                b[rank * inner : (rank + 1) * inner].bfloat16(),
                dist.group.WORLD,
            ),
        }
        g = dist.group.WORLD
        a_rank, b_rank = (
            a[:, rank * inner : (rank + 1) * inner].bfloat16(),
            b[rank * inner : (rank + 1) * inner].bfloat16(),
        )
        unfused = {
            "ag_gemm": reference_unfused(
                "ag_gemm",
                a[rank * rows : (rank + 1) * rows].bfloat16(),
                b[:, rank * cols : (rank + 1) * cols].bfloat16(),
                g,
            ),
            "gemm_rs": reference_unfused("gemm_rs", a_rank, b_rank, g),
            "gemm_ar": reference_unfused("gemm_ar", a_rank, b_rank, g),
        }
        got.update({f"unfused {kind}": t for kind, t in unfused.items()})
        # by value: a tensor put on the queue as it is travels as a shared file descriptor, which a
        # worker that has already ended can no longer hand over (FileNotFoundError in the parent)
        data = io.BytesIO()
        torch.save(got, data)
        q.put((rank, {kind: t.dtype for kind, t in got.items()}, data.getvalue()))
    finally:
        dist.destroy_process_group()


def test_the_gathered_reference_is_the_whole_product():
    ws = 3
    results = {}
    for rank, dtypes, data in run_gloo(_worker, ws, timeout=120):
        results[rank] = got = torch.load(io.BytesIO(data))
        assert {dtypes[kind] for kind in ("ag_gemm", "gemm_rs", "gemm_ar")} == {torch.float32}
        assert {dtypes[f"unfused {kind}"] for kind in ("ag_gemm", "gemm_rs", "gemm_ar")} == {torch.bfloat16}
    m, n, k = 6 * ws, 5 * ws, 4 * ws
    a, b = _operands(m, n, k)
    whole = a.bfloat16().float() @ b.bfloat16().float()
    rows, cols = m // ws, n // ws
    for rank, got in results.items():
        torch.testing.assert_close(
            got["ag_gemm"], whole[:, rank * cols : (rank + 1) * cols], rtol=1e-5, atol=1e-4
        )
        torch.testing.assert_close(
            got["gemm_rs"], whole[rank * rows : (rank + 1) * rows], rtol=1e-5, atol=1e-4
        )
        torch.testing.assert_close(got["gemm_ar"], whole, rtol=1e-5, atol=1e-4)
    a16, b16 = a.bfloat16(), b.bfloat16()
    inner = k // ws
    total = a16[:, :inner] @ b16[:inner]
    for r in range(1, ws):
        total = (
            total.float() + (a16[:, r * inner : (r + 1) * inner] @ b16[r * inner : (r + 1) * inner]).float()
        ).bfloat16()
    for rank, got in results.items():
        assert torch.equal(got["unfused ag_gemm"], (a16 @ b16[:, rank * cols : (rank + 1) * cols]))
        assert torch.equal(got["unfused gemm_rs"], total[rank * rows : (rank + 1) * rows])
        assert torch.equal(got["unfused gemm_ar"], total)
        assert 0 < (got["unfused gemm_ar"].float() - got["gemm_ar"]).abs().max() < 0.1  # rounded, not wrong
