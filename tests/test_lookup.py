"""Layer: `syncopate.lookup` on the CPU, over SQLite files and export files: the ladder, the cache,
argument checking before any database is touched, and the errors a job can meet at start."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap

import pytest
import torch
from db_data import ENV, OTHER_ENV, TOPO, W, trial, workload

import syncopate
from syncopate.cli import main
from syncopate.errors import (
    ConfigError,
    DatabaseError,
    LookupFailedError,
    RuntimeUnavailableError,
    SchemaError,
)
from syncopate.records import TrialRecord
from syncopate.results_db import ResultsDB
from syncopate.results_db.lookups import clear_cache, lookup, shape_distance
from syncopate.search_space import Candidate, Shape, Topology, check_candidate


@pytest.fixture(autouse=True)
def fresh_cache(monkeypatch, tmp_path):
    monkeypatch.delenv("SYNCOPATE_DB", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    clear_cache()
    yield
    clear_cache()


@pytest.fixture
def populated(tmp_path):
    path = tmp_path / "results.db"
    with ResultsDB.open(path, upgrade=True) as db:
        sweep = db.start_sweep("s")
        db.record_trials(
            sweep,
            [
                trial(0, median_us=300.0),
                trial(1, median_us=200.0),
                trial(2, status="wrong_result", median_us=1.0),
            ],
        )
        db.record_trial(sweep, trial(3, w=workload(m=4096), median_us=150.0))
    return path


def test_public_names():
    assert syncopate.lookup is lookup
    assert syncopate.LookupResult.__name__ == "LookupResult"
    assert {"lookup", "LookupResult"} <= set(syncopate.__all__)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"shape": (8192, 4096, 0)}, "K=0 must be positive"),
        ({"shape": (8192, 4096)}, "is not understood"),
        ({"shape": "8192x4096x8192"}, "is not understood"),
        ({"kind": "mm"}, "unknown kind 'mm'"),
        ({"dtype": "e5m2"}, "unknown dtype 'e5m2'"),
        ({"dtype": "torch.int8"}, "unknown dtype"),
        ({"topology": "H9x2-nvlink"}, "unknown GPU 'H9'"),
        ({"topology": 7}, "neither a Topology nor a key"),
        ({"shape": (8191, 4096, 8192)}, "M=8191 is not divisible by world size 2"),
        ({"shape": (10**20, 4096, 8192)}, "M=100000000000000000000 is larger than 1048576"),
    ],
)
def test_bad_arguments_fail_before_the_database_is_touched(tmp_path, kwargs, message):
    args = {"shape": (8192, 4096, 8192), "topology": "H200x2-nvlink", "db": tmp_path / "absent.db", **kwargs}
    with pytest.raises(ConfigError, match=message):
        lookup(args.pop("shape"), args.pop("topology"), environment=ENV, **args)
    assert list(tmp_path.iterdir()) == []


def test_torch_dtypes_and_names_are_the_same_lookup(populated):
    import torch

    a = lookup(W.shape, TOPO, dtype=torch.bfloat16, db=populated, environment=ENV)
    b = lookup((8192, 4096, 8192), "H200x2-nvlink", dtype="bfloat16", db=str(populated), environment=ENV)
    assert a.match == b.match == "exact" and a.trial_id == b.trial_id
    assert lookup(W.shape, TOPO, dtype=torch.float16, db=populated, environment=ENV).match == "cost_model"


def test_the_ladder(populated, caplog):
    exact = lookup(W.shape, TOPO, db=populated, environment=ENV)
    assert (exact.match, exact.time_us, exact.environment) == ("exact", 200.0, ENV)
    assert exact.to_dict() == {
        "candidate": exact.candidate.to_dict(),
        "match": "exact",
        "mode": "eager",
        "objective": "device (no eager measurement)",
        "reason": exact.reason,
        "trial_id": exact.trial_id,
        "time_us": 200.0,
        "eager_us": None,
        "host_us": None,
        "measured_on": "8192x4096x8192",
        "measured_topology": TOPO.key(),
        "environment": ENV.key(),
        "environment_versions": ENV.short(),
    }
    assert exact.reason.startswith(f"measured: trial {exact.trial_id} of this shape on H200x2-nvlink")
    near = lookup((7000 // 8 * 8, 4096, 8192), TOPO, db=populated, environment=ENV)
    assert near.match == "nearest_shape" and near.measured_on == W  # ln(8192/7000) < ln(7000/4096)
    near = lookup((4000, 4096, 8192), TOPO, db=populated, environment=ENV)
    assert near.measured_on == workload(m=4096) and near.time_us == 150.0
    with caplog.at_level(logging.WARNING, logger="syncopate.results_db.lookups"):
        other = lookup(W.shape, TOPO, db=populated, environment=OTHER_ENV)
    assert (other.match, other.environment, other.time_us) == ("other_environment", ENV, 200.0)
    assert "measured under another" in caplog.text and "torch 2.11.0" in caplog.text
    other_near = lookup((4000, 4096, 8192), TOPO, db=populated, environment=OTHER_ENV)
    assert other_near.match == "other_environment" and other_near.to_dict()["measured_on"] == "4096x4096x8192"
    assert other_near.to_dict()["environment"] == ENV.key()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="syncopate.results_db.lookups"):
        elsewhere = lookup(W.shape, "H100x2-nvlink", db=populated, environment=ENV)
    assert (elsewhere.match, elsewhere.trial_id, elsewhere.measured_topology) == (
        "other_topology",
        exact.trial_id,
        TOPO,
    )
    assert "closest measured topology H200x2-nvlink" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="syncopate.results_db.lookups"):
        modelled = lookup(W.shape, "H100x8-nvswitch", db=populated, environment=ENV)
    assert (modelled.match, modelled.trial_id, modelled.time_us) == ("cost_model", None, None)
    assert "no measured trial of them on H100x8-nvswitch" in caplog.text and "topology key" in caplog.text
    assert set(modelled.to_dict()) == {
        "candidate",
        "match",
        "mode",
        "objective",
        "reason",
        "trial_id",
        "time_us",
        "predicted_us",
        "database_holds",
    }
    assert modelled.to_dict()["database_holds"]["topologies"] == {"H200x2-nvlink": 3}
    assert near.to_dict()["measured_on"] == "4096x4096x8192"


def test_nearest_shape_is_by_log_distance():
    assert shape_distance(Shape(m=1024, n=1, k=1), Shape(m=2048, n=1, k=1)) == pytest.approx(
        0.693147, rel=1e-5
    )
    assert shape_distance(Shape(m=4, n=4, k=4), Shape(m=4, n=4, k=4)) == 0.0


def test_a_stored_configuration_invalid_for_the_shape_asked_is_passed_over(tmp_path):
    path = tmp_path / "r.db"
    many_splits = Candidate(num_splits=64, block_n=128)
    with ResultsDB.open(path, upgrade=True) as db:
        sweep = db.start_sweep("s")
        db.record_trial(
            sweep,
            TrialRecord(
                workload=workload(m=256),
                topology=TOPO,
                environment=ENV,
                candidate=many_splits,
                status="ok",
                median_us=10.0,
            ),
        )
        far = db.record_trial(sweep, trial(0, w=workload(m=65536), median_us=900.0))
    result = lookup(
        (64, 4096, 8192), TOPO, db=path, environment=ENV
    )  # 32 rows per rank: 64 splits do not fit
    assert (result.match, result.trial_id) == ("nearest_shape", far)


def test_eight_gpus_pass_over_a_configuration_whose_chunks_cannot_be_cut_at_tile_rows(tmp_path):
    """Tuned at M=16384 on eight GPUs (2048 rows a rank: 8 chunks of 256 rows), asked at M=8192
    (1024 rows a rank: 8 chunks of 128 rows cannot hold 256-row tiles): not served."""
    path = tmp_path / "r.db"
    tp8 = Topology.from_key("H200x8-nvswitch")
    tall = Candidate(num_splits=8, block_m=256, block_n=128, block_k=64, num_warps=8, num_stages=3)
    with ResultsDB.open(path, upgrade=True) as db:
        db.record_trial(
            db.start_sweep("s"),
            TrialRecord(
                workload=workload(m=16384),
                topology=tp8,
                environment=ENV,
                candidate=tall,
                status="ok",
                median_us=10.0,
            ),
        )
    result = lookup((16384, 4096, 8192), tp8, db=path, environment=ENV)
    assert (result.match, result.candidate) == ("exact", tall)
    result = lookup((8192, 4096, 8192), tp8, db=path, environment=ENV)
    assert result.match == "cost_model" and result.candidate != tall
    check_candidate(result.candidate, workload(), tp8)


def test_a_cached_answer_is_no_way_around_the_checks(populated):
    np = pytest.importorskip("numpy")
    first = lookup((8192, 4096, 8192), TOPO, db=populated, environment=ENV)
    with pytest.raises(ConfigError, match="M=8192.0 must be an integer"):
        lookup((8192.0, 4096, 8192), TOPO, db=populated, environment=ENV)
    same = lookup((np.int64(8192), 4096, 8192), TOPO, db=populated, environment=ENV)
    assert same.trial_id == first.trial_id and same.match == "exact"


def test_cache_answers_repeats_and_a_new_process_sees_changes(populated):
    first = lookup(W.shape, TOPO, db=populated, environment=ENV)
    assert lookup(W.shape, TOPO, db=populated, environment=ENV) is first
    with ResultsDB.open(populated) as db:
        db.record_trial(db.start_sweep("faster"), trial(9, median_us=5.0))
    assert lookup(W.shape, TOPO, db=populated, environment=ENV).time_us == 200.0  # cached in this process
    script = textwrap.dedent(f"""
        import json, sys
        from syncopate.records import Environment
        from syncopate.results_db.lookups import lookup
        env = Environment.from_dict({ENV.to_dict()!r})
        r = lookup((8192, 4096, 8192), "H200x2-nvlink", db={str(populated)!r}, environment=env)
        print(json.dumps({{"time_us": r.time_us, "sqlalchemy": "sqlalchemy" in sys.modules}}))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == {"time_us": 5.0, "sqlalchemy": False}
    clear_cache()
    assert lookup(W.shape, TOPO, db=populated, environment=ENV).time_us == 5.0


