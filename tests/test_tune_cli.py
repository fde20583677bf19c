"""Layer: `syncopate tune` as a process, on the real results database. Bad input exits 2 with one
line before any work (a database that cannot be opened: before Ray starts); a coordinator killed
with SIGKILL mid-sweep is resumed with --resume, losing nothing and measuring nothing twice. Each
process that starts Ray starts its own local cluster (declared GPUs)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from support.stored import rows
from support.sweeps import fixture_sweep, planned_keys

import syncopate.autotuner.tune as tune_module
from syncopate.cli import main
from syncopate.results_db import ResultsDB
from syncopate.workers import child_env

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parents[1]
LAUNCHER = REPO / "tests" / "support" / "tune_cli.py"


def env() -> dict[str, str]:
    e = child_env()
    e["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), e.get("PYTHONPATH")) if p)
    e.pop("RAY_ADDRESS", None)
    return e


def tune(*args, timeout: float = 240, **extra_env: str) -> subprocess.CompletedProcess:
    """`python -m syncopate tune ARGS`."""
    return subprocess.run(
        [sys.executable, "-m", "syncopate", "tune", *map(str, args)],
        capture_output=True,
        text=True,
        env={**env(), **extra_env},
        cwd=REPO,
        timeout=timeout,
    )


def url_of(db: Path) -> str:
    return f"sqlite:///{db}"


def sweeps(db: Path) -> list[tuple]:
    return rows(url_of(db), "SELECT id, status FROM syncopate_sweeps ORDER BY id")


def one_error_line(r: subprocess.CompletedProcess) -> str:
    """The one error line of a command the machine stopped (exit code 1, not 2: no value was bad)."""
    assert r.returncode == 1, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("syncopate: error: ") and "Traceback" not in r.stderr
    return lines[0]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_ray_address_fails_fast_and_writes_no_sweep(tmp_path):
    config = fixture_sweep(tmp_path)
    db = tmp_path / "t.db"
    started = time.monotonic()
    line = one_error_line(tune(config, "--db", url_of(db), "--ray-address", f"127.0.0.1:{_closed_port()}"))
    assert time.monotonic() - started < 30
    assert "cannot reach the Ray cluster at 127.0.0.1:" in line and "ray start --head" in line
    assert not db.exists()  # refused before the database was made


def test_gpu_runner_on_a_machine_without_gpus(tmp_path):
    config = fixture_sweep(tmp_path, runner="gpu")
    db = tmp_path / "t.db"
    # no GPU visible to Ray's detection, on any machine
    line = one_error_line(tune(config, "--db", url_of(db), CUDA_VISIBLE_DEVICES=""))
    assert "no GPUs on this machine (Ray found none): runner gpu needs 2" in line
    assert not db.exists()  # refused before the database was made


def test_database_that_cannot_be_opened():
    r = tune(
        "configs/llama_tp2.yaml", "--runner", "cpu-fixture", "--db", "sqlite:////nonexistent-dir/trials.db"
    )
    line = one_error_line(r)
    assert "database" in line and "/nonexistent-dir/trials.db" in line
    assert not Path("/nonexistent-dir").exists()


# -- in this process, with Ray forbidden: the database is checked before Ray starts -------------


@pytest.fixture
def no_ray(monkeypatch):
    def connect(*args, **kwargs):
        raise AssertionError("Ray was started although the run could not go on")

    monkeypatch.setattr(tune_module, "connect", connect)


def run_cli(capsys, *args) -> tuple[int, list[str]]:
    code = main(["tune", *map(str, args)])
    return code, capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize(
    "db, message",
    [
        ("sqlite:////nonexistent-dir/trials.db", "database sqlite:////nonexistent-dir/trials.db does not"),
        ("{tmp}/empty.db", "has no Syncopate tables: run `syncopate db upgrade --db"),
        ("postgresql+psycopg://tuner:secret@127.0.0.1:{port}/syncopate", "cannot open database postgresql"),
        ("mysql://tuner@db/syncopate", "is not supported"),
    ],
)
def test_a_database_that_cannot_be_opened_stops_before_ray(tmp_path, capsys, no_ray, db, message):
    (tmp_path / "empty.db").touch()
    config = fixture_sweep(tmp_path)
    listing = sorted(p.name for p in tmp_path.iterdir())
    code, err = run_cli(capsys, config, "--db", db.format(tmp=tmp_path, port=_closed_port()))
    assert (
        code == (2 if "not supported" in message else 1)
        and len(err) == 1
        and err[0].startswith("syncopate: error: ")
    ), err
    assert message in err[0] and "secret" not in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == listing


def test_resume_with_another_runner_is_refused_before_ray(tmp_path, capsys, no_ray):
    config = fixture_sweep(tmp_path, name="fx")
    db = tmp_path / "t.db"
    with ResultsDB.open(url_of(db), upgrade=True) as rdb:
        sweep_id = rdb.start_sweep("fx", {"name": "fx", "runner": "cpu-fixture"})
        rdb.finish_sweep(sweep_id, "stopped")
    code, err = run_cli(capsys, config, "--db", url_of(db), "--resume", "--runner", "gpu")
    assert code == 2 and len(err) == 1, err
    assert f"sweep 'fx' (id {sweep_id}) was run with runner cpu-fixture, not gpu" in err[0]
    assert "resume it with --runner cpu-fixture" in err[0]
    assert sweeps(db) == [(sweep_id, "stopped")]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--runner", "tpu"], "--runner 'tpu' is unknown"),
        (["--max-trials", "0"], "--max-trials 0 must be positive"),
    ],
)
def test_options_that_cannot_run(tmp_path, capsys, no_ray, args, message):
    config = fixture_sweep(tmp_path)
    code, err = run_cli(capsys, config, "--db", url_of(tmp_path / "t.db"), *args)
    assert code == 2 and len(err) == 1 and message in err[0], err
    assert not (tmp_path / "t.db").exists()


def test_strategy_that_does_not_exist(tmp_path, capsys, no_ray):
    config = fixture_sweep(tmp_path, strategy="annealing")
    code, err = run_cli(capsys, config, "--db", url_of(tmp_path / "t.db"))
    assert code == 2 and len(err) == 1 and "unknown strategy 'annealing'" in err[0], err
    assert not (tmp_path / "t.db").exists()


# -- SIGKILL, then --resume ---------------------------------------------------------------------


def _trial_count(db: Path) -> int:
    if not db.exists():
        return 0
    try:
        return rows(url_of(db), "SELECT count(*) FROM syncopate_trials")[0][0]
    except sa.exc.OperationalError:  # the schema is not created yet
        return 0


def _writes(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.xdist_group("ray")  # starts a Ray cluster: see test_tune_ray.py
def test_resume_after_sigkill_loses_nothing_and_measures_nothing_twice(tmp_path):
    config = fixture_sweep(tmp_path, name="killed", strategy="grid", max_trials=24, fixture={"delay_s": 0.25})
    db = tmp_path / "t.db"
    log = tmp_path / "writes.jsonl"
    logged = {**env(), "SYNCOPATE_TEST_WRITE_LOG": str(log)}
    args = [sys.executable, str(LAUNCHER), str(config), "--db", url_of(db)]
    proc = subprocess.Popen(
        args, env=logged, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and proc.poll() is None:
            if _trial_count(db) >= 6:
                break
            time.sleep(0.2)
        assert proc.poll() is None, proc.stderr.read()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        # the local Ray cluster that process started lives in its session: end it with it
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.stderr.close()
    everything = "SELECT * FROM syncopate_trials ORDER BY id"
    first = rows(url_of(db), everything)
    assert 6 <= len(first) < 24
    assert sweeps(db) == [(1, "running")]
    stored_first = {k for (k,) in rows(url_of(db), "SELECT candidate_hash FROM syncopate_trials")}
    before = _writes(log)

    r = subprocess.run(
        [*args, "--resume", "--wide"], env=logged, cwd=REPO, capture_output=True, text=True, timeout=240
    )
    assert r.returncode == 0, r.stderr
    assert (
        f"resuming sweep 'killed' (id 1): {len(first)} trial(s) stored, {24 - len(first)} to go"
        in " ".join(r.stderr.split())
    )
    assert f"24/24 ({len(first)} resumed)" in r.stdout

    after = rows(url_of(db), everything)
    assert after[: len(first)] == first
    with ResultsDB.open(url_of(db)) as rdb:
        assert sorted(t.candidate.key() for t in rdb.trials()) == sorted(planned_keys(config))
    writes = _writes(log)
    assert writes[: len(before)] == before
    trial_keys = [w["key"] for w in writes if w["kind"] == "trial"]
    assert len(trial_keys) == len(set(trial_keys))  # no trial stored by both processes
    resumed = [w["key"].rsplit("/", 1)[1] for w in writes[len(before) :] if w["kind"] == "trial"]
    assert sorted(resumed) == sorted(set(planned_keys(config)) - stored_first)  # exactly the missing ones
    assert [w["kind"] for w in writes].count("baseline") == 4
    assert all(w["kind"] == "trial" for w in writes[len(before) :])  # baselines reused, not measured again
    assert sweeps(db) == [(1, "done")]


@pytest.mark.slow
@pytest.mark.xdist_group("ray")  # starts a Ray cluster: see test_tune_ray.py
def test_sigterm_on_ray_gangs_marks_the_sweep_interrupted(tmp_path):
    """A scheduler's SIGTERM reaches the coordinator after Ray has started (which installs a handler
    of its own): the sweep is marked `interrupted`, the way on is named, exit 143, Ray shut down."""
    config = fixture_sweep(
        tmp_path, name="stopped", strategy="grid", max_trials=24, fixture={"delay_s": 0.25}
    )
    db = tmp_path / "t.db"
    proc = subprocess.Popen(
        [sys.executable, "-m", "syncopate", "tune", str(config), "--db", url_of(db)],
        env=env(),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and proc.poll() is None:
            if _trial_count(db) >= 3:
                break
            time.sleep(0.2)
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert proc.returncode == 143, (out, err)
    assert "sweep 'stopped' (id 1) interrupted" in " ".join(err.split()) and "syncopate: terminated" in err, (
        err
    )
    assert "SIGTERM received" not in err and "Traceback" not in err
    assert sweeps(db) == [(1, "interrupted")] and 3 <= _trial_count(db) < 24
