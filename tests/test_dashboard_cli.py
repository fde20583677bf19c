"""Layer: CLI on the CPU. `syncopate report` writes one self-contained HTML file of the dashboard's
views (tables, inline SVG charts, no network needed) or fails with one line and writes nothing;
`syncopate dashboard` checks its port, database URL and extra before handing over to Streamlit."""

from __future__ import annotations

import re
import socket
import sys

import dashboard_data as fx
import pytest

from syncopate.cli import main
from syncopate.dashboard import serve as serve_module


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    monkeypatch.delenv("SYNCOPATE_DB", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    return fx.build(tmp_path_factory.mktemp("report") / "results.db")


def cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


# ---- report -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_report_is_self_contained(capsys, tmp_path, url):
    pytest.importorskip("vl_convert", reason="the dashboard extra (vl-convert) is not installed")
    out = tmp_path / "report.html"
    code, stdout, err = cli(capsys, "report", "--db", url, "--out", str(out))
    assert code == 0, err
    assert stdout.startswith(f"wrote {out} (") and out.stat().st_mode & 0o044 == 0o044
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert not re.search(
        r"<script[^>]+src=|<link[^>]+href=|https?://(?!www\.w3\.org)", page
    )  # nothing fetched
    assert page.count("<svg") >= 3 + 4  # three overview charts, a drill-down's four
    for text in (
        "Overview: best configuration per shape",
        fx.CE2.short(),
        "H100x8-nvswitch",
        fx.OOM_ERROR,
        fx.COMPILE_ERROR,
        "Sweep 2 (A) against sweep 3 (B)",
        "2.12.0+cu130",
        "ag_gemm 8192×2048×8192 bf16 · H200x2-nvlink · " + fx.ENV.key()[:8] + " · measured",
    ):
        assert text in page, text
    assert "<td>1.5</td>" in page and "<td>0.75</td>" in page  # × torch_seq and of bound of W1


def test_report_leaves_the_database_file_as_it_was(capsys, tmp_path, url):
    import shutil
    import sqlite3

    db = tmp_path / "results.db"
    shutil.copy(url.removeprefix("sqlite:///"), db)
    with sqlite3.connect(db) as connection:  # as a committed file is: not in WAL mode
        connection.execute("PRAGMA journal_mode = DELETE")
    before = db.read_bytes()
    code, _, err = cli(
        capsys, "report", "--db", str(db), "--out", str(tmp_path / "r.html"), "--drill-down", "0"
    )
    assert code == 0, err
    assert db.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.html", "results.db"]


def test_report_filters_and_compare(capsys, tmp_path, url, monkeypatch):
    monkeypatch.setitem(sys.modules, "vl_convert", None)  # charts as specs: fast, and the fallback's test
    out = tmp_path / "predicted.html"
    code, _, err = cli(
        capsys,
        "report",
        "--db",
        url,
        "--out",
        str(out),
        "--source",
        "predicted",
        "--compare",
        "1,2",
        "--drill-down",
        "0",
        "--environment",
        fx.ENV.key()[:8],
    )
    assert code == 0, err
    page = out.read_text()
    assert "source predicted" in page and "environment " + fx.ENV.key()[:8] in page
    overview = page.split('id="overview"')[1].split('id="sweeps"')[0]
    assert "predicted" in overview and "measured</td>" not in overview
    assert "Sweep 1 (A) against sweep 2 (B)" in page and 'id="shape-0"' not in page
    assert "vl-convert is not installed" in page and "vegaEmbed" in page  # the fallback says so


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--compare", "1"], "--compare '1' must be two sweep ids"),
        (["--compare", "1,9"], "sweep 9 does not exist"),
        (["--compare", "1,1"], "--compare '1,1' names sweep 1 twice: give two different sweep ids"),
        (["--environment", "ffff"], "environment 'ffff' matches 0 of the stored environments"),
        (["--source", "guessed"], "unknown source 'guessed'"),
        (["--kind", "foo"], "unknown kind 'foo' in the filter: accepted are ag_gemm, gemm_rs, gemm_ar"),
        (["--dtype", "int8"], "unknown dtype 'int8'"),
        (["--topology", "H200x2"], "topology key 'H200x2' does not parse"),
        (["--out", "{tmp}"], "it is a directory; give a file name, such as {tmp}/report.html"),
        (["--out", "{tmp}/no/r.html"], "folder {tmp}/no does not exist"),
        (["--out", "/proc/r.html"], "cannot write /proc/r.html"),
    ],
)
def test_report_refuses_bad_options_and_writes_nothing(capsys, tmp_path, url, args, message, monkeypatch):
    monkeypatch.setitem(sys.modules, "vl_convert", None)
    out = tmp_path / "r.html"
    args = [a.format(tmp=tmp_path) for a in args]
    message = message.format(tmp=tmp_path)
    code, _, err = cli(capsys, "report", "--db", url, "--out", str(out), *args)
    assert code == 2 and message in err and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def test_report_on_an_empty_missing_or_old_database(capsys, tmp_path, monkeypatch):
    empty = fx.build_empty(tmp_path / "empty.db")
    code, _, err = cli(capsys, "report", "--db", empty, "--out", str(tmp_path / "r.html"))
    assert code == 2 and "no trials in" in err and "syncopate tune configs/quickstart.yaml --db" in err
    code, _, err = cli(capsys, "report", "--db", str(tmp_path / "none.db"), "--out", str(tmp_path / "r.html"))
    assert code == 1 and "does not exist" in err
    from syncopate.results_db import schema

    future = f"{int(schema.HEAD) + 1:04d}"  # a revision after this database's, that it cannot be read at
    monkeypatch.setattr(schema, "REVISIONS", (*schema.REVISIONS, future))
    monkeypatch.setattr(schema, "HEAD", future)
    code, _, err = cli(capsys, "report", "--db", empty, "--out", str(tmp_path / "r.html"))
    assert code == 1 and f"run `syncopate db upgrade --db {empty}`" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.db"]


