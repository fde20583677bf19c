"""A process that replays the ops from CUDA graphs, then ends (run by tests/test_gpu_capture.py
under torchrun, one process a GPU): each of `--paths` (Syncopate's fused op, torch's NCCL path,
torch async-TP) captured in a graph of ten all-gather matmuls and replayed, the graphs kept alive
to the end; then `syncopate.close_contexts()` (unless --no-close) and `destroy_process_group()`,
and the interpreter must exit. Prints `done` before it returns."""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist

GRAPHS: list = []
"""Alive until the interpreter exits, as a job's captured graphs would be."""


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--paths", default="ours,torch,async_tp")
    p.add_argument("--no-close", action="store_true")
    args = p.parse_args()
    for k, v in (
        ("NCCL_NVLS_ENABLE", "0"),
        ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
        ("NVSHMEM_DISABLE_NVLS", "1"),
    ):
        os.environ.setdefault(k, v)
    rank = int(os.environ["RANK"])
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    import syncopate
    from syncopate.kernels.context import enable_symm_mem
    from syncopate.kernels.library import all_gather_rows

    group = dist.group.WORLD
    ws = dist.get_world_size()
    a = torch.randn(1024 // ws, 1024, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(1024, 512 // ws, device="cuda", dtype=torch.bfloat16)
    calls = {
        "ours": lambda: syncopate.all_gather_matmul(a, b, group, syncopate.Candidate(num_splits=1)),
        "torch": lambda: all_gather_rows(a, group) @ b,
    }
    if "async_tp" in args.paths:
        import torch.distributed._symmetric_memory as _symm_mem  # noqa: F401 — registers torch.ops.symm_mem

        enable_symm_mem(group.group_name)
        calls["async_tp"] = lambda: torch.ops.symm_mem.fused_all_gather_matmul(
            a, [b], gather_dim=0, group_name=group.group_name
        )
    for name in args.paths.split(","):
        fn = calls[name]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(10):
                fn()
        for _ in range(3):
            graph.replay()
        torch.cuda.synchronize()
        GRAPHS.append(graph)
    if not args.no_close:
        syncopate.close_contexts()
    dist.destroy_process_group()
    if rank == 0:
        print("done", flush=True)


if __name__ == "__main__":
    main()