def test_a_missing_default_database_answers_from_the_cost_model_and_creates_nothing(tmp_path):
    result = lookup(W.shape, TOPO, environment=ENV)
    assert result.match == "cost_model" and result.holdings.total == 0
    assert "holds no measured trials at all" in result.reason
    assert not (tmp_path / "xdg").exists()


def test_an_empty_default_database_file_answers_from_the_cost_model(tmp_path):
    (tmp_path / "xdg" / "syncopate").mkdir(parents=True)
    (tmp_path / "xdg" / "syncopate" / "results.db").touch()
    assert lookup(W.shape, TOPO, environment=ENV).match == "cost_model"


def test_syncopate_db_names_the_database(monkeypatch, populated):
    monkeypatch.setenv("SYNCOPATE_DB", f"sqlite:///{populated}")
    assert lookup(W.shape, TOPO, environment=ENV).match == "exact"


def test_an_explicit_path_that_does_not_exist_is_an_error(tmp_path):
    with pytest.raises(DatabaseError, match=r"absent\.db does not exist: .*syncopate db upgrade --db"):
        lookup(W.shape, TOPO, db=tmp_path / "absent.db", environment=ENV)
    assert not (tmp_path / "absent.db").exists()


def test_an_export_file_that_does_not_exist_says_how_to_write_one(tmp_path):
    with pytest.raises(
        LookupFailedError, match=r"export file .*best\.json does not exist: .*syncopate export --out"
    ):
        lookup(W.shape, TOPO, db=tmp_path / "best.json", environment=ENV)
    assert not (tmp_path / "best.json").exists()


