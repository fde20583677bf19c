"""Layer: pure CPU logic. The coordinator's one loop driven in this process (the `model` runner,
no Ray): what a sweep on gangs does when a runner fails, it does here too. Baselines that fail
leave the candidates measured without them, a candidate whose runner raises is stored with the
classified status and text a gang stores, and a spent time budget hands out no work at all.
tests/test_tune_ray.py runs one plan both ways and compares what they store."""

from __future__ import annotations

import io
import logging

from rich.console import Console
from support.stored import BASELINES, TRIALS, rows, stored_trials
from support.sweeps import fixture_sweep, planned_keys

from syncopate.autotuner.tune import TuneOptions, run_tune
from syncopate.workers.model_runner import ModelRunner

SMALL_SPACE = {
    "backends": ["copy_engine", "nccl"],
    "templates": ["direct"],
    "num_splits": [1, 2],
    "tile_orders": ["arrival"],
    "tile_configs": ["128x256x64w8s3"],
    "group_m": [8],
}
SHAPES = (("ag_gemm", (4096, 4096, 4096)), ("gemm_rs", (4096, 8192, 4096)))


def tune(tmp_path, **options):
    config = fixture_sweep(tmp_path, runner="model", max_trials=3, space=SMALL_SPACE, shapes=SHAPES)
    url = f"sqlite:///{tmp_path / 'loop.db'}"
    result = run_tune(TuneOptions(config=config, db=url, **options), console=Console(file=io.StringIO()))
    return config, url, result


def test_baselines_that_fail_leave_the_candidates_measured_without_them(tmp_path, monkeypatch, caplog):
    def fails(self, workload):
        raise RuntimeError(f"no reference for {workload.kind}")

    monkeypatch.setattr(ModelRunner, "baselines", fails)
    with caplog.at_level(logging.WARNING, logger="syncopate.autotuner.coordinator"):
        _, url, result = tune(tmp_path)
    assert result.status == "done"
    assert rows(url, BASELINES) == []
    assert [s for _, _, s, _ in rows(url, TRIALS)] == ["ok"] * 6
    assert all(s.torch_seq_us is None and s.best is not None for s in result.summaries)
    assert (
        "baselines of ag_gemm (M=4096, N=4096, K=4096) bf16 failed (RuntimeError: no reference for ag_gemm)"
        in (caplog.text)
    )


def test_a_runner_that_raises_stores_the_classified_status_and_the_sweep_goes_on(tmp_path, monkeypatch):
    config = fixture_sweep(tmp_path, runner="model", max_trials=3, space=SMALL_SPACE, shapes=SHAPES)
    bad = planned_keys(config)[1]
    run = ModelRunner.run

    def raises(self, workload, candidate, deadline_s):
        if candidate.key() == bad and workload.kind == "ag_gemm":
            raise RuntimeError()  # no text: the error names the exception as a gang's actor does
        return run(self, workload, candidate, deadline_s)

    monkeypatch.setattr(ModelRunner, "run", raises)
    _, url, result = tune(tmp_path)
    assert result.status == "done"
    failed = [t for t in stored_trials(url) if t.status != "ok"]
    assert [(t.candidate.key(), t.status, t.record.error) for t in failed] == [
        (bad, "crash", "RuntimeError: RuntimeError()")
    ]
    assert failed[0].record.median_us is None and failed[0].record.samples_us == ()
    assert len(stored_trials(url)) == 6 and result.summaries[0].failures == {"crash": 1}


def test_a_spent_time_budget_hands_out_no_work_not_even_baselines(tmp_path):
    _, url, result = tune(tmp_path, time_budget_s=1e-6)
    assert result.status == "stopped" and result.progress.stopping == "time budget"
    assert rows(url, BASELINES) == [] and rows(url, TRIALS) == []
    assert rows(url, "SELECT status FROM syncopate_sweeps") == [("stopped",)]


def test_the_loop_counts_and_times_every_trial_in_this_process(tmp_path):
    _, url, result = tune(tmp_path)
    p = result.progress
    assert (p.total, p.done, p.measured) == (6, 6, 6)
    assert len(p.trial_seconds) == 6 and len(p.handling_ms) == 6 and len(p.idle_gap_ms) == 5
    for t in stored_trials(url):
        assert {"runner", "host", "pid", "finished_at", "elapsed_s", "coordinator", "prediction"} <= set(
            t.record.worker
        )
