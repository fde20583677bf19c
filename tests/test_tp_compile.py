"""Layer: gloo process groups on the CPU. `syncopate.tp`'s fused layers, and the public ops, under
`torch.compile` with `fullgraph=True`: the fused ops are traced as `torch.ops.syncopate.*` nodes
(their fake implementations give the shapes), forward and backward, with no graph break; the
compiled model, which runs those ops' CPU path (torch's collective, then the matmul), gives the
output and every gradient of the same layers with `impl="torch"` in eager mode, in float64, with
and without sequence parallelism, keeping the gathered input or only its shard, with a config
given; the public ops compiled give torch's collectives' results. The custom ops' CUDA path is the
fused kernels' (tests/test_gpu_tp.py compiles the layers on GPUs).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from support.gloo import run_gloo

from syncopate.kernels.library import _config, config_text
from syncopate.search_space import Candidate
from syncopate.tp import ColumnParallelLinear, RowParallelLinear

pytestmark = pytest.mark.timeout(300)


def _recording_backend(graphs: list):
    """aot_eager that keeps the forward and backward graphs' op names."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    def keep(gm, example_inputs):
        graphs.append([str(n.target) for n in gm.graph.nodes if n.op == "call_function"])
        return make_boxed_func(gm.forward)

    return aot_autograd(fw_compiler=keep, bw_compiler=keep)


def _worker(rank, ws, init, q):
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=ws)
    try:
        report = []
        config = Candidate(num_splits=2)
        for sp, save_gathered, configs in (
            (True, True, None),
            (True, False, {"ag_gemm": config}),
            (False, True, None),
        ):
            torch.manual_seed(0)
            fc1 = torch.nn.Linear(16, 8 * ws, dtype=torch.float64)
            fc2 = torch.nn.Linear(8 * ws, 16, dtype=torch.float64)
            layers = {}
            for impl in ("fused", "torch"):
                layers[impl] = (
                    ColumnParallelLinear.from_linear(
                        fc1, sequence_parallel=sp, impl=impl, save_gathered=save_gathered, configs=configs
                    ),
                    RowParallelLinear.from_linear(fc2, sequence_parallel=sp, impl=impl, configs=configs),
                )

            def mlp(x, impl):
                col, row = layers[impl]
                return row(torch.nn.functional.gelu(col(x)))

            graphs: list = []
            torch._dynamo.reset()
            compiled = torch.compile(
                lambda x: mlp(x, "fused"), fullgraph=True, backend=_recording_backend(graphs)
            )
            gen = torch.Generator().manual_seed(5 + rank)
            rows = 4 * ws // (ws if sp else 1)
            worst = 0.0
            for _ in range(2):
                x = torch.randn(rows, 3, 16, generator=gen, dtype=torch.float64)
                g = torch.randn(rows, 3, 16, generator=gen, dtype=torch.float64)
                results = {}
                for impl, fn in (("fused", compiled), ("torch", lambda x: mlp(x, "torch"))):
                    xi = x.clone().requires_grad_(True)
                    for p in (*layers[impl][0].parameters(), *layers[impl][1].parameters()):
                        p.grad = None
                    y = fn(xi)
                    (y * g).sum().backward()
                    col, row = layers[impl]
                    results[impl] = [
                        y,
                        xi.grad,
                        col.weight.grad,
                        col.bias.grad,
                        row.weight.grad,
                        row.bias.grad,
                    ]
                worst = max(
                    worst,
                    *(
                        float((a - b).abs().max())
                        for a, b in zip(results["fused"], results["torch"], strict=True)
                    ),
                )
            ops = [name for graph in graphs for name in graph if name.startswith("syncopate.")]
            report.append((sp, save_gathered, worst, len(graphs), sorted(set(ops))))
        q.put((rank, report))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("ws", [2, 3])
def test_fused_layers_compile_whole_and_match_torchs_path(ws):
    for rank, report in sorted(run_gloo(_worker, ws)):
        for sp, save_gathered, worst, graphs, ops in report:
            where = f"rank {rank}, sequence_parallel={sp}, save_gathered={save_gathered}"
            assert worst < 1e-12, f"{where}: compiled fused layers differ from torch's path by {worst:.3g}"
            assert graphs == 2, f"{where}: {graphs} graphs (a forward and a backward, no break, expected)"
            expected = (
                [
                    "syncopate.all_gather_matmul_gathered.default"
                    if save_gathered
                    else "syncopate.all_gather_matmul.default",
                    "syncopate.matmul_reduce_scatter.default",
                ]
                if sp
                else ["syncopate.matmul_all_reduce.default"]
            )
            assert all(name in ops for name in expected), f"{where}: traced {ops}"


def test_a_config_goes_through_its_text_unchanged():
    c = Candidate(backend="sm_copy", comm_sms=16, num_splits=4, block_n=256, tile_order="swizzle")
    assert Candidate.from_dict(_config(config_text(c))) == c
    assert _config(config_text({"num_splits": 2, "backend": "nccl"})) == {"backend": "nccl", "num_splits": 2}
    assert config_text(None) is None and _config(None) is None


def _ops_worker(rank, ws, init, q):
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=ws)
    try:
        import syncopate

        def f(a, b, bt):
            out, full = syncopate.all_gather_matmul(a, b, return_gathered=True)
            return (
                out.relu(),
                full,
                syncopate.matmul_reduce_scatter(full, bt),
                syncopate.matmul_all_reduce(full, bt),
            )

        gen = torch.Generator().manual_seed(3 + rank)
        a = torch.randn(4, 6, generator=gen, dtype=torch.float64)
        b = torch.randn(6, 5, generator=gen, dtype=torch.float64)
        bt = torch.randn(5, 6, generator=gen, dtype=torch.float64).t()  # K-major, as weight.t() is
        graphs: list = []
        torch._dynamo.reset()
        got = torch.compile(f, fullgraph=True, backend=_recording_backend(graphs))(a, b, bt)
        full = torch.empty(4 * ws, 6, dtype=torch.float64)
        dist.all_gather_into_tensor(full, a)
        summed = full @ bt
        dist.all_reduce(summed)
        want = ((full @ b).relu(), full, summed[rank * 4 : (rank + 1) * 4], summed)
        worst = max(float((x - y).abs().max()) for x, y in zip(got, want, strict=True))
        ops = sorted({name for graph in graphs for name in graph if name.startswith("syncopate.")})
        q.put((rank, (worst, len(graphs), ops)))
    finally:
        dist.destroy_process_group()


def test_the_public_ops_compile_whole():
    for rank, (worst, graphs, ops) in sorted(run_gloo(_ops_worker, 2)):
        assert worst < 1e-12, f"rank {rank}: compiled ops differ from torch's path by {worst:.3g}"
        assert graphs == 1 and ops == [
            "syncopate.all_gather_matmul_gathered.default",
            "syncopate.matmul_all_reduce.default",
            "syncopate.matmul_reduce_scatter.default",
        ], (rank, graphs, ops)