def test_a_database_named_like_an_export_file_is_read_as_a_database(populated, tmp_path):
    named = tmp_path / "results.json"
    named.write_bytes(populated.read_bytes())
    assert lookup(W.shape, TOPO, db=named, environment=ENV).match == "exact"


def test_an_explicit_database_without_tables_says_what_to_run(tmp_path):
    (tmp_path / "empty.db").touch()
    with pytest.raises(SchemaError, match="has no Syncopate tables: run `syncopate db upgrade --db"):
        lookup(W.shape, TOPO, db=tmp_path / "empty.db", environment=ENV)


def test_a_file_that_is_not_a_database(tmp_path):
    (tmp_path / "junk.db").write_bytes(b"\x00\x01 not sqlite at all" * 100)
    with pytest.raises(DatabaseError, match="junk.db"):
        lookup(W.shape, TOPO, db=tmp_path / "junk.db", environment=ENV)


def test_an_export_file_answers_like_its_database(populated, tmp_path):
    with ResultsDB.open(populated) as db:
        db.export_best(tmp_path / "best.json")
    from_db = lookup((4000, 4096, 8192), TOPO, db=populated, environment=ENV)
    from_file = lookup((4000, 4096, 8192), TOPO, db=tmp_path / "best.json", environment=ENV)
    assert (from_file.match, from_file.candidate, from_file.trial_id, from_file.time_us) == (
        from_db.match,
        from_db.candidate,
        from_db.trial_id,
        from_db.time_us,
    )
    (tmp_path / "best.export").write_text((tmp_path / "best.json").read_text())  # any name will do
    assert (
        lookup(W.shape, TOPO, db=tmp_path / "best.export", environment=OTHER_ENV).match == "other_environment"
    )


