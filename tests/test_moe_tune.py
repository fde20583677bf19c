"""Layer: pure CPU, gloo ranks on the CPU, and Ray on the CPU. MoE layers in `syncopate tune`: the
config's `moe:` section and its refusals; the MoE harness on 2 gloo ranks (baselines, candidates
checked against the group reference, copy_engine refused on the CPU); and the sweep loop in this
process (LocalExecutor) on a 1-rank gloo group, its trials and baselines stored
(test_moe_tune_ray.py runs it on Ray gangs)."""

from __future__ import annotations

import io
import os
import sqlite3
import tempfile
from types import SimpleNamespace

import pytest
import torch.distributed as dist
import yaml
from rich.console import Console
from support.gloo import run_gloo

from syncopate.autotuner.sweep import parse_sweep
from syncopate.autotuner.tune import TuneOptions, run_tune
from syncopate.errors import ConfigError
from syncopate.search_space import MoeWorkload, RoutingSpec, Topology, guard_candidates
from syncopate.search_space.moe_workload import MoeCandidate, moe_space

LAYER = {"hidden": 64, "ffn": 32, "experts": 8, "top_k": 2}
TOPO = "H200x2-nvlink"


def config(**entry):
    return {"name": "moe", "topology": TOPO, "moe": [{**LAYER, "tokens": [16], **entry}]}


# -- the config ---------------------------------------------------------------------------------


def test_a_moe_entry_expands_over_kinds_tokens_and_routings():
    sweep = parse_sweep(
        config(tokens=[16, 32], routings=[{"distribution": "uniform"}, {"distribution": "skewed", "skew": 2}])
    )
    assert len(sweep.workloads) == 2 * 2 * 2
    assert {w.kind for w in sweep.workloads} == {"a2a_gemm", "gemm_a2a"}
    assert all(isinstance(w, MoeWorkload) for w in sweep.workloads)
    assert sweep.moe_space[sweep.workloads[0].key()] == (("nccl", "copy_engine"), (1, 2, 4))


def test_the_models_of_configs_moe_ep_are_taken_as_they_are_written():
    with open("configs/moe_ep.yaml") as f:
        models = yaml.safe_load(f)["models"]
    sweep = parse_sweep(
        {
            "name": "m",
            "topology": "H200x4-nvswitch",
            "moe": [{"models": models, "tokens": [4096], "kinds": ["a2a_gemm"]}],
        }
    )
    assert [(w.hidden, w.experts) for w in sweep.workloads] == [(2048, 128), (7168, 32)]


def test_dense_and_moe_workloads_sit_in_one_config():
    data = config()
    data["workloads"] = [{"kind": "ag_gemm", "shapes": [[4096, 4096, 4096]]}]
    sweep = parse_sweep(data)
    assert [w.kind for w in sweep.workloads] == ["ag_gemm", "a2a_gemm", "gemm_a2a"]


@pytest.mark.parametrize(
    "entry, message",
    [
        ({"kinds": ["ag_gemm"]}, "moe.0.kinds: kind 'ag_gemm' is not a MoE kind"),
        ({"top_k": None}, "moe.0: lacks top_k"),
        ({"experts": 7}, "experts=7 is not divisible by world size 2"),
        ({"top_k": 9}, "top_k=9 is more than experts=8"),
        ({"tokens": [0]}, "moe.0: tokens=0 must be positive"),
        ({"tokens": []}, "tokens is empty"),
        ({"routings": [{"distribution": "zipf"}]}, "unknown routing distribution 'zipf'"),
        ({"routings": [{"distribution": "uniform", "sed": 1}]}, "routing has unknown key(s) ['sed']"),
        ({"chunks": [3]}, "chunks_per_source 3 is not accepted"),
        ({"backends": ["sm_copy"]}, "unknown MoE backend 'sm_copy'"),
        ({"models": {"q": {**LAYER}}}, "gives both models and hidden, ffn, experts, top_k"),
        ({"hidden": "wide"}, "moe.0.hidden"),
        ({"dtype": "fp8"}, "MoE dtype 'fp8' is not supported"),
    ],
)
def test_bad_moe_entries_are_refused_naming_the_field(entry, message):
    data = config(**entry)
    data["moe"][0] = {k: v for k, v in data["moe"][0].items() if v is not None}
    with pytest.raises(ConfigError, match=None) as info:
        parse_sweep(data, "c.yaml")
    assert str(info.value).startswith("c.yaml: ") and message in str(info.value)


