"""Layer: pure CPU (the interpreter for the kernels). A fused candidate's kernel code is a tuned field:
`kernel` is `triton` or `gluon`; a Triton candidate keeps the key it had before the field existed;
the space and the bench grids offer the Gluon twin of a fused candidate only where the Gluon kernels
run it (Hopper, 16-bit operands, a tile they take); where a process cannot run them, a `gluon`
candidate computes the same tiles in the Triton kernels, and the tuner's harness refuses to time it
under that name."""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest
import torch

from syncopate.autotuner.optuna_strategies import candidate_params
from syncopate.autotuner.sweep import SpaceEntry
from syncopate.errors import ConfigError
from syncopate.kernels import launch
from syncopate.search_space import (
    KERNELS,
    Candidate,
    SpaceOptions,
    Topology,
    Workload,
    bench_grid,
    check_candidate,
    gluon_refusal,
    space,
)

H200x2 = Topology.from_key("H200x2-nvlink")
A100x2 = Topology.from_key("A100x2-nvlink")
RS = Workload(kind="gemm_rs", shape=(8192, 4096, 4096))
AG = Workload(kind="ag_gemm", shape=(8192, 4096, 4096))
FUSED = dict(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3, num_splits=2)


def test_a_triton_candidate_keeps_its_key_and_json():
    c = Candidate(**FUSED)
    assert c.kernel == "triton"
    assert "kernel" not in c.to_dict() and "kernel" not in c.to_json()
    assert Candidate.from_dict(c.to_dict()) == c
    assert Candidate.from_dict({**c.to_dict(), "kernel": "triton"}).key() == c.key()


def test_a_gluon_candidate_round_trips_and_differs_from_its_twin():
    g = Candidate(**FUSED, kernel="gluon")
    assert g.to_dict()["kernel"] == "gluon"
    assert Candidate.from_json(g.to_json()) == g
    assert g.key() != g.replace(kernel="triton").key()
    assert g.short().endswith(" gluon")


@pytest.mark.parametrize(
    "fields, words",
    [
        (dict(kernel="cuda"), ["unknown kernel 'cuda'", "triton, gluon"]),
        (dict(kernel="gluon", template="unfused", backend="nccl"), ["runs cuBLAS", "'triton'"]),
        (dict(kernel="gluon", template="decomposed"), ["runs cuBLAS"]),
        (dict(kernel="gluon", block_m=32, num_warps=4), ["64, 128 or 256 rows", "block_m=32"]),
        (dict(kernel="gluon", block_m=64, num_warps=8), ["at least 16 rows", "num_warps=8"]),
        (dict(kernel="gluon", num_stages=1), ["2 stages or more", "num_stages=1"]),
    ],
)
def test_a_candidate_refuses_a_kernel_it_cannot_run(fields, words):
    with pytest.raises(ConfigError) as e:
        Candidate(**{**FUSED, **fields})
    for w in words:
        assert w in str(e.value)


def test_the_space_offers_the_gluon_twin_of_each_fused_candidate_on_hopper_only():
    on_hopper = space(RS, H200x2)
    cublas = {"unfused", "c_stationary", "decomposed", "a_stationary"}
    fused = [c for c in on_hopper if c.kernel == "triton" and c.template not in cublas]
    fits = {c for c in fused if gluon_refusal(c, RS, H200x2) is None}
    assert fits == set(fused)  # every default tile config
    assert {c.replace(kernel="triton") for c in on_hopper if c.kernel == "gluon"} == fits
    assert not [c for c in space(RS, A100x2) if c.kernel == "gluon"]
    fp32 = Workload(kind="gemm_rs", shape=(8192, 4096, 4096), dtype="fp32")
    assert not [c for c in space(fp32, H200x2) if c.kernel == "gluon"]
    only_triton = space(RS, H200x2, SpaceOptions(kernels=("triton",)))
    assert {c.key() for c in only_triton} == {c.key() for c in on_hopper if c.kernel == "triton"}
    only_gluon = space(RS, H200x2, SpaceOptions(kernels=("gluon",)))
    assert {c for c in only_gluon if c.template not in cublas} == {c.replace(kernel="gluon") for c in fits}


