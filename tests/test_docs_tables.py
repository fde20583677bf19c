"""Layer: pure CPU, over committed files. Every result table in README.md and docs/ is what
`python -m syncopate.docs_tables` makes from the files under results/, no measured figure appears
there outside such a table, and the generator reads a bench run as `syncopate bench` summarizes it
(bound = max(GEMM alone, the fastest collective alone), ours = the fastest verified candidate)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from syncopate import docs_tables
from syncopate.docs_tables import BLOCK, TABLES, bench_rows, blocks, documents, render
from syncopate.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]

FIGURE = re.compile(
    r"(?<![\w.])\d[\d,]*(?:\.\d+)?\s?(?:µs|us|ms|GB/s|TB/s|GiB/s|MB/s|TFLOP/s|%|×(?![\d(]))"  # a quantity with its unit
    r"|(?<![\w.])[0-2]\.\d{2,}(?!\d|\.\d)"  # a ratio such as 0.98 or 1.09 (not a version such as 2.13.0)
    r"|(?<![\w.])\d+(?:\.\d+)?\s?s\b"  # seconds
)
"""What a measured figure looks like in prose."""


def test_every_table_in_the_readme_and_docs_matches_its_data():
    found = blocks(REPO)
    stale = [f"{b.path.relative_to(REPO)}: {b.name}" for b in found if not b.current]
    assert stale == [], "run `python -m syncopate.docs_tables`"
    assert {b.name for b in found} == set(TABLES)  # every generator is quoted somewhere
    assert "summary" in {b.name for b in found if b.path == REPO / "README.md"}


def test_no_measured_figure_appears_outside_a_generated_table():
    figures = []
    for path in documents(REPO):
        for _n, line in enumerate(BLOCK.sub("", path.read_text()).splitlines(), 1):
            figures += [
                f"{path.relative_to(REPO)}: {m.group()!r} in {line.strip()!r}" for m in FIGURE.finditer(line)
            ]
    assert figures == []


def test_the_pattern_catches_figures_and_passes_versions_and_shapes():
    caught = [
        "fused 1.09–1.67× faster",
        "0.984 of the bound",
        "26 µs each",
        "380 GB/s",
        "within 3 %",
        "0.9–2.5 s a kernel",
        "820 TFLOP/s",
    ]
    passed = [
        "pip install torch==2.13.0",
        "Python ≥ 3.10",
        "8192×2048×8192",
        "w8s3",
        "`decomposed s1`",
        "comm_sms",
        "TP=4",
        "at 4096 rows",
    ]
    assert [s for s in caught if not FIGURE.search(s)] == []
    assert [s for s in passed if FIGURE.search(s)] == []


def test_a_changed_figure_is_reported_and_rewritten(tmp_path, capsys):
    (tmp_path / "results").symlink_to(REPO / "results")
    (tmp_path / "docs").mkdir()
    readme = (REPO / "README.md").read_text()
    body = re.search(r"<!-- generated: summary -->\n(.*?)<!-- end -->", readme, re.DOTALL)[1]
    ratio = re.search(r"\d\.\d{3}", body)[0]
    tampered = readme.replace(body, body.replace(ratio, "9.999", 1))
    (tmp_path / "README.md").write_text(tampered)
    assert docs_tables.main(["--root", str(tmp_path), "--check"]) == 1
    assert "table 'summary' differs from its data" in capsys.readouterr().out
    assert (tmp_path / "README.md").read_text() == tampered  # --check changes nothing
    assert docs_tables.main(["--root", str(tmp_path)]) == 0
    assert (tmp_path / "README.md").read_text() == readme
    assert docs_tables.main(["--root", str(tmp_path), "--check"]) == 0


def test_an_empty_block_is_filled_and_an_unknown_name_refused(tmp_path):
    text = "before\n<!-- generated: strategies -->\n<!-- end -->\nafter\n"
    filled = render(text, REPO)
    assert filled.startswith("before\n<!-- generated: strategies -->\n| strategy |") and filled.endswith(
        "<!-- end -->\nafter\n"
    )
    with pytest.raises(ConfigError, match=r"page.md: no generated table named 'nope'; known: summary, "):
        render("<!-- generated: nope -->\n<!-- end -->\n", REPO, "page.md")


def test_a_root_without_results_is_refused(tmp_path, capsys):
    assert docs_tables.main(["--root", str(tmp_path), "--check"]) == 2
    assert "has no results/ folder" in capsys.readouterr().err


def _bench(path: Path, rows: list[dict]) -> Path:
    path.write_text(
        json.dumps(
            {
                "topology": {"key": "H200x2-nvlink"},
                "gpu": "NVIDIA H200",
                "rows": rows,
                "environment": {"torch": "t", "triton": "tr", "nccl": "n"},
            }
        )
    )
    return path


def _trial(template: str, backend: str, splits: int, us: float, status: str = "ok") -> dict:
    return {
        "candidate": {"template": template, "backend": backend, "num_splits": splits},
        "status": status,
        "median_us": us,
    }


def test_a_bench_row_takes_the_fastest_verified_candidate_and_the_fastest_collective(tmp_path):
    base = {
        "torch_seq": 500.0,
        "torch_async_tp": 450.0,
        "gemm_alone": 300.0,
        "comm_alone": 350.0,
        "comm_alone_copy_engine": 320.0,
    }
    rows = [
        {
            "workload": {"kind": "ag_gemm", "m": 8192, "n": 2048, "k": 8192, "dtype": "bf16"},
            "baselines": {k: {"median_us": v} for k, v in base.items()},
            "trials": [
                _trial("direct", "copy_engine", 2, 340.0),
                _trial("a_stationary", "copy_engine", 1, 310.0),
                _trial("ring", "sm_copy", 4, 200.0, status="wrong_result"),
            ],
        },
        {
            "workload": {"kind": "gemm_ar", "m": 8192, "n": 4096, "k": 2048, "dtype": "bf16"},
            "baselines": {k: {"median_us": v} for k, v in base.items() if k != "torch_async_tp"},
            "trials": [_trial("direct", "nccl", 1, 1.0, status="timeout")],
        },  # nothing verified: no row
    ]
    _, got = bench_rows(_bench(tmp_path / "b.json", rows))
    assert len(got) == 1
    (row,) = got
    assert (row.kind, row.n, row.k, row.ours, row.best) == ("ag_gemm", 2048, 8192, 310.0, "a_stationary s1")
    assert (row.comm, row.bound, row.async_tp) == (320.0, 320.0, 450.0)


def test_a_missing_result_file_is_named(tmp_path):
    with pytest.raises(
        ConfigError, match=r"result file '.*absent.json' does not exist: a generated table reads it"
    ):
        bench_rows(tmp_path / "absent.json")


def test_the_generator_reads_no_file_outside_results(tmp_path):
    """A copy of results/ alone, nothing else of the repository, makes every table."""
    shutil.copytree(REPO / "results", tmp_path / "results")
    for name, make in TABLES.items():
        assert make(tmp_path) == make(REPO), name


def test_a_step_ceiling_refuses_a_database_without_the_runs_token_count(tmp_path):
    """The ceiling sums a layer's ops at the step's token count: a database that holds none there is
    named, not summed as zero."""
    db = tmp_path / "ops.db"
    shutil.copy(REPO / "results" / "llama-3-8b-tp2-h100.db", db)
    ops, seq, ours, bound = docs_tables._layer_op_sums(db, 8192)
    assert ops == 8 and seq > ours > 0 and seq > bound > 0
    with pytest.raises(ConfigError, match="holds no measured op at M = 1024"):
        docs_tables._layer_op_sums(db, 1024)
