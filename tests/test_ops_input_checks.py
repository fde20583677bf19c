"""Layer: CPU. The fused ops reject bad input with one clear ConfigError (a ValueError) before
anything is launched: wrong ranks, dtypes, shapes, layouts, devices, no process group, or, under
CUDA graph capture, the first call of a shape or a bounded wait."""

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
        (
            torch.zeros(8, 4, dtype=torch.int32),
            torch.zeros(4, 8, dtype=torch.int32),
            "dtype torch.int32: accepted are",
        ),
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


def test_a_bad_group_config_or_buffer_shape_is_named(tmp_path):
    import torch.distributed as dist

    from syncopate.kernels.ops import gather_buffer

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdv'}", rank=0, world_size=1)
    try:
        a, b = torch.zeros(8, 4), torch.zeros(4, 8)
        for op in OPS:
            with pytest.raises(
                ConfigError, match="group must be a torch.distributed ProcessGroup .* got str 'foo'"
            ):
                op(a, b, "foo")
            with pytest.raises(ConfigError, match=r"unknown backend \['x'\]"):
                op(a, b, None, {"backend": ["x"]})
            with pytest.raises(
                ConfigError, match="config must be a Candidate, a dict or None, got the text 'copy_"
            ):
                op(a, b, None, "copy_engine")
        with pytest.raises(ConfigError, match=r"a_shard_shape \(64,\) must be \(rows, columns\)"):
            gather_buffer((64,), torch.bfloat16)
        with pytest.raises(ConfigError, match=r"a_shard_shape \(64, 0\) must be"):
            gather_buffer((64, 0), torch.bfloat16)
        with pytest.raises(ConfigError, match="dtype torch.int8: accepted are"):
            gather_buffer((64, 64), torch.int8)
        with pytest.raises(ConfigError, match="group must be a torch.distributed ProcessGroup"):
            gather_buffer((64, 64), torch.bfloat16, group=3)
    finally:
        dist.destroy_process_group()


def test_the_nccl_backend_on_a_group_without_nccl_names_the_others(tmp_path):
    """Ranks sharing a GPU run in a gloo group: an `nccl` config there says what to choose instead."""
    import torch.distributed as dist

    from syncopate.kernels.ops import check_backend_group
    from syncopate.search_space import Candidate

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdv'}", rank=0, world_size=1)
    try:
        group = dist.group.WORLD
        with pytest.raises(ConfigError, match="uses 'gloo': choose backend copy_engine or sm_copy") as info:
            check_backend_group(Candidate(backend="nccl", comm_sms=32), group)
        assert "backend='nccl'" in str(info.value)
        for backend, sms in (("copy_engine", 0), ("sm_copy", 16)):
            check_backend_group(Candidate(backend=backend, comm_sms=sms), group)
    finally:
        dist.destroy_process_group()


class _OnCuda(torch.Tensor):
    """A CPU tensor that says it is on the GPU: what the capture check looks at, without one."""

    @property
    def is_cuda(self):
        return True


@pytest.mark.parametrize("op", OPS)
def test_a_first_call_under_cuda_graph_capture_is_refused_first(op, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    a = torch.zeros(8, 4).as_subclass(_OnCuda)
    with pytest.raises(
        ConfigError,
        match=rf"syncopate\.{op.__name__}: the first call with these shapes.*make one "
        r"such call before capturing",
    ):
        op(a, torch.zeros(4, 8))  # no group either: the capture is named before anything else


@pytest.mark.parametrize("op", OPS)
def test_a_bounded_wait_under_cuda_graph_capture_is_refused(op, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    a = torch.zeros(8, 4).as_subclass(_OnCuda)
    with pytest.raises(
        ConfigError, match=rf"syncopate\.{op.__name__}: spin_limit=1000 .* capture it with spin_limit=0"
    ):
        op(a, torch.zeros(4, 8), spin_limit=1000)


def _layout_worker(rank, ws, init, queue):
    import torch.distributed as dist

    from syncopate.kernels.templates import b_layout_on_every_rank as _b_layout_on_every_rank

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=ws)
    try:
        weight_t = torch.zeros(16, 8).t()  # B[8, 16] as an nn.Linear weight's transpose
        agreed = _b_layout_on_every_rank(weight_t, dist.group.WORLD, "matmul_reduce_scatter")
        try:  # rank 1 passes its B row-major, the others K-major
            _b_layout_on_every_rank(
                torch.zeros(8, 16) if rank == 1 else weight_t, dist.group.WORLD, "matmul_reduce_scatter"
            )
            refused = None
        except ConfigError as e:
            refused = str(e)
        queue.put((rank, agreed, refused))
    finally:
        dist.destroy_process_group()


def test_a_b_layout_that_differs_between_ranks_is_refused_on_every_rank():
    """The templates that move B read a peer's B in this rank's layout: the first call of a shape
    checks that every rank passes B the same way, and where one does not, every rank refuses."""
    from support.gloo import run_gloo

    results = sorted(run_gloo(_layout_worker, 3))
    assert [agreed for _, agreed, _ in results] == [True] * 3
    said = (
        "matmul_reduce_scatter: b's layout differs between ranks (rank 0: weight.t() (K-major), rank 1: "
        "row-major, rank 2: weight.t() (K-major)); this config moves B between ranks, so pass b the same way "
        "on every rank"
    )
    assert [refused for _, _, refused in results] == [said] * 3
