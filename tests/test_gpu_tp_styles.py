"""Layer: GPUs. syncopate.tp's ParallelStyles on transformers' Llama on two GPUs (NCCL group), the
fused ops in the forward and the backward: bf16 SGD steps under torchtitan's plan with ours (eager,
each decoder layer compiled, and compiled in reduce-overhead mode) give the losses and gradients of
the same plan with torch's styles to bf16 rounding, on batches of one sequence and of two (whose
sequence-sharded rows the styles reorder around the ops), and the same state_dict placements. The
plan and the training step are tests/test_tp_styles.py's, which checks them on the CPU in float32.
"""

from __future__ import annotations

import pytest
from test_gpu_ops import needs_gpus, run_ranks

VOCAB = 2048
LOSS_TOL, GRAD_TOL = 1e-2, 5e-2
"""Relative: bf16 rounds to 2^-8; the two plans sum their partial products in other orders."""


def _worker(rank, world, port, q):
    from syncopate.measure.local_ranks import join_group

    dev = join_group(rank, world, port)
    import torch
    import torch._dynamo
    import torch.distributed as dist
    from test_tp_styles import _parallelize, _placements, _train
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import LlamaConfig, LlamaForCausalLM

    from syncopate.kernels import ops
    from syncopate.measure.reference import relative_error

    mesh = init_device_mesh("cuda", (world,))
    config = LlamaConfig(
        hidden_size=1024,
        intermediate_size=2816,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=128,
        num_hidden_layers=2,
        vocab_size=VOCAB,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
    )

    def build(styles: str):
        torch.manual_seed(0)
        with torch.device(dev):
            model = LlamaForCausalLM(config)
        return _parallelize(model.to(torch.bfloat16), mesh, styles)

    report = []
    for batch, seq in ((1, 2048), (2, 1024)):
        gen = torch.Generator().manual_seed(1)
        batches = [torch.randint(0, VOCAB, (batch, seq), generator=gen).to(dev) for _ in range(3)]
        torch_model = build("torch")
        want_losses, want_grads = _train(torch_model, batches, lr=1e-3)
        for variant in ("eager", "compiled", "graphs"):
            torch._dynamo.reset()
            model = build("syncopate")
            if variant != "eager":
                for layer in model.model.layers:
                    layer.compile(mode="reduce-overhead" if variant == "graphs" else None)
            losses, grads = _train(model, batches, lr=1e-3)
            loss_errs = [abs(a - b) / abs(b) for a, b in zip(losses, want_losses)]
            grad_errs = {k: relative_error(grads[-1][k][0], g) for k, (g, _) in want_grads[-1].items()}
            worst = max(grad_errs, key=grad_errs.get)
            report.append(
                (
                    batch,
                    variant,
                    max(loss_errs),
                    worst,
                    grad_errs[worst],
                    _placements(model) == _placements(torch_model),
                )
            )
    ops.close_contexts()
    q.put((rank, report))
    dist.destroy_process_group()


@pytest.mark.multigpu
@pytest.mark.timeout(900)
def test_llama_with_our_styles_trains_as_with_torchs_on_gpus():
    pytest.importorskip("transformers")
    needs_gpus(2)
    reports = run_ranks(_worker, 2, (), timeout=800)
    for batch, variant, loss_err, worst, grad_err, same_placements in reports[0]:
        print(f"batch {batch} {variant}: loss rel diff {loss_err:.2e}, worst gradient {worst} {grad_err:.2e}")
        assert loss_err <= LOSS_TOL and grad_err <= GRAD_TOL and same_placements, (batch, variant, worst)
