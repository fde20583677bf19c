"""The fused ops on one GPU, in a group of one rank (no transfers; the rest of a call's path: the
context, the side streams, the local chunk copies and their signals, the kernel): results against
float32 on fresh inputs, six calls, then the host time of a call (median over 7 batches of 20 calls
enqueued back to back) and its device time (median of 20, each after a device sleep).

    python benchmarks/op_host.py                        # kernels relaunched from the context's cache
    SYNCOPATE_RELAUNCH=0 python benchmarks/op_host.py   # through Triton's dispatch every call
    python benchmarks/op_host.py stationary             # the a_stationary / c_stationary templates
                                                        # (and all_gather_matmul's return_gathered with it)
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

import syncopate
from syncopate.kernels.local_ranks import free_port, join_group
from syncopate.kernels.reference import relative_error
from syncopate.search_space import Candidate, a_stationary_candidate, c_stationary_candidate

CANDIDATE = Candidate(backend="copy_engine", template="direct", num_splits=2, block_m=128, block_n=256, block_k=64,
                      group_m=8, num_warps=8, num_stages=3, tile_order="arrival")
CASES = [("ag_gemm", (8192, 2048, 8192)), ("gemm_rs", (8192, 8192, 2048)), ("gemm_ar", (8192, 8192, 2048))]
STATIONARY = {"ag_gemm": a_stationary_candidate(2), "gemm_rs": c_stationary_candidate(),
              "gemm_ar": c_stationary_candidate(2)}



def case(kind: str, m: int, n: int, k: int, group, dev: torch.device, candidate: Candidate = CANDIDATE) -> str:
    ops = {"ag_gemm": syncopate.all_gather_matmul, "gemm_rs": syncopate.matmul_reduce_scatter,
           "gemm_ar": syncopate.matmul_all_reduce}

    def op(a, b):
        return ops[kind](a, b, group, candidate)

    if kind == "ag_gemm":  # the gathered A too (a stationary candidate takes the direct plan for it)
        a = torch.randn(m, k, device=dev).to(torch.bfloat16)
        b = (torch.randn(k, n, device=dev) / k**0.5).to(torch.bfloat16)
        out, gathered = syncopate.all_gather_matmul(a, b, group, candidate, return_gathered=True)
        torch.cuda.synchronize()
        assert torch.equal(gathered, a) and relative_error(out, a.float() @ b.float()) < 1e-2

    def inputs():
        return (torch.randn(m, k, device=dev).to(torch.bfloat16),
                (torch.randn(k, n, device=dev) / k**0.5).to(torch.bfloat16))

    worst = 0.0
    for _ in range(6):
        a, b = inputs()
        out = op(a, b)
        torch.cuda.synchronize()
        worst = max(worst, relative_error(out, a.float() @ b.float()))
    a, b = inputs()
    for _ in range(3):
        op(a, b)
    torch.cuda.synchronize()
    batches = []
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(20):
            op(a, b)
        batches.append((time.perf_counter() - t0) / 20 * 1e6)
        torch.cuda.synchronize()
    device_us = []
    for _ in range(20):
        torch.cuda._sleep(3_000_000)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        op(a, b)
        end.record()
        torch.cuda.synchronize()
        device_us.append(start.elapsed_time(end) * 1000)
    return (f"{kind} {m}x{n}x{k} {candidate.template}/s{candidate.num_splits} "
            f"SYNCOPATE_RELAUNCH={os.environ.get('SYNCOPATE_RELAUNCH', '1')} rel_err {worst:.2e} "
            f"host_us {statistics.median(batches):.1f} device_us {statistics.median(device_us):.1f}")


def main() -> int:
    if not torch.cuda.is_available():
        print("op_host: needs a CUDA GPU; none is visible", file=sys.stderr)
        return 2
    dev = join_group(0, 1, free_port())
    try:
        stationary = sys.argv[1:] == ["stationary"]
        for kind, shape in CASES:
            print(case(kind, *shape, dist.group.WORLD, dev, STATIONARY[kind] if stationary else CANDIDATE), flush=True)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
