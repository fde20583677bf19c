"""Layer: multi-GPU (skipped without two CUDA GPUs), one process a GPU, each with NVSHMEM symmetric
memory (`syncopate.use_nvshmem()` first). The pipelined MoE ops on backend `nvshmem` (and on
`copy_engine` in the same NVSHMEM memory) against the unfused ops and the float32 group references,
for uniform and skewed routings, a rank that receives nothing and a routing that grows the buffers,
outputs poisoned, calls back to back; `MoELayer` forward and backward on `nvshmem` against the
unfused layer's. Skipped where torch has no NVSHMEM."""

from __future__ import annotations

import pytest
import torch
from test_gpu_moe import check_layer, check_ops, run_checks


def _opt_in(rank, world, device, group) -> list[str]:
    import syncopate

    syncopate.use_nvshmem()  # before any symmetric allocation of this process
    return []


def _ops(rank, world, device, group) -> list[str]:
    return check_ops(rank, world, device, group, backends=("nvshmem", "copy_engine"))


def _layer(rank, world, device, group) -> list[str]:
    return check_layer(rank, world, device, group, backends=("nvshmem",))


def _run(world: int) -> None:
    import torch.distributed._symmetric_memory as symm_mem

    if not symm_mem.is_nvshmem_available():
        pytest.skip("torch.distributed._symmetric_memory.is_nvshmem_available() is False here")
    run_checks((_opt_in, _ops, _layer), world, "MoE NVSHMEM check")


@pytest.mark.multigpu
def test_nvshmem_moe_ops_on_two_gpus():
    _run(2)


@pytest.mark.multigpu
def test_nvshmem_moe_ops_on_four_gpus():
    if torch.cuda.device_count() < 4:
        pytest.skip(f"needs four CUDA GPUs on one host; {torch.cuda.device_count()} present")
    _run(4)
