"""Layer: pure CPU, and gloo process groups. The `unfused` template: the matmul and the group's whole
collective in sequence, a candidate of the space like the fused ones, so that tuning measures it
beside them and `lookup` serves it where it measured fastest."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from support.gloo import run_gloo

from syncopate.autotuner.strategies import SearchProblem, make_strategy
from syncopate.cost_model.calibration_defaults import default_calibration
from syncopate.cost_model.model import CostModel
from syncopate.errors import ConfigError
from syncopate.search_space import (
    UNFUSED,
    Candidate,
    SpaceOptions,
    Topology,
    Workload,
    check_candidate,
    check_liveness,
    space,
    unfused_candidate,
)

TOPO = Topology.from_key("H200x2-nvlink")
KINDS = ("ag_gemm", "gemm_rs", "gemm_ar")


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_takes_it_and_the_space_has_it_once(kind):
    w = Workload(kind=kind, shape=(8192, 4096, 4096))
    c = unfused_candidate()
    check_candidate(c, w, TOPO)
    cands = space(w, TOPO)
    assert [x for x in cands if x.template == UNFUSED] == [c]
    fused_only = SpaceOptions(templates=("direct", "ring", "bidirectional_ring"))
    assert all(x.template != UNFUSED for x in space(w, TOPO, fused_only))
    assert c.short() == "nccl/unfused/s1 cuBLAS"
    assert Candidate.from_json(c.to_json()) == c


def test_its_fields_are_fixed():
    with pytest.raises(
        ConfigError,
        match=r"template unfused runs the group's collective after the matmul: it takes "
        r"backend 'nccl' with comm_sms=0, got 'copy_engine' with comm_sms=0",
    ):
        Candidate(backend="copy_engine", template=UNFUSED)
    with pytest.raises(ConfigError, match=r"got 'nccl' with comm_sms=64"):
        Candidate(backend="nccl", template=UNFUSED, comm_sms=64)
    w = Workload(kind="gemm_rs", shape=(8192, 4096, 4096))
    with pytest.raises(
        ConfigError, match=r"template unfused runs cuBLAS GEMMs: its fields keep .*; got num_splits=4"
    ):
        check_candidate(unfused_candidate().replace(num_splits=4), w, TOPO)


def test_a_block_shorter_than_every_tile_is_tuned_unfused():
    w = Workload(kind="gemm_ar", shape=(64, 4096, 4096))  # 32 rows a rank
    assert space(w, TOPO) == [unfused_candidate()]
    strategy = make_strategy("grid", SearchProblem(workload=w, topology=TOPO), max_trials=4, seed=0)
    assert strategy.ask(4) == [unfused_candidate()]


@pytest.mark.parametrize("kind", KINDS)
def test_the_model_predicts_it_as_the_matmul_then_the_collective(kind):
    model = CostModel(default_calibration(TOPO))
    w = Workload(kind=kind, shape=(4096, 8192, 8192))
    p = model.predict(w, TOPO, unfused_candidate())
    base = model.baselines(w, TOPO)
    assert p.feasible and p.time_us == pytest.approx(base["torch_seq"])
    assert p.kernel_us == pytest.approx(base["gemm_alone"])
    best = model.rank(w, TOPO, space(w, TOPO))[0]
    assert best.candidate.template != UNFUSED and best.time_us < p.time_us, "overlap pays at this size"


def test_liveness_has_nothing_to_wait_for():
    for kind in KINDS:
        assert check_liveness(kind, unfused_candidate(), 4, 4096, 1024, 132).live


def _worker(rank, ws, init, q):
    from syncopate.kernels.library import unfused
    from syncopate.measure.reference import reference

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=ws)
    try:
        g = dist.group.WORLD
        gen = torch.Generator().manual_seed(11 + rank)
        a = torch.randn(6, 5, generator=gen, dtype=torch.float64)
        b = torch.randn(5, 4, generator=gen, dtype=torch.float64)
        got = {}
        for kind, rows in (("ag_gemm", 6 * ws), ("gemm_rs", 6 // ws), ("gemm_ar", 6)):
            out = torch.full((rows, 4), float("nan"), dtype=torch.float64)
            y = unfused(kind, a, b, g, out=out)
            got[kind] = (
                y.data_ptr() == out.data_ptr(),
                (out - reference(kind, a, b, g).double()).abs().max().item(),
            )
        y, full = unfused("ag_gemm", a, b, g, gathered=True)
        got["gathered"] = (
            True,
            (y - full @ b).abs().max().item() + (full[rank * 6 : (rank + 1) * 6] - a).abs().max().item(),
        )
        q.put((rank, got))
    finally:
        dist.destroy_process_group()


def test_the_unfused_path_writes_into_out_on_three_ranks():
    for rank, got in run_gloo(_worker, 3, timeout=120):
        for kind, (in_place, err) in got.items():
            assert in_place, f"rank {rank} {kind}: the result is not the out= tensor"
            assert err < 1e-4, f"rank {rank} {kind}: off the float32 reference by {err}"
