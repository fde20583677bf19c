"""Layer: two and four GPUs on one host (multigpu). FP8 training in `syncopate.tp` on the fused ops:
the column- and row-parallel layers with `float8=True`, sequence-parallel and all-reduce, their
output and input, weight and bias gradients, two steps of fresh inputs, against float32 GEMMs of
the same FP8 operands and against the bf16 layer (`tests/test_tp_float8.py`'s checks and
tolerances), with the looked-up configuration and with templates `unfused` and `decomposed`; and
torch's path (`impl="torch"`, `torch._scaled_mm` on CUDA) likewise. Then a tiny MLP parallelized
with the styles (`float8=True`) trains two steps with losses within FP8's tolerance of the bf16
styles'.
"""

from __future__ import annotations

import pytest
from test_gpu_ops import needs_gpus, run_ranks

pytestmark = pytest.mark.multigpu

SHAPE = (512, 1024, 2048)  # tokens, in_features, out_features


def _layers_target(rank, world, port, q):
    from syncopate.measure.local_ranks import join_group

    device = join_group(rank, world, port)
    import torch.distributed as dist
    from test_tp_float8 import layer_failures, layer_report

    import syncopate
    from syncopate.search_space import decomposed_candidate, unfused_candidate

    failures = []
    try:
        setups = {
            "fused, looked up": ("fused", None),
            "fused, unfused": (
                "fused",
                dict.fromkeys(("ag_gemm", "gemm_rs", "gemm_ar"), unfused_candidate()),
            ),
            "fused, decomposed": (
                "fused",
                dict.fromkeys(("ag_gemm", "gemm_rs", "gemm_ar"), decomposed_candidate(2)),
            ),
            "torch": ("torch", None),
        }
        for label, (impl, configs) in setups.items():
            try:
                report = layer_report(rank, world, impl=impl, configs=configs, shape=SHAPE, device=device)
                failures += layer_failures(rank, report, f" {label}")
            except Exception as e:  # noqa: BLE001 - named in the report
                failures.append(f"rank {rank} {label}: {type(e).__name__}: {e}")
        q.put((rank, failures))
    finally:
        syncopate.close_contexts()
        dist.destroy_process_group()


@pytest.mark.timeout(900)
@pytest.mark.parametrize("world", [2, 4])
def test_fp8_layers_on_the_fused_ops_match_their_fp8_reference_and_the_bf16_layer(world):
    needs_gpus(world)
    reports = run_ranks(_layers_target, world, timeout=800)
    failed = [f for r in reports.values() for f in r]
    assert not failed, "\n".join(failed)


def _styles_target(rank, world, port, q):
    from syncopate.measure.local_ranks import join_group

    device = join_group(rank, world, port)
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import parallelize_module

    import syncopate
    from syncopate.tp import ColwiseParallel, RowwiseParallel

    try:
        mesh = init_device_mesh("cuda", (world,))
        seq, batch, hidden, ffn = 256, 2, 1024, 4096
        losses = {}
        for float8 in (False, True):
            torch.manual_seed(3)
            model = torch.nn.Sequential(
                torch.nn.Linear(hidden, ffn), torch.nn.GELU(), torch.nn.Linear(ffn, hidden)
            ).to(device=device, dtype=torch.bfloat16)
            parallelize_module(
                model,
                mesh,
                {
                    "0": ColwiseParallel(input_layouts=Shard(0), float8=float8),
                    "2": RowwiseParallel(output_layouts=Shard(0), float8=float8),
                },
            )
            opt = torch.optim.SGD(model.parameters(), lr=2.0)
            gen = torch.Generator().manual_seed(50)
            x = torch.randn(seq, batch, hidden, generator=gen).bfloat16().to(device)
            t = torch.randn(seq, batch, hidden, generator=gen).bfloat16().to(device)
            blk = slice(rank * seq // world, (rank + 1) * seq // world)
            for step in range(2):
                opt.zero_grad()
                loss = ((model(x[blk]).float() - t[blk].float()) ** 2).sum() / t.numel()
                loss.backward()
                opt.step()
                total = loss.detach().clone()
                dist.all_reduce(total)
                losses[(float8, step)] = float(total)
        q.put((rank, losses))
    finally:
        syncopate.close_contexts()
        dist.destroy_process_group()


@pytest.mark.timeout(600)
def test_a_model_with_the_fp8_styles_trains_two_steps_as_with_the_bf16_styles_on_two_gpus():
    from test_tp_float8 import LOSS_TOLERANCE

    needs_gpus(2)
    for rank, losses in run_ranks(_styles_target, 2, timeout=500).items():
        for step in range(2):
            bf16, fp8 = losses[(False, step)], losses[(True, step)]
            assert abs(fp8 - bf16) <= LOSS_TOLERANCE * abs(bf16), f"rank {rank} step {step}: {fp8} vs {bf16}"
            assert fp8 != bf16, f"rank {rank} step {step}: the FP8 model must have run in FP8"
        assert losses[(True, 1)] < losses[(True, 0)], f"rank {rank}: the FP8 model's loss must fall: {losses}"
