"""Layer: `syncopate tune` as a process. Bad input exits 2 with one line before any work; a
coordinator killed with SIGKILL mid-sweep is resumed with --resume, losing nothing and measuring
nothing twice. Each process that starts Ray starts its own local cluster (declared GPUs)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.sqlite_store import SqliteTrialStore
from support.sweeps import fixture_sweep, planned_keys

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
    """`syncopate tune ARGS` with the tests' SQLite store."""
    return subprocess.run(
        [sys.executable, str(LAUNCHER), *map(str, args)],
        capture_output=True,
        text=True,
        env={**env(), **extra_env},
        cwd=REPO,
        timeout=timeout,
    )


def count(db: Path, sql: str) -> list[tuple]:
    store = SqliteTrialStore(str(db))
    try:
        return store.rows(sql)
    finally:
        store.close()


def one_error_line(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("syncopate: error: ") and "Traceback" not in r.stderr
    return lines[0]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_ray_address_fails_fast_and_writes_nothing(tmp_path):
    config = fixture_sweep(tmp_path)
    db = tmp_path / "t.db"
    started = time.monotonic()
    line = one_error_line(
        tune(config, "--db", f"sqlite:///{db}", "--ray-address", f"127.0.0.1:{_closed_port()}")
    )
    assert time.monotonic() - started < 30
    assert "cannot reach the Ray cluster at 127.0.0.1:" in line and "ray start --head" in line
    assert count(db, "SELECT count(*) FROM sweeps") == [(0,)]


def test_gpu_runner_on_a_machine_without_gpus(tmp_path):
    config = fixture_sweep(tmp_path, runner="gpu")
    db = tmp_path / "t.db"
    # no GPU visible to Ray's detection, on any machine
    line = one_error_line(tune(config, "--db", f"sqlite:///{db}", CUDA_VISIBLE_DEVICES=""))
    assert "no GPUs on this machine (Ray found none): runner gpu needs 2" in line
    assert count(db, "SELECT count(*) FROM sweeps") == [(0,)]


def test_database_that_cannot_be_opened():
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "syncopate",
            "tune",
            "configs/llama_tp2.yaml",
            "--runner",
            "cpu-fixture",
            "--db",
            "sqlite:////nonexistent-dir/trials.db",
        ],
        capture_output=True,
        text=True,
        env=env(),
        cwd=REPO,
        timeout=120,
    )
    line = one_error_line(r)
    assert "database" in line and "/nonexistent-dir/trials.db" in line


@pytest.mark.parametrize(
    "args, message",
    [
        (["--runner", "model"], "runner 'model' is not available yet"),
        (["--runner", "replay"], "runner 'replay' is not available yet"),
        (["--runner", "tpu"], "--runner 'tpu' is unknown"),
        (["--max-trials", "0"], "--max-trials 0 must be positive"),
    ],
)
def test_options_that_cannot_run(tmp_path, args, message):
    config = fixture_sweep(tmp_path)
    line = one_error_line(tune(config, "--db", f"sqlite:///{tmp_path / 't.db'}", *args))
    assert message in line


def test_strategy_not_available_yet(tmp_path):
    config = fixture_sweep(tmp_path, strategy="optuna-tpe")
    line = one_error_line(tune(config, "--db", f"sqlite:///{tmp_path / 't.db'}"))
    assert "strategy 'optuna-tpe' is not available yet" in line


def test_resume_after_sigkill_loses_nothing_and_measures_nothing_twice(tmp_path):
    config = fixture_sweep(tmp_path, name="killed", strategy="grid", max_trials=24, fixture={"delay_s": 0.4})
    db = tmp_path / "t.db"
    args = [sys.executable, str(LAUNCHER), str(config), "--db", f"sqlite:///{db}"]
    proc = subprocess.Popen(
        args, env=env(), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and proc.poll() is None:
            if db.exists() and count(db, "SELECT count(*) FROM trials")[0][0] >= 6:
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
    first = count(db, "SELECT id, candidate_key, record FROM trials ORDER BY id")
    assert 6 <= len(first) < 24
    assert count(db, "SELECT id, status FROM sweeps") == [(1, "running")]

    r = tune(config, "--db", f"sqlite:///{db}", "--resume")
    assert r.returncode == 0, r.stderr
    assert (
        f"resuming sweep 'killed' (id 1): {len(first)} trial(s) stored, {24 - len(first)} to go"
        in " ".join(r.stderr.split())
    )

    after = count(db, "SELECT id, candidate_key, record FROM trials ORDER BY id")
    assert after[: len(first)] == first
    assert sorted(k for _, k, _ in after) == sorted(planned_keys(config))
    written = count(
        db, "SELECT key, count(*) FROM writes WHERE kind = 'trial' GROUP BY key HAVING count(*) > 1"
    )
    assert written == []
    assert count(db, "SELECT count(*) FROM writes WHERE kind = 'baseline'") == [(4,)]
    assert count(db, "SELECT id, status FROM sweeps") == [(1, "done")]
