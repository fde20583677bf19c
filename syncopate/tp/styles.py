"""ParallelStyles for torch's `parallelize_module` whose collectives are Syncopate's fused ops.

Drop-in for torch's styles in a plan written as torchtitan writes its `parallelize.py` (docs/tp.md):

```python
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import parallelize_module
from syncopate.tp import ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel

parallelize_module(block, tp_mesh, {
    "attention_norm": SequenceParallel(),
    "attention": PrepareModuleInput(input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None)),
    "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(), "attention.wv": ColwiseParallel(),
    "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
    ...
})
```

The weights become DTensors sharded as torch's styles shard them (a column-parallel linear's weight
and bias `Shard(0)`, a row-parallel one's weight `Shard(1)` and bias `Replicate()`, scattered from
`src_data_rank`), so state_dicts and distributed checkpoints are torch's. What differs is where the
collectives run:

| style, input → output                                   | forward             | input gradient        |
|---------------------------------------------------------|---------------------|-----------------------|
| ColwiseParallel, sequence-sharded `Shard(d)` → `Shard(-1)` | `all_gather_matmul` | `matmul_reduce_scatter` |
| ColwiseParallel, local tensor, `input_layouts=Replicate()` | local matmul        | `matmul_all_reduce`   |
| ColwiseParallel, `Replicate()` DTensor                  | local matmul        | DTensor's, as torch's |
| RowwiseParallel, `Shard(-1)` → `output_layouts=Shard(d)` | `matmul_reduce_scatter` | `all_gather_matmul` |
| RowwiseParallel, `Shard(-1)` → `Replicate()`            | `matmul_all_reduce` | local matmul          |

`PrepareModuleInput` is torch's, except that an input it would all-gather from `Shard(d)` to
`Replicate()` (the gather before attention and MLP under sequence parallelism) is handed on as it
is, a DTensor `Shard(d)`: the same global tensor (every DTensor op on it gives what it gives
replicated), which the column-parallel projections below gather inside their fused op. The
column-parallel linears below such a module that read that one input (q/k/v, gate/up) run as one
op (`_MergeGroup`): the first one called computes every one's output with their local weights side
by side, the others take theirs, so one all-gather feeds them and the backward has one
reduce-scatter. `SequenceParallel` is torch's own: norms compute on DTensors, and DTensor sums
their weights' gradients over the group.

Each op takes its configuration from `syncopate.lookup` at its first call with a shape (or from
`configs`, one per op kind). Sequence-sharded activations of a batch of more than one sequence
(`[b, s/tp, h]`, `Shard(1)`, b > 1) are reordered around the ops (one copy each way), as their rows
are not one block per rank; a batch folded into the sequence, or `[s, b, h]` with `Shard(0)`, needs
none. `impl` (a Syncopate argument) picks the path as for the layers: `fused` (on CPU tensors the
ops' own path, `torch.ops.syncopate.*`, which is torch's collective then the matmul), `torch`,
`async_tp` or `ops`. `float8=True` (on `ColwiseParallel` and `RowwiseParallel`) runs every GEMM of
the linear on FP8 operands as the layers do (`syncopate.tp.float8`), the weights kept in bf16.
"""

from __future__ import annotations

import functools

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_module, distribute_tensor
from torch.distributed.tensor.parallel import SequenceParallel
from torch.distributed.tensor.parallel.style import ParallelStyle
from torch.distributed.tensor.placement_types import Placement

from syncopate.errors import ConfigError
from syncopate.tp.float8 import check_dims, check_impl
from syncopate.tp.layers import (
    _checked_configs,
    _checked_impl,
    all_gather_linear,
    linear_all_reduce,
    linear_all_reduce_grad,
    linear_reduce_scatter,
)

__all__ = ["ColwiseParallel", "PrepareModuleInput", "RowwiseParallel", "SequenceParallel"]

_FLOAT8 = tuple(
    getattr(torch, n)
    for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
    if hasattr(torch, n)
)


# --- argument checks ---------------------------------------------------------------------------------------


def _layout(style: str, arg: str, value, default: Placement, accepted: str, ok) -> Placement:
    """`value` (None: `default`) checked to be one Placement that `ok` accepts."""
    if value is None:
        return default
    if not isinstance(value, Placement) or not ok(value):
        raise ConfigError(f"{style}: {arg}={value!r} is not supported: accepted are {accepted}")
    return value


