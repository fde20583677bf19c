"""Layer: pure CPU logic. Sweep configs load and validate; bad ones fail with one line naming the
file, field and value."""

from __future__ import annotations

import textwrap

import pytest

from syncopate.autotuner.sweep import load_sweep, parse_sweep
from syncopate.errors import ConfigError


def test_shipped_configs_are_valid():
    suite = load_sweep("configs/llama_tp2.yaml")
    assert suite.topology_key == "H200x2-nvlink"
    by_kind = {}
    for w in suite.workloads:
        by_kind.setdefault(w.kind, []).append((w.shape.n, w.shape.k))
    assert by_kind["ag_gemm"] == [
        (11008, 4096),
        (14336, 4096),
        (28672, 8192),
        (29568, 8192),
        (4096, 8192),
        (2048, 8192),
    ]
    assert by_kind["gemm_rs"] == [
        (4096, 11008),
        (4096, 14336),
        (8192, 28672),
        (8192, 29568),
        (8192, 4096),
        (8192, 2048),
    ]
    assert by_kind["gemm_ar"] == by_kind["gemm_rs"]
    assert all(w.shape.m == 8192 and w.dtype == "bf16" for w in suite.workloads)
    quick = load_sweep("configs/quickstart.yaml")
    assert quick.runner == "model" and quick.topology_key == "H200x2-nvlink" and quick.workloads


BASE = {
    "name": "t",
    "topology": "H200x2-nvlink",
    "workloads": [{"kind": "ag_gemm", "shapes": [[1024, 1024, 1024]]}],
}


@pytest.mark.parametrize(
    "change, message",
    [
        ({"workloads": [{"kind": "conv", "shapes": [[1, 1, 1]]}]}, "workloads.0.kind: unknown kind 'conv'"),
        (
            {"workloads": [{"kind": "ag_gemm", "shapes": [[1023, 1024, 1024]]}]},
            "M=1023 is not divisible by world size 2",
        ),
        ({"workloads": [{"kind": "ag_gemm", "shapes": [[0, 1024, 1024]]}]}, "M=0 must be positive"),
        ({"workloads": [{"kind": "ag_gemm", "models": ["gpt-9"]}]}, "unknown model 'gpt-9'"),
        ({"workloads": [{"kind": "ag_gemm"}]}, "give models or shapes"),
        ({"workloads": []}, "workloads is empty"),
        ({"dtype": "int4"}, "unknown dtype 'int4'"),
        ({"topology": "H200x2"}, "topology key 'H200x2' does not parse"),
        ({"strategy": {"name": "annealing"}}, "strategy.name: unknown strategy 'annealing'"),
        ({"strategy": {"max_trials": 0}}, "max_trials=0 must be positive"),
        (
            {"strategy": {"time_budget_s": float("nan")}},
            "time_budget_s=nan must be a positive, finite number",
        ),
        ({"runner": "tpu"}, "runner: unknown runner 'tpu'"),
        ({"name": " "}, "name: sweep name ' ' must be a non-empty string of at most 192 characters"),
        ({"name": "n" * 193}, "must be a non-empty string of at most 192 characters"),
        ({"db": "mysql://u@h/db"}, "db: database URL 'mysql://u@h/db' is not supported"),
        ({"space": {"backends": ["gloo"]}}, "unknown backend 'gloo'"),
        ({"colour": "red"}, "colour: unknown field"),
        (
            {"tokens": -5, "workloads": [{"kind": "ag_gemm", "models": ["llama-7b"]}]},
            "tokens: Input should be greater than 0",
        ),
        (
            {"workloads": [{"kind": "ag_gemm", "models": ["llama-7b"], "tokens": 0}]},
            "workloads.0.tokens: Input should be greater than 0",
        ),
        ({"tokens": 2**21}, "tokens: Input should be less than or equal to 1048576"),
        (
            {"workloads": [{"kind": "ag_gemm", "shapes": [[2**40, 1024, 1024]]}]},
            "M=1099511627776 is larger than 1048576",
        ),
        ({"space": {"group_m": [0]}}, r"space.group_m=0 must be a power of two in \[1, 64\]"),
        ({"space": {"group_m": [8, 6]}}, "space.group_m=6 must be a power of two"),
        (
            {"space": {"comm_sms": {"sm_copy": [-4]}}},
            r"space.comm_sms.sm_copy value -4 must be an SM count in \[1, 128\]",
        ),
        ({"space": {"comm_sms": {"copy_engine": [8]}}}, "space.comm_sms.copy_engine value 8 must be 0"),
        (
            {"space": {"tile_configs": ["0x0x0w0s0"]}},
            r"tile config 0x0x0w0s0: block_m=0 must be a power of two in \[16, 256\]",
        ),
        ({"space": {"tile_configs": ["128x128x64w8s0"]}}, r"num_stages=0 must be an integer in \[1, 8\]"),
        ({"space": {"tile_configs": ["128x96x64w8s3"]}}, "block_n=96 must be a power of two"),
    ],
)
def test_bad_configs_name_the_problem(change, message):
    data = {**BASE, **change}
    with pytest.raises(ConfigError, match=message) as info:
        parse_sweep(data, "sweep.yaml")
    assert str(info.value).startswith("sweep.yaml")
    assert "\n" not in str(info.value)


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_sweep(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(ConfigError, match="malformed YAML at line"):
        load_sweep(bad)
    latin = tmp_path / "latin.yaml"
    latin.write_bytes("name: caf\u00e9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match="is not UTF-8 text .byte 9.: save it as UTF-8 YAML"):
        load_sweep(latin)
    with pytest.raises(ConfigError, match="is a directory"):
        load_sweep(tmp_path)
    listy = tmp_path / "list.yaml"
    listy.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_sweep(listy)


def test_space_restrictions_apply(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text(
        textwrap.dedent("""
        name: small
        topology: H200x2-nvlink
        workloads: [{kind: gemm_rs, shapes: [[8192, 4096, 4096]]}]
        space: {backends: [nccl], comm_sms: {nccl: [64]}, num_splits: [2], tile_configs: [128x128x64w8s4]}
    """)
    )
    sweep = load_sweep(f)
    from syncopate.search_space import space, unfused_candidate

    cands = space(sweep.workloads[0], sweep.topology(), sweep.space)
    # the unfused candidate (the default templates have it) is one a workload, whatever the restrictions
    assert cands[0] == unfused_candidate()
    assert cands[1:] and all(
        c.backend == "nccl" and c.num_splits == 2 and c.block_n == 128 for c in cands[1:]
    )
