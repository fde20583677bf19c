"""Layer: gloo process groups on the CPU. The per-call path of `syncopate.tp`'s layers, functions
and styles: a call that autograd records nothing of (under no_grad, or none of its operands
requiring grad) skips the autograd function and gives bit for bit what the function gives, for 2-D
and 3-D inputs, with and without bias, with sequence parallelism and without, with impl torch, ops
and fused (the fused ops' own CPU path: their device check lifted, the lookup serving `unfused`),
and the function's results and gradients are still the whole linear's; a 2-D input's output is the
op's own (no view); the transposed weight a layer keeps never serves a weight that has changed (an
optimizer step, load_state_dict with and without assign, a parameter replaced, `.data` assigned, a
dtype conversion); the styles' forward-only path gives their autograd path's outputs.
"""

from __future__ import annotations

import contextlib
from unittest import mock

import pytest
import torch
import torch.distributed as dist
from support.gloo import run_gloo
from torch import nn

import syncopate.tp.layers as layers
from syncopate.kernels import ops
from syncopate.search_space import Topology, unfused_candidate
from syncopate.tp import (
    ColumnParallelLinear,
    RowParallelLinear,
    all_gather_linear,
    linear_all_reduce,
    linear_all_reduce_grad,
    linear_reduce_scatter,
)

F64 = torch.float64
DTYPES = {"torch": F64, "ops": F64, "fused": torch.float32}
"""Operands' dtype by impl (the fused ops take up to float32)."""
TOL = {F64: 1e-12, torch.float32: 1e-5}
LAYERS = [("column", True), ("column", False), ("row", True), ("row", False)]
FUNCTIONS = {
    ("column", True): all_gather_linear,
    ("column", False): linear_all_reduce_grad,
    ("row", True): linear_reduce_scatter,
    ("row", False): linear_all_reduce,
}
AUTOGRAD_FUNCTIONS = [
    layers._GatherLinear,
    layers._LinearScatter,
    layers._LinearReduce,
    layers._LinearReduceGrad,
]


@contextlib.contextmanager
def fused_on_cpu(ws: int):
    """The fused ops on CPU tensors: their device check lifted, the lookup serving `unfused` (torch's
    collective, then the matmul), the topology given; their registries emptied after."""
    topology = Topology.from_key(f"H100x{ws}-nvlink")
    saved = dict(ops._REGISTRY.programs), dict(ops._REGISTRY.calls)
    with (
        mock.patch.object(ops, "_check_devices", lambda a, b: None),
        mock.patch.object(ops._REGISTRY, "config", lambda workload, group, mode: unfused_candidate()),
        mock.patch.object(ops._REGISTRY, "topology", lambda group: topology),
    ):
        try:
            yield
        finally:
            for kept, before in zip((ops._REGISTRY.programs, ops._REGISTRY.calls), saved):
                kept.clear()
                kept.update(before)


def _make(kind: str, sp: bool, whole: nn.Linear, impl: str):
    cls = ColumnParallelLinear if kind == "column" else RowParallelLinear
    return cls.from_linear(whole, sequence_parallel=sp, impl=impl)


def _shares(kind: str, sp: bool, x_whole, y_whole, rank: int, ws: int, layer):
    """(x, the layer's share of the whole output) for a rank: sequence blocks and feature columns."""
    s = x_whole.shape[0]
    blk = slice(rank * s // ws, (rank + 1) * s // ws)
    if kind == "column":
        n = layer.weight.shape[0]
        return (x_whole[blk] if sp else x_whole), y_whole[..., rank * n : (rank + 1) * n]
    k = layer.weight.shape[1]
    return x_whole[..., rank * k : (rank + 1) * k], (y_whole[blk] if sp else y_whole)


def _matrix_worker(rank, ws, init, q):
    """Each layer (and function) forward-only and with autograd, against each other and the whole
    linear, its gradients too."""
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=ws)
    report = []
    try:
        with fused_on_cpu(ws):
            for impl in ("torch", "ops", "fused"):
                for kind, sp in LAYERS:
                    for bias in (True, False):
                        for dims in (2, 3):
                            where = f"{impl} {kind} sp={sp} bias={bias} {dims}-D"
                            report += [
                                f"{where}: {m}" for m in _compare(kind, sp, bias, dims, impl, rank, ws)
                            ]
    finally:
        q.put((rank, report))
        dist.destroy_process_group()


