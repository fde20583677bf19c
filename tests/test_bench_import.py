"""Layer: pure CPU logic. `syncopate import-bench` and `results_db.bench_import` on the bench file
measured on two H200s (results/bench-2026-11-22-h200x2-ag2048.json): what is stored, idempotence,
the environment it is stored under, files it refuses; and `results/h200x2.db` holds exactly the
imports of the two-GPU bench files under results/ (that one, the LLaMA TP=2 suite's two of
2026-11-22 and its two runs of 2026-11-26 with the cuBLAS templates), `results/h200x4.db` those of
the TP=4 suite's two runs of 2026-11-26 and three of 2026-11-27, and `lookup` on each serves the
fastest trial measured."""

from __future__ import annotations

import json
import shutil
from datetime import datetime, timezone
from pathlib import Path

import pytest

from syncopate.cli import main
from syncopate.dashboard import data
from syncopate.errors import ConfigError
from syncopate.records import Environment
from syncopate.results_db import ResultsDB
from syncopate.results_db.bench_import import import_bench, quantile

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "results" / "bench-2026-11-22-h200x2-ag2048.json"
H200X2_DB = ROOT / "results" / "h200x2.db"
SUITE = [
    *(ROOT / "results" / f"bench-2026-11-22-h200x2-suite-{part}.json" for part in ("ag", "rs")),
    ROOT / "results" / "bench-2026-11-26-h200x2-suite.json",
    ROOT / "results" / "bench-2026-11-26-h200x2-suite-2.json",
]
"""Bench files that record their environment themselves (no versions to give on import)."""
H200X4_DB = ROOT / "results" / "h200x4.db"
SUITE4 = [
    ROOT / "results" / f"bench-2026-11-2{day}-h200x4-suite{part}.json"
    for day, part in (("6", ""), ("6", "-2"), ("7", ""), ("7", "-ar"), ("7", "-rs"))
]
"""The TP=4 suite runs `results/h200x4.db` holds."""
VERSIONS = {"triton": "3.6.0", "cuda": "13.0", "nccl": "2.28.3", "driver": "580.159.04"}
FLAGS = [x for k, v in VERSIONS.items() for x in (f"--{k}", v)]
ENV = Environment(syncopate="0.1.0", torch="2.11.0+cu130", gpu_model="H200", **VERSIONS)


@pytest.fixture
def db(tmp_path):
    with ResultsDB.open(tmp_path / "r.db", upgrade=True) as rdb:
        yield rdb


def test_quantile_matches_the_timing_rule():
    assert quantile([4.0, 1.0, 3.0, 2.0, 5.0], 0.2) == pytest.approx(1.8)
    assert quantile([7.0], 0.8) == 7.0
    with pytest.raises(ConfigError):
        quantile([], 0.5)


def test_import_stores_every_candidate_and_baseline(db):
    result = import_bench(db, BENCH, syncopate="0.1.0", **VERSIONS)
    assert result.created and (result.workloads, result.trials, result.baselines) == (1, 8, 5)
    assert result.environment == ENV and result.topology.key() == "H200x2-nvlink"
    sweep = db.sweep(result.sweep_id)
    assert sweep.name.startswith("bench:") and sweep.host == "vm" and sweep.status == "done"
    assert sweep.finished_at == datetime(2026, 11, 22, 0, 23, 30, tzinfo=timezone.utc)
    assert (sweep.finished_at - sweep.started_at).total_seconds() == pytest.approx(6.890334844589233)

    doc = json.loads(BENCH.read_text())
    trials = db.trials()
    # the file was written before backend `nvshmem` was renamed `sm_copy`: stored under the new name
    written = [t["candidate"] for t in doc["rows"][0]["trials"]]
    assert "nvshmem" in {c["backend"] for c in written}
    assert [t.record.candidate.to_dict() for t in trials] == [
        {**c, "backend": "sm_copy"} if c["backend"] == "nvshmem" else c for c in written
    ]
    first = trials[0].record
    assert first.source == "measured" and first.strategy == "bench" and first.status == "ok"
    assert first.median_us == doc["rows"][0]["trials"][0]["median_us"]
    assert first.p20_us == pytest.approx(quantile(doc["rows"][0]["trials"][0]["samples_us"], 0.2))
    assert first.worker["host"] == "vm" and first.worker["imported_from"] == BENCH.name
    base = {b.record.name: b.record for b in db.baselines()}
    assert base["torch_seq"].median_us == doc["rows"][0]["baselines"]["torch_seq"]["median_us"]
    assert base["torch_async_tp"].detail == "torch.ops.symm_mem.fused_all_gather_matmul"
    assert len(base["comm_alone_copy_engine"].samples_us) == 10

    again = import_bench(db, BENCH, syncopate="0.1.0", **VERSIONS)
    assert not again.created and again.sweep_id == result.sweep_id and len(db.trials()) == 8


