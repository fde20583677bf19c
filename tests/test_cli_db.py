"""Layer: CLI on the CPU. `syncopate lookup`, `best`, `export` and `db upgrade` against SQLite files:
answers, tables, atomic export, and one-line errors with exit code 2 that write nothing.

Most commands run in this process (`syncopate.cli.main`), which keeps torch imported once; two tests
run the real `python -m syncopate` (end to end, and with its output piped)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import sqlalchemy as sa
from db_data import TOPO, W, baseline, trial, workload

from syncopate.cli import main
from syncopate.records import Environment
from syncopate.results_db import ResultsDB
from syncopate.results_db.lookups import clear_cache
from syncopate.results_db.schema import HEAD, VERSION_TABLE

TOPOLOGY = ["--topology", "H200x2-nvlink"]
SHAPE = ["--m", "8192", "--n", "4096", "--k", "8192"]


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    monkeypatch.delenv("SYNCOPATE_DB", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    clear_cache()
    yield
    clear_cache()


def cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def populated(tmp_path):
    """A database with this machine's environment: two shapes, baselines in the same sweep."""
    env = Environment.current()
    path = tmp_path / "results.db"
    with ResultsDB.open(path, upgrade=True) as db:
        sweep = db.start_sweep("s")
        db.record_trials(
            sweep,
            [
                trial(0, env=env, median_us=1600.0),
                trial(1, env=env, median_us=1500.0),
                trial(2, env=env, status="oom"),
            ],
        )
        db.record_trial(sweep, trial(4, env=env, w=workload(n=2048), median_us=400.0))
        db.record_baseline(sweep, baseline("torch_seq", 1770.0, env=env))
        db.record_baseline(sweep, baseline("gemm_alone", 1531.0, env=env))
        db.record_baseline(sweep, baseline("comm_alone", 336.0, env=env))
    return path


def test_lookup_json_end_to_end(tmp_path, populated):
    empty = tmp_path / "empty.db"
    with ResultsDB.open(empty, upgrade=True):
        pass
    for db, match in ((empty, "cost_model"), (populated, "exact")):
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "syncopate",
                "lookup",
                "--kind",
                "ag_gemm",
                *SHAPE,
                "--dtype",
                "bf16",
                *TOPOLOGY,
                "--db",
                str(db),
                "--json",
            ],
            capture_output=True,
            text=True,
        )
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        more = (
            ["eager_us", "host_us", "measured_on", "measured_topology", "environment", "environment_versions"]
            if match == "exact"
            else ["predicted_us", "database_holds"]
        )
        assert list(doc) == [
            "candidate",
            "match",
            "mode",
            "objective",
            "reason",
            "trial_id",
            "time_us",
            *more,
        ]
        assert doc["match"] == match and doc["mode"] == "eager" and doc["reason"]
    assert (doc["time_us"], doc["candidate"]["block_m"]) == (1500.0, 128)


def test_lookup_nearest_shape_and_export_file(capsys, populated, tmp_path):
    code, out, _ = cli(
        capsys,
        "lookup",
        "--m",
        "8192",
        "--n",
        "3072",
        "--k",
        "8192",
        *TOPOLOGY,
        "--db",
        str(populated),
        "--json",
    )
    assert (
        code == 0
        and json.loads(out)["match"] == "nearest_shape"
        and json.loads(out)["measured_on"] == "8192x4096x8192"
    )
    code, out, _ = cli(
        capsys, "lookup", "--m", "8192", "--n", "3072", "--k", "8192", *TOPOLOGY, "--db", str(populated)
    )
    assert code == 0 and "nearest_shape from trial" in out and "on (M=8192, N=4096, K=8192)" in out
    code, out, _ = cli(
        capsys, "export", "--db", f"sqlite:///{populated}", "--out", str(tmp_path / "best.json")
    )
    assert code == 0 and "wrote 2 best configurations" in out
    code, out, _ = cli(capsys, "lookup", *SHAPE, *TOPOLOGY, "--db", str(tmp_path / "best.json"), "--json")
    assert code == 0 and json.loads(out)["time_us"] == 1500.0
    code, out, _ = cli(capsys, "lookup", *SHAPE, *TOPOLOGY, "--db", str(populated))
    assert code == 0 and "exact from trial 2 (1500.0 µs)" in out
    code, out, _ = cli(capsys, "lookup", *SHAPE, "--topology", "H100x2-nvlink", "--db", str(populated))
    assert code == 0 and "other_topology from trial 2 (1500.0 µs on H200x2-nvlink, under torch" in out
    code, out, _ = cli(capsys, "lookup", *SHAPE, "--topology", "H100x8-nvswitch", "--db", str(populated))
    assert code == 0 and "cost_model (predicted" in out and "The database holds 3 measured trials" in out
    assert "None" not in out and "False" not in out


