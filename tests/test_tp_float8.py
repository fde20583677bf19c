"""Layer: gloo process groups on the CPU (and plain CPU logic). FP8 training in `syncopate.tp`
(`float8=True`, `syncopate.tp.float8`): the column- and row-parallel layers, with sequence
parallelism and without, on 2 ranks, `impl="torch"` (torch's collectives and the CPU build's
`torch._scaled_mm`, which is the `unfused` template's FP8 path), two steps back to back with fresh
inputs. Their output and the input, weight and bias gradients are checked against

(a) the same layer computed in float32 from the same FP8 operands (quantized here by the documented
    formula, each GEMM's along its contracted dimension, each rank's its own): relative error
    ≤ TIGHT, the bf16 rounding of the outputs and of the reduced partials;
(b) the bf16 layer: relative error ≤ LOOSE, what FP8 (e4m3, 3 mantissa bits) costs on top.

Under torch.compile the FP8 linears run eagerly (a graph break each; fullgraph stops there, naming
why). A tiny MLP parallelized with the styles (`ColwiseParallel(float8=True)`,
`RowwiseParallel(float8=True)`), sequence-parallel, replicated and on a replicated DTensor input,
and transformers' Llama under torchtitan's plan (q/k/v and gate/up merged), train two steps with
losses within LOSS_TOLERANCE of the bf16 styles'. Arguments float8 cannot take are refused with a
message naming the value. The fused ops' FP8 path on GPUs: tests/test_gpu_tp_float8.py.
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.distributed as dist
from support.gloo import run_gloo

from syncopate.errors import ConfigError
from syncopate.measure.reference import relative_error
from syncopate.tp.float8 import AMAX_EPS, E4M3_MAX, quantize

pytestmark = pytest.mark.timeout(180)

TIGHT = 6e-3
"""(a): ‖got − ref‖/‖ref‖ against float32 GEMMs of the same FP8 operands: the bf16 rounding of the
outputs and of the reduced partials (up to 2.9e-3 here)."""
LOOSE = 8e-2
"""(b): against the bf16 layer: e4m3's rounding of both operands of every GEMM (up to 3.9e-2 here)."""
LOSS_TOLERANCE = 5e-3
"""The styles' model: |loss_fp8 − loss_bf16| / |loss_bf16| of each step (a mean squared error against
random targets, which FP8's error in the output moves by about 5e-4 here)."""

M, K, N = 32, 32, 64  # tokens, in_features, out_features: every GEMM dimension a multiple of 16


def _deq(v: torch.Tensor, dim: int) -> torch.Tensor:
    """v through FP8 and back in float32, scaled along `dim` by the documented formula."""
    amax = v.abs().amax(dim=dim, keepdim=True).float()
    scale = amax.clamp_min(1e-12) * (1 / 448.0)
    return (v.float() / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).float() * scale


