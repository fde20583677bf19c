"""Layer: CLI on the CPU. What a person sees of a table: at 80, 100, 120 and 200 columns of a
terminal (rich's Console, as a terminal), piped (not a terminal), and as `--json`.

The workload's shape and the chosen configuration must always be readable: each appears whole on
one line, whatever the width; a terminal line never runs past the terminal's width unless one value
alone is longer; piped output is a header and one line per row, with no box drawing.
"""

from __future__ import annotations

import io
import json
import re
from datetime import datetime, timezone

import dashboard_data as fx
import pytest
from rich.console import Console

from syncopate.autotuner.progress import WorkloadSummary
from syncopate.autotuner.strategies import StudyContinued
from syncopate.autotuner.tune import TuneResult
from syncopate.cli import main
from syncopate.cli.tables import Column, Listing, show
from syncopate.cli.tune_cmds import summary_json, summary_listing
from syncopate.records import TrialRecord
from syncopate.search_space import Candidate, Shape, Topology, Workload

WIDTHS = (80, 100, 120, 200)
BOXES = "│┃─━┏┓┗┛┡┩└┘├┤┼╇"
ANSI = re.compile(r"\x1b\[[0-9;]*m")

LONG = Candidate(backend="sm_copy", num_splits=2, comm_sms=32, tile_order="arrival_colmajor")
"""A configuration with a long short form (62 characters)."""
TYPICAL = Candidate(backend="copy_engine", num_splits=1, tile_order="arrival", block_n=256, group_m=4)
"""What the quickstart's search finds (50 characters)."""


def _terminal(width: int) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=width, force_terminal=True, color_system=None), out


def _piped() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=False), out


def _whole(text: str, value: str) -> bool:
    """Whether `value` appears whole within one line of `text`."""
    return any(value in line for line in ANSI.sub("", text).splitlines())


def _summary(workload: Workload, candidate: Candidate, best: float, **extra) -> WorkloadSummary:
    topo = Topology.from_key("H200x2-nvlink")
    trial = TrialRecord(
        workload=workload,
        topology=topo,
        environment=fx.ENV,
        candidate=candidate,
        status="ok",
        median_us=best,
        created_at=datetime(2026, 11, 22, tzinfo=timezone.utc),
    )
    return WorkloadSummary(
        workload=workload.key(),
        planned=24,
        stored_before=0,
        measured=24,
        failures=extra.pop("failures", {}),
        best=trial,
        torch_seq_us=best * 1.4,
        bound_us=best * 0.9,
        **extra,
    )


def _tune_result(source: str = "measured", long: Candidate = LONG) -> TuneResult:
    a = Workload(kind="gemm_rs", shape=Shape(m=8192, n=8192, k=29568), dtype="bf16")
    b = Workload(kind="ag_gemm", shape=Shape(m=8192, n=11008, k=4096), dtype="bf16")
    return TuneResult(
        sweep_id=3,
        sweep_name="llama",
        status="done",
        resumed=False,
        topology="H200x2-nvlink",
        environment=fx.ENV,
        runner="model" if source == "predicted" else "gpu",
        source=source,
        summaries=[
            _summary(a, long, 2539.7, failures={"oom": 2, "timeout": 1}),
            _summary(
                b, TYPICAL, 493.3, continued=StudyContinued(name="syncopate/study", trials=24, best_us=480.0)
            ),
        ],
    )


# ---- the layouts ---------------------------------------------------------------------------------


def _listing() -> Listing:
    rows = [
        ("gemm_rs/8192x8192x29568/bf16", "H200x2-nvlink", LONG.short(), "2539.7", "1.13", "17"),
        ("ag_gemm/8192x2048x8192/bf16", "H100x8-nvswitch", fx.CE2.short(), "426.6", "1.09", "4"),
    ]
    return Listing(
        title="best configurations in results.db",
        columns=(
            Column(name="workload", key=True),
            Column(name="topology"),
            Column(name="best configuration", key=True),
            Column(name="median µs", numeric=True),
            Column(name="× torch_seq", numeric=True),
            Column(name="trial", numeric=True, wide=True),
        ),
        rows=rows,
        records=[{"workload": r[0], "median_us": float(r[3])} for r in rows],
    )


@pytest.mark.parametrize("width", WIDTHS)
def test_a_terminal_of_any_width_shows_every_key_value_whole(width):
    console, out = _terminal(width)
    show(_listing(), console)
    text = out.getvalue()
    for row in _listing().rows:
        assert _whole(text, row[0]) and _whole(text, row[2]), text
        assert _whole(text, row[3]) and _whole(text, row[4]), text
    assert all(len(line) <= width for line in text.splitlines()), text
    table = any(set(line) == {"─"} for line in text.splitlines())
    # a table where its columns fit: 28 + 15 + 62 + 6 + 9 characters (the last two headers wrapped at
    # their space) and 4 gaps of 2 make 128; narrower, a block of lines per row
    assert table == (width >= 128), text
    assert "17" not in ANSI.sub("", text).split()  # the wide column stays out by default


def test_wide_adds_the_wide_columns_and_still_fits_or_falls_back():
    console, out = _terminal(120)
    show(_listing(), console, wide=True)
    text = out.getvalue()
    assert "trial 17" in " ".join(text.split()) and all(len(line) <= 120 for line in text.splitlines())
    console, out = _terminal(200)
    show(_listing(), console, wide=True)
    assert "trial" in out.getvalue().splitlines()[1]


def test_piped_output_is_one_plain_line_per_row():
    console, out = _piped()
    show(_listing(), console)
    lines = out.getvalue().splitlines()
    assert lines[0] == "best configurations in results.db"
    assert lines[1].split()[:2] == ["workload", "topology"]
    assert len(lines) == 4 and not any(ch in out.getvalue() for ch in BOXES)
    for line, row in zip(lines[2:], _listing().rows):
        assert line.startswith(row[0]) and row[2] in line and line.endswith(row[4])