def test_best_shows_speedups_over_the_sweeps_baselines(capsys, populated):
    code, out, _ = cli(capsys, "best", "--db", str(populated), "--json")
    assert code == 0
    rows = {row["workload"]: row for row in json.loads(out)}
    row = rows[W.key()]
    assert row["median_us"] == 1500.0 and row["topology"] == TOPO.key()
    assert row["speedups"] == pytest.approx(
        {"comm_alone": 336 / 1500, "gemm_alone": 1531 / 1500, "torch_seq": 1770 / 1500}
    )
    assert row["of_bound"] == pytest.approx(1531 / 1500)
    assert rows[workload(n=2048).key()]["speedups"] == {}
    code, out, _ = cli(capsys, "best", "--db", str(populated))
    assert code == 0
    assert "× torch_seq" in out and "1.18" in out and "ag_gemm/8192x2048x8192/bf16" in out


def test_best_tells_apart_environments_that_differ_in_one_version(capsys, tmp_path):
    import dataclasses

    from db_data import ENV

    newer = dataclasses.replace(ENV, nccl="2.29.1")
    path = tmp_path / "two.db"
    with ResultsDB.open(path, upgrade=True) as db:
        sweep = db.start_sweep("s")
        db.record_trials(sweep, [trial(0, env=ENV, median_us=1600.0), trial(1, env=newer, median_us=1500.0)])
    code, out, _ = cli(capsys, "best", "--db", str(path))
    assert code == 0
    # each row names its environment by key (the rows hold two), and a legend line says what each key is
    rows = [line.split() for line in out.splitlines() if line.startswith(W.key())]
    assert sorted(row[1] for row in rows) == sorted([ENV.key()[:8], newer.key()[:8]])
    assert f"env {ENV.key()[:8]}: {ENV.short()}" in out and f"env {newer.key()[:8]}: {newer.short()}" in out


def test_best_on_an_unused_default_database_says_so_and_creates_nothing(capsys, tmp_path):
    code, out, _ = cli(capsys, "best")
    assert code == 0 and "no results stored yet" in out
    assert not (tmp_path / "xdg").exists()


def test_db_upgrade_creates_then_has_nothing_to_do(capsys, tmp_path):
    path = tmp_path / "sub" / "new.db"
    code, out, _ = cli(capsys, "db", "upgrade", "--db", str(path))
    assert code == 0 and f"upgraded from nothing to revision {HEAD}" in out
    code, out, _ = cli(capsys, "db", "upgrade", "--db", f"sqlite:///{path}")
    assert code == 0 and "nothing to do" in out


def test_export_replaces_atomically_and_a_failed_export_writes_nothing(capsys, populated, tmp_path):
    out_file = tmp_path / "best.json"
    out_file.write_text("previous")
    assert cli(capsys, "export", "--db", str(populated), "--out", str(out_file))[0] == 0
    assert json.loads(out_file.read_text())["format"] == "syncopate-best"
    before = sorted(p.name for p in tmp_path.iterdir())
    (tmp_path / "empty.db").touch()
    code, _, err = cli(
        capsys, "export", "--db", str(tmp_path / "empty.db"), "--out", str(tmp_path / "new.json")
    )
    assert code == 1 and "syncopate db upgrade --db" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(before + ["empty.db"])
    code, _, err = cli(capsys, "export", "--db", str(populated), "--out", str(tmp_path / "no" / "best.json"))
    assert code == 2 and "folder" in err and "does not exist" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(before + ["empty.db"])
    code, _, err = cli(capsys, "export", "--db", str(populated), "--out", "/proc/best.json")
    assert (
        code == 2
        and err.startswith("syncopate: error: cannot write /proc/best.json")
        and err.count("\n") == 1
    ), err


