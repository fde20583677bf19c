"""Layer: Ray on the CPU, at the world sizes of configs/llama_tp4.yaml and llama_tp8.yaml. One
local Ray instance declares eight GPUs: `syncopate tune` with the cpu-fixture runner forms one
gang of eight actors (gloo group of eight) for H200x8-nvswitch, or two gangs of four for
H200x4-nvswitch, and every planned trial and baseline is stored once, measured through the gang
at its world size."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console
from support.ray_cluster import local_ray
from support.stored import BASELINES, TRIALS, rows, stored_trials
from support.sweeps import fixture_sweep, planned_keys

from syncopate.autotuner.tune import TuneOptions, run_tune
from syncopate.search_space import Workload
from syncopate.workers.fixture_runner import candidate_time

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.slow,
    pytest.mark.xdist_group("ray"),
]  # see test_tune_ray.py

SHAPES = (("ag_gemm", (8192, 8192, 8192)), ("gemm_rs", (8192, 8192, 8192)), ("gemm_ar", (8192, 8192, 8192)))
"""One shape of each kind from the TP 8 suite (each divides by 4 and by 8)."""


@pytest.fixture(scope="module", autouse=True)
def ray_cluster():
    yield from local_ray(8)


def tune(tmp_path: Path, topology: str, max_trials: int):
    config = fixture_sweep(
        tmp_path,
        name=topology.lower(),
        topology=topology,
        strategy="grid",
        max_trials=max_trials,
        shapes=SHAPES,
    )
    db = tmp_path / "trials.db"
    result = run_tune(
        TuneOptions(config=config, db=f"sqlite:///{db}", form_timeout_s=120),
        console=Console(file=io.StringIO()),
    )
    return config, f"sqlite:///{db}", result


@pytest.mark.parametrize("topology, ws, gangs", [("H200x8-nvswitch", 8, 1), ("H200x4-nvswitch", 4, 2)])
def test_tune_on_declared_gpus_stores_every_trial_at_the_world_size(tmp_path, topology, ws, gangs):
    config, url, result = tune(tmp_path, topology, max_trials=4)
    assert result.status == "done" and result.topology == topology and result.progress.gangs == gangs
    stored = rows(url, TRIALS)
    planned = {
        (f"{kind}/{m}x{n}x{k}/bf16", key)
        for i, (kind, (m, n, k)) in enumerate(SHAPES)
        for key in planned_keys(config, i)
    }
    assert len(stored) == len(planned) == 4 * len(SHAPES)
    assert {(w, c) for w, c, _, _ in stored} == planned
    assert {(s, src) for _, _, s, src in stored} == {("ok", "fixture")}
    for t in stored_trials(url):
        worker = t.record.worker
        assert len(worker["gpu_uuids"]) == len(set(worker["actor_ids"])) == len(set(worker["pids"])) == ws
        assert t.record.median_us == pytest.approx(candidate_time(t.workload, t.candidate, ws), rel=0.011), (
            "the times are the fixture's for this world size, reduced over all of its ranks"
        )
    assert {t.record.worker["gang"] for t in stored_trials(url)} == set(range(gangs))
    names = {(w, n) for w, n, _, _ in rows(url, BASELINES)}
    assert {n for _, n in names} >= {"torch_seq", "gemm_alone", "comm_alone"}
    assert {w for w, _ in names} == {Workload(kind=k, shape=s).key() for k, s in SHAPES}
    for summary in result.summaries:
        assert summary.best is not None and summary.bound_us <= summary.torch_seq_us
