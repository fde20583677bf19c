"""Layer: CPU, one process, a gloo group of one rank. The per-call checks of `syncopate.tp`'s
functions (impl="torch"): each bad argument is named in one ConfigError, with grad and under no_grad
alike, x of any rank and layout gives the linear's result and its gradients, and under autocast the
operands are cast to its dtype first (the checks read the autocast state of the operands' device on
every call)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from syncopate.errors import ConfigError
from syncopate.tp import all_gather_linear, linear_all_reduce, linear_all_reduce_grad, linear_reduce_scatter

FUNCTIONS = [all_gather_linear, linear_reduce_scatter, linear_all_reduce, linear_all_reduce_grad]


@pytest.fixture()
def group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdv'}", rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


@pytest.mark.parametrize("grad", [True, False], ids=["grad", "no_grad"])
@pytest.mark.parametrize("f", FUNCTIONS, ids=lambda f: f.__name__)
def test_each_bad_argument_is_named(group, f, grad):
    x, w, b = torch.randn(4, 6), torch.randn(3, 6), torch.randn(3)
    name = f.__name__
    cases = {
        "x must be a torch.Tensor, got": ([[1.0]], w, b, {}),
        "weight must be a torch.Tensor, got": (x, "w", b, {}),
        "weight must be 2-D": (x, torch.randn(3, 6, 1), b, {}),
        r"x of shape \(4, 5\) must be \[\.\.\., 6\]": (torch.randn(4, 5), w, b, {}),
        r"x of shape \(6,\) must be": (torch.randn(6), w, b, {}),
        "bias must be a torch.Tensor or None": (x, w, [0.0], {}),
        "x has dtype torch.float32 but weight has torch.float64": (x, w.double(), b, {}),
        "x has dtype torch.float32 but bias has torch.float64": (x, w, b.double(), {}),
        r"bias must have shape \(3,\), got \(4,\)": (x, w, torch.randn(4), {}),
        "float8 must be True or False": (x, w, b, {"float8": 1}),
    }
    unnamed = {  # said alike by every function and layer
        "impl 'nccl': accepted are": (x, w, b, {"impl": "nccl"}),
        r"configs has key\(s\) \['ag'\]: accepted are ag_gemm": (x, w, b, {"configs": {"ag": None}}),
        "configs must be a dict keyed by op kind": (x, w, b, {"configs": ["ag_gemm"]}),
    }
    for message, (xx, ww, bb, kwargs) in [*cases.items(), *unnamed.items()]:
        with (
            torch.set_grad_enabled(grad),  # a forward-only call skips the autograd function, not a check
            pytest.raises(ConfigError, match=f"^{name}: {message}" if message in cases else f"^{message}"),
        ):
            f(xx, ww, bb, group, **{"impl": "torch", **kwargs})


@pytest.mark.parametrize("f", FUNCTIONS, ids=lambda f: f.__name__)
def test_x_of_any_rank_and_layout_gives_the_linear_and_its_gradients(group, f):
    w = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, dtype=torch.float64, requires_grad=True)
    base = torch.randn(6, 4, dtype=torch.float64)
    for x in (base.t(), base.t().contiguous(), torch.randn(2, 2, 6, dtype=torch.float64)):
        x = x.detach().requires_grad_(True)
        got = f(x, w, b, group, impl="torch")
        want = torch.nn.functional.linear(x, w, b)
        torch.testing.assert_close(got, want)
        dy = torch.randn_like(want)
        grads = torch.autograd.grad(got, (x, w, b), dy)
        for g, v in zip(grads, torch.autograd.grad(want, (x, w, b), dy)):
            torch.testing.assert_close(g, v)


@pytest.mark.parametrize("f", FUNCTIONS, ids=lambda f: f.__name__)
def test_under_autocast_the_operands_are_cast_first(group, f):
    torch.manual_seed(0)
    x, w, b = torch.randn(4, 6), torch.randn(3, 6), torch.randn(3)
    assert f(x, w, b, group, impl="torch").dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = f(x, w, b, group, impl="torch")
    want = torch.nn.functional.linear(x.bfloat16(), w.bfloat16(), b.bfloat16())
    assert got.dtype == torch.bfloat16  # the bias added apart from the GEMM: rounded twice
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the cast makes a float64 x match its weight
        assert f(x.double(), w, b, group, impl="torch").dtype == torch.bfloat16