def test_best_and_export_leave_the_database_file_as_it_was(capsys, populated, tmp_path):
    import sqlite3

    with sqlite3.connect(populated) as connection:  # as a committed file is: not in WAL mode
        connection.execute("PRAGMA journal_mode = DELETE")
    before = populated.read_bytes()
    assert cli(capsys, "best", "--db", str(populated))[0] == 0
    assert cli(capsys, "export", "--db", str(populated), "--out", str(tmp_path / "best.json"))[0] == 0
    assert populated.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.json", "results.db"]


def _newer(path):
    with ResultsDB.open(path, upgrade=True):
        pass
    engine = sa.create_engine(f"sqlite:///{path}")
    with engine.begin() as c:
        c.execute(sa.text(f"UPDATE {VERSION_TABLE} SET version_num = 'abc123'"))
    engine.dispose()
    return path


@pytest.mark.parametrize(
    "args, message, code",
    [
        (["lookup", "--kind", "mm", *SHAPE, *TOPOLOGY], "unknown kind 'mm'", 2),
        (["lookup", "--m", "0", "--n", "8", "--k", "8", *TOPOLOGY], "M=0 must be positive", 2),
        (["lookup", *SHAPE, "--dtype", "int8", *TOPOLOGY], "unknown dtype 'int8'", 2),
        (["lookup", *SHAPE, "--topology", "H200x3-wifi"], "unknown interconnect 'wifi'", 2),
        (
            ["lookup", *SHAPE, *TOPOLOGY, "--db", "{tmp}/absent.db"],
            "absent.db does not exist: check the path",
            1,
        ),
        (["lookup", *SHAPE, *TOPOLOGY, "--db", "{tmp}/bad.json"], "is not valid JSON", 1),
        (["lookup", *SHAPE, *TOPOLOGY, "--db", "mysql://u@h/db"], "is not supported", 2),
        (["best", "--db", "{tmp}/empty.db"], "has no Syncopate tables: run `syncopate db upgrade --db", 1),
        (["best", "--db", "postgresql+psycopg://nobody:secret@127.0.0.1:1/none"], "cannot open database", 1),
        (["db", "upgrade", "--db", "{newer}"], "newer than this version of Syncopate", 1),
        (["export", "--db", "{tmp}/absent.db", "--out", "{tmp}/x.json"], "does not exist", 1),
        (["export", "--out", "{tmp}"], "it is a directory; give a file name, such as {tmp}/best.json", 2),
        (
            ["export", "--out", "{tmp}/bad.json/best.json"],
            "cannot write {tmp}/bad.json/best.json: {tmp}/bad.json is a file, not a folder",
            2,
        ),
        (["best", "--db", "{tmp}"], "is a directory: give a file in it, such as", 1),
        (["best", "--db", "{tmp}/bad.json"], "bad.json is not a SQLite database file", 1),
        (
            ["best", "--db", "{tmp}/bad.json"],
            "only `syncopate lookup` reads (given as a path): give the results database",
            1,
        ),
        (["export", "--db", "{tmp}/bad.json", "--out", "{tmp}/x.json"], "only `syncopate lookup` reads", 1),
        (["db", "upgrade", "--db", "{tmp}/bad.json"], "bad.json is not a SQLite database file", 1),
        (["db", "upgrade", "--db", "{tmp}"], "is a directory", 1),
        (["db", "upgrade", "--db", "sqlite://"], "is in memory: an upgrade there keeps nothing", 2),
        (["best", "--db", "sqlite://"], "is in memory: it holds nothing between commands", 1),
        (["lookup", *SHAPE, *TOPOLOGY, "--db", "{tmp}"], "is a directory", 1),
        (["best", "--db", "{tmp}/no/such/results.db"], "does not exist, nor does its folder", 1),
    ],
)
def test_bad_input_gives_one_line_and_its_exit_code(capsys, tmp_path, args, message, code):
    """A value that is invalid as given exits 2 (as a usage error does); a database that cannot be
    used as it is, 1."""
    (tmp_path / "bad.json").write_text("{oops")
    (tmp_path / "empty.db").touch()
    newer = _newer(tmp_path / "newer.db") if "{newer}" in args else None
    args = [a.format(tmp=tmp_path, newer=newer) for a in args]
    listing = sorted(p.name for p in tmp_path.iterdir())
    got, _, err = cli(capsys, *args)
    assert got == code, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("syncopate: error: "), err
    assert message.format(tmp=tmp_path) in lines[0]
    assert "secret" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == listing  # nothing written


