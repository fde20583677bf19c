"""Layer: one GPU, and two. The fused ops captured in CUDA graphs (tests/support/capture_check.py):
every op, backend and stationary template replayed right with fresh inputs, between uncaptured
calls and back to back; the first call of a shape and bounded waits refused under capture. In a
group of one rank (a fresh process without TRITON_INTERPRET, which the interpreter tests set in
this one), two ranks sharing one GPU (no NCCL there), and two GPUs, there also with NCCL
registering no captured buffer."""

from __future__ import annotations

import pytest
from support.checks import run_script
from test_gpu_ops import needs_gpus, run_ranks

pytestmark = pytest.mark.timeout(900)

CHECKS_ONE_RANK = 3 * 3 + 6 + 2
"""Three kinds x three backends; a_stationary and decomposed for the all-gather, c_stationary and
decomposed for each reduction; two refusals."""


def _rank_worker(rank, world, port, shared_gpu, queue):
    from syncopate.measure.local_ranks import join_group

    dev = join_group(
        rank, world, port, shared_gpu
    )  # TRITON_INTERPRET dropped before the kernels are imported
    import torch.distributed as dist
    from support.capture_check import run_all

    import syncopate

    try:
        queue.put((rank, run_all(dev, dist.group.WORLD, rank, world, nccl=not shared_gpu)))
    finally:
        syncopate.close_contexts()
        dist.destroy_process_group()


def _assert_all_right(reports: dict, expected: int) -> None:
    for rank, results in sorted(reports.items()):
        for name, failure, detail in results:
            print(f"rank {rank} {'FAIL' if failure else 'ok  '} {name}: {failure or detail}")
    failures = [
        f"rank {r}: {name}\n{detail}"
        for r, res in reports.items()
        for name, failure, detail in res
        if failure
    ]
    assert not failures, "\n".join(failures)
    assert all(len(res) == expected for res in reports.values()), {r: len(res) for r, res in reports.items()}


@pytest.mark.gpu
def test_captured_calls_replay_right_in_a_group_of_one():
    done = run_script("capture_check.py", timeout=880)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("ok    ") == CHECKS_ONE_RANK, done.stdout


@pytest.mark.gpu
def test_captured_calls_replay_right_with_two_ranks_sharing_one_gpu():
    _assert_all_right(run_ranks(_rank_worker, 2, (True,), timeout=880), CHECKS_ONE_RANK - 3)


@pytest.mark.multigpu
@pytest.mark.parametrize("world", [2, 4])
def test_captured_calls_replay_right_on_two_and_four_gpus(world):
    needs_gpus(world)
    _assert_all_right(run_ranks(_rank_worker, world, (False,), timeout=880), CHECKS_ONE_RANK)


@pytest.mark.multigpu
def test_nccl_chunk_plans_replay_right_where_nccl_registers_no_captured_buffer(monkeypatch):
    """With NCCL_GRAPH_REGISTER=0 in the ranks' environment the nccl backend's chunk plans are
    captured and checked like the others (without it, a graph of two calls stalls)."""
    needs_gpus(2)
    monkeypatch.setenv("NCCL_GRAPH_REGISTER", "0")
    _assert_all_right(run_ranks(_rank_worker, 2, (False,), timeout=880), CHECKS_ONE_RANK)


@pytest.mark.multigpu
@pytest.mark.parametrize("paths", ["ours", "ours,async_tp"])
@pytest.mark.parametrize("close", [True, False], ids=["closed", "not_closed"])
def test_a_process_with_captured_calls_exits(paths, close):
    """The process ends on its own after destroy_process_group, its graphs still alive, with
    close_contexts() called first and without. (Graphs that captured torch's own NCCL collectives
    keep destroy_process_group from returning while they live: docs/reliability.md.)"""
    import os
    import subprocess
    import sys
    from pathlib import Path

    needs_gpus(2)
    script = Path(__file__).parent / "support" / "exit_check.py"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        str(script),
        "--paths",
        paths,
    ]
    if not close:
        cmd.append("--no-close")
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).parent.parent),
        "NCCL_NVLS_ENABLE": "0",
        "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
        "NVSHMEM_DISABLE_NVLS": "1",
    }
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    except subprocess.TimeoutExpired as e:
        pytest.fail(
            f"the processes did not exit within 120 s after destroy_process_group ({paths}, "
            f"close_contexts {'called' if close else 'not called'}):\n{e.stdout}\n{e.stderr}"
        )
    assert done.returncode == 0 and "done" in done.stdout, done.stdout + done.stderr
