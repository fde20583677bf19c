"""Layer: gloo process groups on the CPU (and plain CPU logic). `syncopate.tp`'s ParallelStyles in a
plan for torch's `parallelize_module`, on a model nobody here wrote: transformers' LlamaForCausalLM at
tiny widths, parallelized as torchtitan parallelizes Llama (colwise q/k/v/gate/up, rowwise o/down,
SequenceParallel norms, PrepareModuleInput on attention and MLP), once with torch's styles and once
with ours, trained two steps from the same weights on the same batches of two sequences: the losses
match each other and the whole model's, every gradient matches torch's plan's (float32), the
state_dict keys and the DTensor placements are torch's, and the ops ours call are one all-gather
matmul and one reduce-scatter matmul each for q/k/v together, o, gate/up together and down, forward
and backward (their CPU path: torch's collective then the matmul). The same plan compiled
(torch.compile of each decoder layer) gives the whole model's losses and gradients without a graph
break (marked slow). Arguments torch's
styles take that ours do not, and modules ours do not parallelize, are refused with one message
naming the argument and value, on every rank alike, before any collective starts.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from support.gloo import run_gloo
from torch.distributed.tensor import Partial, Replicate, Shard

from syncopate.errors import ConfigError
from syncopate.tp import ColwiseParallel, PrepareModuleInput, RowwiseParallel

pytestmark = pytest.mark.timeout(300)

STEPS = 2


def _llama(layers: int = 2):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=96,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_hidden_layers=layers,
        vocab_size=96,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def _parallelize(model, mesh, styles: str):
    """torchtitan's Llama plan with transformers' module names; `styles`: torch or syncopate."""
    import torch.distributed.tensor.parallel as torch_tp
    from torch.distributed.tensor.parallel import parallelize_module

    import syncopate.tp as ours

    lib = ours if styles == "syncopate" else torch_tp
    parallelize_module(
        model,
        mesh,
        {
            "model.embed_tokens": torch_tp.RowwiseParallel(
                input_layouts=Replicate(), output_layouts=Shard(1)
            ),
            "model.norm": torch_tp.SequenceParallel(),
            "lm_head": torch_tp.ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
        },
    )
    # The first compiled layer's input must not be the embedding's to_local() view: with it, torch's
    # plan too gets a plain tensor where DTensor's redistribution expects a DTensor in the backward.
    model.model.embed_tokens.register_forward_hook(lambda m, args, out: out.clone())
    for layer in model.model.layers:
        parallelize_module(
            layer,
            mesh,
            {
                "input_layernorm": lib.SequenceParallel(),
                "self_attn": lib.PrepareModuleInput(
                    input_kwarg_layouts={"hidden_states": Shard(1)},
                    desired_input_kwarg_layouts={"hidden_states": Replicate()},
                ),
                "self_attn.q_proj": lib.ColwiseParallel(),
                "self_attn.k_proj": lib.ColwiseParallel(),
                "self_attn.v_proj": lib.ColwiseParallel(),
                "self_attn.o_proj": lib.RowwiseParallel(output_layouts=Shard(1)),
                "post_attention_layernorm": lib.SequenceParallel(),
                "mlp": lib.PrepareModuleInput(
                    input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
                ),
                "mlp.gate_proj": lib.ColwiseParallel(),
                "mlp.up_proj": lib.ColwiseParallel(),
                "mlp.down_proj": lib.RowwiseParallel(output_layouts=Shard(1)),
            },
        )
    return model


def _values(grad):
    """A gradient as this rank holds it: a sharded one's shard, a partial one summed (DTensor keeps
    the norms' gradients partial until they are used), with its placements."""
    from torch.distributed.tensor import DTensor

    if not isinstance(grad, DTensor):
        return grad.clone(), None
    whole = [Replicate() if isinstance(p, Partial) else p for p in grad.placements]
    return grad.redistribute(placements=whole).to_local().clone(), tuple(grad.placements)


