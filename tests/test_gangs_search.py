"""Layer: Ray on the CPU (declared GPUs, the cpu-fixture runner, the results database on SQLite).
The coordinator with the search pieces that live beside it: re-measuring the best few into the
companion sweep before a winner is declared, and an Optuna study driven by gangs."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import yaml
from rich.console import Console
from support.ray_cluster import local_ray

from syncopate.autotuner.tune import TuneOptions, run_tune
from syncopate.cli import main
from syncopate.results_db import ResultsDB

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.slow,
    pytest.mark.xdist_group("ray"),
]  # see test_tune_ray.py


@pytest.fixture(scope="module", autouse=True)
def ray_cluster():
    yield from local_ray(2)


def sweep(tmp_path: Path, name: str, strategy: dict) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": name,
                "topology": "H200x2-nvlink",
                "workloads": [{"kind": "ag_gemm", "shapes": [[4096, 4096, 4096]]}],
                "strategy": strategy,
                "runner": "cpu-fixture",
                "timing": {"warmup": 0, "repetitions": 5, "deadline_s": 30},
                "space": {"backends": ["copy_engine", "nccl"], "templates": ["direct"], "num_splits": [1, 2]},
            }
        )
    )
    return path


@pytest.fixture
def db(tmp_path):
    url = f"sqlite:///{tmp_path / 'results.db'}"
    assert main(["db", "upgrade", "--db", url]) == 0
    return url


def test_the_best_few_are_measured_again_into_the_companion_sweep(tmp_path, db):
    config = sweep(tmp_path, "confirm", {"name": "grid", "max_trials": 8, "seed": 0, "top_k_remeasure": 2})
    result = run_tune(
        TuneOptions(config=config, db=db, form_timeout_s=120, mode="graph"),  # by device time
        console=Console(file=io.StringIO()),
    )
    assert result.status == "done"
    with ResultsDB.open(db) as d:
        names = {s.name: s for s in d.sweeps()}
        assert set(names) == {"confirm", "confirm+confirm"}
        first = d.trials(sweep_id=names["confirm"].sweep_id)
        again = d.trials(sweep_id=names["confirm+confirm"].sweep_id)
    assert len(first) == 8 and 1 <= len(again) <= 2
    ranked = sorted((t for t in first if t.status == "ok"), key=lambda t: t.median_us)
    assert again[0].candidate == ranked[0].candidate
    assert {t.candidate.key() for t in again} <= {t.candidate.key() for t in ranked[:2]}
    assert names["confirm+confirm"].config["confirms"] == names["confirm"].sweep_id
    (summary,) = result.summaries
    assert summary.verdict is not None and summary.verdict.contenders == len(again)
    assert summary.verdict.samples == 5 * 2


def test_an_optuna_study_driven_by_gangs(tmp_path, db):
    import optuna

    config = sweep(tmp_path, "tpe", {"name": "optuna-tpe", "max_trials": 6, "seed": 0})
    result = run_tune(
        TuneOptions(config=config, db=db, form_timeout_s=120), console=Console(file=io.StringIO())
    )
    assert result.status == "done"
    with ResultsDB.open(db) as d:
        trials = d.trials()
        assert len(trials) == 6 and {t.record.strategy for t in trials} == {"optuna-tpe"}
        assert {s.name for s in d.sweeps()} == {"tpe"}
    (study,) = optuna.get_all_study_summaries(storage=db)
    completed = [
        t
        for t in optuna.load_study(study_name=study.study_name, storage=db).trials
        if t.state.name == "COMPLETE"
    ]
    # the unfused guard lies outside this space: measured beside the study, not told to it
    told = {t.candidate.key() for t in trials if t.status == "ok" and t.candidate.template != "unfused"}
    assert {t.user_attrs["candidate_key"] for t in completed} == told
