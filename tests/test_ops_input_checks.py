"""Layer: CPU. The fused ops reject bad input with one clear ConfigError (a ValueError) before
anything is launched: wrong ranks, dtypes, shapes, layouts, devices, or no process group."""

from __future__ import annotations

import pytest
import torch

from syncopate.errors import ConfigError
from syncopate.kernels.ops import all_gather_matmul, matmul_all_reduce, matmul_reduce_scatter

OPS = [all_gather_matmul, matmul_reduce_scatter, matmul_all_reduce]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize(
    "a, b, message",
    [
        (torch.zeros(8, 4, 2), torch.zeros(4, 8), "a must be 2-D"),
        (torch.zeros(8, 4, dtype=torch.int32), torch.zeros(4, 8, dtype=torch.int32), "dtype torch.int32: accepted are"),
        (torch.zeros(8, 4, dtype=torch.bfloat16), torch.zeros(4, 8, dtype=torch.float16), "they must match"),
        (torch.zeros(8, 4), torch.zeros(5, 8), "a's columns must equal b's rows"),
        (torch.zeros(4, 8).t(), torch.zeros(4, 8), "a must be contiguous"),
        (torch.zeros(8, 4), torch.zeros(8, 16)[:4, :8], "b must be row-major or the transpose"),
        ([[1.0]], torch.zeros(4, 8), "a must be a torch.Tensor"),
    ],
)
def test_bad_tensors_are_named(op, a, b, message):
    with pytest.raises(ConfigError, match=message) as info:
        op(a, b)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("op", OPS)
def test_no_process_group_says_what_to_call(op):
    with pytest.raises(ConfigError, match="call init_process_group first"):
        op(torch.zeros(8, 4), torch.zeros(4, 8))


def test_cpu_tensors_are_refused_in_a_group(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdv'}", rank=0, world_size=1)
    try:
        with pytest.raises(ConfigError, match="a is on cpu: the fused ops need CUDA tensors"):
            all_gather_matmul(torch.zeros(8, 4), torch.zeros(4, 8))
        transposed_weight = torch.zeros(8, 4).t()  # B given as weight.t() is accepted up to the device check
        with pytest.raises(ConfigError, match="need CUDA tensors"):
            matmul_reduce_scatter(torch.zeros(8, 4), transposed_weight)
    finally:
        dist.destroy_process_group()
