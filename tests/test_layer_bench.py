"""`syncopate bench --layer` on the CPU (pure logic): the layer bench's checks, the fused ops a
layer calls forward and backward, and the table it prints; the timing itself needs GPUs."""

from __future__ import annotations

import pytest

from syncopate.errors import ConfigError
from syncopate.tp.bench import LayerBench, format_layer_table


def test_mlp_ops_forward_and_backward():
    b = LayerBench(layer="mlp", hidden=4096, ffn=14336, tokens=8192, tp=4)
    assert b.ops() == [
        ("ag_gemm", (8192, 28672, 4096)),
        ("gemm_rs", (8192, 4096, 14336)),
        ("ag_gemm", (8192, 14336, 4096)),
        ("gemm_rs", (8192, 4096, 28672)),
    ]
    nsp = LayerBench(layer="mlp", hidden=4096, ffn=14336, tokens=2048, tp=2, sequence_parallel=False)
    assert nsp.ops() == [("gemm_ar", (2048, 4096, 14336)), ("gemm_ar", (2048, 4096, 28672))]


def test_attention_ops_use_the_head_widths():
    b = LayerBench(layer="attention", hidden=4096, heads=32, kv_heads=8, tokens=4096, tp=2)
    qkv = (32 + 2 * 8) * 128
    assert b.ops()[0] == ("ag_gemm", (4096, qkv, 4096))
    assert b.ops()[1] == ("gemm_rs", (4096, 4096, 4096))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"layer": "moe"}, "unknown layer 'moe': accepted are mlp, attention"),
        ({"tp": 1}, "tp=1: a tensor-parallel layer needs at least 2 ranks"),
        ({"tokens": 8191}, "tokens=8191 must be a multiple of tp=2"),
        ({"ffn": 14335}, "ffn=14335 must be a multiple of tp=2"),
        (
            {"layer": "attention", "kv_heads": 3, "heads": 30, "hidden": 3840, "tp": 2},
            "kv_heads=3 must be a multiple of tp=2",
        ),
        (
            {"impls": ("torch", "magic")},
            r"impls=\['torch', 'magic'\]: accepted are torch, async_tp, syncopate, default, bound",
        ),
        ({"hidden": 0}, "hidden=0 must be a positive integer"),
        ({"launch": "graphs"}, "launch='graphs': accepted are auto, graph, direct"),
    ],
)
def test_bad_settings_are_refused_with_the_value(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        LayerBench(**kwargs)


def test_table_gives_torch_paths_over_ours_per_mode_and_pass():
    result = {
        "results": {
            "torch": {"eager/forward": 300.0, "graph/forward": 240.0},
            "async_tp": {"eager/forward": 330.0, "graph/forward": 250.0},
            "syncopate": {"eager/forward": 250.0, "graph/forward": 200.0},
            "default": {"error": "RuntimeError: no"},
        }
    }
    table = format_layer_table(result).splitlines()
    assert table[0].split(" | ")[:4] == ["mode/pass (bf16)", "torch", "async_tp", "syncopate"]
    eager = table[2].split(" | ")
    assert eager[0] == "eager/forward" and eager[-3:] == ["1.200", "1.320", "–"]
    graph = table[3].split(" | ")
    assert graph[0] == "graph/forward" and graph[-3] == "1.200"


def test_attention_with_a_head_width_of_its_own():
    b = LayerBench(layer="attention", hidden=5120, heads=64, kv_heads=8, head_dim=128, tokens=4096, tp=4)
    assert b.ops()[0] == ("ag_gemm", (4096, (64 + 2 * 8) * 128, 5120))
    assert b.ops()[1] == ("gemm_rs", (4096, 5120, 64 * 128))
    with pytest.raises(ConfigError, match="head_dim=-1"):
        LayerBench(layer="attention", head_dim=-1)


def test_the_bound_computes_each_rank_s_shapes_without_communicating():
    """The bound's layers run the local matmuls of the real ones, forward and backward, with no
    process group at all (a collective would raise), and give every gradient its shape."""
    import types

    import torch

    from syncopate.tp.bench import _local_ops

    bench = LayerBench(layer="mlp", hidden=8, ffn=16, tokens=12, tp=2)
    col = types.SimpleNamespace(weight=torch.randn(16, 8, requires_grad=True), bias=None)
    row = types.SimpleNamespace(weight=torch.randn(8, 8, requires_grad=True), bias=None)
    col_fn, row_fn = _local_ops(bench, col, row)
    x = torch.randn(6, 8, requires_grad=True)
    gu = col_fn(x)
    assert gu.shape == (12, 16)
    gate, up = gu.chunk(2, dim=-1)
    h = torch.nn.functional.silu(gate) * up
    out = row_fn(h)
    assert out.shape == (6, 8)
    torch.testing.assert_close(out, (h @ row.weight.t())[:6])
    out.backward(torch.randn_like(out))
    assert x.grad.shape == (6, 8) and col.weight.grad.shape == (16, 8) and row.weight.grad.shape == (8, 8)

    local = LayerBench(layer="mlp", hidden=8, ffn=16, tokens=12, tp=2, sequence_parallel=False)
    col_fn, row_fn = _local_ops(local, col, row)
    x = torch.randn(12, 8)
    torch.testing.assert_close(col_fn(x), x @ col.weight.t())


def test_table_adds_the_bound_columns_when_the_bound_is_measured():
    result = {
        "results": {
            "torch": {"graph/forward": 300.0},
            "syncopate": {"graph/forward": 250.0},
            "bound": {"graph/forward": 200.0},
        }
    }
    head, _, row = format_layer_table(result).splitlines()
    assert head.split(" | ")[-2:] == ["bound/ours", "torch/bound"]
    assert row.split(" | ")[-2:] == ["0.800", "1.500"]


def test_profile_summary_sorts_device_time_into_classes_and_streams():
    from syncopate.tp.bench import kernel_class, summarize_trace

    assert kernel_class("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL") == "nccl"
    assert kernel_class("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64") == "gemm"
    assert kernel_class("nvjet_tst_256x128_64x4_1x2_h_bz_coopA_NTN") == "gemm"
    assert kernel_class("Memcpy PtoP (Device -> Device)") == "copy"
    assert kernel_class("_gemm_rs_kernel") == "syncopate"
    assert kernel_class("void at::native::vectorized_elementwise_kernel<4, ...>") == "other"
    events = [("nvjet_a", 7, 300.0), ("ncclDevKernel_X", 13, 120.0), ("nvjet_a", 7, 300.0), ("elem", 7, 60.0)]
    s = summarize_trace(events, iterations=2)
    assert s["by_class"]["gemm"] == 300.0 and s["by_class"]["nccl"] == 60.0 and s["by_class"]["other"] == 30.0
    assert list(s["by_stream"]) == ["7", "13"] and s["by_stream"]["7"] == 330.0
    assert s["top"][0] == ["nvjet_a", 300.0]


def test_the_launch_of_each_program_is_printed_with_its_figures():
    from syncopate.tp.bench import format_launch

    result = {
        "launch": [
            {
                "op": "all_gather_matmul",
                "a": [512, 4096],
                "b": [4096, 7168],
                "config": "copy_engine/direct/s2",
                "launch": "replayed",
                "direct_us": 181.25,
                "replayed_us": 120.5,
                "direct_host_us": 300.0,
                "replayed_host_us": 21.0,
            },
            {
                "op": "matmul_reduce_scatter",
                "a": [2048, 3584],
                "b": [3584, 4096],
                "config": "x",
                "launch": "sampling",
            },
        ]
    }
    assert format_launch(result).splitlines() == [
        "all_gather_matmul 512x4096 @ 4096x7168 copy_engine/direct/s2: replayed (timed, direct / replayed: "
        "181.2 / 120.5 us on the stream, 300.0 / 21.0 us of host time)",
        "matmul_reduce_scatter 2048x3584 @ 3584x4096 x: sampling",
    ]
    assert format_launch({}) == "" and format_launch({"launch": []}) == ""


def _run(launch, torch_us, ours_us, launched=(), tp=4, tokens=2048, passes=("forward", "forward_backward")):
    """A `run_layer_bench` result of one launch: eager torch and ours µs per pass."""
    results = {
        "torch": {f"eager/{p}": t for p, t in zip(passes, torch_us)},
        "syncopate": {f"eager/{p}": o for p, o in zip(passes, ours_us)},
    }
    bench = {"layer": "mlp", "hidden": 4096, "ffn": 14336, "heads": 32, "kv_heads": 8, "tokens": tokens}
    bench.update(tp=tp, launch=launch, dtype="bf16")
    return {"bench": bench, "results": results, "launch": [{"launch": how} for how in launched]}


def test_the_launches_of_a_layer_are_set_side_by_side_each_against_torch_in_its_own_run():
    from syncopate.tp.bench import format_launches, launch_rows

    runs = [
        _run("auto", (440.0, 1700.0), (400.0, 1250.0), ("replayed", "replayed", "direct", "sampling")),
        _run("graph", (575.0, 1930.0), (388.0, 1370.0)),
        _run("direct", (437.0, 1650.0), (607.5, 1987.0)),
        _run("auto", (1500.0, 4300.0), (1260.0, 3980.0), tokens=8192),  # one launch only: no row
    ]
    head, rows = launch_rows(runs)
    assert head == [
        "TP",
        "layer",
        "tokens",
        "mode/pass",
        "ours, auto",
        "torch / ours, auto",
        "ours, graph",
        "torch / ours, graph",
        "ours, direct",
        "torch / ours, direct",
        "replayed by auto",
    ]
    assert rows == [
        [
            "TP=4",
            "mlp 4096/14336",
            "2048",
            "eager/forward",
            "400.0",
            "1.100",
            "388.0",
            "1.482",
            "607.5",
            "0.719",
            "2 of 3",
        ],
        [
            "TP=4",
            "mlp 4096/14336",
            "2048",
            "eager/forward+backward",
            "1250.0",
            "1.360",
            "1370.0",
            "1.409",
            "1987.0",
            "0.830",
            "2 of 3",
        ],
    ]
    table = format_launches(runs).splitlines()
    assert table[0] == " | ".join(head) and len(table) == 4
    assert format_launches(runs[3:]) == "" and format_launches([]) == ""


def test_a_launch_a_layer_did_not_run_reads_as_a_dash():
    from syncopate.tp.bench import launch_rows

    fwd = ("forward",)
    runs = [
        _run("auto", (440.0,), (400.0,), passes=fwd),
        _run("direct", (437.0,), (607.5,), passes=fwd),
        _run("auto", (1500.0,), (1250.0,), passes=fwd, tokens=8192),
        _run("graph", (1500.0,), (1200.0,), passes=fwd, tokens=8192),
    ]
    _, rows = launch_rows(runs)
    assert [row[4:] for row in rows] == [
        ["400.0", "1.100", "–", "–", "607.5", "0.719", "–"],  # auto reported no program: a dash too
        ["1250.0", "1.200", "1200.0", "1.250", "–", "–", "–"],
    ]


@pytest.mark.parametrize(
    "launch, impls, message",
    [
        ("auto,graphs", None, "--launch 'auto,graphs': give one of auto, graph, direct, or several of them"),
        ("auto,auto", None, "each once"),
        (
            "auto,graph",
            "syncopate,async_tp",
            "--impls must include torch and syncopate, got syncopate,async_tp",
        ),
    ],
)
def test_several_launches_are_checked_before_any_gpu_work(tmp_path, launch, impls, message):
    from syncopate.cli.bench_cmds import _bench_layer

    out = tmp_path / "layer.json"
    with pytest.raises(ConfigError, match=message):
        _bench_layer("mlp", 4096, 14336, 32, 8, 0, 8192, 2, True, 7, out, None, launch=launch, impls=impls)
    assert not out.exists()