def _train(model, batches, record=None, lr: float = 0.5):
    """Losses and gradients (`_values`) of an SGD step on each batch."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses, grads = [], []
    for ids in batches:
        if record is not None:
            record.append("step")
        opt.zero_grad()
        positions = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)  # the whole sequence's
        loss = model(input_ids=ids, labels=ids, position_ids=positions).loss
        loss.backward()
        losses.append(loss.item())
        grads.append({k: _values(p.grad) for k, p in model.named_parameters()})
        opt.step()
    return losses, grads


def _placements(model) -> dict:
    from torch.distributed.tensor import DTensor

    return {
        k: (type(v).__name__, tuple(v.placements) if isinstance(v, DTensor) else None)
        for k, v in model.state_dict().items()
    }


def _batches(ws: int) -> list:
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(0, 96, (2, 8 * ws), generator=gen) for _ in range(STEPS)]


def _hf_worker(rank, ws, init, q):
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=ws)
    try:
        from torch.distributed.device_mesh import init_device_mesh

        from syncopate.tp import layers

        mesh = init_device_mesh("cpu", (ws,))
        batches = _batches(ws)
        report = []
        ref_losses, _ = _train(_llama(), batches)
        torch_model = _parallelize(_llama(), mesh, "torch")
        torch_losses, torch_grads = _train(torch_model, batches)

        calls: list = []
        custom_op = layers._custom_op

        def recorded(kind, a, b, group, config, gathered=False):
            calls.append((kind, tuple(b.shape)))
            return custom_op(kind, a, b, group, config, gathered)

        layers._custom_op = recorded
        try:
            ours = _parallelize(_llama(), mesh, "syncopate")
            our_losses, our_grads = _train(ours, batches, calls)
        finally:
            layers._custom_op = custom_op
        for name, losses in (("torch's plan", torch_losses), ("ours", our_losses)):
            if not torch.allclose(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-5, atol=1e-5):
                report.append(f"{name}: losses {losses} vs the whole model's {ref_losses}")
        for step, (want, got) in enumerate(zip(torch_grads, our_grads)):
            for key, (g, placements) in want.items():
                mine, my_placements = got[key]
                if (
                    my_placements != placements
                    or mine.shape != g.shape
                    or not torch.allclose(mine, g, rtol=1e-4, atol=1e-6)
                ):
                    report.append(
                        f"step {step} {key}: gradient {my_placements} differs from torch's plan's "
                        f"{placements}"
                    )
        if _placements(ours) != _placements(torch_model):
            report.append(f"state_dict: {_placements(ours)} vs torch's {_placements(torch_model)}")
        # One layer, one step: q/k/v (4 + 2 + 2 heads of 16 = 128 features, 128/ws a rank) gathered
        # once, gate/up (2 x 96) once; o and down reduce-scattered; the backward mirrors them.
        step_calls = calls[1 : calls.index("step", 1)]
        want_calls = [
            ("ag_gemm", (64, 128 // ws)),
            ("gemm_rs", (64 // ws, 64)),
            ("ag_gemm", (64, 192 // ws)),
            ("gemm_rs", (96 // ws, 64)),
        ] * 2
        want_calls += [
            ("ag_gemm", (64, 96 // ws)),
            ("gemm_rs", (192 // ws, 64)),
            ("ag_gemm", (64, 64 // ws)),
            ("gemm_rs", (128 // ws, 64)),
        ] * 2
        if step_calls != want_calls:
            report.append(f"ops called in a step: {step_calls}, expected {want_calls}")
        q.put((rank, report))
    finally:
        dist.destroy_process_group()


def _compiled_worker(rank, ws, init, q):
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=ws)
    try:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (ws,))
        batches = _batches(ws)
        report = []
        ref_losses, ref_grads = _train(_llama(layers=1), batches)  # one layer: one compilation
        compiled = _parallelize(_llama(layers=1), mesh, "syncopate")
        from torch._dynamo.utils import counters

        torch._dynamo.reset()
        counters.clear()
        for layer in compiled.model.layers:
            layer.compile(backend="aot_eager")
        compiled_losses, compiled_grads = _train(compiled, batches)
        if not torch.allclose(torch.tensor(compiled_losses), torch.tensor(ref_losses), rtol=1e-5, atol=1e-5):
            report.append(f"compiled: losses {compiled_losses} vs the whole model's {ref_losses}")
        if counters["graph_break"]:
            report.append(f"compiled: graph breaks {dict(counters['graph_break'])}")
        for key, (g, _) in compiled_grads[-1].items():
            want = ref_grads[-1][key][0]
            if g.shape != want.shape:  # this rank's shard: the whole model's in the same block
                dim = next(i for i, (a, b) in enumerate(zip(g.shape, want.shape)) if a != b)
                want = want.chunk(ws, dim)[rank]
            if not torch.allclose(g, want, rtol=1e-4, atol=1e-6):
                report.append(f"compiled {key}: gradient differs from the whole model's")
        q.put((rank, report))
    finally:
        dist.destroy_process_group()


def _failures(results: dict) -> str:
    return "\n".join(f"rank {r}: {line}" for r, lines in sorted(results.items()) for line in lines)


def test_llama_with_our_styles_trains_as_with_torchs():
    pytest.importorskip("transformers")
    failures = _failures(dict(run_gloo(_hf_worker, 2, timeout=280)))
    assert not failures, failures


@pytest.mark.slow
def test_llama_with_our_styles_compiles_without_a_graph_break():
    pytest.importorskip("transformers")
    failures = _failures(dict(run_gloo(_compiled_worker, 2, timeout=280)))
    assert not failures, failures


@pytest.mark.parametrize(
    "make, said",
    [
        (
            lambda: ColwiseParallel(output_layouts=Replicate()),
            "output_layouts=Replicate() is not supported: accepted are Shard(-1)",
        ),
        (lambda: ColwiseParallel(input_layouts=Shard(-1)), "input_layouts=Shard(dim=-1) is not supported"),
        (lambda: ColwiseParallel(input_layouts=Partial()), "input_layouts=Partial(sum) is not supported"),
        (
            lambda: ColwiseParallel(input_layouts=(Shard(1),)),
            "input_layouts=(Shard(dim=1),) is not supported",
        ),
        (
            lambda: RowwiseParallel(input_layouts=Replicate()),
            "input_layouts=Replicate() is not supported: accepted are Shard(-1)",
        ),
        (
            lambda: RowwiseParallel(output_layouts=Shard(-1)),
            "output_layouts=Shard(dim=-1) is not supported: accepted are Replicate()",
        ),
        (lambda: RowwiseParallel(output_layouts=Partial()), "output_layouts=Partial(sum) is not supported"),
        (
            lambda: ColwiseParallel(use_local_output="yes"),
            "use_local_output must be True or False, got 'yes'",
        ),
        (lambda: RowwiseParallel(impl="nccl"), "impl 'nccl': accepted are 'fused'"),
        (lambda: ColwiseParallel(configs={"ag": None}), "configs has key(s) ['ag']"),
        (
            lambda: PrepareModuleInput(input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(),)),
            "must be tuples of the same length",
        ),
        (
            lambda: PrepareModuleInput(
                input_kwarg_layouts={"x": Shard(1)}, desired_input_kwarg_layouts={"y": Replicate()}
            ),
            "names ['x'] but desired_input_kwarg_layouts names ['y']",
        ),
    ],
)
def test_what_torchs_styles_take_and_ours_do_not_is_refused(make, said):
    with pytest.raises(ConfigError) as e:
        make()
    assert said in str(e.value)


class _OwnForward(torch.nn.Linear):
    def forward(self, x):
        return super().forward(x) * 2


def _bad_apply_worker(rank, ws, init, q):
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=ws)
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import parallelize_module

        mesh = init_device_mesh("cpu", (ws,))
        cases = {
            "embedding": lambda: parallelize_module(torch.nn.Embedding(8, 4), mesh, ColwiseParallel()),
            "row embedding": lambda: parallelize_module(torch.nn.Embedding(8, 4), mesh, RowwiseParallel()),
            "own forward": lambda: parallelize_module(_OwnForward(4, 4), mesh, ColwiseParallel()),
            "float8": lambda: parallelize_module(
                torch.nn.Linear(4, 4).to(torch.float8_e4m3fn), mesh, RowwiseParallel()
            ),
            "2-D mesh": lambda: parallelize_module(
                torch.nn.Linear(4, 4), init_device_mesh("cpu", (1, ws)), ColwiseParallel()
            ),
            "out split": lambda: parallelize_module(torch.nn.Linear(4, 2 * ws + 1), mesh, ColwiseParallel()),
            "in split": lambda: parallelize_module(torch.nn.Linear(2 * ws + 1, 4), mesh, RowwiseParallel()),
            "odd sequence": lambda: parallelize_module(
                torch.nn.Linear(4 * ws, 4), mesh, RowwiseParallel(output_layouts=Shard(0))
            )(torch.randn(2 * ws + 1, 4)),
            "features sharded": lambda: parallelize_module(
                torch.nn.Linear(4, 2 * ws), mesh, ColwiseParallel(input_layouts=Shard(1))
            )(torch.randn(3, 4)),
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


def test_modules_and_inputs_ours_do_not_take_are_refused_alike_on_every_rank():
    results = dict(run_gloo(_bad_apply_worker, 2))
    assert results[0] == results[1]
    said = results[0]
    assert "no error" not in said.values(), said
    assert "module of type Embedding is not supported: accepted is nn.Linear" in said["embedding"]
    assert "keep torch's ColwiseParallel" in said["embedding"]
    assert "keep torch's RowwiseParallel" in said["row embedding"]
    assert "_OwnForward is an nn.Linear with a forward of its own" in said["own forward"]
    assert "weight dtype torch.float8_e4m3fn is not supported" in said["float8"]
    assert "must be the 1-D tensor-parallel mesh" in said["2-D mesh"] and "2-D DeviceMesh" in said["2-D mesh"]
    assert "out_features=5 is not divisible by the mesh's size 2" in said["out split"]
    assert "in_features=5 is not divisible by the mesh's size 2" in said["in split"]
    assert "the sequence dim 0 has 5 rows, not divisible by the group's size 2" in said["odd sequence"]
    assert "sharded as Shard(dim=1) is sharded on its features" in said["features sharded"]
