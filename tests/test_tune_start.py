"""Layer: how `syncopate tune` starts and stops, on the CPU. What can refuse a run is checked before
Ray starts and before the database is made (a database it cannot write, another application's
file, a GPU runner on a machine without GPUs), and a refused run leaves every file as it was; a run
stopped while it makes its database leaves none, and the same command then just works; a signal
while Ray starts ends the command with its documented exit code and one line, Ray shut down with
every process it started.

Most runs are in this process with Ray forbidden; the signals go to a real `python -m syncopate`
on a local Ray cluster (declared GPUs, the cpu-fixture runner)."""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.signals import default_stops
from support.sweeps import fixture_sweep
from support.unprivileged import captured, listing, shared_folder, unprivileged

import syncopate.autotuner.tune as tune_module
from syncopate.cli import main
from syncopate.results_db import ResultsDB
from syncopate.workers import child_env

REPO = Path(__file__).resolve().parents[1]
SMALL_SPACE = {
    "backends": ["copy_engine", "nccl"],
    "templates": ["direct"],
    "num_splits": [1, 2],
    "tile_orders": ["arrival"],
    "tile_configs": ["128x256x64w8s3"],
    "group_m": [8],
}


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    monkeypatch.delenv("SYNCOPATE_DB", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))


@pytest.fixture
def no_ray(monkeypatch):
    def connect(*args, **kwargs):
        raise AssertionError("Ray was started although the run could not go on")

    monkeypatch.setattr(tune_module, "connect", connect)


def tune(*args) -> tuple[int, list[str], str]:
    """`syncopate tune ARGS` in this process: (exit code, stderr lines, stdout)."""
    code, out, err = captured(lambda: main(["tune", *map(str, args)]))
    return code, err.strip().splitlines(), out


def one_error(code: int, err: list[str]) -> str:
    assert code == 1 and len(err) == 1 and err[0].startswith("syncopate: error: "), (code, err)
    return err[0]


# -- refused before Ray, and before the database is made ------------------------------------------


@pytest.mark.parametrize("what", ["file", "folder"])
def test_a_database_it_cannot_write_is_refused_before_ray_and_left_as_it_was(no_ray, what):
    with shared_folder() as root:
        config = fixture_sweep(root)
        ResultsDB.open(root / "results.db", upgrade=True).close()
        (root / "db").mkdir()
        db = root / "db" / "results.db"
        shutil.copy(root / "results.db", db)
        assert tune(config, "--db", root / "missing" / "results.db")[0] == 1  # loads what a start imports
        if what == "file":  # a results file handed out read-only, in a folder the user may write
            db.chmod(0o444)
            db.parent.chmod(0o777)
        else:  # a writable file in a folder the user may not write: no journal can be made
            db.chmod(0o666)
            db.parent.chmod(0o555)
        before = listing(db.parent)
        code, err, _ = unprivileged(lambda: tune(config, "--db", db))
        line = one_error(code, err)
        assert f"database {db} cannot be written: " in line and "give a file in a writable folder" in line
        assert listing(db.parent) == before


def test_a_gpu_runner_without_gpus_is_refused_before_ray_and_makes_no_database(tmp_path, monkeypatch, no_ray):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPU visible here, on any machine
    config = fixture_sweep(tmp_path, runner="gpu")
    line = one_error(*tune(config, "--db", tmp_path / "t.db")[:2])
    assert "no GPUs on this machine (Ray found none): runner gpu needs 2" in line
    assert "--runner model" in line
    assert not (tmp_path / "t.db").exists()


@pytest.mark.parametrize("runner", ["model", "replay"])
def test_an_in_process_runner_refused_by_its_config_makes_no_database(tmp_path, no_ray, runner):
    # runner model predicts for a named topology, not `detect`; runner replay needs a replay: section
    config = fixture_sweep(tmp_path, runner=runner, topology="detect")
    code, err, _ = tune(config, "--db", tmp_path / "t.db")
    assert code == 2 and len(err) == 1, (code, err)  # the config is what is wrong
    line = err[0]
    assert (
        ("topology named in the config" in line)
        if runner == "model"
        else ("needs a `replay:` section" in line)
    )
    assert not (tmp_path / "t.db").exists()


def test_another_applications_file_is_refused_before_ray_and_left_as_it_was(tmp_path, no_ray):
    config = fixture_sweep(tmp_path)
    db = tmp_path / "notes.db"
    with sqlite3.connect(db) as c:
        c.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT)")
    before = listing(tmp_path)
    line = one_error(*tune(config, "--db", db)[:2])
    assert f"database {db} has no Syncopate tables" in line
    assert listing(tmp_path) == before  # its journal mode included