def _qmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b in float32 on FP8 operands quantized along the contracted dimension."""
    return _deq(a, 1) @ _deq(b, 0)


def test_quantize_scales_each_row_or_column_by_its_amax_over_448():
    v = torch.tensor([[1.0, -2.0, 0.5], [0.0, 0.0, 0.0], [300.0, 1e-3, -7.0]], dtype=torch.bfloat16)
    v8, scale = quantize(v, 1)
    assert v8.dtype == torch.float8_e4m3fn and scale.dtype == torch.float32 and scale.shape == (3, 1)
    assert torch.equal(scale[:, 0], torch.tensor([2.0 / E4M3_MAX, AMAX_EPS / E4M3_MAX, 300.0 / E4M3_MAX]))
    assert torch.equal(v8.float().abs().amax(1), torch.tensor([448.0, 0.0, 448.0]))
    assert torch.equal(v8[1].float(), torch.zeros(3)), "an all-zero row stays zero, its scale finite"
    cols8, cols = quantize(v, 0)
    assert cols.shape == (1, 3) and torch.equal(cols[0], torch.tensor([300.0, 2.0, 7.0]) / E4M3_MAX)
    w = torch.randn(64, 48)
    w8, sw = quantize(w.t(), 0)  # a weight's transpose stays column-major: no copy for the GEMM
    assert w8.stride() == (1, 48) and sw.shape == (1, 64)
    assert relative_error(w8.float() * sw, w.t()) < 4e-2


# The layers on two ranks ---------------------------------------------------------------------------


def _step_inputs(step, m, k, n, device):
    """The whole input and output gradient of a step, the same on every rank (each takes its part):
    rows of unlike magnitudes, so that one scale per row matters."""
    gen = torch.Generator().manual_seed(1000 * step + 17)
    x = torch.randn(m, k, generator=gen) * torch.linspace(0.2, 5.0, m).unsqueeze(1)
    g = torch.randn(m, n, generator=gen) * torch.linspace(3.0, 0.1, m).unsqueeze(1)
    return x.bfloat16().to(device), g.bfloat16().to(device)


def layer_report(rank, ws, impl="torch", configs=None, shape=(M, K, N), device="cpu") -> dict:
    """{(kind, sp, step, output or gradient): (dtype, shape, the bf16 layer's shape, error against
    (a), against (b), the bf16 layer's against (a))} of the FP8 column and row layers, with sequence
    parallelism and without, two steps of fresh inputs each."""
    from syncopate.tp import ColumnParallelLinear, RowParallelLinear

    m, k_all, n_all = shape
    report = {}
    for kind in ("column", "row"):
        for sp in (True, False):
            torch.manual_seed(5)
            whole = torch.nn.Linear(k_all, n_all, dtype=torch.bfloat16, device=device)
            with torch.no_grad():
                whole.bias.normal_()
            cls = ColumnParallelLinear if kind == "column" else RowParallelLinear
            fp8 = cls.from_linear(whole, sequence_parallel=sp, impl=impl, configs=configs, float8=True)
            bf16 = cls.from_linear(whole, sequence_parallel=sp, impl="torch")
            n, k = fp8.weight.shape
            cols = slice(rank * n, (rank + 1) * n) if kind == "column" else slice(None)
            kcols = slice(rank * k, (rank + 1) * k) if kind == "row" else slice(None)
            blk = slice(rank * m // ws, (rank + 1) * m // ws)
            w = whole.weight.detach()
            for step in range(2):
                x, g = _step_inputs(step, m, k_all, n_all, device)
                got = {}
                for name, layer in (("fp8", fp8), ("bf16", bf16)):
                    layer.zero_grad(set_to_none=True)
                    if kind == "column":
                        x_mine = x[blk] if sp else x
                        g_mine = g[:, cols]
                    else:
                        x_mine = x[:, kcols]
                        g_mine = g[blk] if sp else g
                    x_mine = x_mine.clone().requires_grad_(True)
                    y = layer(x_mine)
                    y.backward(g_mine)
                    got[name] = {
                        "y": y,
                        "dx": x_mine.grad,
                        "dW": layer.weight.grad,
                        "db": layer.bias.grad,
                    }
                # (a) float32 from the same FP8 operands, each rank's partial with its own scales
                if kind == "column":
                    y_ref = _qmm(x, w[cols].t()) + whole.bias[cols].float()
                    dx_ref = sum(_qmm(g[:, r * n : (r + 1) * n], w[r * n : (r + 1) * n]) for r in range(ws))
                    dx_ref = dx_ref[blk] if sp else dx_ref
                    dw_ref = _qmm(g[:, cols].t(), x)
                    db_ref = g[:, cols].float().sum(0)
                else:
                    y_ref = (
                        sum(_qmm(x[:, r * k : (r + 1) * k], w[:, r * k : (r + 1) * k].t()) for r in range(ws))
                        + whole.bias.float()
                    )
                    y_ref = y_ref[blk] if sp else y_ref
                    dx_ref = _qmm(g, w[:, kcols])
                    dw_ref = _qmm(g.t(), x[:, kcols])
                    db_ref = g.float().sum(0)
                refs = {"y": y_ref, "dx": dx_ref, "dW": dw_ref, "db": db_ref}
                for what, ref in refs.items():
                    fp8_got, bf16_got = got["fp8"][what], got["bf16"][what]
                    report[(kind, sp, step, what)] = (
                        None if fp8_got is None else fp8_got.dtype,
                        None if fp8_got is None else tuple(fp8_got.shape),
                        tuple(bf16_got.shape),
                        relative_error(fp8_got, ref) if fp8_got is not None else float("inf"),
                        relative_error(fp8_got, bf16_got) if fp8_got is not None else float("inf"),
                        relative_error(bf16_got, ref),  # how far the unquantized layer is from (a)
                    )
    return report


def layer_failures(rank, report: dict, label: str = "") -> list[str]:
    """What of a `layer_report` is off: a dtype or shape, (a) beyond TIGHT, (b) beyond LOOSE, or
    (a) unable to tell FP8 from bf16 (the bf16 layer within 2 × TIGHT of it)."""
    failures = []
    for (kind, sp, step, what), (dtype, shape, want_shape, tight, loose, bf16_off) in report.items():
        where = f"rank {rank}{label} {kind} sp={sp} step {step} {what}"
        if dtype != torch.bfloat16 or shape != want_shape:
            failures.append(f"{where}: {dtype} {shape} vs {want_shape}")
        if not tight <= TIGHT:
            failures.append(f"{where}: {tight:.3g} from float32 on the same FP8 operands")
        if not loose <= LOOSE:
            failures.append(f"{where}: {loose:.3g} from the bf16 layer")
        if what != "db" and not bf16_off > 2 * TIGHT:  # the bias's gradient is a bf16 sum in both
            failures.append(f"{where}: the FP8 rounding must be visible to (a) ({bf16_off:.3g})")
    return failures


def _layers_worker(rank, ws, init, q):
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=ws)
    try:
        q.put((rank, layer_report(rank, ws)))
    finally:
        dist.destroy_process_group()


def test_fp8_column_and_row_layers_match_their_fp8_reference_and_the_bf16_layer_on_two_ranks():
    for rank, report in run_gloo(_layers_worker, 2):
        assert len(report) == 2 * 2 * 2 * 4
        failures = layer_failures(rank, report)
        assert not failures, "\n".join(failures)


# The styles on a tiny model ------------------------------------------------------------------------


class _MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(K, N, dtype=torch.bfloat16)
        self.fc2 = torch.nn.Linear(N, K, dtype=torch.bfloat16)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))


def _styles_worker(rank, ws, init, q):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor.parallel import parallelize_module

    from syncopate.tp import ColwiseParallel, RowwiseParallel

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=ws)
    try:
        mesh = init_device_mesh("cpu", (ws,))
        gen = torch.Generator().manual_seed(50)
        x = torch.randn(M, 2, K, generator=gen).bfloat16()  # [s, b, h]: one batch, two steps on it
        t = torch.randn(M, 2, K, generator=gen).bfloat16()
        blk = slice(rank * M // ws, (rank + 1) * M // ws)
        losses = {}
        # sequence-parallel; a replicated local input; a replicated DTensor input (fc1 then computes
        # locally and DTensor reduces the input's gradient)
        for sp in ("sp", "local", "dtensor"):
            for float8 in (False, True):
                torch.manual_seed(3)
                model = _MLP()
                if sp == "sp":
                    plan = {
                        "fc1": ColwiseParallel(input_layouts=Shard(0), float8=float8),
                        "fc2": RowwiseParallel(output_layouts=Shard(0), float8=float8),
                    }
                else:
                    plan = {"fc1": ColwiseParallel(float8=float8), "fc2": RowwiseParallel(float8=float8)}
                parallelize_module(model, mesh, plan)
                assert ("float8=True" in repr(model)) == float8
                opt = torch.optim.SGD(model.parameters(), lr=2.0)
                for step in range(2):
                    x_mine, t_mine = (x[blk], t[blk]) if sp == "sp" else (x, t)
                    if sp == "dtensor":
                        x_mine = DTensor.from_local(x_mine.clone().requires_grad_(True), mesh, (Replicate(),))
                    opt.zero_grad()
                    loss = ((model(x_mine).float() - t_mine.float()) ** 2).sum() / t.numel()
                    loss.backward()
                    opt.step()
                    total = loss.detach().clone()
                    if sp == "sp":
                        dist.all_reduce(total)
                    losses[(sp, float8, step)] = float(total)
        q.put((rank, losses))
    finally:
        dist.destroy_process_group()


def test_a_model_with_the_fp8_styles_trains_two_steps_as_with_the_bf16_styles():
    for rank, losses in run_gloo(_styles_worker, 2):
        for sp in ("sp", "local", "dtensor"):
            steps = [(losses[(sp, False, s)], losses[(sp, True, s)]) for s in range(2)]
            for s, (bf16, fp8) in enumerate(steps):
                assert abs(fp8 - bf16) <= LOSS_TOLERANCE * abs(bf16), (
                    f"rank {rank} sp={sp} step {s}: {fp8} vs {bf16}"
                )
                assert fp8 != bf16, f"rank {rank} sp={sp} step {s}: the FP8 model must have run in FP8"
            assert steps[1][1] < steps[0][1], f"rank {rank} sp={sp}: the FP8 model's loss must fall: {steps}"
        assert losses[("sp", True, 1)] == pytest.approx(losses[("local", True, 1)], rel=LOSS_TOLERANCE)
        assert losses[("dtensor", True, 1)] == pytest.approx(losses[("local", True, 1)], rel=LOSS_TOLERANCE)


# Refusals ------------------------------------------------------------------------------------------


def _refusals_worker(rank, ws, init, q):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    from syncopate.tp import (
        ColumnParallelLinear,
        ColwiseParallel,
        RowParallelLinear,
        RowwiseParallel,
        all_gather_linear,
        linear_all_reduce,
    )

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=ws)
    try:
        mesh = init_device_mesh("cpu", (ws,))
        # every case is refused before it communicates: without one collective a rank could finish
        # and close its connections while its peer is still completing the group's
        dist.barrier()
        said = []
        cases = [
            lambda: ColumnParallelLinear(24, 64, float8=True),
            lambda: ColumnParallelLinear(32, 48, float8=True),
            lambda: RowParallelLinear(48, 32, float8=True),
            lambda: ColumnParallelLinear(32, 64, float8=True, impl="ops"),
            lambda: RowParallelLinear(32, 32, float8="yes"),
            lambda: ColumnParallelLinear(32, 64, impl="torch", float8=True, dtype=torch.bfloat16)(
                torch.randn(4, 32, dtype=torch.bfloat16)
            ),
            lambda: all_gather_linear(
                torch.randn(8, 32, dtype=torch.float64),
                torch.randn(32, 32, dtype=torch.float64),
                impl="torch",
                float8=True,
            ),
            lambda: linear_all_reduce(torch.randn(16, 32), torch.randn(32, 32), impl="ops", float8=True),
            lambda: ColwiseParallel(float8=True, impl="ops"),
            lambda: parallelize_module(torch.nn.Linear(32, 40), mesh, ColwiseParallel(float8=True)),
            lambda: parallelize_module(torch.nn.Linear(32, 32), mesh, RowwiseParallel(float8=1)),
        ]
        for make in cases:
            try:
                make()
            except ConfigError as e:
                said.append(str(e))
            else:
                said.append(None)
        q.put((rank, said))
    finally:
        dist.destroy_process_group()


def test_what_float8_cannot_run_is_refused_naming_the_value():
    expected = [
        r"ColumnParallelLinear: float8 needs every dimension .* multiple of 16 .* local in features is 24",
        r"ColumnParallelLinear: .* local out features is 24",
        r"RowParallelLinear: .* local in features is 24",
        r"float8=True runs with impl 'fused' .*, 'torch' .* or 'async_tp' .*, got impl='ops'",
        r"RowParallelLinear: float8 must be True or False, got the text 'yes'",
        r"all_gather_linear: .* tokens is 8: pad it, or keep this layer in bf16",
        r"all_gather_linear: float8=True quantizes bfloat16, float16 or float32 operands, got torch.float64",
        r"linear_all_reduce: float8=True runs with impl 'fused' .* got impl='ops'",
        r"ColwiseParallel: float8=True runs with impl 'fused' .* or 'async_tp' .*, got impl='ops'",
        r"ColwiseParallel: .* local out features is 20",
        r"RowwiseParallel: float8 must be True or False, got 1",
    ]
    for rank, said in run_gloo(_refusals_worker, 2):
        assert len(said) == len(expected)
        for message, pattern in zip(said, expected):
            assert message is not None and re.search(pattern, message), (
                f"rank {rank}: {message!r} !~ {pattern}"
            )


# The styles on transformers' Llama (torchtitan's plan: q/k/v and gate/up merged into one op each) ---------


def _llama_worker(rank, ws, init, q):
    from test_tp_styles import _batches, _llama
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel as TorchColwise
    from torch.distributed.tensor.parallel import RowwiseParallel as TorchRowwise
    from torch.distributed.tensor.parallel import parallelize_module

    from syncopate.tp import ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=ws)
    try:
        mesh = init_device_mesh("cpu", (ws,))
        losses, merged = {}, {}
        for float8 in (False, True):
            model = _llama().bfloat16()
            parallelize_module(
                model,
                mesh,
                {
                    "model.embed_tokens": TorchRowwise(input_layouts=Replicate(), output_layouts=Shard(1)),
                    "model.norm": SequenceParallel(),
                    "lm_head": TorchColwise(input_layouts=Shard(1), output_layouts=Replicate()),
                },
            )
            for layer in model.model.layers:
                parallelize_module(
                    layer,
                    mesh,
                    {
                        "input_layernorm": SequenceParallel(),
                        "self_attn": PrepareModuleInput(
                            input_kwarg_layouts={"hidden_states": Shard(1)},
                            desired_input_kwarg_layouts={"hidden_states": Replicate()},
                        ),
                        "self_attn.q_proj": ColwiseParallel(float8=float8),
                        "self_attn.k_proj": ColwiseParallel(float8=float8),
                        "self_attn.v_proj": ColwiseParallel(float8=float8),
                        "self_attn.o_proj": RowwiseParallel(output_layouts=Shard(1), float8=float8),
                        "post_attention_layernorm": SequenceParallel(),
                        "mlp": PrepareModuleInput(
                            input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
                        ),
                        "mlp.gate_proj": ColwiseParallel(float8=float8),
                        "mlp.up_proj": ColwiseParallel(float8=float8),
                        "mlp.down_proj": RowwiseParallel(output_layouts=Shard(1), float8=float8),
                    },
                )
            attn = model.model.layers[0].self_attn
            merged[float8] = len(attn.q_proj._syncopate_tp.merge.members)
            opt = torch.optim.SGD(model.parameters(), lr=0.5)
            for step, ids in enumerate(_batches(ws)):
                opt.zero_grad()
                positions = torch.arange(ids.shape[1]).unsqueeze(0)
                loss = model(input_ids=ids, labels=ids, position_ids=positions).loss
                loss.backward()
                opt.step()
                losses[(float8, step)] = loss.item()
        q.put((rank, (losses, merged)))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_llama_with_the_fp8_styles_trains_two_steps_as_with_the_bf16_styles():
    for rank, (losses, merged) in run_gloo(_llama_worker, 2):
        assert merged == {False: 3, True: 3}, "q, k and v run as one op, in FP8 too"
        for step in range(2):
            bf16, fp8 = losses[(False, step)], losses[(True, step)]
            assert abs(fp8 - bf16) <= LOSS_TOLERANCE * abs(bf16), f"rank {rank} step {step}: {fp8} vs {bf16}"
            assert fp8 != bf16, f"rank {rank} step {step}: the FP8 model must have run in FP8"


# Under torch.compile -------------------------------------------------------------------------------


def _compiled_worker(rank, ws, init, q):
    from syncopate.tp import ColumnParallelLinear, RowParallelLinear

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=ws)
    try:
        torch.manual_seed(0)
        col = ColumnParallelLinear(K, N, impl="torch", float8=True, dtype=torch.bfloat16)
        row = RowParallelLinear(N, K, impl="torch", float8=True, dtype=torch.bfloat16)

        def mlp(x):
            return row(torch.nn.functional.gelu(col(x)))

        x = torch.randn(M // ws, K, dtype=torch.bfloat16)
        got = {}
        for name, f in (("eager", mlp), ("compiled", torch.compile(mlp))):
            xi = x.clone().requires_grad_(True)
            col.zero_grad(set_to_none=True)
            row.zero_grad(set_to_none=True)
            y = f(xi)
            y.float().square().sum().backward()
            got[name] = [y.detach(), xi.grad, col.weight.grad, row.weight.grad]
        same = [torch.equal(a, b) for a, b in zip(got["eager"], got["compiled"], strict=True)]
        try:
            torch.compile(mlp, fullgraph=True)(x)
            stopped = None
        except Exception as e:  # noqa: BLE001 - what stopped it is the check
            stopped = str(e)
        q.put((rank, (same, stopped)))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_under_torch_compile_the_fp8_layers_run_eagerly_and_fullgraph_stops_at_them():
    for rank, (same, stopped) in run_gloo(_compiled_worker, 2):
        assert same == [True] * 4, f"rank {rank}: compiled against eager, y, dx, dW1, dW2: {same}"
        assert stopped is not None and "the FP8 linears run eagerly" in stopped, f"rank {rank}: {stopped}"


def _early_gather_worker(rank, ws, init, q):
    """The FP8 column and row layers (sequence parallel) on impl "fused", whose backward issues the
    weight gradient's all-gather before the input gradient's op and waits for it after, against
    impl "torch" (in sequence). On the CPU, "fused"'s ops are the unfused ones (`op8` as for torch):
    what differs is only when the all-gather is issued and waited for."""
    import syncopate.tp.float8 as f8
    from syncopate.tp import ColumnParallelLinear, RowParallelLinear

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=ws)
    try:
        op8 = f8.op8
        f8.op8 = lambda kind, a, b, group, impl, config, fast_accum=False: op8(
            kind, a, b, group, "torch", config, fast_accum
        )
        issued = []
        gather = f8.all_gather_rows_async
        f8.all_gather_rows_async = lambda t, group: issued.append(tuple(t.shape)) or gather(t, group)
        same = []
        for cls in (ColumnParallelLinear, RowParallelLinear):
            torch.manual_seed(5)
            whole = torch.nn.Linear(K, N, dtype=torch.bfloat16)
            grads = {}
            for impl in ("fused", "torch"):
                layer = cls.from_linear(whole, sequence_parallel=True, impl=impl, float8=True)
                x, g = _step_inputs(0, M, K, N, "cpu")
                k = layer.weight.shape[1]
                x = (
                    x[rank * M // ws : (rank + 1) * M // ws]
                    if cls is ColumnParallelLinear
                    else x[:, rank * k : (rank + 1) * k]
                )
                x = x.clone().requires_grad_(True)
                y = layer(x)
                y.backward(torch.randn(y.shape, generator=torch.Generator().manual_seed(rank)).to(y.dtype))
                grads[impl] = (x.grad, layer.weight.grad, layer.bias.grad)
            same.append(all(torch.equal(a, b) for a, b in zip(grads["fused"], grads["torch"])))
        q.put((rank, same, issued))
    finally:
        dist.destroy_process_group()


def test_fused_fp8_backward_gathers_the_weight_gradient_rows_beside_the_input_gradient():
    got = sorted(run_gloo(_early_gather_worker, 2))
    for _rank, same, issued in got:
        assert same == [True, True]  # the same gradients as in sequence
        # the column layer's x shard, then the row layer's output gradient: issued early, once each
        assert issued == [(M // 2, K), (M // 2, N)]


def _fast_flags_worker(rank, ws, init, q):
    """Every scaled GEMM of a float8 layer's forward and backward, with its fast-accumulation flag,
    on `impl="torch"` (the `unfused` path's scaled GEMMs) and on the `local` mode."""
    from syncopate.kernels import scaled
    from syncopate.tp import float8

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=ws)
    try:
        seen = []
        real = scaled.scaled_mm

        def recording(a, b, a_scale, b_scale, out=None, fast_accum=False):
            seen.append(fast_accum)
            return real(a, b, a_scale, b_scale, out=out, fast_accum=fast_accum)

        scaled.scaled_mm = recording  # library.unfused_scaled imports it from there at each call
        float8.scaled_mm = recording  # mm8's
        got = {}
        for mode in ("gather", "scatter", "reduce", "local"):
            seen.clear()
            gen = torch.Generator().manual_seed(3 + rank)
            rows = M // ws if mode == "gather" else M
            in_f = K // ws if mode in ("scatter", "reduce") else K
            x = torch.randn(rows, in_f, generator=gen).bfloat16().requires_grad_(True)
            w = torch.randn(N, in_f, generator=gen).bfloat16().requires_grad_(True)
            y = float8.Float8Linear.apply(x, w, None, dist.group.WORLD, "torch", {}, mode)
            forward = list(seen)
            seen.clear()
            y.float().sum().backward()
            got[mode] = (forward, list(seen))
        q.put((rank, got))
    finally:
        dist.destroy_process_group()


def test_the_forward_gemm_accumulates_fast_and_the_gradients_gemms_do_not():
    """As torchao's recipes configure them: the output's GEMM with fast accumulation
    (`FAST_OUTPUT`), the input and weight gradients' without, whichever collective goes with them."""
    from syncopate.tp.float8 import FAST_OUTPUT

    assert FAST_OUTPUT is True
    for rank, got in run_gloo(_fast_flags_worker, 2, timeout=120):
        for mode, (forward, backward) in got.items():
            assert forward == [True], f"rank {rank}, {mode}: forward GEMMs {forward}"
            assert backward == [False, False], f"rank {rank}, {mode}: gradient GEMMs {backward}"