def _sequence_dim(p: Placement) -> bool:
    return isinstance(p, Shard) and p.dim != -1


def _checked_bool(style: str, arg: str, value) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{style}: {arg} must be True or False, got {value!r}")
    return value


def _checked_mesh(style: str, mesh) -> DeviceMesh:
    if not isinstance(mesh, DeviceMesh) or mesh.ndim != 1:
        what = f"a {mesh.ndim}-D DeviceMesh" if isinstance(mesh, DeviceMesh) else repr(mesh)
        raise ConfigError(
            f"{style}: the device mesh must be the 1-D tensor-parallel mesh (device_mesh['tp'] of a "
            f"larger one), got {what}"
        )
    return mesh


def _checked_linear(style: str, module: nn.Module) -> None:
    """A plain nn.Linear: its forward is F.linear, which the style's own forward replaces."""
    if not isinstance(module, nn.Linear):
        raise ConfigError(
            f"{style}: module of type {type(module).__name__} is not supported: accepted is nn.Linear (keep torch's "
            f"{style} from torch.distributed.tensor.parallel for an nn.Embedding or another module)"
        )
    if type(module).forward is not nn.Linear.forward:
        raise ConfigError(
            f"{style}: {type(module).__name__} is an nn.Linear with a forward of its own (float8, LoRA, ...): "
            f"accepted is a Linear whose forward is nn.Linear's, as the style computes it with Syncopate's ops"
        )
    if module.weight.dtype in _FLOAT8:
        raise ConfigError(
            f"{style}: weight dtype {module.weight.dtype} is not supported: accepted are bf16, fp16 "
            f"and fp32 (float8 linears keep torchao's Float8 styles)"
        )


def _resolved_impl(impl: str, weight: torch.Tensor, float8: bool = False) -> str:
    """`fused` on tensors off CUDA runs the ops' own path there (their custom ops: torch's collective,
    then the matmul), which is what a compiled model calls; with float8, torch's collective then the
    scaled matmul (the custom ops take no scales)."""
    if impl == "fused" and not weight.is_cuda:
        return "torch" if float8 else "ops"
    return impl


def _checked_float8(style: str, float8, impl: str) -> bool:
    """float8 checked: a bool, and an impl that runs it."""
    float8 = _checked_bool(style, "float8", float8)
    if float8:
        check_impl(style, impl)
    return float8


def _local(t):
    return t.to_local() if isinstance(t, DTensor) else t


def _local_params(module: nn.Module) -> tuple:
    """(weight, bias) of a parallelized linear as this rank's local tensors. Read from `_parameters`
    where they are (`module.weight` goes through Module.__getattr__); under no_grad, not traced, each
    DTensor's own local tensor (what `to_local` gives there, less the fresh view it wraps a
    parameter's in), else `to_local`, autograd's path back to the DTensor parameter."""
    params = module._parameters
    weight = params["weight"] if "weight" in params else module.weight
    bias = params["bias"] if "bias" in params else module.bias
    if torch.is_grad_enabled() or torch.compiler.is_compiling():
        return _local(weight), _local(bias)
    return (
        weight._local_tensor if isinstance(weight, DTensor) else weight,
        bias._local_tensor if isinstance(bias, DTensor) else bias,
    )


@functools.cache
def _swapped_class(mixin: type, cls: type) -> type:
    """The class a parallelized module takes: `cls` with the style's forward (as FSDP2's fully_shard
    does), so that isinstance, state_dict and repr stay those of `cls`."""
    return type(f"{mixin.__name__.strip('_')}{cls.__name__}", (mixin, cls), {})


# --- sequence-sharded activations as the ops' rows ---------------------------------------------------------


def _gathered(out: torch.Tensor, lshape: torch.Size, d: int, ws: int) -> torch.Tensor:
    """The output rows of an all-gather (rank-major: every rank's rows in turn) as [..., s, ..., n]
    of the global sequence at dim d (one copy where dims before d are not all 1)."""
    n = out.shape[-1]
    y = out.view(ws, *lshape[:-1], n).movedim(0, d)
    return y.reshape(*lshape[:d], ws * lshape[d], *lshape[d + 1 : -1], n)