def test_json_prints_the_records():
    console, out = _terminal(80)
    show(_listing(), console, as_json=True)
    assert json.loads(out.getvalue()) == _listing().records


# ---- the commands' tables ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fixture_db(tmp_path_factory):
    return fx.build(tmp_path_factory.mktemp("tables") / "results.db")


def _cli(capsys, monkeypatch, width: int | None, *args: str) -> str:
    """Run the CLI in-process on a terminal of `width` columns (None: piped); its stdout."""
    if width is None:
        monkeypatch.delenv("TTY_COMPATIBLE", raising=False)
    else:
        monkeypatch.setenv("TTY_COMPATIBLE", "1")
        monkeypatch.setenv("COLUMNS", str(width))
    monkeypatch.setenv("NO_COLOR", "1")
    code = main(list(args))
    out, err = capsys.readouterr()
    assert code == 0, err
    return ANSI.sub("", out)


@pytest.mark.parametrize("width", [80, 120, 200, None])
def test_best_keeps_the_shape_and_configuration_whole(capsys, monkeypatch, fixture_db, width):
    out = _cli(capsys, monkeypatch, width, "best", "--db", fixture_db)
    rows = json.loads(_cli(capsys, monkeypatch, width, "best", "--db", fixture_db, "--json"))
    assert len(rows) == 5
    for row in rows:
        config = Candidate.from_dict(row["candidate"]).short()
        assert _whole(out, row["workload"]) and _whole(out, config), out
    if width is None:
        assert not any(ch in out for ch in BOXES)
        for row in rows:  # a row is one line: grep for the shape finds its configuration
            config = Candidate.from_dict(row["candidate"]).short()
            assert any(row["workload"] in line and config in line for line in out.splitlines()), out
    else:
        assert all(len(line) <= width for line in out.splitlines()), out


@pytest.mark.parametrize("width", [80, 120, 200, None])
def test_the_tune_summary_keeps_the_shape_and_configuration_whole(width):
    console, out = _terminal(width) if width else _piped()
    show(summary_listing(_tune_result()), console)
    text = out.getvalue()
    for s in _tune_result().summaries:
        assert _whole(text, s.workload) and _whole(text, s.best.candidate.short()), text
    if width is None:
        assert not any(ch in text for ch in BOXES) and len(text.splitlines()) == 4
    else:
        assert all(len(line) <= width for line in text.splitlines()), text
    assert "timeout" not in text  # the failures by status are a wide column


def test_the_tune_summary_fits_100_columns_with_a_typical_configuration():
    console, out = _terminal(100)
    show(summary_listing(_tune_result("predicted", long=TYPICAL)), console)
    lines = out.getvalue().splitlines()
    rule = next(i for i, line in enumerate(lines) if set(line) == {"─"})
    assert len(lines[rule]) <= 100 and "predicted" in " ".join(lines[:rule])  # the times say what they are
    assert len(lines) == rule + 3


def test_tune_json_carries_every_number_and_the_continued_study():
    doc = json.loads(json.dumps(summary_json(_tune_result())))
    assert [w["workload"] for w in doc["workloads"]] == [
        "gemm_rs/8192x8192x29568/bf16",
        "ag_gemm/8192x11008x4096/bf16",
    ]
    first, second = doc["workloads"]
    assert first["failures"] == {"oom": 2, "timeout": 1} and first["candidate"] == LONG.to_dict()
    assert second["continued_study"] == {"name": "syncopate/study", "trials": 24, "best_us": 480.0}
    assert doc["served"] is True and doc["sweep_id"] == 3


def test_validate_and_space_predict_print_json(capsys, monkeypatch):
    doc = json.loads(_cli(capsys, monkeypatch, None, "validate", "configs/quickstart.yaml", "--json"))
    assert doc["name"] == "quickstart" and [w["candidates"] for w in doc["workloads"]] == [967, 967]
    ranked = json.loads(
        _cli(
            capsys,
            monkeypatch,
            None,
            "space",
            "--m",
            "8192",
            "--n",
            "4096",
            "--k",
            "8192",
            "--topology",
            "H200x2-nvlink",
            "--predict",
            "2",
            "--json",
        )
    )
    assert [r["rank"] for r in ranked] == [1, 2] and ranked[0]["predicted_us"] <= ranked[1]["predicted_us"]
    assert Candidate.from_dict(ranked[0]["candidate"])


def test_the_calibration_table_names_its_figures():
    from syncopate.cli.calibrate_cmds import calibration_listing
    from syncopate.records import CalibrationRecord

    topo = Topology.from_key("H200x2-nvlink")
    records = [
        CalibrationRecord(
            kind="transfer",
            topology=topo,
            environment=fx.ENV,
            key="copy_engine/push",
            payload={"curves": {"0": {"sizes": [1 << 20, 256 << 20], "us": [10.0, 700.0]}}},
        ),
        CalibrationRecord(
            kind="gemm",
            topology=topo,
            environment=fx.ENV,
            key="128x256x64w8s3",
            payload={"tflops_by_sms": {"66": 350.0, "132": 690.0}},
        ),
    ]
    listing = calibration_listing(records, None, "stored 2 calibration(s)")
    console, out = _piped()
    show(listing, console)
    lines = out.getvalue().splitlines()
    assert lines[2].split()[:4] == ["copy_engine/push", "sms=0", "at", "256"] and "383 GB/s" in lines[2]
    assert lines[3].startswith("gemm 128x256x64w8s3 on 132 SMs") and "690 TFLOP/s" in lines[3]
    assert [r["kind"] for r in listing.records] == ["transfer", "gemm"]