def test_the_kernel_switches_of_a_bench_file_are_kept_with_its_trials(db, tmp_path):
    doc = json.loads(BENCH.read_text())
    doc["switches"] = {"SYNCOPATE_GLUON": "1"}
    path = tmp_path / "bench-gluon.json"
    path.write_text(json.dumps(doc))
    import_bench(db, path, syncopate="0.1.0", **VERSIONS)
    assert {t.record.worker["switches"]["SYNCOPATE_GLUON"] for t in db.trials()} == {"1"}
    # measured with the Gluon kernels: stored under a fingerprint of its own, never ENV's
    assert {t.record.environment.triton for t in db.trials()} == {"3.6.0+gluon"}
    assert ENV.key() not in {t.record.environment.key() for t in db.trials()}


def test_imported_rows_reach_the_overview(db):
    import_bench(db, BENCH, syncopate="0.1.0", **VERSIONS)
    row = data.overview(db).iloc[0]
    assert row["config"] == "copy_engine/direct/s2/arrival 128x256x64 g8 w8 st3"
    assert row["best_us"] == pytest.approx(426.576, abs=1e-3)
    assert row["speedup_seq"] == pytest.approx(464.976 / 426.576, rel=1e-4)
    assert row["bound_us"] == pytest.approx(210.256, abs=1e-3)  # the copy engine's all-gather beats NCCL's


def test_environment_must_be_complete_and_agree_with_the_file(db, tmp_path):
    with pytest.raises(ConfigError, match="does not say which triton, cuda, nccl, driver"):
        import_bench(db, BENCH, syncopate="0.1.0")
    with pytest.raises(ConfigError, match=r"says torch '2.11.0\+cu130' but '2.10.0' was given"):
        import_bench(db, BENCH, syncopate="0.1.0", torch="2.10.0", **VERSIONS)
    with_env = tmp_path / "with-env.json"
    doc = json.loads(BENCH.read_text())
    doc["environment"] = ENV.to_dict()
    with_env.write_text(json.dumps(doc))
    assert import_bench(db, with_env).environment == ENV  # a file that says it all needs no flags
    assert db.trials()[0].record.environment == ENV


def test_bad_files_are_refused(db, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="is not valid JSON"):
        import_bench(db, bad, **VERSIONS)
    bad.write_text(json.dumps({"rows": []}))
    with pytest.raises(ConfigError, match="not a `syncopate bench --json` file: it has no 'topology'"):
        import_bench(db, bad, **VERSIONS)
    doc = json.loads(BENCH.read_text())
    doc["rows"][0]["trials"][0]["candidate"]["backend"] = "carrier_pigeon"
    bad.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match="workload 0: unknown backend 'carrier_pigeon'"):
        import_bench(db, bad, syncopate="0.1.0", **VERSIONS)
    doc = json.loads(BENCH.read_text())
    doc["topology"]["key"] = "H200x3-nvlink"
    bad.write_text(json.dumps(doc))
    with pytest.raises(
        ConfigError,
        match=r"names its topology 'H200x3-nvlink', but its other fields give "
        r"H200x2-nvlink",
    ):
        import_bench(db, bad, syncopate="0.1.0", **VERSIONS)
    with pytest.raises(ConfigError, match="has world size 8"):
        import_bench(db, BENCH, syncopate="0.1.0", topology="H100x8-nvswitch", **VERSIONS)
    with pytest.raises(
        ConfigError, match="topology H100x2-nvlink is of H100 GPUs, but bench file .* ran on H200"
    ):
        import_bench(db, BENCH, syncopate="0.1.0", topology="H100x2-nvlink", **VERSIONS)
    assert db.trials() == [] and db.sweeps() == []


