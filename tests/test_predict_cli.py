"""Layer: the command line on the CPU, with the results database on SQLite. `syncopate tune` with
the `model` and `replay` runners (no GPU, no Ray): the quickstart, predictions for topologies not
at hand, Optuna studies that resume and refuse a changed space, and bad input that fails with
one line and nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from syncopate.autotuner.synthetic import synthetic_sweep
from syncopate.cli import main
from syncopate.results_db import ResultsDB
from syncopate.search_space import SpaceOptions, TileConfig, Topology, Workload, guard_candidates
from syncopate.workers.replay_runner import write_sweep

REPO = Path(__file__).resolve().parents[1]
SMALL_SPACE = {
    "backends": ["copy_engine", "nccl"],
    "templates": ["direct"],
    "num_splits": [1, 2],
    "tile_orders": ["arrival", "row_major"],
    "tile_configs": ["128x256x64w8s3", "128x128x64w8s4"],
    "group_m": [8],
}


@pytest.fixture
def db(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("SYNCOPATE_DB", raising=False)
    url = f"sqlite:///{tmp_path / 'results.db'}"
    assert main(["db", "upgrade", "--db", url]) == 0
    return url


def config(tmp_path: Path, name: str = "predict", **fields) -> Path:
    data = {
        "name": name,
        "topology": "H200x2-nvlink",
        "workloads": [{"kind": "ag_gemm", "shapes": [[4096, 4096, 4096]]}],
        "strategy": {"name": "random", "max_trials": 5, "seed": 0},
        "space": SMALL_SPACE,
        "runner": "model",
        **fields,
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("syncopate: error: "), err
    return err[0]


def sweeps(url: str) -> list:
    with ResultsDB.open(url) as d:
        return d.sweeps()


def test_the_quickstart_predicts_on_a_cpu_machine_and_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("SYNCOPATE_DB", raising=False)
    monkeypatch.chdir(REPO)
    assert main(["tune", "configs/quickstart.yaml"]) == 0
    out = capsys.readouterr()
    text = " ".join((out.out + out.err).split())
    assert "PREDICTED by the cost model, not measured" in text and "predicted µs" in text
    assert "no GPU is used" in text and "default calibration for H200x2-nvlink" in text
    assert "syncopate calibrate" in text
    with ResultsDB.open(None) as d:
        trials = d.trials()
        assert trials and {t.record.source for t in trials} == {"predicted"}
        assert {b.record.source for b in d.baselines()} == {"predicted"}
        w = trials[0].workload
        assert d.best(w, trials[0].topology, trials[0].record.environment) is None


@pytest.mark.parametrize("suite, key", [("llama_tp4", "H200x4-nvswitch"), ("llama_tp8", "H200x8-nvswitch")])
def test_the_tp4_and_tp8_suites_predict_every_workload(db, capsys, suite, key):
    assert (
        main(
            [
                "tune",
                str(REPO / "configs" / f"{suite}.yaml"),
                "--runner",
                "model",
                "--max-trials",
                "2",
                "--db",
                db,
            ]
        )
        == 0
    )
    assert f"on {key}: done (PREDICTED by the cost model" in " ".join(capsys.readouterr().out.split())
    with ResultsDB.open(db) as d:
        trials, baselines = d.trials(), d.baselines()
    assert len(trials) == 2 * 18 and {t.topology.key() for t in trials} == {key}
    assert {(t.status, t.record.source) for t in trials} == {("ok", "predicted")}
    assert len({t.workload for t in trials}) == len({b.record.workload for b in baselines}) == 18
    assert {b.record.source for b in baselines} == {"predicted"}


def test_predicting_for_eight_gpus_not_at_hand(tmp_path, db, capsys):
    path = config(tmp_path, workloads=[{"kind": "gemm_rs", "shapes": [[4096, 4096, 2048]]}])
    assert main(["tune", str(path), "--db", db, "--topology", "H200x8-nvswitch"]) == 0
    with ResultsDB.open(db) as d:
        trials = d.trials()
    assert len(trials) == 5 and {t.topology.key() for t in trials} == {"H200x8-nvswitch"}
    assert all(t.record.source == "predicted" and t.record.worker["runner"] == "model" for t in trials)
    assert all("prediction" in t.record.worker for t in trials)


def test_the_model_needs_a_named_topology(tmp_path, db, capsys):
    path = config(tmp_path, topology="detect")
    assert main(["tune", str(path), "--db", db]) == 2
    assert "runner model predicts for a topology named in the config" in error_line(capsys)
    assert sweeps(db) == []


def test_a_ray_address_for_a_runner_without_ray_is_refused(tmp_path, db, capsys):
    path = config(tmp_path)
    assert main(["tune", str(path), "--db", db, "--ray-address", "10.0.0.1:6379"]) == 2
    line = error_line(capsys)
    assert "--ray-address 10.0.0.1:6379 is for the runners on Ray (gpu, cpu-fixture); runner model" in line
    assert sweeps(db) == []


def test_measured_calibrations_missing_name_the_command_and_write_nothing(tmp_path, db, capsys):
    path = config(tmp_path, calibration="measured")
    assert main(["tune", str(path), "--db", db]) == 1
    line = error_line(capsys)
    assert "calibrations missing for H200x2-nvlink" in line or "no measured calibration" in line
    assert "syncopate calibrate" in line
    assert sweeps(db) == []


def test_an_optuna_sweep_resumes_and_refuses_a_changed_space(tmp_path, db, capsys):
    import optuna

    path = config(tmp_path, name="tpe", strategy={"name": "optuna-tpe", "max_trials": 6, "seed": 0})
    assert main(["tune", str(path), "--db", db]) == 0
    assert main(["tune", str(path), "--db", db, "--resume", "--max-trials", "10"]) == 0
    capsys.readouterr()
    with ResultsDB.open(db) as d:
        keys = [t.candidate.key() for t in d.trials()]
    assert len(keys) == 10 == len(set(keys)) and len(sweeps(db)) == 1
    studies = optuna.get_all_study_summaries(storage=db)
    assert len(studies) == 1 and studies[0].study_name.startswith(
        "syncopate/ag_gemm/4096x4096x4096/bf16/H200x2-nvlink/"
    )
    n_trials = studies[0].n_trials

    changed = config(
        tmp_path,
        name="tpe",
        strategy={"name": "optuna-tpe", "max_trials": 6, "seed": 0},
        space={**SMALL_SPACE, "num_splits": [1, 2, 4]},
    )
    assert main(["tune", str(changed), "--db", db]) == 2
    line = error_line(capsys)
    assert "made over another search space" in line and "Nothing was changed" in line
    assert len(sweeps(db)) == 1
    assert optuna.get_all_study_summaries(storage=db)[0].n_trials == n_trials


@pytest.mark.parametrize(
    "change, args, expected",
    [
        (
            {"workloads": [{"kind": "ag_gemm", "shapes": [[4096, 4096, 4096], [8192, 4096, 4096]]}]},
            [],
            "workloads added ag_gemm (M=8192, N=4096, K=4096) bf16",
        ),
        (
            {"workloads": [{"kind": "gemm_rs", "shapes": [[4096, 4096, 4096]]}]},
            [],
            "left out ag_gemm (M=4096, N=4096, K=4096) bf16",
        ),
        ({"space": {**SMALL_SPACE, "num_splits": [1, 2, 4]}}, [], "space section"),
        ({"timing": {"warmup": 2, "repetitions": 40}}, [], "timing section"),
        ({}, ["--topology", "H100x2-nvlink"], "topology H200x2-nvlink, not H100x2-nvlink"),
        ({"topology": "H200x4-nvlink"}, [], "topology H200x2-nvlink, not H200x4-nvlink"),
    ],
)
def test_resume_refuses_a_changed_config(tmp_path, db, capsys, change, args, expected):
    path = config(tmp_path, name="same")
    assert main(["tune", str(path), "--db", db]) == 0
    capsys.readouterr()
    with ResultsDB.open(db) as d:
        before = len(d.trials())
    changed = config(tmp_path, name="same", **change)
    assert main(["tune", str(changed), "--db", db, "--resume", *args]) == 2
    line = error_line(capsys)
    assert "sweep 'same' (id 1) was started with other settings" in line and expected in line, line
    assert "leave out --resume" in line
    assert [s.status for s in sweeps(db)] == ["done"]
    with ResultsDB.open(db) as d:
        assert len(d.trials()) == before
    # a larger budget is no change of what is measured: the same config resumes
    path = config(tmp_path, name="same")
    assert main(["tune", str(path), "--db", db, "--resume", "--max-trials", "7"]) == 0
    with ResultsDB.open(db) as d:
        assert len(d.trials()) == 7 and len(d.sweeps()) == 1


def test_model_guided_through_tune_measures_the_models_pick(tmp_path, db, capsys):
    path = config(
        tmp_path, name="mg", strategy={"name": "model-guided", "max_trials": 4, "seed": 0, "model_top_k": 2}
    )
    assert main(["tune", str(path), "--db", db]) == 0
    with ResultsDB.open(db) as d:
        trials = d.trials()
    assert len(trials) == 4 and trials[0].record.strategy == "model-guided"
    guards = {
        c.key()
        for c in guard_candidates(
            Workload(kind="ag_gemm", shape=(4096, 4096, 4096)), Topology.from_key("H200x2-nvlink")
        ).values()
    }
    assert {t.candidate.key() for t in trials[:2]} == guards  # the references first
    assert trials[2].median_us == min(t.median_us for t in trials[2:])  # then the model's pick


def test_replaying_a_synthetic_sweep(tmp_path, db, capsys):
    topo = Topology.from_key("H200x2-nvlink")
    w = Workload(kind="ag_gemm", shape=(4096, 4096, 4096))
    options = SpaceOptions(
        backends=("copy_engine", "nccl"),
        templates=("direct",),
        num_splits=(1, 2),
        tile_orders=("arrival", "row_major"),
        group_m=(8,),
        tile_configs=tuple(TileConfig.from_key(k) for k in SMALL_SPACE["tile_configs"]),
    )
    stored = synthetic_sweep([w], topo, seed=1, options=options)
    sweep_file = tmp_path / "sweep.json.gz"
    write_sweep(sweep_file, stored)
    path = config(
        tmp_path,
        name="replayed",
        runner="replay",
        replay={"source": str(sweep_file), "noise": 0.01},
        strategy={"name": "grid", "seed": 0},
    )
    assert main(["tune", str(path), "--db", db, "--wide"]) == 0
    out = capsys.readouterr()
    text = " ".join((out.out + out.err).split())
    assert "replayed from a SYNTHETIC sweep" in text and "not measured" in text and "re-measured" in text
    with ResultsDB.open(db) as d:
        trials = d.trials()
        names = [s.name for s in d.sweeps()]
    assert names == ["replayed", "replayed+confirm"]
    main_trials = [t for t in trials if t.sweep_id == 1]
    assert len(main_trials) == len(stored.trials[w.key()]) and {t.record.source for t in trials} == {
        "fixture"
    }
    best = min(t.median_us for t in stored.trials[w.key()].values() if t.status == "ok")
    assert min(t.median_us for t in main_trials if t.status == "ok") == pytest.approx(
        best, rel=0.05
    )  # noise 1 %
    assert 1 <= len(trials) - len(main_trials) <= 3


def _stored_measurements(tmp_path) -> tuple[Path, Workload, int]:
    """A SQLite file holding one measured sweep of one workload (synthetic numbers, stored as
    measured); its path, the workload and the number of trials."""
    import dataclasses

    topo = Topology.from_key("H200x2-nvlink")
    w = Workload(kind="ag_gemm", shape=(4096, 4096, 4096))
    options = SpaceOptions(
        backends=("copy_engine",),
        templates=("direct",),
        num_splits=(1, 2),
        tile_orders=("arrival", "row_major"),
        group_m=(8,),
        tile_configs=tuple(TileConfig.from_key(k) for k in SMALL_SPACE["tile_configs"]),
    )
    stored = synthetic_sweep([w], topo, seed=2, options=options)
    path = tmp_path / "measured.db"
    with ResultsDB.open(str(path), upgrade=True) as d:
        sweep_id = d.start_sweep("measured")
        d.record_trials(
            sweep_id, [dataclasses.replace(t, source="measured") for t in stored.trials[w.key()].values()]
        )
    return path, w, len(stored.trials[w.key()])


def test_replay_from_a_database_given_as_a_plain_path(tmp_path, db, capsys):
    source, w, count = _stored_measurements(tmp_path)
    path = config(
        tmp_path,
        name="replayed",
        runner="replay",
        replay={"source": str(source), "sweep": "measured"},
        strategy={"name": "grid", "seed": 0},
        space={**SMALL_SPACE, "backends": ["copy_engine"]},
    )
    assert main(["tune", str(path), "--db", db]) == 0
    capsys.readouterr()
    with ResultsDB.open(db) as d:
        trials = d.trials()
    assert len(trials) == count and {t.status for t in trials} <= {"ok", "wrong", "oom", "compile_error"}


def test_replay_says_how_many_trials_the_stored_sweep_did_not_hold(tmp_path, db, capsys):
    source, w, count = _stored_measurements(tmp_path)
    path = config(
        tmp_path,
        name="replayed",
        runner="replay",
        replay={"source": str(source), "sweep": "measured"},
        strategy={"name": "grid", "seed": 0},
    )  # the space has nccl too, which the source lacks
    assert main(["tune", str(path), "--db", db]) == 0
    text = " ".join(capsys.readouterr().out.split())
    with ResultsDB.open(db) as d:
        unheld = sum(1 for t in d.trials() if "is not in the replayed sweep" in (t.record.error or ""))
    assert unheld > 0
    assert (
        f"{unheld} trial(s) asked for candidates that the replayed sweep does not hold, stored as `crash`"
        in text
    )
    assert "give the config the `space:` of the replayed sweep" in text


def test_replaying_a_workload_the_source_never_measured_is_refused(tmp_path, db, capsys):
    source, w, _ = _stored_measurements(tmp_path)
    path = config(
        tmp_path,
        name="replayed",
        runner="replay",
        replay={"source": f"sqlite:///{source}"},
        workloads=[{"kind": "ag_gemm", "shapes": [[4096, 4096, 4096], [8192, 4096, 4096]]}],
    )
    assert main(["tune", str(path), "--db", db]) == 2
    line = error_line(capsys)
    assert "holds no trial of ag_gemm (M=8192, N=4096, K=4096) bf16" in line, line
    assert "it holds ag_gemm/4096x4096x4096/bf16" in line
    assert sweeps(db) == []


def test_replay_without_a_source_is_refused(tmp_path, db, capsys):
    path = config(tmp_path, runner="replay")
    assert main(["tune", str(path), "--db", db]) == 2
    assert "runner replay needs a `replay:` section" in error_line(capsys)
    assert sweeps(db) == []


@pytest.mark.parametrize("strategy", ["annealing"])
def test_an_unknown_strategy_fails_before_anything_is_written(tmp_path, db, capsys, strategy):
    path = config(tmp_path, strategy={"name": strategy, "max_trials": 3})
    assert main(["tune", str(path), "--db", db]) == 2
    assert "unknown strategy 'annealing'" in error_line(capsys)
    assert sweeps(db) == []


def test_a_budget_of_zero_fails_before_anything_is_written(tmp_path, db, capsys):
    path = config(tmp_path)
    assert main(["tune", str(path), "--db", db, "--max-trials", "0"]) == 2
    assert "--max-trials 0 must be positive" in error_line(capsys)
    assert sweeps(db) == []


def test_space_ranks_with_the_cost_model_and_says_it_predicts(db, capsys):
    args = [
        "space",
        "--kind",
        "gemm_ar",
        "--m",
        "4096",
        "--n",
        "4096",
        "--k",
        "2048",
        "--topology",
        "H200x4-nvswitch",
        "--predict",
        "3",
        "--db",
        db,
    ]
    assert main(args) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "PREDICTED by the cost model, not measured" in text and "worth measuring" in text
    assert "default calibration for H200x4-nvswitch" in text


@pytest.mark.parametrize("signum, code, word", [(2, 130, "interrupted"), (15, 143, "terminated")])
def test_a_signal_stops_a_sweep_as_interrupted_and_it_resumes(tmp_path, signum, code, word):
    """Ctrl-C and SIGTERM (a scheduler's stop) alike: the sweep is marked `interrupted`, its trials
    kept, the way on is named, and --resume continues it."""
    import os
    import subprocess
    import sys
    import time

    from support.signals import default_stops

    url = f"sqlite:///{tmp_path / 'results.db'}"
    shapes = [[262144, 8192, 8192], [262144, 16384, 8192], [262144, 8192, 16384]]  # about 40 s in all
    big = config(
        tmp_path,
        name="long",
        workloads=[{"kind": "gemm_ar", "shapes": shapes}],
        strategy={"name": "random", "max_trials": 200, "seed": 0},
        space={"tile_configs": ["128x256x64w8s3"]},
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH")))),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "syncopate", "tune", str(big), "--db", url],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_stops,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if (tmp_path / "results.db").exists():
                try:
                    with ResultsDB.open(url) as d:
                        if d.trials(limit=1):
                            break
                except Exception:  # noqa: BLE001 - the schema is still being made
                    pass
            time.sleep(0.2)
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == code, (out, err)
    assert f"syncopate: {word}" in err and "sweep 'long' (id 1) interrupted" in err and "--resume" in err, err
    assert "Traceback" not in err
    with ResultsDB.open(url) as d:
        assert [s.status for s in d.sweeps()] == ["interrupted"]
        before = d.trials()
    per_workload = min(sum(t.workload.shape.as_tuple() == tuple(shape) for t in before) for shape in shapes)
    assert 0 < len(before) < 500
    assert main(["tune", str(big), "--db", url, "--resume", "--max-trials", str(per_workload + 1)]) == 0
    with ResultsDB.open(url) as d:
        after = d.trials()
        assert [s.status for s in d.sweeps()] == ["done"]
    assert len(after) > len(before) and {t.trial_id for t in before} <= {t.trial_id for t in after}
    keys = [(t.workload.key(), t.candidate.key()) for t in after]
    assert len(keys) == len(set(keys))  # nothing measured twice


def test_a_stop_logged_by_a_library_prints_no_traceback():
    """A stop landing while SQLAlchemy's pool resets a connection: the pool logs the interrupt with
    its traceback before passing it on (seen once in the SIGTERM test above); `tune`'s log handler
    leaves such records out, and prints every other error with its traceback."""
    import io
    import logging

    from rich.console import Console

    from syncopate.cli.tune_cmds import _setup_logging
    from syncopate.errors import Terminated

    root = logging.getLogger()
    kept = root.handlers[:], root.level
    text = io.StringIO()
    try:
        root.handlers = [h for h in root.handlers if not getattr(h, "_syncopate_cli", False)]
        _setup_logging(Console(file=text, width=200), verbose=False)
        pool = logging.getLogger("sqlalchemy.pool.impl.QueuePool")
        for error in (Terminated(), KeyboardInterrupt(), RuntimeError("the database went away")):
            try:
                raise error
            except BaseException:
                pool.error("Exception during reset or similar", exc_info=True)
    finally:
        root.handlers, root.level = kept
    out = text.getvalue()
    assert out.count("Exception during reset or similar") == 1 and "the database went away" in out
    assert "Traceback" in out and "Terminated" not in out and "KeyboardInterrupt" not in out


def test_a_repeated_sweep_says_it_continued_the_study(tmp_path, capsys):
    """The second run into the same database carries on each workload's Optuna study, so it measures
    other candidates and may report another best (as a repeated quickstart does): it says so, naming
    the study and its earlier trials."""
    path = config(tmp_path, name="again", strategy={"name": "model-guided", "max_trials": 2, "seed": 0})
    args = ["tune", str(path), "--db", f"sqlite:///{tmp_path / 'q.db'}"]
    assert main(args) == 0
    first = capsys.readouterr()
    assert "continued study" not in first.out + first.err
    assert main([*args, "--json"]) == 0
    second = capsys.readouterr()
    [w] = json.loads(second.out)["workloads"]
    study = w["continued_study"]
    # the first run's trials told to the study (the guards it measured first may not be)
    n = study["trials"]
    assert 1 <= n <= 2 and study["name"].startswith(f"syncopate/{w['workload']}/H200x2-nvlink/")
    said = f"{n} earlier trial" + ("s" if n != 1 else "")
    assert f"{w['workload']}: continued study {study['name']}: {said}" in " ".join(second.err.split())


def test_the_replay_example_replays_the_committed_sweep(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    db = f"sqlite:///{tmp_path / 'replayed.db'}"
    assert main(["tune", "configs/replay_example.yaml", "--db", db, "--max-trials", "1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["runner"] == "replay" and doc["source"] == "fixture" and not doc["served"]
    assert len(doc["workloads"]) == 4 and all(w["best_us"] for w in doc["workloads"])
    with ResultsDB.open(db) as d:
        assert {t.record.source for t in d.trials()} == {"fixture"}


def test_runner_replay_without_a_source_names_files_that_exist(tmp_path, capsys, monkeypatch):
    import re

    monkeypatch.chdir(REPO)
    assert (
        main(["tune", "configs/quickstart.yaml", "--runner", "replay", "--db", str(tmp_path / "r.db")]) == 2
    )
    line = error_line(capsys)
    named = re.findall(r"(?:results|configs)/[\w./-]+\.(?:db|yaml|json\.gz)", line)
    assert named and all((REPO / path).exists() for path in named), line
    assert "configs/replay_example.yaml" in named


def test_tune_help_names_the_detected_topology(capsys):
    assert main(["tune", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "`detect`: this machine's GPUs" in text and "configs/replay_example.yaml" in text


def test_piped_logs_are_plain_lines():
    """With stderr piped, a record is one line, neither wrapped nor padded to a width."""
    import io
    import logging

    from rich.console import Console

    from syncopate.cli.tune_cmds import _setup_logging

    root = logging.getLogger()
    kept = root.handlers[:], root.level
    text = io.StringIO()
    try:
        root.handlers = [h for h in root.handlers if not getattr(h, "_syncopate_cli", False)]
        _setup_logging(Console(file=text, width=240, soft_wrap=True), verbose=False)
        logging.getLogger("syncopate.autotuner").warning("a note that runs long " * 8)
    finally:
        root.handlers, root.level = kept
    assert text.getvalue() == "WARNING  " + "a note that runs long " * 8 + "\n"
