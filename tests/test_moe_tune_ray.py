"""Layer: Ray on the CPU. `syncopate tune` of MoE layers end to end on one local Ray instance with
declared GPU resources: a gang of 2 actors with a gloo group, runner cpu (the MoE harness, wall-clock
times), the coordinator and the results database; every candidate of the space stored, the
copy_engine ones as refused, the baselines of each workload."""

from __future__ import annotations

import io
import json
import sqlite3

import pytest
import yaml
from rich.console import Console
from support.ray_cluster import local_ray

from syncopate.autotuner.tune import TuneOptions, run_tune
from syncopate.search_space import MoeWorkload
from syncopate.search_space.moe_workload import MoeCandidate, moe_space

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow, pytest.mark.xdist_group("ray")]

LAYER = {"hidden": 64, "ffn": 32, "experts": 8, "top_k": 2}
TOPO = "H200x2-nvlink"


@pytest.fixture(scope="module", autouse=True)
def ray_cluster():
    yield from local_ray(2)


def test_syncopate_tune_runs_a_moe_sweep_on_ray_gangs_with_runner_cpu(tmp_path):
    data = {
        "name": "moe_ray",
        "topology": TOPO,
        "runner": "cpu",
        "strategy": {"name": "grid"},
        "timing": {"warmup": 1, "repetitions": 3, "deadline_s": 60},
        "moe": [{**LAYER, "tokens": [16], "chunks": [1, 2]}],
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    url = f"sqlite:///{tmp_path / 'r.db'}"
    result = run_tune(
        TuneOptions(config=path, db=url, form_timeout_s=120), console=Console(file=io.StringIO())
    )
    assert result.status == "done"
    with sqlite3.connect(tmp_path / "r.db") as c:
        trials = c.execute(
            "SELECT w.kind, t.candidate, t.status, t.error, t.median_us FROM syncopate_trials t "
            "JOIN syncopate_workloads w ON w.id = t.workload_id"
        ).fetchall()
        baselines = c.execute("SELECT COUNT(*), COUNT(DISTINCT name) FROM syncopate_baselines").fetchone()
    spaces = [
        moe_space(MoeWorkload(kind=k, tokens=16, **LAYER), 2, chunks=(1, 2)) for k in ("a2a_gemm", "gemm_a2a")
    ]
    assert len(trials) == sum(map(len, spaces))
    for kind, doc, status, error, median in trials:
        c = MoeCandidate.from_dict(json.loads(doc))
        if c.backend == "nccl":
            assert status == "ok" and median > 0, (kind, c.short(), error)
        else:
            assert status == "compile_error" and "copy_engine" in error and median is None
    assert baselines == (6, 3)