def test_a_file_stored_under_one_topology_is_not_reported_under_another(db):
    first = import_bench(db, BENCH, syncopate="0.1.0", **VERSIONS)
    again = import_bench(db, BENCH, syncopate="0.1.0", topology="H200x2-nvlink", **VERSIONS)
    assert not again.created and again.sweep_id == first.sweep_id
    with pytest.raises(
        ConfigError, match=f"already stored as sweep {first.sweep_id} on H200x2-nvlink, not H200x2-nvswitch"
    ):
        import_bench(db, BENCH, syncopate="0.1.0", topology="H200x2-nvswitch", **VERSIONS)
    assert {t.record.topology.key() for t in db.trials()} == {"H200x2-nvlink"}


def test_cli_import_bench(tmp_path, capsys):
    path = tmp_path / "cli.db"
    assert main(["import-bench", str(BENCH), "--db", str(path), *FLAGS]) == 1
    assert "does not exist" in capsys.readouterr().err
    assert main(["db", "upgrade", "--db", str(path)]) == 0
    assert main(["import-bench", str(BENCH), "--db", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "give --triton, --cuda, --nccl, --driver" in err
    assert main(["import-bench", str(BENCH), "--db", str(path), *FLAGS]) == 0
    out = capsys.readouterr().out
    assert "stored:" in out and "8 trial(s), 5 baseline(s) on H200x2-nvlink" in out
    assert main(["import-bench", str(BENCH), "--db", str(path), *FLAGS]) == 0
    assert "already stored" in capsys.readouterr().out


def test_cli_a_bad_row_is_named_before_the_database_is_opened(tmp_path, capsys):
    doc = json.loads(BENCH.read_text())
    doc["rows"][0]["workload"]["m"] = -5
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    assert main(["import-bench", str(bad), "--db", str(tmp_path / "absent.db"), *FLAGS]) == 2
    err = capsys.readouterr().err
    assert "M=-5 must be positive" in err and "does not exist" not in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.json"]


def _content(rdb):
    """Every trial, baseline and sweep of a results database, as compared."""
    trials = [
        (
            t.record.candidate.key(),
            t.record.status,
            t.record.median_us,
            t.record.p20_us,
            t.record.samples_us,
            t.record.environment,
            t.record.created_at,
        )
        for t in rdb.trials()
    ]
    baselines = [(b.record.name, b.record.median_us, b.record.samples_us) for b in rdb.baselines()]
    sweeps = [(s.name, s.host, s.status, s.started_at, s.finished_at) for s in rdb.sweeps()]
    return trials, baselines, sweeps


def _assert_serves_the_fastest(db: Path, files: list[Path], topology: str) -> set[str]:
    """`lookup` on a copy of `db`, under the one environment of the bench `files`, answers each of
    their shapes with the fastest `ok` trial of any of them; the winners' templates."""
    from syncopate.results_db.lookups import clear_cache, lookup

    docs = [json.loads(path.read_text()) for path in files]
    assert all(doc["environment"] == docs[0]["environment"] for doc in docs)
    env = Environment(**docs[0]["environment"])
    best: dict[str, tuple] = {}
    for doc in docs:
        for row in doc["rows"]:
            for t in row["trials"]:
                if t["status"] == "ok" and (
                    row["key"] not in best or t["median_us"] < best[row["key"]][1]["median_us"]
                ):
                    best[row["key"]] = (row["workload"], t)
    clear_cache()
    try:
        for key, (w, t) in best.items():
            got = lookup(
                (w["m"], w["n"], w["k"]), topology, kind=w["kind"], dtype=w["dtype"], db=db, environment=env
            )
            assert got.match == "exact" and got.candidate.to_dict() == t["candidate"], (key, got)
    finally:
        clear_cache()
    assert len(best) == 18
    return {t["candidate"]["template"] for _, t in best.values()}


def test_committed_database_is_this_import(tmp_path):
    """results/h200x2.db holds the bench files' imports and nothing else (the dashboard's real data)."""
    copy = tmp_path / "h200x2.db"
    shutil.copy(H200X2_DB, copy)  # opening a SQLite file may touch it: never the committed one
    with (
        ResultsDB.open(copy, upgrade=False) as committed,
        ResultsDB.open(tmp_path / "fresh.db", upgrade=True) as fresh,
    ):
        import_bench(fresh, BENCH, syncopate="0.1.0", **VERSIONS)
        for path in SUITE:
            import_bench(fresh, path)
        assert _content(committed) == _content(fresh)


def test_the_committed_database_serves_the_fastest_of_the_2026_11_26_runs(tmp_path):
    """`lookup` on results/h200x2.db, under the environment of the two 2026-11-26 runs (00:43 and
    08:33, one fingerprint), answers each of the suite's shapes with the fastest trial of either
    (the cuBLAS templates among their candidates, the all-gather's `decomposed` in the second)."""
    copy = tmp_path / "h200x2.db"
    shutil.copy(H200X2_DB, copy)
    assert {"a_stationary", "c_stationary", "decomposed"} <= _assert_serves_the_fastest(
        copy, SUITE[-2:], "H200x2-nvlink"
    )


def test_the_four_gpu_database_is_the_tp4_suites_import_and_serves_their_fastest(tmp_path):
    """results/h200x4.db holds the two TP=4 suite runs of 2026-11-26 (05:48 and 08:49, four H200s,
    one environment) and the three of 2026-11-27 (03:06, and 03:10 and 03:20 of the all-reduces and
    the reduce-scatters alone) and nothing else; `lookup` answers each TP=4 shape with the fastest
    of them (the all-gather's `decomposed` among the winners: N=29568 and N=8192; c_stationary for
    the all-reduce and the reduce-scatter 8192x8192x4096)."""
    copy = tmp_path / "h200x4.db"
    shutil.copy(H200X4_DB, copy)
    with (
        ResultsDB.open(copy, upgrade=False) as committed,
        ResultsDB.open(tmp_path / "fresh.db", upgrade=True) as fresh,
    ):
        for path in SUITE4:
            import_bench(fresh, path)
        assert _content(committed) == _content(fresh)
    assert {"decomposed", "c_stationary"} <= _assert_serves_the_fastest(copy, SUITE4, "H200x4-nvswitch")


def test_host_and_eager_times_in_a_bench_file_are_stored(db, tmp_path):
    """A bench file's `host_us` (what the harness measured per call) and, where it has them,
    `eager_us` of trials and baselines land in the trials and baselines stored."""
    doc = json.loads(BENCH.read_text())
    row = doc["rows"][0]
    ok = [t for t in row["trials"] if t["status"] == "ok"]
    ok[0]["host_us"], ok[0]["eager_us"] = 231.5, 612.25
    ok[1]["host_us"] = 198.0
    row["baselines"]["torch_seq"].update(host_us=131.0, eager_us=480.5)
    path = tmp_path / "bench-times.json"
    path.write_text(json.dumps(doc))
    import_bench(db, path, syncopate="0.1.0", **VERSIONS)
    stored = {
        t.candidate.to_dict() == ok[0]["candidate"]: t
        for t in db.trials()
        if t.candidate.to_dict() in (ok[0]["candidate"], ok[1]["candidate"])
    }
    assert (stored[True].record.host_us, stored[True].record.eager_us) == (231.5, 612.25)
    assert (stored[False].record.host_us, stored[False].record.eager_us) == (198.0, None)
    seq = [b.record for b in db.baselines() if b.name == "torch_seq"]
    assert [(b.host_us, b.eager_us) for b in seq] == [(131.0, 480.5)]
