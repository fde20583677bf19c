"""Check on one GPU (a group of one rank) that the fused ops refuse a CUDA graph capture with their
ConfigError and are right after it: each op under `torch.cuda.graph` before its first call (no
context yet) and after a call, then three calls with fresh inputs against float32, outputs
poisoned, and the stationary templates too.

Run in a fresh process without TRITON_INTERPRET (tests/test_gpu_capture.py does): it prints one
line per check and exits 1 if one fails.

    python tests/support/capture_check.py
"""

from __future__ import annotations

import os
import sys

if os.environ.get("TRITON_INTERPRET", "0") == "1":
    sys.exit("capture_check: unset TRITON_INTERPRET; it launches compiled kernels")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from checks import run_checks  # noqa: E402

import syncopate  # noqa: E402
from syncopate.errors import ConfigError  # noqa: E402
from syncopate.kernels.local_ranks import free_port, join_group  # noqa: E402
from syncopate.kernels.reference import reference, relative_error  # noqa: E402
from syncopate.search_space import Candidate, Workload, a_stationary_candidate, c_stationary_candidate  # noqa: E402

DIRECT = Candidate(backend="copy_engine", num_splits=2, block_m=128, block_n=128, block_k=64, group_m=8,
                   num_warps=8, num_stages=3)
OPS = {"ag_gemm": syncopate.all_gather_matmul, "gemm_rs": syncopate.matmul_reduce_scatter,
       "gemm_ar": syncopate.matmul_all_reduce}
SHAPES = {"ag_gemm": (1024, 768, 512), "gemm_rs": (1024, 512, 768), "gemm_ar": (1024, 512, 768)}
STATIONARY = {"ag_gemm": a_stationary_candidate(2), "gemm_rs": c_stationary_candidate(),
              "gemm_ar": c_stationary_candidate(2)}


def inputs(kind: str, dev: torch.device):
    m, n, k = SHAPES[kind]
    shapes = Workload(kind=kind, shape=(m, n, k), dtype="bf16").local_shapes(1)
    return (torch.randn(shapes["a"], device=dev).bfloat16(),
            (torch.randn(shapes["b"], device=dev) / k**0.5).bfloat16(), shapes["out"])


def refused(kind: str, cand: Candidate, dev: torch.device, group) -> None:
    a, b, _ = inputs(kind, dev)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            OPS[kind](a, b, group, cand)
    except ConfigError as e:
        assert "cannot be captured in a CUDA graph" in str(e), e
    else:
        raise AssertionError(f"{kind} {cand.short()} was captured")


def right_after(kind: str, cand: Candidate, dev: torch.device, group) -> None:
    for _ in range(3):
        a, b, out_shape = inputs(kind, dev)
        out = torch.full(out_shape, float("nan"), dtype=torch.bfloat16, device=dev)
        OPS[kind](a, b, group, cand, out=out)
        err = relative_error(out, reference(kind, a, b, group))
        assert err < 1e-2, f"rel err {err:.3g}"


def check(kind: str, cand: Candidate, dev: torch.device, group):
    def run() -> None:
        refused(kind, cand, dev, group)  # the first call: no context yet
        right_after(kind, cand, dev, group)
        refused(kind, cand, dev, group)  # with its context and kernels cached
        right_after(kind, cand, dev, group)

    return f"{kind} {cand.short()}: refused under capture, right before and after", run


def main() -> int:
    if not torch.cuda.is_available():
        print("capture_check: needs a CUDA GPU; none is visible", file=sys.stderr)
        return 1
    dev = join_group(0, 1, free_port())
    group = dist.group.WORLD
    try:
        checks = [check(kind, cand, dev, group) for kind in OPS for cand in (DIRECT, STATIONARY[kind])]
        return run_checks(checks)
    finally:
        syncopate.close_contexts()
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