def test_a_moe_kind_under_workloads_points_to_the_moe_section():
    with pytest.raises(ConfigError, match="list it under `moe:`"):
        parse_sweep({"name": "m", "workloads": [{"kind": "a2a_gemm", "shapes": [[1, 2, 3]]}]}, "c.yaml")


def test_runner_model_predicts_a_moe_sweep_and_stores_it_as_predicted(tmp_path):
    """The MoE cost model answers every candidate of both kinds and the harness's baselines, stored
    as source `predicted`, which lookup never serves."""
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config()))
    url = f"sqlite:///{tmp_path / 'r.db'}"
    run_tune(TuneOptions(config=path, db=url, runner="model"), console=Console(file=io.StringIO()))
    with sqlite3.connect(tmp_path / "r.db") as c:
        trials = c.execute(
            "SELECT w.kind, t.status, t.source FROM syncopate_trials t "
            "JOIN syncopate_workloads w ON w.id = t.workload_id"
        ).fetchall()
        baselines = {row[0] for row in c.execute("SELECT name FROM syncopate_baselines")}
    expected = [
        (k, "ok", "predicted")
        for k in ("a2a_gemm", "gemm_a2a")
        for _ in moe_space(MoeWorkload(kind=k, tokens=16, **LAYER), 2)
    ]
    assert sorted(trials) == sorted(expected)
    assert baselines == {"torch_seq", "comm_alone", "comm_alone_copy_engine", "gemm_alone"}
    from syncopate.moe import lookup_moe

    found = lookup_moe(MoeWorkload(kind="a2a_gemm", tokens=16, **LAYER), TOPO, db=tmp_path / "r.db")
    assert found.match == "cost_model" and found.trial_id is None


@pytest.mark.parametrize("runner", ["replay", "cpu-fixture"])
def test_runners_that_cannot_answer_for_moe_refuse_it_before_anything_starts(tmp_path, runner):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config()))
    with pytest.raises(ConfigError, match=f"runner {runner} answers for the dense kinds only"):
        run_tune(TuneOptions(config=path, db=f"sqlite:///{tmp_path / 'r.db'}", runner=runner))
    assert not (tmp_path / "r.db").exists()


def test_runner_cpu_refuses_dense_workloads_before_anything_starts(tmp_path):
    data = config()
    data["workloads"] = [{"kind": "ag_gemm", "shapes": [[4096, 4096, 4096]]}]
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="runner cpu measures the MoE kinds only"):
        run_tune(TuneOptions(config=path, db=f"sqlite:///{tmp_path / 'r.db'}", runner="cpu"))
    assert not (tmp_path / "r.db").exists()


def test_the_guard_of_a_moe_workload_is_unfused():
    w = MoeWorkload(kind="gemm_a2a", tokens=16, **LAYER)
    assert guard_candidates(w, Topology.from_key(TOPO)) == {"unfused": MoeCandidate()}


# -- the harness on gloo ranks ----------------------------------------------------------------------


def _harness_worker(rank, ws, init, q):
    from syncopate.measure.moe import MoeHarness

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=ws)
    timing = SimpleNamespace(warmup=1, repetitions=3, flush_l2=False)
    try:
        out = {}
        for kind in ("a2a_gemm", "gemm_a2a"):
            w = MoeWorkload(
                kind=kind, tokens=12, routing=RoutingSpec(distribution="skewed", skew=2.5, seed=1), **LAYER
            )
            h = MoeHarness(w, dist.group.WORLD, timing)
            baselines = [(b.name, len(b.samples_us), b.eager_us is not None) for b in h.measure_baselines()]
            results = {c.short(): h.run_candidate(c) for c in moe_space(w, ws, chunks=(1, 2))}
            h.close()
            out[kind] = (
                baselines,
                {k: (r.status, r.max_rel_error, len(r.samples_us), r.error) for k, r in results.items()},
            )
        q.put((rank, out))
    finally:
        dist.destroy_process_group()


def test_the_harness_checks_and_times_what_runs_on_gloo_and_refuses_copy_engine():
    got = dict(run_gloo(_harness_worker, 2))
    for kind, (baselines, results) in got[0].items():
        assert baselines == [("torch_seq", 3, True), ("comm_alone", 3, True), ("gemm_alone", 3, True)], kind
        for short, (status, rel, samples, error) in results.items():
            if short in ("unfused", "dedup") or short.startswith("pipelined/nccl"):
                assert status == "ok" and rel < 1e-2 and samples == 3, (kind, short, error)
            else:
                assert status == "compile_error" and "copy_engine" in error and samples == 0, (kind, short)
    # every rank agrees on every status
    assert {k: {s: r[0] for s, r in v[1].items()} for k, v in got[0].items()} == {
        k: {s: r[0] for s, r in v[1].items()} for k, v in got[1].items()
    }


