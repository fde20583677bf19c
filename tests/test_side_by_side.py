"""benchmarks/side_by_side.py's variants as written on its command line, and its refusals (CPU)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "side_by_side", Path(__file__).resolve().parent.parent / "benchmarks" / "side_by_side.py"
)
side_by_side = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(side_by_side)
_candidate, main, parse_variant = side_by_side._candidate, side_by_side.main, side_by_side.parse_variant


def test_a_variant_is_a_template_its_splits_and_its_settings():
    assert parse_variant("decomposed:4") == ("decomposed", 4, {})
    assert parse_variant("c_stationary") == ("c_stationary", 2, {})
    assert parse_variant("decomposed:2 SYNCOPATE_A=1 SYNCOPATE_B=x=y") == (
        "decomposed",
        2,
        {"SYNCOPATE_A": "1", "SYNCOPATE_B": "x=y"},
    )


@pytest.mark.parametrize(
    "text, said",
    [
        ("decomposed:four", "'four' is not a whole number"),
        ("decomposed:2 SWITCH", "'SWITCH' is not NAME=VALUE"),
        ("decomposed:2 =1", "'=1' is not NAME=VALUE"),
        ("bogus:2", "unknown plan template 'bogus'"),
        ("decomposed:0", "num_splits=0"),
    ],
)
def test_a_malformed_variant_is_refused_before_any_gpu_is_asked_for(text, said, capsys):
    assert main(["gemm_ar", "8192", "4096", "11008", "decomposed:4", text]) == 2
    assert said in capsys.readouterr().err


def test_a_variant_names_the_candidate_the_bench_would_time():
    c = _candidate("gemm_ar", "decomposed", 4)
    assert (c.backend, c.template, c.num_splits) == ("copy_engine", "decomposed", 4)
    c = _candidate("gemm_rs", "direct", 2)
    assert (c.template, c.num_splits, c.block_m, c.block_n, c.tile_order) == (
        "direct",
        2,
        128,
        256,
        "arrival",
    )
