"""Layer: pure CPU logic. The pieces of `syncopate tune` that need no Ray cluster: placement plans,
gang capacity, strategies, sample statistics, exception classification, the actors' environment,
the fixture's synthetic times, address checks and option validation."""

from __future__ import annotations

import socket

import pytest

from syncopate.autotuner.cluster import Cluster, check_reachable, gang_capacity, gang_shape
from syncopate.autotuner.gangs import check_gang_members
from syncopate.autotuner.strategies import GridStrategy, SearchProblem, make_strategy
from syncopate.autotuner.sweep import parse_sweep
from syncopate.autotuner.tune import TuneOptions
from syncopate.errors import CandidateTimeoutError, ConfigError, RuntimeUnavailableError
from syncopate.search_space import (
    SpaceOptions,
    Topology,
    Workload,
    default_candidate,
    space,
    unfused_candidate,
)
from syncopate.workers import (
    ACTOR_ENV,
    Gang,
    PlacementPlan,
    RunnerSpec,
    child_env,
    classify_exception,
    runner_class,
    summarize,
)
from syncopate.workers.fixture_runner import PlantedFault, candidate_time, fixture_times

W = Workload(kind="ag_gemm", shape=(4096, 4096, 4096))
TOPO = Topology.from_key("H200x2-nvlink")


def test_placement_one_node_packs_one_bundle_per_gpu():
    plan = PlacementPlan.for_world(4, 1, cpus_per_rank=1)
    assert plan.strategy == "STRICT_PACK"
    assert plan.bundles == tuple({"GPU": 1.0, "CPU": 1.0} for _ in range(4))
    assert plan.bundle_of_rank == (0, 1, 2, 3)


def test_placement_over_nodes_spreads_one_bundle_per_node():
    plan = PlacementPlan.for_world(16, 2, cpus_per_rank=0)
    assert plan.strategy == "STRICT_SPREAD"
    assert plan.bundles == ({"GPU": 8.0}, {"GPU": 8.0})
    assert plan.bundle_of_rank == (0,) * 8 + (1,) * 8
    with pytest.raises(ConfigError, match="cannot be spread evenly"):
        PlacementPlan.for_world(6, 4, cpus_per_rank=0)


@pytest.mark.parametrize(
    "ws, nodes, gpus, expected",
    [
        (2, 1, [("a", 2)], 1),
        (2, 1, [("a", 8)], 4),
        (2, 1, [("a", 1), ("b", 1)], 0),
        (4, 1, [("a", 2)], 0),
        (2, 1, [("a", 3), ("b", 2)], 2),
        (16, 2, [("a", 8), ("b", 8), ("c", 8)], 1),
        (16, 2, [("a", 16), ("b", 16)], 2),
        (16, 2, [("a", 16), ("b", 4)], 0),
    ],
)
def test_gang_capacity(ws, nodes, gpus, expected):
    assert gang_capacity(ws, nodes, tuple(gpus)) == expected


def test_grid_covers_the_space_evenly_and_resume_skips_stored():
    cands = space(W, TOPO, SpaceOptions())
    problem = SearchProblem(workload=W, topology=TOPO)
    grid = GridStrategy(problem, max_trials=10, seed=0)
    plan = grid.ask(100)
    assert len(plan) == 10 and grid.planned == 10 and grid.remaining == 0
    assert plan[:2] == [default_candidate(W, TOPO), unfused_candidate()]  # the guards first
    assert plan[2] == cands[0] and len({c.key() for c in plan}) == 10
    assert {c.backend for c in plan} == {c.backend for c in cands}
    done = frozenset(c.key() for c in plan[:4])
    resumed = GridStrategy(SearchProblem(workload=W, topology=TOPO, done=done), max_trials=10, seed=0)
    assert resumed.planned == 10 and resumed.remaining == 6
    assert resumed.ask(100) == plan[4:]
    assert resumed.ask(1) == []


def test_random_is_seeded_and_differs_per_seed():
    problem = SearchProblem(workload=W, topology=TOPO)
    a = make_strategy("random", problem, max_trials=12, seed=0).ask(12)
    b = make_strategy("random", problem, max_trials=12, seed=0).ask(12)
    c = make_strategy("random", problem, max_trials=12, seed=1).ask(12)
    assert a == b and a != c and len({x.key() for x in a}) == 12


@pytest.mark.parametrize("name", ["optuna-tpe", "model-guided"])
def test_optuna_strategies_are_available(name):
    strategy = make_strategy(name, SearchProblem(workload=W, topology=TOPO), max_trials=1, seed=0)
    assert strategy.name == name and strategy.planned == 2  # a budget below the guards still measures them


@pytest.mark.parametrize("name, source", [("model", "predicted"), ("replay", "fixture")])
def test_the_cpu_runners_say_what_their_numbers_are(name, source):
    assert runner_class(name).source == source


