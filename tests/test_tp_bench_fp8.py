"""Layer: pure CPU, gloo process groups, and the CLI on the CPU. `syncopate bench --layer ... --dtype
fp8` (`LayerBench(dtype="fp8")`): the settings it refuses, naming the value; the defaults it runs
(`unfused` for fp8 workloads); the dtype in the table's header and the JSON's settings; and the
layer it builds for each implementation on two gloo ranks with tiny widths: `torch` (torch's
collectives and the CPU build's `torch._scaled_mm`) and `async_tp` (torch's fused scaled ops, with
CPU kernels that compute them as torch's own fallbacks do: gloo moves no float8, so the
all-gather's is torch's fallback with A's bytes moved as uint8) forward and backward, the same
numbers as each other (without sequence parallelism async-TP's all-reduce is torch's), FP8's
rounding visible against the bf16 layer. The fused implementations
need CUDA tensors: on the CPU their layers are built and refuse to run, naming why. The timing
itself needs GPUs (benchmarks/fp8_check.sh)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from support.gloo import run_gloo

from syncopate.errors import ConfigError
from syncopate.measure.reference import relative_error
from syncopate.search_space import Topology, unfused_candidate
from syncopate.tp.bench import LayerBench, _build, _default_configs, format_layer_table

REPO = Path(__file__).resolve().parents[1]
TWO = Topology.from_key("H200x2-nvlink")
TINY = {"hidden": 32, "ffn": 64, "heads": 2, "kv_heads": 2, "tokens": 64, "tp": 2}


# The settings ---------------------------------------------------------------------------------------


def test_fp8_is_a_setting_of_its_own_and_other_dtypes_are_refused():
    assert LayerBench().dtype == "bf16"
    fp8 = LayerBench(dtype="fp8")
    assert dataclasses.asdict(fp8)["dtype"] == "fp8" and fp8.ops() == LayerBench().ops()
    with pytest.raises(ConfigError, match=r"layer bench dtype='fp16': accepted are bf16, fp8"):
        LayerBench(dtype="fp16")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"hidden": 4104}, "but hidden is 4104"),
        ({"ffn": 14344}, "but the column layer's out features a rank holds is 14344"),
        ({"ffn": 14352, "tp": 4}, "but the column layer's out features a rank holds is 7176"),
        ({"tokens": 8200}, "but tokens is 8200"),
        (
            {"layer": "attention", "hidden": 4096, "heads": 32, "kv_heads": 8, "head_dim": 129},
            "but the column layer's out features a rank holds is 3096",
        ),
    ],
)
def test_fp8_refuses_a_dimension_scaled_mm_cannot_take_naming_it(kwargs, message):
    LayerBench(**kwargs)  # fine in bf16
    with pytest.raises(ConfigError, match=rf"dtype=fp8: every dimension .* multiple of 16 .*{message}"):
        LayerBench(dtype="fp8", **kwargs)


def test_fp8_mlp_row_layer_width_is_checked_too():
    """ffn/tp a multiple of 8 only: the column layer's 2·ffn/tp passes, the row layer's does not."""
    with pytest.raises(ConfigError, match=r"but the row layer's in features a rank holds is 7176"):
        LayerBench(dtype="fp8", ffn=14352)


def test_the_defaults_of_fp8_ops_are_unfused():
    """The untuned default of an fp8 workload is `unfused` (the fused Triton kernels take no FP8):
    the `default` row runs the FP8 ops' unfused template; bf16's are not unfused."""
    col, row = _default_configs(LayerBench(dtype="fp8"), TWO)
    assert set(col.values()) | set(row.values()) == {unfused_candidate()}
    assert set(col) == set(row) == {"ag_gemm", "gemm_rs"}
    col16, row16 = _default_configs(LayerBench(), TWO)
    assert unfused_candidate() not in set(col16.values()) | set(row16.values())


def test_the_table_header_says_the_dtype():
    result = {
        "bench": dataclasses.asdict(LayerBench(dtype="fp8")),
        "results": {"torch": {"eager/forward": 300.0}, "syncopate": {"eager/forward": 250.0}},
    }
    table = format_layer_table(result).splitlines()
    assert table[0].split(" | ")[:3] == ["mode/pass (fp8)", "torch", "syncopate"]
    assert table[2].split(" | ")[-3] == "1.200"


# The layers on two gloo ranks -----------------------------------------------------------------------


def _register_cpu_async_tp() -> None:
    """CPU kernels for torch's fused scaled ops, in this rank's process only: the reduce-scatter's is
    torch's own fallback; the all-gather's is torch's fallback with A's bytes gathered as uint8 (gloo
    moves no float8), after torch's own check that the scales are row-wise sharded."""
    import torch.distributed._symmetric_memory as symm_mem
    from torch.distributed import distributed_c10d as c10d

    from syncopate.kernels.library import all_gather_rows

    def all_gather_scaled(
        a, bs, a_scale, b_scales, gather_dim, group_name, biases, result_scales, dtypes, fast
    ):
        group = c10d._resolve_process_group(group_name)
        mode = symm_mem._check_and_verify_fp8_all_gather_scale_mode(
            shard=a, scale=a_scale, gather_dim=gather_dim, group_size=group.size()
        )
        assert mode == symm_mem._ScaleMode.ROW_WISE_SHARDED and gather_dim == 0, (mode, gather_dim)
        dtypes = symm_mem._maybe_convert_scalar_types_to_dtypes(dtypes)
        full = all_gather_rows(a.view(torch.uint8), group).view(a.dtype)
        scales = all_gather_rows(a_scale, group)
        outs = [
            torch._scaled_mm(full, b, scales, sb, bias, rs, out_dtype=dt, use_fast_accum=f)
            for b, sb, bias, rs, dt, f in zip(bs, b_scales, biases, result_scales, dtypes, fast, strict=True)
        ]
        return full, outs

    torch.library.impl("symm_mem::fused_all_gather_scaled_matmul", "CPU")(all_gather_scaled)
    torch.library.impl("symm_mem::fused_scaled_matmul_reduce_scatter", "CPU")(
        symm_mem._fused_scaled_matmul_reduce_scatter_fallback
    )


