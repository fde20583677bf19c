"""`all_gather_matmul(..., return_gathered=True)` on one GPU, a group of one (the shard is all of A):
the gathered A filled on a side stream while the GEMM runs (the default) against the way before
(the shard copied into the gathered buffer, the buffer copied out after the call:
`ops._GATHERED_OVERLAP = False`, SYNCOPATE_GATHERED_OVERLAP=0), with return_gathered=False for
reference; three rounds in turn, each the median of 20 calls timed by `gpu_single.bench` (events,
L2 flushed, a device sleep first).
Every call's output and gathered A are checked.

    python benchmarks/gathered_copy.py
"""

from __future__ import annotations

import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

SHAPES = ((8192, 14336, 4096), (8192, 4096, 8192), (8192, 2048, 8192))
MODES = ("plain", "copied after", "side stream")


def main() -> int:
    import torch
    import torch.distributed as dist
    from gpu_single import bench

    from syncopate.kernels import ops
    from syncopate.kernels.local_ranks import free_port, join_group
    from syncopate.search_space import Candidate

    join_group(0, 1, free_port())
    cand = Candidate(backend="copy_engine", num_splits=4, block_m=128, block_n=256, block_k=64, group_m=8,
                     num_warps=8, num_stages=3)
    print(f"one {torch.cuda.get_device_name()}, torch {torch.__version__}; µs, median of three rounds")
    print("| ag_gemm at 1 rank | " + " | ".join(MODES) + " |")
    print("|---" * (len(MODES) + 1) + "|")
    for m, n, k in SHAPES:
        a = torch.randn(m, k, device="cuda").bfloat16()
        b = (torch.randn(k, n, device="cuda") / k**0.5).bfloat16()
        ref = a.float() @ b.float()
        times: dict[str, list[float]] = {mode: [] for mode in MODES}
        for _ in range(3):
            for mode in MODES:
                ops._GATHERED_OVERLAP = mode == "side stream"
                gathered = mode != "plain"

                def call(gathered=gathered):
                    return ops.all_gather_matmul(a, b, None, cand, return_gathered=gathered)

                result = call()
                out, full = result if gathered else (result, a)
                err = float((out.float() - ref).norm() / ref.norm())
                if not torch.equal(full, a) or err > 1e-2:
                    raise SystemExit(f"{mode} {m}x{n}x{k}: gathered A equal {torch.equal(full, a)}, rel err {err:.3g}")
                times[mode].append(bench(call))
        print(f"| {m}×{n}×{k} | " + " | ".join(f"{statistics.median(times[x]):.1f}" for x in MODES) + " |")
    ops.close_contexts()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