def test_runner_sources():
    assert runner_class("cpu-fixture").source == "fixture"
    assert runner_class("cpu-fixture").dist_backend == "gloo"
    assert runner_class("gpu").source == "measured"
    assert runner_class("gpu").dist_backend == "nccl"


def test_summarize_median_and_percentiles():
    assert summarize([]) is None
    assert summarize([5.0]) == (5.0, 5.0, 5.0)
    median, p20, p80 = summarize([float(x) for x in range(1, 11)])
    assert median == pytest.approx(5.5) and p20 == pytest.approx(2.8) and p80 == pytest.approx(8.2)


class OutOfMemoryError(RuntimeError):
    """Named as torch's."""


class CompilationError(Exception):
    """Named as Triton's."""


@pytest.mark.parametrize(
    "exc, status, healthy",
    [
        (CandidateTimeoutError("signal 3 never arrived"), "timeout", True),
        (OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"), "oom", True),
        (MemoryError(), "oom", True),
        (RuntimeError("CUDA error: out of memory"), "oom", True),
        (CompilationError("at 12:4: unsupported"), "compile_error", True),
        (PlantedFault("compile_error", "x"), "compile_error", True),
        (RuntimeError("CUDA error: an illegal memory access was encountered"), "crash", False),
        (ValueError("boom"), "crash", False),
    ],
)
def test_classify_exception(exc, status, healthy):
    assert classify_exception(exc) == (status, healthy)


def test_actor_env_keeps_cuda_devices_and_turns_multicast_off():
    assert ACTOR_ENV == {
        "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1",
        "NCCL_NVLS_ENABLE": "0",
        "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
        "NVSHMEM_DISABLE_NVLS": "1",
    }
    env = child_env({"PATH": "/bin", "NCCL_NVLS_ENABLE": "1"})
    assert env["PATH"] == "/bin" and env["NCCL_NVLS_ENABLE"] == "0"


def test_kernel_switches_travel_to_the_actors_and_into_the_provenance(monkeypatch):
    # A sweep run with SYNCOPATE_GLUON=1 measures the Gluon producer on every actor, even on a Ray
    # cluster started elsewhere, and its trials say so; variables that are not switches stay home.
    from syncopate.environment import KERNEL_SWITCHES, provenance
    from syncopate.workers.env import actor_runtime_env

    assert KERNEL_SWITCHES == ("SYNCOPATE_GLUON",)
    for name in ("SYNCOPATE_GLUON", "SYNCOPATE_DB"):
        monkeypatch.delenv(name, raising=False)
    assert actor_runtime_env()["env_vars"] == ACTOR_ENV and provenance()["switches"] == {}
    monkeypatch.setenv("SYNCOPATE_GLUON", "1")
    monkeypatch.setenv("SYNCOPATE_DB", "postgresql://user:secret@host/db")
    env = actor_runtime_env({"X": "y"})["env_vars"]
    assert env["SYNCOPATE_GLUON"] == "1" and env["X"] == "y"
    assert "SYNCOPATE_DB" not in env
    stamp = provenance()
    assert stamp["switches"] == {"SYNCOPATE_GLUON": "1"} and stamp["triton"].endswith("+gluon")


def test_fixture_times_follow_the_workload():
    t = fixture_times(W, 2)
    assert t["torch_seq"] == pytest.approx(t["gemm_alone"] + t["comm_alone"])
    assert "torch_async_tp" not in fixture_times(Workload(kind="gemm_ar", shape=(4096, 4096, 4096)), 2)
    bound = max(t["gemm_alone"], t["comm_alone"])
    times = [candidate_time(W, c, 2) for c in space(W, TOPO)[:50]]
    assert all(bound < x < t["torch_seq"] * 1.3 for x in times)
    assert len(set(times)) == len(times)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_ray_address_fails_fast():
    with pytest.raises(RuntimeUnavailableError, match="cannot reach the Ray cluster"):
        check_reachable(f"127.0.0.1:{_closed_port()}", timeout_s=2)
    with pytest.raises(ConfigError, match="does not parse"):
        check_reachable("no-port-here")
    check_reachable("auto")


def test_fixture_section_is_validated():
    base = {
        "name": "t",
        "topology": "H200x2-nvlink",
        "workloads": [{"kind": "ag_gemm", "shapes": [[1024, 1024, 1024]]}],
    }
    with pytest.raises(ConfigError, match="'zz' is not a candidate key"):
        parse_sweep({**base, "fixture": {"hang": ["zz"]}})
    with pytest.raises(ConfigError, match="unknown failure 'boom'"):
        parse_sweep({**base, "fixture": {"fail": {"0123456789abcdef": "boom"}}})
    sweep = parse_sweep({**base, "fixture": {"crash": ["0123456789abcdef"], "delay_s": 0.5}})
    assert sweep.fixture.crash == ["0123456789abcdef"] and sweep.fixture.delay_s == 0.5


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_trials": 0}, "--max-trials 0 must be positive"),
        ({"time_budget_s": -1.0}, "--time-budget -1.0 must be a positive"),
        ({"time_budget_s": float("nan")}, "--time-budget nan must be a positive, finite number"),
        ({"time_budget_s": float("inf")}, "--time-budget inf must be a positive, finite number"),
        ({"runner": "tpu"}, "--runner 'tpu' is unknown"),
    ],
)
def test_tune_options_are_checked(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        TuneOptions(config="x.yaml", **kwargs)


def test_no_gpus_or_too_few_in_the_cluster():
    none = Cluster(address="local", owned=False, gpus_by_node=(("10.0.0.1", 0),))
    with pytest.raises(
        RuntimeUnavailableError, match=r"no GPUs on this machine \(Ray found none\): runner gpu needs 2"
    ):
        gang_shape(TOPO, none, "gpu")
    with pytest.raises(RuntimeUnavailableError, match="use --runner cpu-fixture for a test run$"):
        gang_shape(TOPO, none, "gpu")
    with pytest.raises(
        RuntimeUnavailableError, match=r"use --runner cpu for a test run of the MoE layers \(gloo"
    ):
        gang_shape(TOPO, none, "gpu", moe=True)  # cpu-fixture answers for the dense kinds only
    one = Cluster(address="10.0.0.1:6379", owned=False, gpus_by_node=(("10.0.0.1", 1), ("10.0.0.2", 1)))
    with pytest.raises(RuntimeUnavailableError, match="needs 2 GPUs on one node; the cluster has 2 GPU"):
        gang_shape(TOPO, one, "gpu")
    eight = Cluster(address="local", owned=False, gpus_by_node=(("10.0.0.1", 8),))
    assert gang_shape(TOPO, eight, "gpu") == (2, 1)
    assert gang_shape(None, eight, "gpu") == (8, 1)


def _gang(index: int, models: list[str]) -> Gang:
    gang = Gang(index, len(models), RunnerSpec(name="cpu-fixture", timing=None))
    gang.formed(
        [
            {"rank": r, "gpu_model": m, "gpu_uuid": f"GPU-{index}{r}", "host": "h"}
            for r, m in enumerate(models)
        ]
    )
    return gang


def test_gangs_must_hold_one_gpu_model_the_topology_names():
    check_gang_members([_gang(0, ["H200", "H200"]), _gang(1, ["H200", "H200"])], "H200")
    with pytest.raises(
        RuntimeUnavailableError, match=r"mixed models \(H100, H200\): gang 0 rank 0: H200 \(GPU-00 on h\)"
    ):
        check_gang_members([_gang(0, ["H200", "H200"]), _gang(1, ["H100", "H100"])], None)
    with pytest.raises(RuntimeUnavailableError, match="topology names H200 GPUs, but the gangs have H100"):
        check_gang_members([_gang(0, ["H100", "H100"])], "H200")


def test_ctrl_c_in_tune_exits_130(monkeypatch, capsys):
    import syncopate.autotuner.tune as tune_module
    from syncopate.cli import main

    def interrupted(options, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(tune_module, "run_tune", interrupted)
    assert main(["tune", "configs/quickstart.yaml"]) == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == "syncopate: interrupted"


@pytest.mark.parametrize(
    "source, label", [("fixture", "best so far (fixture, not measured):"), ("measured", "best so far:")]
)
def test_the_live_display_says_when_its_best_is_not_measured(source, label):
    import io

    from rich.console import Console

    from syncopate.autotuner.coordinator import SweepProgress, WorkloadRun
    from syncopate.autotuner.progress import _View
    from syncopate.records import Environment, TrialRecord

    strategy = GridStrategy(SearchProblem(workload=W, topology=TOPO), max_trials=2, seed=0)
    run = WorkloadRun(workload=W, strategy=strategy)
    env = Environment(syncopate="0", torch="0", triton="0", cuda="0", nccl="0", driver="0", gpu_model="H200")
    run.best = TrialRecord(
        workload=W,
        topology=TOPO,
        environment=env,
        candidate=space(W, TOPO)[0],
        status="ok",
        source=source,
        median_us=100.0,
    )
    progress = SweepProgress(sweep_name="s", topology=TOPO.key(), runs=[run], gangs=1, source=source)
    progress.latest = run
    console = Console(file=io.StringIO(), width=200)
    console.print(_View(progress))
    assert label in console.file.getvalue() and "100.0 µs" in console.file.getvalue()


def test_winners_faster_than_the_bound_are_explained():
    from types import SimpleNamespace

    from syncopate.autotuner.progress import below_bound_note

    at = SimpleNamespace(workload="ag_gemm/8192x4096x8192/bf16", device_us=400.0, bound_us=396.0)
    under = SimpleNamespace(workload="gemm_ar/8192x8192x2048/bf16", device_us=377.7, bound_us=568.8)
    assert below_bound_note([at]) is None
    note = below_bound_note([at, under])
    assert note.startswith("faster than the bound: gemm_ar/8192x8192x2048/bf16 (1.51× under)")
    assert "ag_gemm" not in note and "timed through NCCL only" in note
