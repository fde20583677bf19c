"""The cuBLAS templates (a_stationary, c_stationary, decomposed) on two GPUs: their cases of the
correctness matrix (tests/test_gpu_ops.py: fresh inputs, poisoned outputs, back-to-back calls,
against float32) and of the capture check (tests/support/capture_check.py). No Triton kernel
compiles, so it takes a minute on a fresh machine; exits 1 if a case fails.

    python tests/support/cublas_ops_check.py
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]


def capture_worker(rank, world, port, templates, queue) -> None:
    from syncopate.measure.local_ranks import join_group

    dev = join_group(rank, world, port)
    import torch.distributed as dist
    from capture_check import run_all

    import syncopate

    try:
        queue.put((rank, run_all(dev, dist.group.WORLD, rank, world, nccl=True, templates=templates)))
    finally:
        syncopate.close_contexts()
        dist.destroy_process_group()


def main() -> int:
    from test_gpu_ops import matrix, run_cases, run_ranks

    from syncopate.search_space import COPY_ENGINE_KINDS

    templates = tuple(COPY_ENGINE_KINDS)
    cases = [case for case in matrix(False, 2) if case[3]["template"] in templates]
    results, _ = run_cases(cases)
    failures = sorted(set().union(*results.values()))
    print(
        f"matrix: {len(cases)} cases of {', '.join(templates)}, {len(failures)} failing", *failures, sep="\n"
    )
    reports = run_ranks(capture_worker, 2, (templates,), timeout=600)
    for rank, results in sorted(reports.items()):
        for name, failure, detail in results:
            print(f"capture rank {rank} {'FAIL' if failure else 'ok  '} {name}: {failure or detail}")
            failures += [name] if failure else []
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