# ---- dashboard --------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_dashboard_port_in_use_is_one_line_and_exit_2(capsys, url):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, out, err = cli(capsys, "dashboard", "--db", url, "--port", str(port))
    assert code == 2 and out == ""
    assert (
        err
        == f"syncopate: error: port {port} on 127.0.0.1 is in use: stop what listens there or pick another "
        f"with --port\n"
    )


@pytest.mark.parametrize(
    ("args", "message", "exit_code"),
    [
        (["--port", "70000"], "port 70000 is not a TCP port", 2),
        (["--host", "no-such-host.invalid"], "host 'no-such-host.invalid' does not resolve", 2),
        (["--db", "mysql://x/y"], "database URL 'mysql://x/y' is not supported", 2),
        (["--db", "{tmp}"], "is a directory: give a file in it", 1),
        (["--db", "sqlite://"], "is in memory", 1),
        (["--db", "{tmp}/notes.txt"], "notes.txt is not a SQLite database file", 1),
    ],
)
def test_dashboard_refuses_bad_options(capsys, tmp_path, args, message, exit_code):
    (tmp_path / "notes.txt").write_text("not a database\n")
    args = [a.format(tmp=tmp_path) for a in args]
    code, _, err = cli(capsys, "dashboard", *args)
    assert code == exit_code and message in err and err.count("\n") == 1


def test_dashboard_without_the_extra(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "streamlit", None)
    code, _, err = cli(capsys, "dashboard")
    assert code == 1 and "pip install 'syncopate[dashboard]'" in err


def test_dashboard_hands_over_to_streamlit(capsys, monkeypatch, url):
    calls = []

    def execv(path, argv):
        calls.append(argv)
        raise SystemExit(0)

    monkeypatch.setattr(serve_module.os, "execv", execv)
    port = free_port()
    code, _, err = cli(capsys, "dashboard", "--db", url, "--port", str(port), "--host", "127.0.0.1")
    assert code == 0 and f"on http://127.0.0.1:{port}" in err
    argv = calls[0]
    assert argv[:5] == [sys.executable, "-m", "streamlit", "run", str(serve_module.APP)]
    assert argv[argv.index("--server.port") + 1] == str(port)
    assert argv[argv.index("--server.headless") + 1] == "true"
    assert argv[argv.index("--browser.gatherUsageStats") + 1] == "false"
    assert argv[-3:] == ["--", "--db", url]
