"""Layer: gloo ranks on the CPU. `syncopate.kernels.ranks.slowest`: each value at its largest over
the group's ranks, NaN counted as infinite, the same answer on every rank."""

from __future__ import annotations

import math

from support.gloo import run_gloo


def _worker(rank, ws, init, queue):
    import torch.distributed as dist

    from syncopate.kernels.ranks import slowest

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=ws)
    try:
        values = [float(rank), 10.0 - rank, float("nan") if rank == 1 else 1.0]
        queue.put((rank, slowest(values, dist.group.WORLD)))
    finally:
        dist.destroy_process_group()


def test_each_value_at_its_largest_over_the_ranks():
    got = dict(run_gloo(_worker, 3))
    assert sorted(got) == [0, 1, 2]
    for rank, values in got.items():
        assert values[:2] == [2.0, 10.0], rank
        assert math.isinf(values[2]), rank