def _weights(layer: str):
    torch.manual_seed(11)
    h, f = TINY["hidden"], TINY["ffn"]
    if layer == "mlp":
        col = [torch.nn.Linear(h, f, bias=False, dtype=torch.bfloat16) for _ in range(2)]
        row_in = f
    else:
        width = TINY["hidden"] // TINY["heads"]
        col = torch.nn.Linear(
            h, (TINY["heads"] + 2 * TINY["kv_heads"]) * width, bias=False, dtype=torch.bfloat16
        )
        row_in = TINY["heads"] * width
    return {"col": col, "row": torch.nn.Linear(row_in, h, bias=False, dtype=torch.bfloat16)}


def _layers_worker(rank, ws, init, q):
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=ws)
    try:
        _register_cpu_async_tp()
        group = dist.group.WORLD
        report = {}
        for layer, sp in (("mlp", True), ("attention", True), ("mlp", False)):
            gen = torch.Generator().manual_seed(5 + rank if sp else 5)
            rows = TINY["tokens"] // ws if sp else TINY["tokens"]
            x = torch.randn(rows, TINY["hidden"], generator=gen).bfloat16()
            dy = torch.randn(rows, TINY["hidden"], generator=gen).bfloat16()
            got = {}
            for dtype, impl in (("fp8", "torch"), ("fp8", "async_tp"), ("bf16", "torch")):
                bench = LayerBench(layer=layer, dtype=dtype, sequence_parallel=sp, **TINY)
                forward, params = _build(bench, impl, group, torch.device("cpu"), _weights(layer), None)
                xi = x.clone().requires_grad_(True)
                y = forward(xi)
                y.backward(dy)
                got[(dtype, impl)] = [y.detach(), xi.grad, *(p.grad for p in params)]
            said = {}
            for impl in ("syncopate", "default"):
                bench = LayerBench(layer=layer, dtype="fp8", sequence_parallel=sp, **TINY)
                configs = _default_configs(bench, TWO) if impl == "default" else None
                forward, _ = _build(bench, impl, group, torch.device("cpu"), _weights(layer), configs)
                try:
                    forward(x)
                except ConfigError as e:
                    said[impl] = str(e)
            bounds = {}
            for dtype in ("fp8", "bf16"):  # the bound: the layer's local GEMMs on the same buffers
                bench = LayerBench(layer=layer, dtype=dtype, sequence_parallel=sp, **TINY)
                torch.manual_seed(7)
                forward, params = _build(bench, "bound", group, torch.device("cpu"), _weights(layer), None)
                xi = x.clone().requires_grad_(True)
                y = forward(xi)
                y.backward(dy)
                bounds[dtype] = [y.detach(), xi.grad, *(p.grad for p in params)]
            fp8, atp, bf16 = got[("fp8", "torch")], got[("fp8", "async_tp")], got[("bf16", "torch")]
            report[f"{layer} sp={sp}"] = (
                [torch.equal(a, b) for a, b in zip(fp8, atp, strict=True)],
                [relative_error(a, b) for a, b in zip(fp8, bf16, strict=True)],
                [t.dtype for t in fp8],
                said,
                [relative_error(a, b) for a, b in zip(bounds["fp8"], bounds["bf16"], strict=True)],
            )
        q.put((rank, report))
    finally:
        dist.destroy_process_group()