def _rank_major(x: torch.Tensor, d: int, ws: int) -> torch.Tensor:
    """x [..., S, ..., k] as 2-D rows in the order a reduce-scatter hands out: rank r's block of S
    (with everything before and after it) r-th (one copy where dims before d are not all 1)."""
    shape = x.shape
    return x.reshape(*shape[:d], ws, shape[d] // ws, *shape[d + 1 :]).movedim(d, 0).reshape(-1, shape[-1])


def _seq_dim(style: str, placement: Shard, ndim: int) -> int:
    d = placement.dim + ndim if placement.dim < 0 else placement.dim
    if not 0 <= d < ndim - 1:
        raise ConfigError(
            f"{style}: an input of {ndim} dims sharded as {placement!r} is sharded on its features: "
            f"accepted is Shard(d) of a sequence dim (0 <= d < {ndim - 1})"
        )
    return d


def _check_divisible(style: str, size: int, d: int, ws: int) -> None:
    if size % ws:
        raise ConfigError(
            f"{style}: the sequence dim {d} has {size} rows, not divisible by the group's size {ws}: "
            f"the fused ops take an equal block of it on every rank"
        )


# --- the column-parallel linear ----------------------------------------------------------------------------


class _Plan:
    """What a parallelized linear keeps: its style's settings, the mesh and its group."""

    __slots__ = (
        "configs",
        "float8",
        "group",
        "impl",
        "input_layout",
        "merge",
        "merge_index",
        "mesh",
        "name",
        "output_layout",
        "save_gathered",
        "use_local_output",
        "ws",
    )

    def __init__(self, style, mesh: DeviceMesh) -> None:
        self.name = type(style).__name__
        self.mesh, self.group, self.ws = mesh, mesh.get_group(), mesh.size()
        self.impl, self.configs = style.impl, style.configs
        self.input_layout, self.output_layout = style.input_layouts[0], style.output_layouts[0]
        self.use_local_output = style.use_local_output
        self.save_gathered = getattr(style, "save_gathered", True)
        self.float8 = style.float8
        self.merge: _MergeGroup | None = None
        self.merge_index = 0

    def merge_key(self, module: nn.Linear) -> tuple:
        """What linears must share to run as one op."""
        return (
            module.in_features,
            module.bias is not None,
            self.impl,
            tuple(sorted(self.configs.items(), key=str)),
            self.save_gathered,
            self.float8,
            id(self.mesh),
        )


def _gather_linear(plan: _Plan, local: torch.Tensor, d: int, weight, bias) -> torch.Tensor:
    """all_gather(local along d) @ weight.T + bias, as [..., s, ..., out/ws]."""
    rows = local.reshape(-1, local.shape[-1])
    out = all_gather_linear(
        rows,
        weight,
        bias,
        plan.group,
        impl=_resolved_impl(plan.impl, weight, plan.float8),
        configs=plan.configs,
        save_gathered=plan.save_gathered,
        float8=plan.float8,
    )
    return _gathered(out, local.shape, d, plan.ws)


class _MergeGroup:
    """Column-parallel linears below one `PrepareModuleInput` that hands an input on sequence-sharded:
    those of them that read that input run as one op.

    The first member called with a sequence-sharded input computes every member's output (their local
    weights concatenated, one `all_gather_matmul`; its backward one `matmul_reduce_scatter`) and keeps
    the others'; a member called with that same input takes its own. A member called with another
    input (a cross-attention's key and value, say) computes its own alone. Members are those of equal
    in_features, bias, impl, configs and mesh as the first (`_Plan.merge_key`)."""

    def __init__(self) -> None:
        self.members: list[nn.Linear] = []
        self.source: DTensor | None = None
        self.pending: tuple = ()

    def join(self, module: nn.Linear) -> None:
        plan = module._syncopate_tp
        if plan.merge is not None:
            return
        if self.members and self.members[0]._syncopate_tp.merge_key(self.members[0]) != plan.merge_key(
            module
        ):
            return
        plan.merge, plan.merge_index = self, len(self.members)
        self.members.append(module)

    def output(self, module: nn.Linear, x: DTensor, d: int) -> torch.Tensor:
        """`module`'s output for x (sequence-sharded at dim d)."""
        i = module._syncopate_tp.merge_index
        if self.source is x and self.pending[i] is not None:
            out = self.pending[i]
            self.pending = tuple(None if j == i else o for j, o in enumerate(self.pending))
            if all(o is None for o in self.pending):
                self.source, self.pending = None, ()
            return out
        weights = [_local(m.weight) for m in self.members]
        if any(w.dtype != weights[0].dtype or w.device != weights[0].device for w in weights):
            return _gather_linear(
                module._syncopate_tp, x.to_local(), d, _local(module.weight), _local(module.bias)
            )
        bias = None if module.bias is None else torch.cat([_local(m.bias) for m in self.members])
        out = _gather_linear(module._syncopate_tp, x.to_local(), d, torch.cat(weights), bias)
        outs = out.split([w.shape[0] for w in weights], dim=-1)
        self.source, self.pending = x, tuple(None if j == i else o for j, o in enumerate(outs))
        return outs[i]


class _Colwise:
    def forward(self, input: torch.Tensor) -> torch.Tensor:
        plan: _Plan = self._syncopate_tp
        weight, bias = _local_params(self)
        x, layout = input, plan.input_layout
        if isinstance(x, DTensor):
            layout = x.placements[0]
            if not (
                isinstance(layout, Replicate) or (isinstance(layout, Shard) and _seq_dim_ok(layout, x.ndim))
            ):
                x, layout = x.redistribute(placements=(Replicate(),)), Replicate()  # as torch's style would
        if isinstance(layout, Shard):
            d = _seq_dim(plan.name, layout, x.ndim)
            if isinstance(x, DTensor) and plan.merge is not None and len(plan.merge.members) > 1:
                out = plan.merge.output(self, x, d)
            else:
                out = _gather_linear(plan, _local(x), d, weight, bias)
        elif isinstance(x, DTensor):  # replicated already: DTensor reduces the input gradient upstream
            local = x.to_local(grad_placements=(Partial(),))
            if plan.float8:
                out = _local_float8(plan, local, weight, bias)
            else:
                out = nn.functional.linear(local, weight, bias)
        else:
            out = linear_all_reduce_grad(
                x,
                weight,
                bias,
                plan.group,
                impl=_resolved_impl(plan.impl, weight, plan.float8),
                configs=plan.configs,
                float8=plan.float8,
            )
        if plan.use_local_output:
            return out
        return DTensor.from_local(out, plan.mesh, (Shard(out.ndim - 1),), run_check=False)

    def extra_repr(self) -> str:
        plan = self._syncopate_tp
        return f"{super().extra_repr()}, syncopate=colwise, impl={plan.impl!r}" + (
            ", float8=True" if plan.float8 else ""
        )


def _local_float8(plan: _Plan, x: torch.Tensor, weight, bias) -> torch.Tensor:
    """x @ weight.T + bias on FP8 GEMMs, local (its input gradient is DTensor's to reduce)."""
    from syncopate.tp.float8 import apply

    rows = x.reshape(-1, x.shape[-1]).contiguous()
    out = apply(plan.name, "local", rows, weight, bias, plan.group, "torch", {})
    return out.view(*x.shape[:-1], weight.shape[0])


def _seq_dim_ok(p: Shard, ndim: int) -> bool:
    d = p.dim + ndim if p.dim < 0 else p.dim
    return 0 <= d < ndim - 1


class ColwiseParallel(ParallelStyle):
    """torch's ColwiseParallel on Syncopate's ops: an nn.Linear's weight and bias sharded `Shard(0)`.

    input_layouts: how a local tensor input is laid out: `Replicate()` (the default) or `Shard(d)` of
    a sequence dim (sequence parallelism: the op gathers it). A DTensor input is taken as it is laid
    out (one sharded on its features is all-gathered first, as torch's style does).
    output_layouts: `Shard(-1)` only (the default). use_local_output: a local tensor (the default) or
    a DTensor `Shard(-1)`. Syncopate's: impl (`fused`, `torch`, `async_tp`, `ops`), configs (one per
    op kind; None: looked up), save_gathered (keep the gathered input for the weight's gradient, or
    only its shard and gather it again in the backward), float8 (every GEMM on FP8 operands, scaled
    row-wise as torchao's float8 "rowwise" recipe does, the weight kept in its dtype:
    `syncopate.tp.float8`; the local and out features a rank holds multiples of 16).
    """

    def __init__(
        self,
        *,
        input_layouts: Placement | None = None,
        output_layouts: Placement | None = None,
        use_local_output: bool = True,
        impl: str = "fused",
        configs: dict | None = None,
        save_gathered: bool = True,
        float8: bool = False,
    ) -> None:
        super().__init__()
        name = type(self).__name__
        self.input_layouts = (
            _layout(
                name,
                "input_layouts",
                input_layouts,
                Replicate(),
                "Replicate() and Shard(d) of a sequence dim d (not the features, -1)",
                lambda p: isinstance(p, Replicate) or _sequence_dim(p),
            ),
        )
        self.output_layouts = (
            _layout(
                name,
                "output_layouts",
                output_layouts,
                Shard(-1),
                "Shard(-1) (each rank's output features); gather or reduce them after the "
                "module, or keep torch's ColwiseParallel for this module",
                lambda p: p == Shard(-1),
            ),
        )
        self.desired_input_layouts = (Replicate(),)
        self.use_local_output = _checked_bool(name, "use_local_output", use_local_output)
        self.impl = _checked_impl(impl)
        self.configs = _checked_configs(configs)
        self.save_gathered = _checked_bool(name, "save_gathered", save_gathered)
        self.float8 = _checked_float8(name, float8, self.impl)

    def _partition(self, name, module, mesh) -> None:
        for key, param in list(module.named_parameters(recurse=False)):
            module.register_parameter(
                key,
                nn.Parameter(
                    distribute_tensor(param, mesh, [Shard(0)], src_data_rank=self.src_data_rank),
                    requires_grad=param.requires_grad,
                ),
            )

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        name = type(self).__name__
        mesh = _checked_mesh(name, device_mesh)
        _checked_linear(name, module)
        for what, size in (("out_features", module.out_features),):
            if size % mesh.size():
                raise ConfigError(
                    f"{name}: {what}={size} is not divisible by the mesh's size {mesh.size()}: each "
                    f"rank holds an equal block of the weight's rows"
                )
        if self.float8:
            check_dims(
                name,
                local_out_features=module.out_features // mesh.size(),
                local_in_features=module.in_features,
            )
        distribute_module(module, mesh, self._partition)
        module.__class__ = _swapped_class(_Colwise, type(module))
        module._syncopate_tp = _Plan(self, mesh)
        group = getattr(module, "_syncopate_merge", None)
        if group is not None:
            group.join(module)
        return module

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(input_layouts={self.input_layouts}, output_layouts={self.output_layouts}, "
            f"use_local_output={self.use_local_output}, impl={self.impl!r}, float8={self.float8})"
        )


# --- the row-parallel linear -------------------------------------------------------------------------------


class _Rowwise:
    def forward(self, input: torch.Tensor) -> torch.Tensor:
        plan: _Plan = self._syncopate_tp
        weight, bias = _local_params(self)
        x = input
        if isinstance(x, DTensor):
            if not (isinstance(x.placements[0], Shard) and x.placements[0].dim in (-1, x.ndim - 1)):
                x = x.redistribute(placements=(Shard(x.ndim - 1),))  # as torch's style would
            x = x.to_local()
        impl = _resolved_impl(plan.impl, weight, plan.float8)
        if isinstance(plan.output_layout, Replicate):
            out = linear_all_reduce(
                x, weight, bias, plan.group, impl=impl, configs=plan.configs, float8=plan.float8
            )
            placement = Replicate()
        else:
            d = _seq_dim(plan.name, plan.output_layout, x.ndim)
            _check_divisible(plan.name, x.shape[d], d, plan.ws)
            rows = linear_reduce_scatter(
                _rank_major(x, d, plan.ws),
                weight,
                bias,
                plan.group,
                impl=impl,
                configs=plan.configs,
                float8=plan.float8,
            )
            out = rows.view(*x.shape[:d], x.shape[d] // plan.ws, *x.shape[d + 1 : -1], rows.shape[-1])
            placement = Shard(d)
        if plan.use_local_output:
            return out
        return DTensor.from_local(out, plan.mesh, (placement,), run_check=False)

    def extra_repr(self) -> str:
        plan = self._syncopate_tp
        return f"{super().extra_repr()}, syncopate=rowwise, impl={plan.impl!r}" + (
            ", float8=True" if plan.float8 else ""
        )


class RowwiseParallel(ParallelStyle):
    """torch's RowwiseParallel on Syncopate's ops: an nn.Linear's weight sharded `Shard(1)`, its bias
    `Replicate()`.

    input_layouts: `Shard(-1)` only (the default: each rank's input features, a column-parallel
    linear's output). output_layouts: `Replicate()` (the default: `matmul_all_reduce`) or `Shard(d)`
    of a sequence dim (sequence parallelism: `matmul_reduce_scatter`). use_local_output, impl, configs,
    float8: as for `ColwiseParallel`.
    """

    def __init__(
        self,
        *,
        input_layouts: Placement | None = None,
        output_layouts: Placement | None = None,
        use_local_output: bool = True,
        impl: str = "fused",
        configs: dict | None = None,
        float8: bool = False,
    ) -> None:
        super().__init__()
        name = type(self).__name__
        self.input_layouts = (
            _layout(
                name,
                "input_layouts",
                input_layouts,
                Shard(-1),
                "Shard(-1) (each rank's input features)",
                lambda p: p == Shard(-1),
            ),
        )
        self.output_layouts = (
            _layout(
                name,
                "output_layouts",
                output_layouts,
                Replicate(),
                "Replicate() (all-reduced) and Shard(d) of a sequence dim d (reduce-"
                "scattered; not the features, -1)",
                lambda p: isinstance(p, Replicate) or _sequence_dim(p),
            ),
        )
        self.desired_input_layouts = (Shard(-1),)
        self.use_local_output = _checked_bool(name, "use_local_output", use_local_output)
        self.impl = _checked_impl(impl)
        self.configs = _checked_configs(configs)
        self.float8 = _checked_float8(name, float8, self.impl)

    def _partition(self, name, module, mesh) -> None:
        module.register_parameter(
            "weight",
            nn.Parameter(
                distribute_tensor(module.weight, mesh, [Shard(1)], src_data_rank=self.src_data_rank),
                requires_grad=module.weight.requires_grad,
            ),
        )
        if module.bias is not None:
            module.register_parameter(
                "bias",
                nn.Parameter(
                    distribute_tensor(module.bias, mesh, [Replicate()], src_data_rank=self.src_data_rank),
                    requires_grad=module.bias.requires_grad,
                ),
            )

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        name = type(self).__name__
        mesh = _checked_mesh(name, device_mesh)
        _checked_linear(name, module)
        if module.in_features % mesh.size():
            raise ConfigError(
                f"{name}: in_features={module.in_features} is not divisible by the mesh's size "
                f"{mesh.size()}: each rank holds an equal block of the weight's columns"
            )
        if self.float8:
            check_dims(
                name,
                local_out_features=module.out_features,
                local_in_features=module.in_features // mesh.size(),
            )
        distribute_module(module, mesh, self._partition)
        module.__class__ = _swapped_class(_Rowwise, type(module))
        module._syncopate_tp = _Plan(self, mesh)
        return module

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(input_layouts={self.input_layouts}, output_layouts={self.output_layouts}, "
            f"use_local_output={self.use_local_output}, impl={self.impl!r}, float8={self.float8})"
        )


# --- module inputs -----------------------------------------------------------------------------------------


def _placements(name: str, arg: str, value) -> tuple | None:
    if value is None:
        return None
    value = (value,) if isinstance(value, Placement) else value
    if not isinstance(value, tuple) or not all(p is None or isinstance(p, Placement) for p in value):
        raise ConfigError(f"{name}: {arg}={value!r} must be a Placement or a tuple of Placements and Nones")
    return value


def _kwarg_placements(name: str, arg: str, value) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(p, Placement) for k, p in value.items()
    ):
        raise ConfigError(f"{name}: {arg}={value!r} must be a dict of argument names to Placements")
    return dict(value)


class PrepareModuleInput(ParallelStyle):
    """torch's PrepareModuleInput, except that an input it would all-gather (`Shard(d)` of a sequence
    dim → `Replicate()`, with use_local_output=False, torch's default) is handed on sequence-sharded,
    for the column-parallel linears below (this package's `ColwiseParallel`) to gather in their fused
    op; those of them that read it run as one op (see the module docstring).

    The arguments are torch's: input_layouts / desired_input_layouts (a Placement or a tuple, None
    for an input left alone), input_kwarg_layouts / desired_input_kwarg_layouts (by argument name),
    use_local_output.
    """

    def __init__(
        self,
        *,
        input_layouts=None,
        desired_input_layouts=None,
        input_kwarg_layouts=None,
        desired_input_kwarg_layouts=None,
        use_local_output: bool = False,
    ) -> None:
        name = type(self).__name__
        self.input_layouts = _placements(name, "input_layouts", input_layouts)
        self.desired_input_layouts = _placements(name, "desired_input_layouts", desired_input_layouts)
        self.input_kwarg_layouts = _kwarg_placements(name, "input_kwarg_layouts", input_kwarg_layouts)
        self.desired_input_kwarg_layouts = _kwarg_placements(
            name, "desired_input_kwarg_layouts", desired_input_kwarg_layouts
        )
        self.use_local_output = _checked_bool(name, "use_local_output", use_local_output)
        self.with_kwargs = input_kwarg_layouts is not None
        if self.input_layouts is not None and (
            self.desired_input_layouts is None or len(self.input_layouts) != len(self.desired_input_layouts)
        ):
            raise ConfigError(
                f"{name}: input_layouts={self.input_layouts} and desired_input_layouts="
                f"{self.desired_input_layouts} must be tuples of the same length"
            )
        if set(self.input_kwarg_layouts) != set(self.desired_input_kwarg_layouts):
            raise ConfigError(
                f"{name}: input_kwarg_layouts names {sorted(self.input_kwarg_layouts)} but "
                f"desired_input_kwarg_layouts names {sorted(self.desired_input_kwarg_layouts)}: "
                f"they must name the same arguments"
            )

    def _defers(self, layout, desired) -> bool:
        return not self.use_local_output and _sequence_dim(layout) and isinstance(desired, Replicate)

    def _prepare(self, x, mesh: DeviceMesh, layout, desired):
        if layout is None:
            return x
        if not isinstance(x, torch.Tensor):
            raise ConfigError(
                f"{type(self).__name__}: an input laid out as {layout!r} must be a tensor, got "
                f"{type(x).__name__}"
            )
        dt = x if isinstance(x, DTensor) else DTensor.from_local(x, mesh, (layout,), run_check=False)
        if (
            self._defers(layout, desired)
            and _seq_dim_ok(dt.placements[0], dt.ndim)
            and isinstance(dt.placements[0], Shard)
        ):
            return dt  # gathered by the column-parallel linears that read it
        if desired is not None and layout != desired:
            dt = dt.redistribute(placements=(desired,))
        return dt.to_local() if self.use_local_output else dt

    def _inputs(self, inputs: tuple, mesh: DeviceMesh) -> tuple:
        if self.input_layouts is None:
            return inputs
        if len(inputs) != len(self.input_layouts):
            raise ConfigError(
                f"{type(self).__name__}: the module got {len(inputs)} positional inputs but "
                f"input_layouts has {len(self.input_layouts)}: give one layout (or None) per input"
            )
        return tuple(
            self._prepare(x, mesh, layout, desired)
            for x, layout, desired in zip(inputs, self.input_layouts, self.desired_input_layouts)
        )

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        mesh = _checked_mesh(type(self).__name__, device_mesh)
        pairs = list(zip(self.input_layouts or (), self.desired_input_layouts or ()))
        pairs += [(p, self.desired_input_kwarg_layouts[k]) for k, p in self.input_kwarg_layouts.items()]
        if any(self._defers(layout, desired) for layout, desired in pairs):
            group = _MergeGroup()
            for m in module.modules():
                if m is not module and isinstance(m, nn.Linear):
                    m._syncopate_merge = group
                    if isinstance(getattr(m, "_syncopate_tp", None), _Plan) and isinstance(m, _Colwise):
                        group.join(m)  # parallelized before its parent was
        if self.with_kwargs:
            module.register_forward_pre_hook(
                lambda _, args, kwargs: (
                    self._inputs(args, mesh),
                    {
                        k: self._prepare(
                            v, mesh, self.input_kwarg_layouts.get(k), self.desired_input_kwarg_layouts.get(k)
                        )
                        for k, v in kwargs.items()
                    },
                ),
                with_kwargs=True,
            )
        else:
            module.register_forward_pre_hook(lambda _, args: self._inputs(args, mesh))
        return module

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(input_layouts={self.input_layouts}, desired_input_layouts="
            f"{self.desired_input_layouts}, input_kwarg_layouts={self.input_kwarg_layouts}, "
            f"desired_input_kwarg_layouts={self.desired_input_kwarg_layouts}, "
            f"use_local_output={self.use_local_output})"
        )
