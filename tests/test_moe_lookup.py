"""Layer: pure CPU, SQLite files, and gloo ranks on the CPU. `syncopate.moe.lookup_moe` down its
ladder (exact, nearest tokens, other environment, other topology, the cost model's pick, the
unfused default), from a database and from an export file; `syncopate lookup --kind a2a_gemm`; and `MoELayer` without a
config picking the looked-up plan where SYNCOPATE_DB is set."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch.distributed as dist
from db_data import ENV, OTHER_ENV, OTHER_TOPO, TOPO
from support.gloo import run_gloo

from syncopate.cli import main
from syncopate.errors import ConfigError
from syncopate.records import TrialRecord
from syncopate.results_db import ResultsDB
from syncopate.results_db.lookups import clear_cache
from syncopate.search_space import MoeWorkload, RoutingSpec, Topology
from syncopate.search_space.moe_workload import MoeCandidate

MW = MoeWorkload(kind="a2a_gemm", tokens=16, hidden=64, ffn=32, experts=8, top_k=2)
PIPELINED = MoeCandidate(template="pipelined", chunks_per_source=2)
H100X2 = Topology.from_key("H100x2-nvlink")


@pytest.fixture(autouse=True)
def fresh():
    clear_cache()
    yield
    clear_cache()


def record(candidate, us, *, workload=MW, topology=TOPO, environment=ENV, source="measured"):
    return TrialRecord(
        workload=workload,
        topology=topology,
        environment=environment,
        candidate=candidate,
        status="ok",
        source=source,
        median_us=us,
        eager_us=us,
    )


def stored(tmp_path, *records, name="results.db"):
    url = f"sqlite:///{tmp_path / name}"
    with ResultsDB.open(url, upgrade=True) as db:
        sweep = db.start_sweep("s", {"name": "s"})
        db.record_trials(sweep, list(records))
    return url


def lookup(url, workload=MW, topology=TOPO, **kw):
    from syncopate.moe import lookup_moe

    return lookup_moe(workload, topology, db=url.removeprefix("sqlite:///"), environment=ENV, **kw)


def test_exact_serves_the_fastest_measured_configuration(tmp_path):
    url = stored(tmp_path, record(MoeCandidate(), 20.0), record(PIPELINED, 10.0))
    r = lookup(url)
    assert (r.match, r.candidate, r.time_us, r.guard) == ("exact", PIPELINED, 10.0, "")
    assert r.measured_on == MW and "measured: trial" in r.reason


def test_unfused_is_served_where_it_is_faster_than_every_tuned_candidate(tmp_path):
    url = stored(tmp_path, record(MoeCandidate(), 8.0), record(PIPELINED, 10.0))
    r = lookup(url)
    assert (r.match, r.candidate, r.guard) == ("exact", MoeCandidate(), "unfused")


def test_fixture_trials_are_never_served(tmp_path):
    url = stored(tmp_path, record(PIPELINED, 10.0, source="fixture"))
    r = lookup(url)
    assert (r.match, r.candidate, r.trial_id) == ("cost_model", MoeCandidate(), None)


def test_nearest_tokens_with_the_same_experts_and_routing_distribution(tmp_path):
    near = dataclasses.replace(MW, tokens=32, routing=RoutingSpec(seed=5))
    far = dataclasses.replace(MW, tokens=256)
    skewed = dataclasses.replace(MW, routing=RoutingSpec(distribution="skewed"))
    wider = dataclasses.replace(MW, hidden=128)
    url = stored(
        tmp_path,
        record(PIPELINED, 10.0, workload=near),
        record(MoeCandidate(), 1.0, workload=far),
        record(MoeCandidate(), 1.0, workload=skewed),
        record(MoeCandidate(), 1.0, workload=wider),
    )
    r = lookup(url)
    assert (r.match, r.candidate, r.measured_on) == ("nearest_tokens", PIPELINED, near)


def test_other_environment_then_other_topology_then_the_cost_model(tmp_path):
    url = stored(tmp_path, record(PIPELINED, 10.0, environment=OTHER_ENV))
    r = lookup(url)
    assert (r.match, r.candidate, r.environment) == ("other_environment", PIPELINED, OTHER_ENV)
    clear_cache()
    url = stored(tmp_path, record(PIPELINED, 10.0, topology=H100X2), name="other.db")
    r = lookup(url)
    assert (r.match, r.candidate, r.measured_topology) == ("other_topology", PIPELINED, H100X2)
    clear_cache()
    url = stored(tmp_path, record(PIPELINED, 10.0, topology=OTHER_TOPO), name="eight.db")
    r = lookup(url)  # 8 GPUs measured, 2 asked: no stand-in
    assert (r.match, r.candidate, r.trial_id) == ("cost_model", MoeCandidate(), None)
    assert "MoE cost model's pick" in r.reason and r.predicted_us > 0
    assert r.to_dict()["predicted_us"] == r.predicted_us


QWEN3 = MoeWorkload(kind="gemm_a2a", tokens=4096, hidden=2048, ffn=768, experts=128, top_k=8)


def test_the_cost_model_serves_a_plan_only_from_a_calibration_measured_on_the_topology(tmp_path):
    """With nothing measured for the workload, the MoE cost model answers; from the default
    calibration's leads it serves unfused and says what it would pick, from the same figures stored
    as a measured calibration of the topology its pick (a plan, for Qwen3-30B-A3B's combine on the
    device) is served."""
    from syncopate.cost_model.calibration_defaults import default_calibration

    path = tmp_path / "cal.db"
    with ResultsDB.open(path, upgrade=True):
        pass
    url = f"sqlite:///{path}"
    leads = lookup(url, workload=QWEN3, mode="graph")
    assert (leads.match, leads.candidate, leads.objective) == (
        "cost_model",
        MoeCandidate(),
        "device (predicted)",
    )
    assert "is not measured on this topology" in leads.reason and " would be " in leads.reason
    with ResultsDB.open(path) as db:
        for r in default_calibration(TOPO).records(TOPO, ENV):
            db.record_calibration(r)
    clear_cache()
    measured = lookup(url, workload=QWEN3, mode="graph")
    assert measured.match == "cost_model" and measured.candidate.template != "unfused"
    assert " would be " not in measured.reason and "measured calibration" in measured.reason
    assert measured.predicted_us < leads.predicted_us


def test_the_default_answers_where_the_cost_model_ranks_nothing(tmp_path, monkeypatch):
    from syncopate.cost_model import moe

    monkeypatch.setattr(moe.MoeCostModel, "rank", lambda *a, **k: [])
    url = stored(tmp_path, record(PIPELINED, 10.0, topology=OTHER_TOPO))
    r = lookup(url)
    assert (r.match, r.candidate, r.trial_id) == ("default", MoeCandidate(), None)
    assert "same kind, expert shapes and routing distribution are stored" in r.reason
    assert "the cost model ranks" in r.reason


def test_an_export_file_answers_as_the_database_does(tmp_path):
    url = stored(tmp_path, record(MoeCandidate(), 20.0), record(PIPELINED, 10.0))
    path = tmp_path / "best.json"
    with ResultsDB.open(url) as db:
        db.export_best(path)
    from syncopate.moe import lookup_moe

    r = lookup_moe(MW, TOPO, db=path, environment=ENV)
    assert (r.match, r.candidate) == ("exact", PIPELINED)


def test_bad_arguments_are_refused_before_any_database_is_read(tmp_path):
    from syncopate.moe import lookup_moe

    with pytest.raises(ConfigError, match="takes a MoeWorkload"):
        lookup_moe((1, 2, 3), TOPO, db=tmp_path / "none.db")
    with pytest.raises(ConfigError, match="not divisible by world size 3"):
        lookup_moe(dataclasses.replace(MW, experts=8), Topology(world_size=3, gpu_model="H200"), db="x.db")


def test_the_cli_looks_up_a_moe_workload(tmp_path, capsys):
    url = stored(tmp_path, record(PIPELINED, 10.0))
    args = [
        "lookup",
        "--kind",
        "a2a_gemm",
        "--tokens",
        "16",
        "--hidden",
        "64",
        "--ffn",
        "32",
        "--experts",
        "8",
    ]
    args += ["--top-k", "2", "--topology", TOPO.key(), "--db", url, "--json"]
    code = main(args)
    out, err = capsys.readouterr()
    assert code == 0, err
    doc = json.loads(out)
    assert doc["candidate"] == PIPELINED.to_dict() and doc["match"] in ("exact", "other_environment")
    code = main(["lookup", "--kind", "a2a_gemm", "--tokens", "16", "--topology", TOPO.key(), "--db", url])
    out, err = capsys.readouterr()
    assert code == 2 and "--hidden" in err


def _layer_worker(rank, ws, init, q):
    import torch

    from syncopate.moe import MoELayer

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=ws)
    try:
        layer = MoELayer(
            hidden=64,
            ffn=32,
            experts=8,
            top_k=2,
            group=dist.group.WORLD,
            dtype=torch.float32,
            topology="H200x2-nvlink",
        )
        torch.manual_seed(rank)
        out = layer(torch.randn(16, 64))
        plain = MoELayer(
            hidden=64,
            ffn=32,
            experts=8,
            top_k=2,
            group=dist.group.WORLD,
            dtype=torch.float32,
            config=MoeCandidate(),
        )
        q.put(
            (rank, layer.tuned, [r.candidate.to_dict() for r in layer.lookups[16]], plain.tuned, out.shape[0])
        )
    finally:
        dist.destroy_process_group()


def test_moelayer_without_a_config_runs_the_looked_up_plan(tmp_path, monkeypatch):
    fp32 = dataclasses.replace(MW, dtype="fp32")
    combine = dataclasses.replace(fp32, kind="gemm_a2a")
    url = stored(
        tmp_path,
        record(MoeCandidate(), 20.0, workload=fp32),
        record(PIPELINED, 10.0, workload=fp32),
        record(MoeCandidate(), 5.0, workload=combine),
    )
    monkeypatch.setenv("SYNCOPATE_DB", url)
    got = sorted(run_gloo(_layer_worker, 2))
    for _rank, tuned, plans, plain_tuned, rows in got:
        assert tuned and not plain_tuned and rows == 16
        assert plans == [PIPELINED.to_dict(), MoeCandidate().to_dict()]


def _checking_worker(rank, ws, init, q):
    """A tuned layer's calls, forward and backward (forward alone with SLOW_NO_GRAD): each call's
    dispatch plan seen, and the layer's choice. The dispatch sleeps where SLOW_<rank> names its
    plan ("plan" or "unfused"), so that the ranks disagree and the slowest rank's figures decide."""
    import os
    import time

    import torch

    import syncopate.moe.layer as layer_module
    from syncopate.moe import MoELayer

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=ws)
    try:
        slow = os.environ.get(f"SLOW_{rank}", "")
        seen = []
        dispatch = layer_module.dispatch_gemm

        def timed_dispatch(*args, config=None, **kw):
            seen.append("unfused" if config is None else config.template)
            if slow == seen[-1] or (slow == "plan" and config is not None):
                time.sleep(0.05)
            return dispatch(*args, config=config, **kw)

        layer_module.dispatch_gemm = timed_dispatch
        layer = MoELayer(
            hidden=64, ffn=32, experts=8, top_k=2, group=dist.group.WORLD, dtype=torch.float32, topology=TOPO
        )
        torch.manual_seed(rank)
        x = torch.randn(16, 64, requires_grad=True)
        calls = 2 * (layer_module.CHECK_WARMUP + layer_module.CHECK_SAMPLES) + 3
        for _ in range(calls):
            if os.environ.get("SLOW_NO_GRAD"):
                with torch.no_grad():
                    layer(x)
            else:
                layer(x).sum().backward()
        q.put((rank, seen, layer.choices))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize(
    ("slow", "no_grad", "kept"),
    [
        ({"SLOW_0": "unfused", "SLOW_1": ""}, False, "plans"),
        ({"SLOW_0": "", "SLOW_1": "plan"}, False, "unfused"),
        ({"SLOW_0": "plan", "SLOW_1": ""}, True, "unfused"),
    ],
)
def test_a_tuned_moelayer_keeps_the_faster_of_its_looked_up_plans_and_unfused(
    tmp_path, monkeypatch, slow, no_grad, kept
):
    """The looked-up pipelined dispatch against unfused on the layer's first calls, alternating;
    one rank slow on one of them decides for both (the slowest rank's medians), and every later call
    runs the kept plan. Without backwards the forwards decide."""
    from syncopate.moe.layer import CHECK_SAMPLES, CHECK_WARMUP

    fp32 = dataclasses.replace(MW, dtype="fp32")
    url = stored(
        tmp_path,
        record(MoeCandidate(), 20.0, workload=fp32),
        record(PIPELINED, 10.0, workload=fp32),
        record(MoeCandidate(), 5.0, workload=dataclasses.replace(fp32, kind="gemm_a2a")),
    )
    monkeypatch.setenv("SYNCOPATE_DB", url)
    for name, value in slow.items():
        monkeypatch.setenv(name, value)
    if no_grad:
        monkeypatch.setenv("SLOW_NO_GRAD", "1")
    got = sorted(run_gloo(_checking_worker, 2))
    sampling = 2 * (CHECK_WARMUP + CHECK_SAMPLES)
    later = "pipelined" if kept == "plans" else "unfused"
    for _rank, seen, choices in got:
        assert seen[:sampling] == ["pipelined", "unfused"] * (CHECK_WARMUP + CHECK_SAMPLES)
        assert seen[sampling:] == [later] * (len(seen) - sampling)
        assert choices[16]["kept"] == kept
        assert choices[16]["timed"] == ("forward" if no_grad else "forward + backward")
    assert got[0][2] == got[1][2]  # the same figures on both ranks: the all-reduced ones
