"""Layer: two and four GPUs, one process each with NVSHMEM symmetric memory (`syncopate.use_nvshmem()`
first thing). Backend `nvshmem`, every kind, on the direct and ring plans with 16 and 32
communication programs: calls back to back with fresh inputs and poisoned outputs, then a CUDA graph
of two calls replayed (with calls outside it between replays: `support/capture_check.replayed`),
every output right against float32; the SM copier and the copy engine right in the same process.
In a process that did not opt in, a first call with backend `nvshmem` raises ConfigError naming
the fix before it makes anything.
"""

from __future__ import annotations

import pytest
from test_gpu_capture import _assert_all_right
from test_gpu_ops import needs_gpus, run_ranks

pytestmark = pytest.mark.timeout(900)

ROUNDS = 3


def _candidate(backend: str, template: str, sms: int):
    from syncopate.search_space import Candidate

    return Candidate(
        backend=backend,
        template=template,
        num_splits=2,
        comm_sms=sms,
        block_m=128,
        block_n=128,
        block_k=64,
        group_m=8,
        num_warps=8,
        num_stages=3,
    )


def _cases(world: int) -> list:
    templates = ["direct"] if world == 2 else ["direct", "ring"]
    cases = [_candidate("nvshmem", t, sms) for t in templates for sms in (16, 32)]
    return cases + [_candidate("sm_copy", "direct", 16), _candidate("copy_engine", "direct", 0)]


def _worker(rank, world, port, queue):
    from syncopate.measure.local_ranks import join_group

    dev = join_group(rank, world, port)
    import torch
    import torch.distributed as dist

    import syncopate

    syncopate.use_nvshmem()  # before any symmetric allocation of this process
    from support.capture_check import OPS, Inputs, _error, replayed

    group = dist.group.WORLD
    gen = torch.Generator(device=dev)
    gen.manual_seed(41 + rank)
    report = []
    try:
        for kind in OPS:
            for cand in _cases(world):
                name = f"{kind} {cand.short()}"
                x = Inputs(kind, world, dev, gen)
                b = x.b()
                errors = []
                try:
                    for _ in range(ROUNDS):  # back to back, no synchronization between
                        pairs = [(x.a(), x.poisoned()) for _ in range(2)]
                        for a, out in pairs:
                            OPS[kind](a, b, group, cand, out=out)
                        errors += [_error(kind, out, a, b, group) for a, out in pairs]
                    failure = (
                        f"relative errors {[f'{e:.3g}' for e in errors]}" if max(errors) > 1e-2 else None
                    )
                    report.append((f"{name} direct", failure, f"max rel err {max(errors):.3g}"))
                    report.append((f"{name} captured", None, replayed(kind, cand, dev, group, world, gen)))
                except Exception as e:  # noqa: BLE001 — reported, the other cases still run
                    report.append((name, f"{type(e).__name__}: {e}", ""))
        torch.cuda.synchronize()
    finally:
        syncopate.close_contexts()
        dist.destroy_process_group()
    queue.put((rank, report))


@pytest.mark.multigpu
@pytest.mark.parametrize("world", [2, 4])
def test_the_nvshmem_backend_is_right_direct_and_captured(world):
    needs_gpus(world)
    per_kind = len(_cases(world)) * 2
    _assert_all_right(run_ranks(_worker, world, (), timeout=880), 3 * per_kind)


def _refusing_worker(rank, world, port, queue):
    from syncopate.measure.local_ranks import join_group

    dev = join_group(rank, world, port)
    import torch
    import torch.distributed as dist

    import syncopate
    from syncopate.errors import ConfigError

    report = []
    try:
        from support.capture_check import Inputs

        x = Inputs("ag_gemm", world, dev, torch.Generator(device=dev))
        try:
            syncopate.all_gather_matmul(x.a(), x.b(), dist.group.WORLD, _candidate("nvshmem", "direct", 16))
            report.append(("refused", "the call ran", ""))
        except ConfigError as e:
            ok = "syncopate.use_nvshmem()" in str(e) and "sm_copy" in str(e)
            report.append(("refused", None if ok else f"message {e}", str(e)))
    finally:
        syncopate.close_contexts()
        dist.destroy_process_group()
    queue.put((rank, report))


@pytest.mark.multigpu
def test_without_the_opt_in_the_backend_is_refused_with_the_fix():
    needs_gpus(2)
    _assert_all_right(run_ranks(_refusing_worker, 2, (), timeout=300), 1)