def _layer_call_worker(rank, ws, init, q):
    import syncopate.moe as moe
    from syncopate.measure.moe import MoeHarness

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=ws)
    try:
        made = []
        exchange = moe.exchange_layout

        def counted(*args, **kwargs):
            made.append(exchange(*args, **kwargs))
            return made[-1]

        w = MoeWorkload(kind="a2a_gemm", tokens=12, routing=RoutingSpec(seed=3), **LAYER)
        h = MoeHarness(w, dist.group.WORLD, SimpleNamespace(warmup=1, repetitions=2, flush_l2=False))
        moe.exchange_layout = counted
        seen = []
        h._time(lambda layout: seen.append(layout))
        moe.exchange_layout = exchange
        case = h.case
        fresh = [lay for lay in seen if lay is not case.layout]
        q.put(
            (
                rank,
                (
                    len(made),
                    len(fresh),
                    len(seen) - len(fresh),
                    all(a is b for a, b in zip(fresh, made, strict=True)),
                    all(lay.recv_splits == case.layout.recv_splits for lay in fresh),
                ),
            )
        )
    finally:
        dist.destroy_process_group()


def test_the_eager_time_is_a_layers_call_on_a_layout_made_for_it():
    """The device time runs the op on the case's layout; the eager time, as MoELayer calls it, on a
    layout made for each call (its counts exchanged, the host waiting for them, the plan's tables
    made anew), so that what a plan spends on the host after that wait is in its eager time."""
    for rank, (made, fresh, on_case, same_objects, same_routing) in run_gloo(_layer_call_worker, 2):
        assert made > 0 and fresh == made and on_case > 0, rank
        assert same_objects and same_routing, rank


# -- the sweep in this process, on a 1-rank gloo group --------------------------------------------


def test_the_sweep_loop_runs_moe_workloads_in_this_process(tmp_path):
    from syncopate.autotuner.in_process import LocalExecutor
    from syncopate.autotuner.store import open_store
    from syncopate.autotuner.tune import _plan, run_sweep, runner_spec
    from syncopate.workers.runner import make_runner

    data = {
        "name": "moe_local",
        "topology": "H200x1-nvlink",
        "runner": "cpu",
        "timing": {"warmup": 1, "repetitions": 3, "deadline_s": 60},
        "moe": [{**LAYER, "tokens": [16], "chunks": [1, 2], "backends": ["nccl"]}],
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    url = f"sqlite:///{tmp_path / 'r.db'}"
    plan = _plan(TuneOptions(config=path, db=url))
    with tempfile.TemporaryDirectory() as d:
        dist.init_process_group("gloo", init_method="file://" + os.path.join(d, "r"), rank=0, world_size=1)
        try:
            runner = make_runner(runner_spec(plan))
            device = runner.bind_device(0, [0])
            runner.setup(0, 1, dist.group.WORLD)
            store = open_store(url)
            store.prepare_writes()
            try:
                result = run_sweep(
                    plan,
                    store,
                    LocalExecutor(runner, deadline_s=60),
                    plan.topology,
                    runner.environment(device),
                    None,
                    Console(file=io.StringIO()),
                )
            finally:
                store.close()
                runner.close()
        finally:
            dist.destroy_process_group()
    assert result.status == "done" and result.source == "fixture"
    db = tmp_path / "r.db"
    with sqlite3.connect(db) as c:
        trials = c.execute(
            "SELECT w.kind, t.status, t.source FROM syncopate_trials t "
            "JOIN syncopate_workloads w ON w.id = t.workload_id"
        ).fetchall()
        baselines = c.execute("SELECT name FROM syncopate_baselines ORDER BY name").fetchall()
    # unfused, dedup and pipelined/nccl at 1 and 2 chunks, both kinds; each verified and timed
    assert sorted(trials) == sorted(
        [(k, "ok", "fixture") for k in ("a2a_gemm", "gemm_a2a") for _ in range(4)]
    )
    assert baselines == [
        (n,) for n in ("comm_alone", "comm_alone", "gemm_alone", "gemm_alone", "torch_seq", "torch_seq")
    ]
    assert all(s.best is not None and s.bound_us is not None for s in result.summaries)
