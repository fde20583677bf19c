"""Layer: CLI on the CPU. `syncopate space`, `validate`, `--help` everywhere, and one-line errors
with exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from syncopate.search_space import Candidate


def run(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "syncopate", *args], capture_output=True, text=True, cwd=cwd)


def test_space_json_lists_valid_candidates():
    r = run(
        "space",
        "--kind",
        "ag_gemm",
        "--m",
        "8192",
        "--n",
        "28672",
        "--k",
        "8192",
        "--dtype",
        "bf16",
        "--topology",
        "H200x2-nvlink",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    cands = [Candidate.from_dict(d) for d in json.loads(r.stdout)]
    assert len(cands) > 100


def test_validate_prints_the_workloads():
    r = run("validate", "configs/llama_tp2.yaml")
    assert r.returncode == 0, r.stderr
    assert "ag_gemm/8192x28672x8192/bf16" in r.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["space", "--kind", "mm", "--m", "8", "--n", "8", "--k", "8", "--topology", "H200x2-nvlink"],
            "unknown kind 'mm'",
        ),
        (
            ["space", "--m", "9", "--n", "8", "--k", "8", "--topology", "H200x2-nvlink"],
            "M=9 is not divisible by world size 2",
        ),
        (["space", "--m", "8", "--n", "8", "--k", "8", "--topology", "H9x2-nvlink"], "unknown GPU 'H9'"),
        (
            ["space", "--m", "8", "--n", "8", "--k", "8", "--dtype", "e5m2", "--topology", "H200x2-nvlink"],
            "unknown dtype 'e5m2'",
        ),
        (
            ["space", "--m", "0", "--n", "8", "--k", "8", "--topology", "H200x2-nvlink"],
            "M=0 must be positive",
        ),
        (
            ["space", "--m", "x", "--n", "8", "--k", "8", "--topology", "H200x2-nvlink"],
            "Invalid value for '--m'",
        ),
        (["validate", "configs/none.yaml"], "does not exist"),
        (["frobnicate"], "No such command 'frobnicate'"),
    ],
)
def test_bad_input_gives_one_line_and_exit_2(args, message, tmp_path):
    r = run(*args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert message in lines[0]
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize(
    "command", ["space", "validate", "tune", "lookup", "best", "export", "bench", "dashboard", "db"]
)
def test_every_command_has_help(command):
    r = run(command, "--help")
    assert r.returncode == 0, r.stderr
    assert "Usage" in r.stdout


def test_version():
    from syncopate import __version__

    r = run("--version")
    assert r.returncode == 0 and r.stdout == f"syncopate {__version__}\n", (r.stdout, r.stderr)


def test_a_shape_too_small_for_any_tile_says_so():
    r = run(
        "space",
        "--kind",
        "gemm_ar",
        "--m",
        "2",
        "--n",
        "2",
        "--k",
        "2",
        "--topology",
        "H200x2-nvlink",
        "--predict",
        "2",
    )
    assert r.returncode == 0, r.stderr
    out = " ".join(r.stdout.split())
    assert "no fused candidate; each rank's block has 1 row(s)" in out and "M must be at least 128" in out
    assert "only template 'unfused' (a matmul, then the whole all-reduce) runs" in out
    assert "1 valid candidates" in out and "nccl/unfused/s1 cuBLAS" in out


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "is empty: a sweep config is a mapping of fields (name, topology, workloads, strategy, …)"),
        ("- a\n- b\n", "a sweep config must be a mapping of fields, got a list of 2 items"),
        (
            "name: x\nworkloads:\n",
            "workloads: Input should be a valid list (got nothing: the field is empty)",
        ),
    ],
)
def test_a_config_error_names_what_was_given_in_words(text, message, tmp_path, capsys):
    """Not a Python type name (`got NoneType`) nor a Python value (`got None`): what the file holds."""
    from syncopate.cli import main

    path = tmp_path / "sweep.yaml"
    path.write_text(text)
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and "NoneType" not in err and "got None" not in err, err


def test_describe_names_values_not_types():
    from syncopate.errors import describe

    assert [describe(v) for v in (None, False, 3, 2.5, "abc", [1, 2], (1,), {"a": 1}, object())] == [
        "None",
        "False",
        "the number 3",
        "the number 2.5",
        "the text 'abc'",
        "a list of 2 items",
        "a list of 1 item",
        "a mapping",
        "an object",
    ]
    assert describe("x" * 100) == f"the text '{'x' * 37}...'"