def _compare(kind, sp, bias, dims, impl, rank, ws) -> list[str]:
    said = []
    torch.manual_seed(0)  # the same whole linear and data on every rank
    dtype = DTYPES[impl]
    tol = TOL[dtype]
    whole = nn.Linear(4 * ws, 2 * ws, bias=bias, dtype=dtype)
    layer = _make(kind, sp, whole, impl)
    shape = (2 * ws, 3, 4 * ws) if dims == 3 else (2 * ws, 4 * ws)
    x_whole = torch.randn(shape, dtype=dtype, requires_grad=True)
    y_whole = whole(x_whole)
    dy_whole = torch.randn_like(y_whole)
    (y_whole * dy_whole).sum().backward()
    x, want = _shares(kind, sp, x_whole.detach(), y_whole.detach(), rank, ws, layer)
    _, dy = _shares(kind, sp, x_whole.detach(), dy_whole, rank, ws, layer)

    xg = x.clone().requires_grad_(True)
    y = layer(xg)
    y.backward(dy)
    with torch.no_grad():
        y_no_grad = layer(x)
    for p in layer.parameters():
        p.requires_grad_(False)
    y_frozen = layer(x)  # grad on, nothing requiring it
    f_no_grad = FUNCTIONS[kind, sp](x, layer.weight, layer.bias, impl=impl)
    for p in layer.parameters():
        p.requires_grad_(True)

    if y.shape != want.shape or not torch.allclose(y, want, rtol=tol, atol=tol):
        said.append(f"output {tuple(y.shape)} differs from the whole linear's {tuple(want.shape)}")
    for name, got in (("no_grad", y_no_grad), ("frozen", y_frozen), ("function", f_no_grad)):
        if got.requires_grad or not torch.equal(got, y.detach()):
            said.append(f"the {name} output is not the autograd path's, bit for bit")
        if dims == 2 and got._is_view():
            said.append(f"the {name} output of a 2-D input is a view")
    if dims == 2 and y._is_view():
        said.append("the autograd path's output of a 2-D input is a view")

    s, n = x_whole.shape[0], layer.weight.shape[0 if kind == "column" else 1]
    blk = slice(rank * s // ws, (rank + 1) * s // ws)
    cols = slice(rank * n, (rank + 1) * n)
    if kind == "column":
        grads = {
            "dx": (xg.grad, x_whole.grad[blk] if sp else x_whole.grad),
            "dW": (layer.weight.grad, whole.weight.grad[cols]),
        }
        if bias:
            grads["db"] = (layer.bias.grad, whole.bias.grad[cols])
    else:
        grads = {
            "dx": (xg.grad, x_whole.grad[..., cols]),
            "dW": (layer.weight.grad, whole.weight.grad[:, cols]),
        }
        if bias:
            grads["db"] = (layer.bias.grad, whole.bias.grad)
    for name, (got, want_g) in grads.items():
        if got is None or got.shape != want_g.shape or not torch.allclose(got, want_g, rtol=tol, atol=tol):
            said.append(f"{name} differs from the whole linear's")
    return said


def _styles_worker(rank, ws, init, q):
    """The styles' forward-only outputs are their autograd path's, bit for bit."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import parallelize_module

    from syncopate.tp import ColwiseParallel, RowwiseParallel

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=ws)
    report = []
    try:
        mesh = init_device_mesh("cpu", (ws,))
        cases = [
            ("colwise", ColwiseParallel(impl="torch")),
            ("colwise sequence-sharded", ColwiseParallel(input_layouts=Shard(0), impl="torch")),
            ("rowwise", RowwiseParallel(impl="torch")),
            ("rowwise scattered", RowwiseParallel(output_layouts=Shard(0), impl="torch")),
        ]
        for name, style in cases:
            for bias in (True, False):
                torch.manual_seed(0)
                lin = nn.Linear(4 * ws, 2 * ws, bias=bias, dtype=F64)
                whole = nn.Linear(4 * ws, 2 * ws, bias=bias, dtype=F64)
                whole.load_state_dict(lin.state_dict())
                parallelize_module(lin, mesh, style)
                x_whole = torch.randn(2 * ws, 3, 4 * ws, dtype=F64)
                k = 4 * ws // ws
                if name.startswith("rowwise"):
                    x = x_whole[..., rank * k : (rank + 1) * k]
                elif name == "colwise sequence-sharded":
                    x = x_whole[rank * 2 : (rank + 1) * 2]
                else:
                    x = x_whole
                y = lin(x.clone().requires_grad_(True))
                with torch.no_grad():
                    y_no_grad = lin(x)
                if y_no_grad.requires_grad or not torch.equal(y_no_grad, y.detach()):
                    report.append(f"{name} bias={bias}: the no_grad output is not the autograd path's")
                want = whole(x_whole).detach()
                n = 2 * ws // ws
                if name.startswith("colwise"):
                    want = want[..., rank * n : (rank + 1) * n]
                elif name == "rowwise scattered":
                    want = want[rank * 2 : (rank + 1) * 2]
                if y.shape != want.shape or not torch.allclose(y, want, rtol=1e-12, atol=1e-12):
                    report.append(f"{name} bias={bias}: differs from the whole linear")
    finally:
        q.put((rank, report))
        dist.destroy_process_group()


def _failures(results) -> str:
    return "\n".join(f"rank {r}: {line}" for r, lines in sorted(results) for line in lines)


def test_forward_only_calls_give_the_autograd_paths_results_bit_for_bit():
    failures = _failures(run_gloo(_matrix_worker, 2))
    assert not failures, failures


def test_the_styles_forward_only_path_gives_their_autograd_paths_outputs():
    failures = _failures(run_gloo(_styles_worker, 2))
    assert not failures, failures


@pytest.fixture()
def group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdv'}", rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


@pytest.mark.parametrize("kind,sp", LAYERS, ids=lambda v: str(v))
def test_forward_only_calls_skip_the_autograd_function(group, monkeypatch, kind, sp):
    def refuse(*args, **kwargs):
        raise AssertionError("the autograd function was applied")

    for fn in AUTOGRAD_FUNCTIONS:
        monkeypatch.setattr(fn, "apply", refuse)
    torch.manual_seed(0)
    layer = _make(kind, sp, nn.Linear(6, 4, dtype=F64), "torch")
    x = torch.randn(4, 6 if kind == "column" else layer.weight.shape[1], dtype=F64)
    f = FUNCTIONS[kind, sp]
    with torch.no_grad():
        y = layer(x)
        torch.testing.assert_close(f(x, layer.weight, layer.bias, impl="torch"), y, rtol=0, atol=0)
    torch.testing.assert_close(y, nn.functional.linear(x, layer.weight, layer.bias).detach())
    layer.requires_grad_(False)
    layer(x)  # grad on, nothing requiring it
    layer.requires_grad_(True)
    with pytest.raises(AssertionError, match="autograd function was applied"):
        layer(x)  # the weight requires grad: the function records it


def _check_follows(layer, x, said: list, step: str, rtol: float = 1e-12) -> None:
    with torch.no_grad():
        got = layer(x)
        want = nn.functional.linear(x, layer.weight, layer.bias)
    if not torch.allclose(got, want, rtol=rtol, atol=rtol):
        said.append(f"after {step}: the output is not the current weight's")


@pytest.mark.parametrize("impl", ["torch", "fused"])
@pytest.mark.parametrize("kind,sp", [("column", True), ("row", True), ("row", False)], ids=lambda v: str(v))
def test_the_kept_transposed_weight_follows_every_change_of_the_weight(group, impl, kind, sp):
    said = []
    dtype, tol = DTYPES[impl], TOL[DTYPES[impl]]
    with fused_on_cpu(1):
        torch.manual_seed(0)
        layer = _make(kind, sp, nn.Linear(6, 4, dtype=dtype), impl)
        x = torch.randn(4, 6, dtype=dtype)
        _check_follows(layer, x, said, "the first call", tol)
        kept = layer._kept_t
        if kept is None or layer._weight_t(layer.weight) is not kept[1]:
            said.append("the transposed weight is not kept between calls")

        layer(x.clone().requires_grad_(True)).square().sum().backward()
        torch.optim.SGD(layer.parameters(), lr=0.5).step()
        _check_follows(layer, x, said, "an optimizer step", tol)

        other = _make(kind, sp, nn.Linear(6, 4, dtype=dtype), impl)
        layer.load_state_dict(other.state_dict())
        _check_follows(layer, x, said, "load_state_dict", tol)

        other = _make(kind, sp, nn.Linear(6, 4, dtype=dtype), impl)
        layer.load_state_dict(other.state_dict(), assign=True)
        _check_follows(layer, x, said, "load_state_dict(assign=True)", tol)

        layer.weight = nn.Parameter(torch.randn_like(layer.weight))
        if layer._kept_t is not None:
            said.append("a replaced parameter's transposed view is still kept")
        _check_follows(layer, x, said, "a parameter replaced", tol)

        layer.weight.data = torch.randn_like(layer.weight)
        _check_follows(layer, x, said, ".data assigned", tol)

        layer.weight.data = torch.randn(tuple(reversed(layer.weight.shape)), dtype=dtype).t()
        _check_follows(layer, x, said, ".data assigned a transposed tensor", tol)

        with torch.no_grad():
            layer.weight.mul_(-2)
        _check_follows(layer, x, said, "an in-place update", tol)

        layer.bfloat16()
        if layer._kept_t is not None:
            said.append("the transposed view is kept through a dtype conversion")
        _check_follows(layer, x.bfloat16(), said, "a conversion to bfloat16", 0.1)
    assert not said, "\n".join(said)


def test_a_torch_func_transform_meets_the_autograd_function_not_the_kept_transpose(group):
    """A transform's wrapped weight keeps no storage: the layer transposes it per call, and the call
    reaches the autograd function (which torch.func refuses without setup_context), as it did."""
    from torch.func import functional_call, grad

    layer = RowParallelLinear(6, 4, impl="torch")
    x = torch.randn(4, 6)
    params = {k: v.detach() for k, v in layer.named_parameters()}
    with pytest.raises(RuntimeError, match="setup_context"):
        grad(lambda p: functional_call(layer, p, (x,)).sum())(params)
