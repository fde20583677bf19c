"""Layer: gloo process groups on the CPU (and plain CPU logic). The tensor-parallel layers of
`syncopate.tp` with torch's collectives (`impl="torch"`): a two-layer MLP split over 2 and 4 ranks,
with and without sequence parallelism, gives the whole MLP's output and every gradient (input,
weights, biases) in float64, over three steps with fresh inputs (at 2 ranks the column layer keeps
only x's shard and gathers it again for its weight's gradient); and with its first layer frozen,
under activation checkpointing and under no_grad; a pre-norm SwiGLU MLP block with its gate and up
projections in one layer likewise (the norm's gradients summed over the group), also in
tensor-parallel groups of 2 within 4 ranks (data-parallel replicas with their own data). The fused
path of the same layers runs on GPUs (tests/test_gpu_tp.py). Bad arguments are refused with one
message naming the value, on every rank alike, before any collective starts.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from support.gloo import run_gloo

from syncopate.errors import ConfigError
from syncopate.tp import (
    ColumnParallelLinear,
    RowParallelLinear,
    all_gather_linear,
    linear_reduce_scatter,
    sync_sequence_parallel_grads,
)


def _mlp_worker(rank, ws, init, q):
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=ws)
    try:
        report = []
        for sp in (True, False):
            torch.manual_seed(0)  # the same whole MLP on every rank
            hidden, ffn = 12, 8 * ws
            fc1 = torch.nn.Linear(hidden, ffn, dtype=torch.float64)
            fc2 = torch.nn.Linear(ffn, hidden, dtype=torch.float64)
            col = ColumnParallelLinear.from_linear(
                fc1, sequence_parallel=sp, impl="torch", save_gathered=not sp or ws == 4
            )
            row = RowParallelLinear.from_linear(fc2, sequence_parallel=sp, impl="torch")
            for step in range(3):
                gen = torch.Generator().manual_seed(100 * step + 7)
                s, b = 4 * ws, 3
                x = torch.randn(s, b, hidden, generator=gen, dtype=torch.float64, requires_grad=True)
                g = torch.randn(s, b, hidden, generator=gen, dtype=torch.float64)
                for p in (*fc1.parameters(), *fc2.parameters(), *col.parameters(), *row.parameters()):
                    p.grad = None
                y = fc2(torch.nn.functional.gelu(fc1(x)))
                (y * g).sum().backward()

                lo, hi = rank * s // ws, (rank + 1) * s // ws
                blk = slice(lo, hi) if sp else slice(None)
                x_mine = x.detach()[blk].clone().requires_grad_(True)
                y_mine = row(torch.nn.functional.gelu(col(x_mine)))
                (y_mine * g[blk]).sum().backward()
                n1, n2 = col.weight.shape[0], row.weight.shape[1]
                checks = {
                    "y": (y_mine, y.detach()[blk]),
                    "dx": (x_mine.grad, x.grad[blk]),
                    "fc1.weight": (col.weight.grad, fc1.weight.grad[rank * n1 : (rank + 1) * n1]),
                    "fc1.bias": (col.bias.grad, fc1.bias.grad[rank * n1 : (rank + 1) * n1]),
                    "fc2.weight": (row.weight.grad, fc2.weight.grad[:, rank * n2 : (rank + 1) * n2]),
                    "fc2.bias": (row.bias.grad, fc2.bias.grad),
                }
                for name, (got, want) in checks.items():
                    if (
                        got is None
                        or got.shape != want.shape
                        or not torch.allclose(got, want, rtol=1e-10, atol=1e-10)
                    ):
                        report.append(
                            f"sp={sp} step {step} {name}: {None if got is None else tuple(got.shape)} "
                            f"vs {tuple(want.shape)}"
                        )
            # Frozen first layer (its weight's gradient not asked for) and a forward under no_grad.
            col.weight.requires_grad_(False)
            x_mine = x.detach()[blk].clone().requires_grad_(True)
            col.weight.grad = row.weight.grad = None
            y_mine = row(torch.nn.functional.gelu(col(x_mine)))
            (y_mine * g[blk]).sum().backward()
            if (
                col.weight.grad is not None
                or not torch.allclose(x_mine.grad, x.grad[blk], rtol=1e-10, atol=1e-10)
                or not torch.allclose(
                    row.weight.grad, fc2.weight.grad[:, rank * n2 : (rank + 1) * n2], rtol=1e-10, atol=1e-10
                )
            ):
                report.append(f"sp={sp} frozen fc1: gradients differ")
            col.weight.requires_grad_(True)
            # Activation checkpointing: the forward's collectives run again inside the backward.
            from torch.utils.checkpoint import checkpoint

            x_mine = x.detach()[blk].clone().requires_grad_(True)
            col.weight.grad = row.weight.grad = None
            y_mine = checkpoint(lambda t: row(torch.nn.functional.gelu(col(t))), x_mine, use_reentrant=False)
            (y_mine * g[blk]).sum().backward()
            if not (
                torch.allclose(x_mine.grad, x.grad[blk], rtol=1e-10, atol=1e-10)
                and torch.allclose(
                    col.weight.grad, fc1.weight.grad[rank * n1 : (rank + 1) * n1], rtol=1e-10, atol=1e-10
                )
                and torch.allclose(
                    row.weight.grad, fc2.weight.grad[:, rank * n2 : (rank + 1) * n2], rtol=1e-10, atol=1e-10
                )
            ):
                report.append(f"sp={sp} checkpointed: gradients differ")
            with torch.no_grad():
                y_nograd = row(torch.nn.functional.gelu(col(x.detach()[blk])))
            if y_nograd.requires_grad or not torch.allclose(
                y_nograd, y.detach()[blk], rtol=1e-10, atol=1e-10
            ):
                report.append(f"sp={sp} no_grad forward differs")
        q.put((rank, report))
    finally:
        dist.destroy_process_group()


def _swiglu_worker(rank, ws, init, q):
    """A pre-norm SwiGLU MLP block with its residual (gate and up projections in one column layer,
    one all-gather for both; the norm's gradients summed over the group), split over
    tensor-parallel groups of 2 (ranks {0, 1} and {2, 3} at 4 ranks, each replica its own data)."""
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=ws)
    try:
        report = []
        tp = 2
        groups = [dist.new_group(list(range(r, r + tp))) for r in range(0, ws, tp)]  # every rank makes each
        group, replica = groups[rank // tp], rank // tp
        me = dist.get_rank(group)
        torch.manual_seed(1)
        hidden, ffn = 10, 6 * tp
        gate, up = (torch.nn.Linear(hidden, ffn, bias=False, dtype=torch.float64) for _ in range(2))
        down = torch.nn.Linear(ffn, hidden, bias=False, dtype=torch.float64)
        norm = torch.nn.LayerNorm(hidden, dtype=torch.float64)
        with torch.no_grad():
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.uniform_(-0.5, 0.5)
        my_norm = torch.nn.LayerNorm(hidden, dtype=torch.float64)
        my_norm.load_state_dict(norm.state_dict())
        fc1 = ColumnParallelLinear.from_linear([gate, up], group, impl="torch")
        fc2 = RowParallelLinear.from_linear(down, group, impl="torch")
        if fc1.parts != (ffn // tp, ffn // tp) or tuple(fc1.weight.shape) != (2 * ffn // tp, hidden):
            report.append(f"parts {fc1.parts}, weight {tuple(fc1.weight.shape)}")
        s = 2 * tp
        gen = torch.Generator().manual_seed(5 + replica)
        x = torch.randn(s, 3, hidden, generator=gen, dtype=torch.float64, requires_grad=True)
        h = norm(x)  # a pre-norm MLP block with its residual
        y = x + down(torch.nn.functional.silu(gate(h)) * up(h))
        y.square().sum().backward()
        blk = slice(me * s // tp, (me + 1) * s // tp)
        x_mine = x.detach()[blk].clone().requires_grad_(True)
        g_part, u_part = fc1(my_norm(x_mine)).split(fc1.parts, -1)
        y_mine = x_mine + fc2(torch.nn.functional.silu(g_part) * u_part)
        y_mine.square().sum().backward()
        if torch.allclose(my_norm.weight.grad, norm.weight.grad):
            report.append("the norm's gradient was whole before the sum over the group")
        sync_sequence_parallel_grads(my_norm.parameters(), group)
        n = ffn // tp
        rows = slice(me * n, (me + 1) * n)
        for name, got, want in (
            ("y", y_mine, y.detach()[blk]),
            ("dx", x_mine.grad, x.grad[blk]),
            ("gate", fc1.weight.grad[:n], gate.weight.grad[rows]),
            ("up", fc1.weight.grad[n:], up.weight.grad[rows]),
            ("down", fc2.weight.grad, down.weight.grad[:, rows]),
            ("norm.weight", my_norm.weight.grad, norm.weight.grad),
            ("norm.bias", my_norm.bias.grad, norm.bias.grad),
        ):
            if not torch.allclose(got, want, rtol=1e-10, atol=1e-10):
                report.append(f"{name} differs")
        q.put((rank, report))
    finally:
        dist.destroy_process_group()


def _bad_input_worker(rank, ws, init, q):
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=ws)
    try:
        w = torch.randn(4, 6)
        cases = {
            "odd rows": lambda: linear_reduce_scatter(torch.randn(3, 6), w, impl="torch"),
            "in features": lambda: all_gather_linear(torch.randn(2, 5), w, impl="torch"),
            "dtype": lambda: all_gather_linear(torch.randn(2, 6, dtype=torch.float64), w, impl="torch"),
            "bias": lambda: all_gather_linear(torch.randn(2, 6), w, torch.randn(3), impl="torch"),
            "impl": lambda: all_gather_linear(torch.randn(2, 6), w, impl="nccl"),
            "configs": lambda: all_gather_linear(torch.randn(2, 6), w, impl="torch", configs={"ag": None}),
            "split": lambda: ColumnParallelLinear(6, 2 * ws + 1),
            "row split": lambda: RowParallelLinear(2 * ws + 1, 6),
            "features": lambda: RowParallelLinear(0, 6),
            "fused on cpu": lambda: all_gather_linear(torch.randn(2, 6), w),
            "parts": lambda: ColumnParallelLinear.from_linear([torch.nn.Linear(6, 4), torch.nn.Linear(5, 4)]),
            "part split": lambda: ColumnParallelLinear.from_linear(
                [torch.nn.Linear(6, 4), torch.nn.Linear(6, 3)]
            ),
        }
        said = {}
        for name, call in cases.items():
            try:
                call()
                said[name] = "no error"
            except ConfigError as e:
                said[name] = str(e)
        dist.barrier()  # every rank got here: no case started a collective that waits for the others
        q.put((rank, said))
    finally:
        dist.destroy_process_group()


def _run(worker, ws):
    return dict(run_gloo(worker, ws))


@pytest.mark.parametrize("ws", [2, 4])
def test_parallel_mlp_matches_the_whole_one(ws):
    results = _run(_mlp_worker, ws)
    failures = [f"rank {r}: {line}" for r, lines in sorted(results.items()) for line in lines]
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("ws", [2, 4])
def test_a_swiglu_mlp_gathers_once_for_gate_and_up(ws):
    results = _run(_swiglu_worker, ws)
    failures = [f"rank {r}: {line}" for r, lines in sorted(results.items()) for line in lines]
    assert not failures, "\n".join(failures)


def test_bad_arguments_are_refused_alike_on_every_rank():
    results = _run(_bad_input_worker, 2)
    assert results[0] == results[1]
    said = results[0]
    assert "no error" not in said.values(), said
    assert "first (sequence) dimension 3 is not divisible by the group's size 2" in said["odd rows"]
    assert "[..., 6]" in said["in features"] and "(2, 5)" in said["in features"]
    assert "float64" in said["dtype"] and "float32" in said["dtype"] and "autocast" in said["dtype"]
    assert "bias must have shape (4,)" in said["bias"]
    assert "'nccl'" in said["impl"] and "'fused'" in said["impl"] and "'async_tp'" in said["impl"]
    assert "['ag']" in said["configs"] and "ag_gemm" in said["configs"]
    assert "out_features=5" in said["split"] and "group's size 2" in said["split"]
    assert "in_features=5" in said["row split"]
    assert "in_features must be a positive integer, got 0" in said["features"]
    assert "need CUDA tensors" in said["fused on cpu"]
    assert (
        "must share in_features" in said["parts"] and "6/bias" in said["parts"] and "5/bias" in said["parts"]
    )
    assert "out_features=3 of a layer given is not divisible by the group's size 2" in said["part split"]


def test_layers_need_a_process_group():
    assert not dist.is_initialized()
    with pytest.raises(ConfigError, match="init_process_group"):
        ColumnParallelLinear(8, 8)


def _regather_worker(rank, ws, init, q):
    """The sequence-parallel column layer keeping only x's shard, on impl "fused" (its shard's
    all-gather issued before the input gradient's reduce-scatter, waited for after it) against
    impl "torch" (in sequence). On the CPU "fused"'s reduce-scatter is torch's (the fused op needs
    CUDA): what differs is only when the all-gather is issued and waited for."""
    import syncopate.tp.layers as layers
    from syncopate.kernels.library import unfused

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=ws)
    try:
        layers.ops.matmul_reduce_scatter = lambda a, b, group, config: unfused("gemm_rs", a, b, group)
        layers.ops.all_gather_matmul = lambda a, b, group, config, return_gathered=False: unfused(
            "ag_gemm", a, b, group, return_gathered
        )
        issued = []
        gather = layers.all_gather_rows_async
        layers.all_gather_rows_async = lambda t, group: issued.append(tuple(t.shape)) or gather(t, group)
        torch.manual_seed(0)
        fc = torch.nn.Linear(12, 8 * ws, dtype=torch.float64)
        x = torch.randn(4, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(rank))
        g = torch.randn(4 * ws, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(10 + rank))
        grads = {}
        for impl in ("fused", "torch"):
            col = ColumnParallelLinear.from_linear(fc, sequence_parallel=True, impl=impl, save_gathered=False)
            xi = x.clone().requires_grad_(True)
            col(xi).backward(g)
            grads[impl] = (xi.grad, col.weight.grad, col.bias.grad)
        q.put((rank, [torch.equal(a, b) for a, b in zip(grads["fused"], grads["torch"])], issued))
    finally:
        dist.destroy_process_group()


def test_fused_column_layer_gathers_its_shard_again_beside_the_input_gradient():
    for _rank, same, issued in sorted(run_gloo(_regather_worker, 2)):
        assert same == [True, True, True]
        assert issued == [(4, 12)]  # the fused layer's shard, issued early once; torch's in sequence