@pytest.mark.parametrize(
    "text, message",
    [
        ("{not json", "is not valid JSON"),
        ('{"entries": []}', "is not a Syncopate export file"),
        ('{"format": "syncopate-best", "version": 7, "entries": []}', "has version 7"),
        ('{"format": "syncopate-best", "version": 1, "entries": {}}', 'no list of "entries"'),
        ('{"format": "syncopate-best", "version": 1, "entries": [{"workload": {}}]}', "entry 0"),
    ],
)
def test_a_corrupt_export_file_is_named(tmp_path, text, message):
    (tmp_path / "best.json").write_text(text)
    with pytest.raises(LookupFailedError, match=message):
        lookup(W.shape, TOPO, db=tmp_path / "best.json", environment=ENV)


def test_a_bad_candidate_in_an_export_file_is_named(populated, tmp_path):
    with ResultsDB.open(populated) as db:
        db.export_best(tmp_path / "best.json")
    doc = json.loads((tmp_path / "best.json").read_text())
    doc["entries"][1]["candidate"]["block_m"] = 100
    (tmp_path / "best.json").write_text(json.dumps(doc))
    with pytest.raises(LookupFailedError, match=r"entry 1.*block_m=100"):
        lookup(W.shape, TOPO, db=tmp_path / "best.json", environment=ENV)


def test_without_a_topology_it_is_detected_or_the_reason_is_given(populated):
    try:
        result = lookup(W.shape, None, db=populated, environment=ENV)
    except RuntimeUnavailableError as e:
        assert "cannot detect the topology here" in str(e) and "topology='H200x2-nvlink'" in str(e)
        assert str(e).count("H200x2-nvlink") == 1 and "--topology" not in str(e)
    else:
        assert result.topology == syncopate.detect_topology()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is visible: the topology is detected")
def test_the_command_without_a_topology_names_the_option_once(populated, capsys):
    code = main(["lookup", "--m", "8192", "--n", "28672", "--k", "8192", "--db", str(populated)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1, err
    assert err[0] == (
        "syncopate: error: cannot detect this machine's topology (no CUDA GPU is visible): pass "
        "--topology KEY, such as --topology H200x2-nvlink"
    )


def test_the_command_says_its_answer_once(populated):
    """An answer measured under another environment is printed once, on stdout; the warning that a
    job calling syncopate.lookup gets in its log is not repeated on stderr."""
    m, n, k = W.shape.as_tuple()
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "syncopate",
            "lookup",
            "--m",
            str(m),
            "--n",
            str(n),
            "--k",
            str(k),
            "--topology",
            TOPO.key(),
            "--db",
            str(populated),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0 and "other_environment" in r.stdout and r.stderr == "", (r.stdout, r.stderr)


def test_the_cost_model_serves_a_fused_pick_only_from_a_calibration_measured_on_the_topology(tmp_path):
    """From the default calibration's leads the model has erred by up to 2× on a machine it was not
    calibrated on, so with nothing measured lookup serves unfused; the same figures stored as a
    measured calibration of the topology let the model's fused pick through."""
    from syncopate.cost_model.calibration_defaults import default_calibration

    topo = Topology.from_key("H200x4-nvswitch")
    shape, kind = (8192, 4096, 4096), "gemm_ar"
    path = tmp_path / "cal.db"
    with ResultsDB.open(path, upgrade=True):
        pass
    leads = lookup(shape, topo, kind=kind, db=path, environment=ENV)
    assert leads.match == "cost_model" and leads.candidate.template == "unfused"
    assert "is not measured on this topology" in leads.reason and " would be " in leads.reason
    with ResultsDB.open(path) as db:
        for r in default_calibration(topo).records(topo, ENV):
            db.record_calibration(r)
    clear_cache()
    measured = lookup(shape, topo, kind=kind, db=path, environment=ENV)
    assert measured.match == "cost_model" and measured.candidate.template != "unfused"
    assert " would be " not in measured.reason
    assert measured.predicted_us < leads.predicted_us
