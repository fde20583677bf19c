"""Layer: CLI on the CPU. `syncopate bench` runs one process per GPU of one host, as many as the
suite's topology asks for (else `--gpus`, else every visible GPU); where the host has fewer it
fails before any work with one line that names the count needed and the count visible, exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from syncopate.cli.bench_cmds import bench_world_size
from syncopate.errors import ConfigError, RuntimeUnavailableError
from syncopate.search_space import Topology

REPO = Path(__file__).resolve().parents[1]


def bench(*args: str) -> subprocess.CompletedProcess:
    """`syncopate bench ARGS` in a process that sees no CUDA device."""
    return subprocess.run(
        [sys.executable, "-m", "syncopate", "bench", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )


@pytest.mark.parametrize("suite, need", [("configs/llama_tp4.yaml", 4), ("configs/llama_tp8.yaml", 8)])
def test_a_suite_without_its_gpus_fails_cleanly(suite, need):
    r = bench("--suite", suite)
    assert r.returncode == 1, (r.stdout, r.stderr)  # the machine lacks what it needs, not a bad value
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"suite {suite} needs {need} CUDA GPUs on this host" in lines[0]
    assert f"world size {need}); 0 visible" in lines[0]
    assert f"`syncopate tune {suite} --runner model`" in lines[0]


def test_gpus_that_contradict_the_suite_are_refused():
    r = bench("--suite", "configs/llama_tp8.yaml", "--gpus", "2")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "--gpus 2 contradicts suite configs/llama_tp8.yaml: its topology H200x8-nvswitch" in r.stderr
    assert "has world size 8; leave out --gpus" in r.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["ag_gemm", "--m", "8192", "--suite", "configs/llama_tp2.yaml"],
            "KIND, --m and --suite exclude each other",
        ),
        (["--dtype", "fp16", "--suite", "configs/llama_tp2.yaml"], "--dtype and --suite exclude each other"),
        (
            ["ag_gemm", "--m", "8192", "--n", "8192", "--k", "8192", "--kinds", "gemm_rs"],
            "--kinds narrows a suite",
        ),
        (["--suite", "configs/quickstart.yaml", "--kinds", "gemm_ar"], "has no workload of kind gemm_ar"),
        (["ag_gemm", "--m", "8192"], "give KIND with --m, --n and --k, or --suite CONFIG"),
    ],
)
def test_options_that_contradict_each_other_are_refused(args, message):
    r = bench(*args)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert message in r.stderr


@pytest.mark.parametrize(
    "where, message",
    [
        ("{tmp}", "cannot write {tmp}: it is a directory"),
        ("{tmp}/no/bench.json", "cannot write {tmp}/no/bench.json: folder {tmp}/no does not exist"),
    ],
)
def test_a_json_file_that_cannot_be_written_is_refused_before_the_gpus(tmp_path, where, message):
    r = bench("ag_gemm", "--m", "8192", "--n", "8192", "--k", "8192", "--json", where.format(tmp=tmp_path))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert message.format(tmp=tmp_path) in r.stderr
    assert list(tmp_path.iterdir()) == []


TP8 = Topology.from_key("H200x8-nvswitch")


def test_the_suites_topology_decides_the_world_size():
    assert bench_world_size(TP8, None, 8) == 8
    assert bench_world_size(TP8, 8, 16) == 8, "a host with more GPUs runs the suite on as many as it asks"
    assert bench_world_size(Topology.from_key("H200x4-nvswitch"), None, 8) == 4
    with pytest.raises(RuntimeUnavailableError, match=r"needs 8 CUDA GPUs .*; 2 visible"):
        bench_world_size(TP8, None, 2, Path("configs/llama_tp8.yaml"))
    with pytest.raises(ConfigError, match="2 nodes"):
        bench_world_size(Topology.from_key("H200x16-nvswitch-2n"), None, 16)


def test_without_a_topology_gpus_or_every_visible_gpu():
    assert bench_world_size(None, None, 4) == 4
    assert bench_world_size(None, 2, 4) == 2
    with pytest.raises(RuntimeUnavailableError, match="needs at least 2 CUDA GPUs on this host; 1 visible"):
        bench_world_size(None, None, 1)
    with pytest.raises(RuntimeUnavailableError, match="--gpus 8 needs 8 CUDA GPUs on this host; 4 visible"):
        bench_world_size(None, 8, 4)
    with pytest.raises(ConfigError, match="--gpus 1: syncopate bench needs at least 2 GPUs"):
        bench_world_size(None, 1, 4)


@pytest.mark.parametrize(
    "kind, topology, splits",
    [
        ("ag_gemm", "H200x2-nvlink", {2, 4}),
        ("ag_gemm", "H200x4-nvswitch", {1, 2, 4}),
        ("ag_gemm", "H200x8-nvswitch", {1, 2, 4}),
        ("gemm_rs", "H200x4-nvswitch", {2, 4}),
        ("gemm_ar", "H200x8-nvswitch", {2, 4}),
    ],
)
def test_the_tiny_grid_tries_one_chunk_a_rank_for_all_gathers_on_four_ranks_and_more(kind, topology, splits):
    from syncopate.search_space import Workload, bench_grid, guard_candidates

    workload, topo = Workload(kind=kind, shape=(8192, 8192, 8192)), Topology.from_key(topology)
    grid = bench_grid(workload, topo, "tiny", ("copy_engine", "sm_copy", "nccl"))
    guards = list(guard_candidates(workload, topo).values())
    assert grid[: len(guards)] == guards and len(guards) == 2  # the default and unfused, measured first
    fused = [c for c in grid[len(guards) :] if c.template in ("direct", "ring", "bidirectional_ring")]
    assert {c.num_splits for c in fused} == splits
    assert {c.backend for c in fused} == {"copy_engine", "sm_copy", "nccl"}


@pytest.mark.parametrize(
    "topology, splits",
    [
        ("H200x2-nvlink", {1, 2, 4}),
        ("H200x4-nvswitch", {1, 2, 3, 6}),
        ("H200x8-nvswitch", {1, 2, 4, 7, 14}),
    ],
)
def test_the_tiny_grid_gathers_in_one_gemm_a_group_of_shards_or_a_part_of_each(topology, splits):
    """The decomposed all-gather: its splits the template takes on that many ranks, one GEMM over
    every peer's rows (1) up to one a part of each shard (2 x (ws - 1)), never for a reduction."""
    from syncopate.search_space import DECOMPOSED, Workload, bench_grid

    topo = Topology.from_key(topology)
    grid = bench_grid(Workload(kind="ag_gemm", shape=(8192, 8192, 8192)), topo, "tiny", ("copy_engine",))
    assert {c.num_splits for c in grid if c.template == DECOMPOSED} == splits
    reductions = bench_grid(
        Workload(kind="gemm_rs", shape=(8192, 8192, 8192)), topo, "tiny", ("copy_engine",)
    )
    assert {c.num_splits for c in reductions if c.template == DECOMPOSED} == {2, 4, 8}