def test_check_candidate_says_why_gluon_does_not_fit():
    g = Candidate(**FUSED, kernel="gluon")
    check_candidate(g, RS, H200x2)
    with pytest.raises(ConfigError, match="Hopper GPUs .*not on A100.*kernel 'triton' runs everywhere"):
        check_candidate(g.replace(block_n=128), RS, A100x2)
    small = g.replace(block_m=64, block_n=64, num_warps=4, num_stages=2)
    with pytest.raises(ConfigError, match="bf16, fp16 and fp8 operands, not fp32"):
        check_candidate(small, Workload(kind="gemm_rs", shape=(8192, 4096, 4096), dtype="fp32"), H200x2)
    fp8 = g.replace(block_k=128)
    for kind in ("gemm_rs", "gemm_ar"):  # the reductions' Gluon kernel takes FP8 tiles
        check_candidate(fp8, Workload(kind=kind, shape=(8192, 4096, 4096), dtype="fp8"), H200x2)
    with pytest.raises(ConfigError, match="Gluon all-gather kernel takes bf16 and fp16 operands, not fp8"):
        check_candidate(fp8, Workload(kind="ag_gemm", shape=(8192, 4096, 4096), dtype="fp8"), H200x2)
    short = Workload(kind="ag_gemm", shape=(8192, 4096, 64))
    with pytest.raises(ConfigError, match="K=64 is shorter"):
        check_candidate(Candidate(**FUSED, kernel="gluon"), short, H200x2)


def test_space_kernels_are_checked_and_read_from_a_sweep_config():
    with pytest.raises(ConfigError, match="space.kernels"):
        SpaceOptions(kernels=("cuda",))
    with pytest.raises(ConfigError, match="space.kernels"):
        SpaceOptions(kernels=())
    assert SpaceEntry(kernels=["triton"]).options().kernels == ("triton",)
    assert SpaceOptions().kernels == KERNELS


def test_the_bench_grid_measures_each_fused_candidate_in_both_kernels_on_hopper():
    grid = bench_grid(AG, H200x2, "tiny", ["copy_engine"])
    gluon = [c for c in grid if c.kernel == "gluon"]
    assert gluon and all(c.replace(kernel="triton") in grid for c in gluon)
    assert not [c for c in bench_grid(AG, A100x2, "tiny", ["copy_engine"]) if c.kernel == "gluon"]


def test_optuna_draws_the_kernel_as_a_parameter():
    assert candidate_params(Candidate(**FUSED, kernel="gluon"))["kernel"] == "gluon"
    assert candidate_params(Candidate(**FUSED))["kernel"] == "triton"


def test_a_gluon_candidate_asks_for_the_gluon_kernels_but_the_interpreter_runs_triton(monkeypatch):
    monkeypatch.delenv("SYNCOPATE_GLUON", raising=False)
    g = Candidate(**{**FUSED, "block_m": 64, "block_n": 64, "num_warps": 4}, kernel="gluon")
    assert launch.gluon_asked(g) and not launch.gluon_asked(g.replace(kernel="triton"))
    monkeypatch.setenv("SYNCOPATE_GLUON", "1")
    assert launch.gluon_asked(g.replace(kernel="triton"))
    a = torch.zeros(128, 128, dtype=torch.float16)
    assert not launch.gluon_runs_here(a)  # CPU tensors, the interpreter
    assert not launch._gluon_fits(g, 128, a)


def test_a_gluon_consumer_computes_its_tiles_on_the_interpreter():
    """The Triton kernels stand in for the Gluon ones where these cannot run: same tables, same rows."""
    from test_kernels_interpreter import run_consumer

    c = Candidate(
        block_m=64, block_n=32, block_k=32, group_m=2, num_warps=4, num_stages=2, num_splits=1, kernel="gluon"
    )
    for rank in range(2):
        out, ref, err = run_consumer(2, rank, 256, 64, 64, c, seed=rank)
        assert err == 0 and torch.isfinite(out).all()
        assert torch.allclose(out.float(), ref, rtol=2e-2, atol=2e-2)


def test_the_harness_refuses_to_time_a_gluon_candidate_where_gluon_cannot_run(monkeypatch):
    from syncopate.measure.harness import Harness

    monkeypatch.setattr(launch, "interpreting", lambda: False)
    monkeypatch.setattr(launch, "gluon_runs_here", lambda a: False)
    fake = type("H", (), {"a": torch.zeros(1)})()
    with pytest.raises(ConfigError, match="kernel 'gluon' needs triton's Gluon Hopper API"):
        Harness._check_kernel(fake, Candidate(**FUSED, kernel="gluon"))
    Harness._check_kernel(fake, Candidate(**FUSED))  # a Triton candidate runs anywhere