def test_a_database_at_an_older_revision_is_refused_before_ray_with_the_upgrade_and_left_as_it_was(
    tmp_path, no_ray
):
    """Read as it is by lookups (a file on a read-only mount), but a sweep writes: upgrade it first."""
    from alembic import command

    from syncopate.results_db.engine import make_engine
    from syncopate.results_db.migrate import alembic_config
    from syncopate.results_db.urls import locate

    config = fixture_sweep(tmp_path)
    db = tmp_path / "old.db"
    ResultsDB.open(db, upgrade=True).close()
    engine = make_engine(locate(db))
    with engine.begin() as connection:
        command.downgrade(alembic_config(connection), "0002")
    engine.dispose()
    before = listing(tmp_path)
    line = one_error(*tune(config, "--db", db)[:2])
    assert f"database {db} has schema revision 0002, older than" in line
    assert f"run `syncopate db upgrade --db {db}`" in line
    assert listing(tmp_path) == before


# -- stopped while the database is made, then run again -------------------------------------------


def _sigterm_before_the_schema_commits(monkeypatch) -> None:
    """A real SIGTERM to this process once the migration has made every table, before it commits:
    the worst moment for a first run to be stopped."""
    from alembic import command

    real = command.upgrade

    def upgrade(config, revision):
        real(config, revision)
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(command, "upgrade", upgrade)


@pytest.mark.parametrize("rerun", [[], ["--resume"]], ids=["again", "resume"])
def test_a_first_run_stopped_while_it_makes_the_database_leaves_none_and_runs_again(
    tmp_path, monkeypatch, rerun
):
    config = fixture_sweep(tmp_path, runner="model", max_trials=2, space=SMALL_SPACE)
    db = tmp_path / "new.db"
    _sigterm_before_the_schema_commits(monkeypatch)
    code, err, _ = tune(config, "--db", f"sqlite:///{db}")
    assert (code, err) == (143, ["syncopate: terminated"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fx.yaml"]

    monkeypatch.undo()
    code, err, out = tune(config, "--db", f"sqlite:///{db}", *rerun)
    assert code == 0, err
    assert "sweep 'fx' (id 1) on H200x2-nvlink: done" in " ".join(out.split())
    with ResultsDB.open(db) as rdb:
        assert [(s.sweep_id, s.status) for s in rdb.sweeps() if s.name == "fx"] == [(1, "done")]


# -- a signal while Ray starts ---------------------------------------------------------------------


def _session(sid: int) -> dict[int, list[str]]:
    """The processes of session `sid` other than its leader, with their command lines."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == sid:
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                session = int(f.read().rsplit(")", 1)[1].split()[3])
            if session == sid:
                with open(f"/proc/{entry}/cmdline") as f:
                    found[int(entry)] = f.read().split("\0")
        except (OSError, ValueError, IndexError):
            continue
    return found


def _is_agent(argv: list[str]) -> bool:
    return any(
        a.endswith(("dashboard/agent.py", "runtime_env/agent/main.py"))
        or (a.startswith("ray::") and "Agent" in a)
        for a in argv
    )


MOMENTS = {
    "gcs": lambda procs: bool(procs),  # Ray's first process is up
    "agents": lambda procs: any(
        _is_agent(argv) for argv in procs.values()
    ),  # the raylet has started its agents
}


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize(
    "signum, moment, code, line",
    [
        (signal.SIGTERM, "gcs", 143, "syncopate: terminated"),
        (signal.SIGINT, "agents", 130, "syncopate: interrupted"),
    ],
    ids=["sigterm-gcs", "sigint-agents"],
)
def test_a_signal_while_ray_starts_stops_with_one_line_and_leaves_no_ray_process(
    tmp_path, signum, moment, code, line
):
    config = fixture_sweep(tmp_path)
    db = tmp_path / "t.db"
    env = child_env()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "syncopate", "tune", str(config), "--db", f"sqlite:///{db}"],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=default_stops,
    )
    left: dict[int, list[str]] = {}
    try:
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline and not MOMENTS[moment](_session(proc.pid)):
            time.sleep(0.02)
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=120)
        deadline = time.monotonic() + 20
        while (left := _session(proc.pid)) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        for pid in list(_session(proc.pid)):  # whatever is left of that run, so that no test after it sees it
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == code, (proc.returncode, err[-3000:])
    assert err.strip().splitlines() == [line], err[-3000:]
    assert left == {}, left
    assert not db.exists()  # stopped before it was ready to write: nothing made