def test_a_models_decoder_layer_gives_the_workloads_tune_derives():
    """`syncopate bench --model NAME --tp N --tokens T` benchmarks the ops `syncopate tune --model`
    derives (each distinct once), in the given dtype; on a host without N GPUs it stops before any
    work, saying how many it needs; a contradicting KIND/--suite or a missing --tp is refused."""
    from syncopate.cli.bench_cmds import model_workloads
    from syncopate.cli.tune_model_cmds import model_sweep
    from syncopate.models import model_spec

    got = model_workloads("llama-3-8b", 4, 8192, True, None)
    _, calls = model_sweep(model_spec("llama-3-8b"), 4, 8192, topology="detect", runner="gpu")
    assert got == list(dict.fromkeys(c.workload for c in calls)) and len(got) == 8
    assert {(w.kind, w.shape.m, w.shape.n, w.shape.k) for w in got} >= {
        ("ag_gemm", 8192, 28672, 4096),
        ("gemm_rs", 8192, 4096, 14336),
    }
    assert {w.dtype for w in model_workloads("llama-3-8b", 2, 4096, True, "fp8")} == {"fp8"}
    r = bench("--model", "llama-3-8b", "--tp", "4", "--tokens", "8192")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "syncopate bench --model llama-3-8b --tp 4 needs 4 CUDA GPUs on this host; 0 visible" in r.stderr
    assert "--runner model" in r.stderr
    for args, message in (
        (["--model", "llama-3-8b", "--tokens", "8192"], "give --tp N"),
        (
            ["--model", "llama-3-8b", "--tp", "2", "--suite", "configs/llama_tp2.yaml"],
            "--suite and --model exclude",
        ),
        (["--model", "llama-3-8b", "--tp", "3"], "not divisible by tp=3"),
        (["--model", "llama-3-8b", "--tp", "2", "--gpus", "4"], "--gpus 4 contradicts --tp 2"),
    ):
        r = bench(*args)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)
        assert message in r.stderr, (args, r.stderr)


@pytest.mark.parametrize(
    "kind, shape, narrow",
    [
        ("ag_gemm", (2048, 14336, 4096), True),  # 16 x 14 tiles of 128x256 a rank: under two waves of 132 SMs
        ("ag_gemm", (2048, 28672, 4096), False),  # 16 x 28
        ("gemm_rs", (2048, 4096, 14336), True),  # 16 x 16 partial tiles
        ("gemm_rs", (8192, 4096, 14336), False),  # 64 x 16
    ],
)
def test_the_tiny_grid_tries_the_narrower_tile_where_the_wide_one_leaves_sms_idle(kind, shape, narrow):
    from syncopate.search_space import Workload, bench_grid

    grid = bench_grid(
        Workload(kind=kind, shape=shape), Topology.from_key("H200x4-nvswitch"), "tiny", ("copy_engine",)
    )
    tiles = {(c.block_m, c.block_n) for c in grid if c.template in ("direct", "ring")}
    assert tiles == ({(128, 256), (128, 128)} if narrow else {(128, 256)})