def test_each_impl_and_the_bound_build_the_fp8_layer_on_two_gloo_ranks():
    for rank, report in run_gloo(_layers_worker, 2):
        for layer, (same, off, dtypes, said, bound_off) in report.items():
            where = f"rank {rank} {layer}"
            assert same == [True] * len(same), f"{where}: async_tp against torch, y, dx, dW: {same}"
            assert dtypes == [torch.bfloat16] * len(dtypes), f"{where}: {dtypes}"
            assert all(1e-3 < e < 8e-2 for e in off), f"{where}: FP8 against the bf16 layer: {off}"
            # the FP8 bound runs scaled GEMMs: FP8's error against the bf16 bound, no more
            assert all(1e-3 < e < 8e-2 for e in bound_off), (
                f"{where}: the FP8 bound against bf16's: {bound_off}"
            )
            refused = "a is on cpu: the fused ops need CUDA tensors"
            for impl in ("syncopate", "default"):
                assert refused in said.get(impl, ""), (where, impl, said)


# The CLI -------------------------------------------------------------------------------------------


def test_the_cli_takes_dtype_fp8_with_layer_up_to_the_gpus_it_needs():
    args = ["bench", "--layer", "mlp", "--dtype", "float8_e4m3fn", "--tp", "2"]
    r = subprocess.run(
        [sys.executable, "-m", "syncopate", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
        timeout=120,
    )
    assert r.returncode == 1 and "needs 2 CUDA GPUs on this host (--tp 2); 0 visible" in r.stderr, r.stderr


@pytest.mark.parametrize(
    "dtype, hidden, message",
    [
        ("fp16", 4096, "layer bench dtype='fp16': accepted are bf16, fp8"),
        ("int8", 4096, "unknown dtype 'int8'"),
        ("fp8", 4104, "but hidden is 4104"),
    ],
)
def test_the_cli_refuses_a_dtype_or_width_fp8_cannot_bench_before_any_gpu_work(
    tmp_path, dtype, hidden, message
):
    from syncopate.cli.bench_cmds import _bench_layer

    out = tmp_path / "layer.json"
    with pytest.raises(ConfigError, match=message):
        _bench_layer("mlp", hidden, 14336, 32, 8, 0, 8192, 2, True, 7, out, None, dtype=dtype)
    assert not out.exists()