def test_a_database_named_by_the_variable_is_said_to_come_from_it(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("SYNCOPATE_DB", str(tmp_path / "absent.db"))
    code, _, err = cli(capsys, "best")
    assert code == 1 and f"database {tmp_path / 'absent.db'} (from $SYNCOPATE_DB) does not exist" in err
    assert f"`syncopate db upgrade --db {tmp_path / 'absent.db'}`" in err
    monkeypatch.setenv("SYNCOPATE_DB", "mysql://u@h/db")
    code, _, err = cli(capsys, "best")
    assert code == 2 and "(from $SYNCOPATE_DB) is not supported" in err


def test_piped_output_keeps_lines_and_columns_whole(tmp_path, populated):
    """Piped into grep or a file, a long database URL stays on one line and a table keeps its numbers."""
    deep = tmp_path / ("a-rather-long-folder-name-" * 4) / "results.db"
    deep.parent.mkdir()
    deep.write_bytes(populated.read_bytes())
    r = subprocess.run(
        [sys.executable, "-m", "syncopate", "export", "--db", str(deep), "--out", str(tmp_path / "b.json")],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.strip().splitlines()) == 1 and str(deep) in r.stdout
    r = subprocess.run(
        [sys.executable, "-m", "syncopate", "space", *SHAPE, *TOPOLOGY, "--predict", "3"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    header = lines.index(next(line for line in lines if line.startswith("rank")))
    rows = lines[header + 1 :]
    assert len(rows) == 3 and all(row.split()[0] == str(i) for i, row in enumerate(rows, 1)), r.stdout
    assert all(len(row.split()) >= 4 for row in rows) and not any(ch in r.stdout for ch in "│─┃━"), r.stdout


def test_a_gpu_model_outside_the_table_is_filtered_by_its_key(capsys, tmp_path):
    """A detected GPU that the datasheet table does not know (its SMs and memory read off the device)
    is stored under its own key, and `best --topology KEY` and the report's filter find it."""
    from syncopate.dashboard.data import Filters
    from syncopate.search_space import Topology

    l4 = Topology(world_size=2, gpu_model="L4", interconnect="pcie", sm_count=58, memory_gb=24)
    path = tmp_path / "l4.db"
    with ResultsDB.open(path, upgrade=True) as db:
        db.record_trial(db.start_sweep("s"), trial(0, topo=l4, median_us=900.0))
    code, out, err = cli(capsys, "best", "--db", str(path), "--topology", "L4x2-pcie", "--json")
    assert code == 0, err
    assert [row["topology"] for row in json.loads(out)] == ["L4x2-pcie"]
    assert Filters(topologies=("L4x2-pcie", "h200x2-nvlink")).topologies == ("L4x2-pcie", "H200x2-nvlink")
    code, _, err = cli(
        capsys, "report", "--db", str(path), "--topology", "L4x2-pcie", "--out", str(tmp_path / "r.html")
    )
    assert code == 0, err
    assert "L4x2-pcie" in (tmp_path / "r.html").read_text()
