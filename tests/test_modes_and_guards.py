"""Layer: pure CPU logic over SQLite files and export files. The job's mode (eager: back-to-back
calls, the host on the path; graph: calls replayed from CUDA graphs) and the guard (never serve a
configuration slower in that mode than the untuned default or the unfused template): what lookup,
`picks`, the export and the tuner's confirmation serve and rank by; the rungs that answer without
a measured row of the shape's topology (other_topology, cost_model, default); migration 0002, a
database at revision 0001 read as it is, and a committed database at revision 0002 read-only."""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
from pathlib import Path

import pytest
from db_data import ENV, OTHER_ENV

from syncopate.autotuner.confirm import Confirmation
from syncopate.cli import main
from syncopate.errors import ConfigError, SchemaError
from syncopate.records import TrialRecord, pick
from syncopate.results_db import ResultsDB, read_export
from syncopate.results_db.lookups import clear_cache, lookup
from syncopate.results_db.migrate import alembic_config, upgrade
from syncopate.results_db.schema import HEAD, NAMES_REVISION
from syncopate.results_db.urls import locate
from syncopate.search_space import (
    Topology,
    Workload,
    check_candidate,
    default_candidate,
    guard_candidates,
    space,
    unfused_candidate,
)

REPO = Path(__file__).resolve().parents[1]
H200X4 = Topology.from_key("H200x4-nvswitch")
H100X4 = Topology.from_key("H100x4-nvswitch")
H100X4_PCIE = Topology.from_key("H100x4-pcie")
W = Workload(kind="ag_gemm", shape=(8192, 11008, 4096))
ASKED = Workload(kind="ag_gemm", shape=(8192, 14336, 4096))  # another shape: answered from W's trials
H200X4_ENV = ENV
H100_ENV = OTHER_ENV.__class__(**{**OTHER_ENV.to_dict(), "gpu_model": "H100"})


def tuned(topology: Topology = H200X4, workload: Workload = W, n: int = 2):
    """`n` fused candidates of the space that are not guards."""
    guards = {c.key() for c in guard_candidates(workload, topology).values()}
    found = [c for c in space(workload, topology) if c.template == "direct" and c.key() not in guards]
    return found[:n]


def trial(candidate, median, eager=None, host=None, *, workload=W, topology=H200X4, env=H200X4_ENV):
    return TrialRecord(
        workload=workload,
        topology=topology,
        environment=env,
        candidate=candidate,
        status="ok",
        median_us=median,
        eager_us=eager,
        host_us=host,
    )


def store(path: Path, trials: list[TrialRecord]) -> dict[str, int]:
    """Store `trials` in one sweep of a new database at `path`; their ids by candidate key."""
    with ResultsDB.open(path, upgrade=True) as db:
        ids = db.record_trials(db.start_sweep("s"), trials)
    return {t.candidate.key(): i for t, i in zip(trials, ids)}


@pytest.fixture(autouse=True)
def fresh_cache(monkeypatch, tmp_path):
    monkeypatch.delenv("SYNCOPATE_DB", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    clear_cache()
    yield
    clear_cache()


# -- the rule ---------------------------------------------------------------------------------


def test_the_rule_ranks_by_the_modes_time_and_serves_a_faster_guard():
    fast_device, fast_eager = tuned()
    default, unfused = default_candidate(W, H200X4), unfused_candidate()
    a, b = trial(fast_device, 100.0, 400.0), trial(fast_eager, 150.0, 160.0)
    assert pick("graph", a, {}).chosen is a and pick("eager", b, {}).objective == "eager"
    slow_default, quick_unfused = trial(default, 130.0, 380.0), trial(unfused, 200.0, 120.0)
    served = pick("eager", b, {"default": slow_default, "unfused": quick_unfused})
    assert (served.chosen, served.guard, served.tuned) == (quick_unfused, "unfused", b)
    served = pick("graph", a, {"default": slow_default, "unfused": quick_unfused})
    assert (served.chosen, served.guard) == (a, "")
    older = trial(fast_device, 100.0)  # no eager figure: ranked by device time, and said so
    assert pick("eager", older, {}).objective == "device (no eager measurement)"
    assert pick("eager", None, {"unfused": quick_unfused}).guard == "unfused"
    assert pick("graph", None, {}) is None


def test_an_unknown_mode_is_refused_before_any_database_is_touched(tmp_path):
    with pytest.raises(ConfigError, match="mode 'jit' is unknown: accepted are eager .* and graph"):
        lookup(W.shape, H200X4, db=tmp_path / "absent.db", environment=ENV, mode="jit")
    assert list(tmp_path.iterdir()) == []


# -- modes and the guard in lookup --------------------------------------------------------------


def test_eager_and_graph_serve_different_trials_where_their_rankings_differ(tmp_path):
    host_bound, quick = tuned()
    ids = store(
        tmp_path / "r.db",
        [
            trial(host_bound, 100.0, 400.0, 390.0),  # fastest on the device, but the host holds every call up
            trial(quick, 150.0, 160.0, 120.0),
            trial(default_candidate(W, H200X4), 130.0, 380.0, 370.0),
            trial(unfused_candidate(), 200.0, 210.0, 130.0),
        ],
    )
    graph = lookup(W.shape, H200X4, db=tmp_path / "r.db", environment=ENV, mode="graph")
    eager = lookup(W.shape, H200X4, db=tmp_path / "r.db", environment=ENV)
    assert (graph.match, graph.candidate, graph.objective, graph.time_us) == (
        "exact",
        host_bound,
        "device",
        100.0,
    )
    assert (eager.match, eager.candidate, eager.objective, eager.mode) == ("exact", quick, "eager", "eager")
    assert (eager.trial_id, eager.eager_us, eager.host_us) == (ids[quick.key()], 160.0, 120.0)
    assert eager.to_dict()["eager_us"] == 160.0 and not eager.guard
    with ResultsDB.open(tmp_path / "r.db", read_only=True) as db:
        assert db.best(W, H200X4, ENV, mode="graph").candidate == host_bound
        assert db.best(W, H200X4, ENV, mode="eager").candidate == quick
        assert {p.mode: p.trial.candidate for p in db.picks()} == {"eager": quick, "graph": host_bound}


def test_a_fused_candidate_slower_in_eager_than_unfused_is_served_only_in_graph(tmp_path):
    (fused,) = tuned(n=1)
    default = default_candidate(W, H200X4)
    ids = store(
        tmp_path / "r.db",
        [
            trial(fused, 100.0, 400.0),
            trial(default, 150.0, 390.0),
            trial(unfused_candidate(), 200.0, 210.0),
        ],
    )
    eager = lookup(W.shape, H200X4, db=tmp_path / "r.db", environment=ENV)
    assert (eager.candidate, eager.guard, eager.trial_id) == (
        unfused_candidate(),
        "unfused",
        ids[unfused_candidate().key()],
    )
    assert (
        f"the fastest tuned candidate there (trial {ids[fused.key()]}, 400.0 µs a call eager) is slower"
        in eager.reason
    )
    graph = lookup(W.shape, H200X4, db=tmp_path / "r.db", environment=ENV, mode="graph")
    assert (graph.candidate, graph.guard) == (fused, "")
    # the nearest shape's guard stands for the guard of the shape asked
    near = lookup(ASKED.shape, H200X4, db=tmp_path / "r.db", environment=ENV)
    assert (near.match, near.guard, near.candidate) == ("nearest_shape", "unfused", unfused_candidate())


def test_the_untuned_default_served_is_the_default_of_the_shape_asked(tmp_path):
    (fused,) = tuned(n=1)
    measured_default = default_candidate(W, H200X4)
    ids = store(
        tmp_path / "r.db",
        [
            trial(fused, 100.0, 400.0),
            trial(measured_default, 150.0, 300.0),
            trial(unfused_candidate(), 200.0, 350.0),
        ],
    )
    exact = lookup(W.shape, H200X4, db=tmp_path / "r.db", environment=ENV)
    assert (exact.guard, exact.candidate, exact.trial_id) == (
        "default",
        measured_default,
        ids[measured_default.key()],
    )
    small = Workload(kind="ag_gemm", shape=(1024, 11008, 4096))
    near = lookup(small.shape, H200X4, db=tmp_path / "r.db", environment=ENV)
    assert (near.match, near.guard, near.candidate) == (
        "nearest_shape",
        "default",
        default_candidate(small, H200X4),
    )
    assert near.measured_on == W and near.trial_id == ids[measured_default.key()]


def test_a_guard_under_another_environment_does_not_count(tmp_path):
    (fused,) = tuned(n=1)
    store(
        tmp_path / "r.db",
        [trial(fused, 100.0, 400.0), trial(unfused_candidate(), 200.0, 210.0, env=OTHER_ENV)],
    )
    assert lookup(W.shape, H200X4, db=tmp_path / "r.db", environment=ENV).candidate == fused


def test_without_eager_figures_eager_ranks_by_device_time_and_says_so(tmp_path):
    a, b = tuned()
    store(tmp_path / "r.db", [trial(a, 120.0), trial(b, 100.0)])
    result = lookup(W.shape, H200X4, db=tmp_path / "r.db", environment=ENV)
    assert (result.candidate, result.objective) == (b, "device (no eager measurement)")
    assert "no eager time was measured" in result.reason


# -- the rungs without a measured row on the topology asked -----------------------------------


def test_another_gpu_model_with_the_same_count_and_interconnect_answers(tmp_path):
    a, b = tuned()
    h100 = tuned(topology=H100X4_PCIE, n=1)[0]
    ids = store(
        tmp_path / "r.db",
        [
            trial(a, 100.0, 150.0),
            trial(b, 120.0, 130.0),
            trial(h100, 90.0, 95.0, topology=H100X4_PCIE, env=H100_ENV),
        ],
    )
    result = lookup(W.shape, H100X4, db=tmp_path / "r.db", environment=H100_ENV)
    assert (result.match, result.measured_topology, result.trial_id) == (
        "other_topology",
        H200X4,
        ids[b.key()],
    )
    assert result.environment == H200X4_ENV
    assert (
        "closest measured topology H200x4-nvswitch (same GPU count and interconnect, H200 GPUs)"
        in result.reason
    )
    assert result.to_dict()["measured_topology"] == "H200x4-nvswitch"
    pcie = lookup(W.shape, Topology.from_key("H200x4-pcie"), db=tmp_path / "r.db", environment=ENV)
    assert (pcie.match, pcie.measured_topology) == ("other_topology", H100X4_PCIE)  # same interconnect first


def test_a_database_with_nothing_of_this_gpu_count_answers_with_the_cost_models_pick(tmp_path):
    two = Topology.from_key("H200x2-nvlink")
    (c,) = tuned(topology=two, n=1)
    store(tmp_path / "r.db", [trial(c, 100.0, 150.0, topology=two)])
    for mode in ("eager", "graph"):
        result = lookup(W.shape, H100X4, db=tmp_path / "r.db", environment=ENV, mode=mode)
        assert (result.match, result.trial_id, result.time_us) == ("cost_model", None, None)
        check_candidate(result.candidate, W, H100X4)
        assert result.objective == ("eager (predicted)" if mode == "eager" else "device (predicted)")
        assert result.predicted_us > 0 and "the cost model's pick among" in result.reason
        assert "default calibration for H100x4-nvswitch" in result.reason
        assert result.holdings.topologies == {"H200x2-nvlink": 1} and result.holdings.total == 1
        assert "1 measured trial: ag_gemm/bf16 1; on H200x2-nvlink 1" in result.reason
        assert "None" not in result.reason and "False" not in result.reason


def test_the_cost_model_rung_uses_the_calibrations_stored_for_the_topology(tmp_path):
    from syncopate.cost_model.calibration_defaults import default_calibration

    path = tmp_path / "r.db"
    with ResultsDB.open(path, upgrade=True) as db:
        for record in default_calibration(H100X4).records(H100X4, ENV):
            db.record_calibration(record)
    result = lookup(W.shape, H100X4, db=path, environment=ENV)
    assert result.match == "cost_model" and "measured calibration for H100x4-nvswitch" in result.reason


def test_default_answers_only_where_the_cost_model_cannot_and_says_what_the_database_holds(tmp_path):
    (c,) = tuned(n=1)
    store(tmp_path / "r.db", [trial(c, 100.0, 150.0)])
    unknown = Topology(world_size=4, gpu_model="X9", interconnect="nvswitch", sm_count=100, memory_gb=64.0)
    result = lookup(W.shape, unknown, db=tmp_path / "r.db", environment=ENV)
    assert (result.match, result.candidate, result.objective) == (
        "default",
        default_candidate(W, unknown),
        "",
    )
    assert "no default calibration for GPU model X9" in result.reason
    assert "The database holds 1 measured trial: ag_gemm/bf16 1; on H200x4-nvswitch 1" in result.reason
    holds = result.to_dict()["database_holds"]
    assert holds["kinds"] == {"ag_gemm/bf16": 1} and holds["environments"][ENV.key()]["count"] == 1


# -- the export carries both modes' picks --------------------------------------------------------


def test_export_and_import_carry_the_times_and_both_modes_picks(tmp_path):
    (fused,) = tuned(n=1)
    store(
        tmp_path / "r.db",
        [
            trial(fused, 100.0, 400.0, 380.0),
            trial(default_candidate(W, H200X4), 150.0, 390.0),
            trial(unfused_candidate(), 200.0, 210.0, 120.0),
        ],
    )
    out = tmp_path / "best.json"
    with ResultsDB.open(tmp_path / "r.db", read_only=True) as db:
        assert db.export_best(out) == 2
    entries = {e.candidate.key(): e for e in read_export(out)}
    assert entries[fused.key()].served_in == ("graph",) and entries[fused.key()].host_us == 380.0
    assert entries[unfused_candidate().key()].served_in == ("eager",)
    assert entries[unfused_candidate().key()].guards == {"eager": "unfused"}
    for mode in ("eager", "graph"):
        from_db = lookup(W.shape, H200X4, db=tmp_path / "r.db", environment=ENV, mode=mode)
        from_file = lookup(W.shape, H200X4, db=out, environment=ENV, mode=mode)
        assert (
            from_file.candidate,
            from_file.trial_id,
            from_file.eager_us,
            from_file.guard,
            from_file.objective,
        ) == (from_db.candidate, from_db.trial_id, from_db.eager_us, from_db.guard, from_db.objective)
    with ResultsDB.open(tmp_path / "copy.db", upgrade=True) as copy:
        assert copy.import_best(out) == 2
        assert {(t.candidate, t.eager_us, t.host_us) for t in copy.trials()} == {
            (fused, 400.0, 380.0),
            (unfused_candidate(), 210.0, 120.0),
        }
        assert {p.mode: (p.trial.candidate, p.guard) for p in copy.picks()} == {
            "eager": (unfused_candidate(), "unfused"),
            "graph": (fused, ""),
        }


def test_an_export_file_of_version_1_serves_both_modes(tmp_path):
    (fused,) = tuned(n=1)
    store(tmp_path / "r.db", [trial(fused, 100.0, 400.0)])
    out = tmp_path / "best.json"
    with ResultsDB.open(tmp_path / "r.db", read_only=True) as db:
        db.export_best(out)
    doc = json.loads(out.read_text())
    doc["version"] = 1
    for entry in doc["entries"]:
        for name in ("eager_us", "host_us", "served_in", "guards"):
            entry.pop(name)
    out.write_text(json.dumps(doc))
    for mode in ("eager", "graph"):
        result = lookup(W.shape, H200X4, db=out, environment=ENV, mode=mode)
        assert result.candidate == fused and result.eager_us is None


# -- migration 0002, and older revisions read as they are -----------------------------------------


def _downgrade(path: Path, revision: str) -> None:
    from alembic import command

    from syncopate.results_db.engine import make_engine

    engine = make_engine(locate(path))
    with engine.begin() as connection:
        command.downgrade(alembic_config(connection), revision)
    engine.dispose()


def test_a_database_at_revision_0001_is_read_as_it_is_then_upgraded_with_its_data(tmp_path):
    a, b = tuned()
    path = tmp_path / "old.db"
    ids = store(path, [trial(a, 120.0, 130.0), trial(b, 100.0, 400.0)])
    _downgrade(path, "0001")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    old = lookup(W.shape, H200X4, db=path, environment=ENV)
    assert (old.trial_id, old.eager_us, old.objective) == (
        ids[b.key()],
        None,
        "device (no eager measurement)",
    )
    with ResultsDB.open(path, read_only=True) as db:
        assert db.revision == "0001" and not db.has_times
        assert {t.trial_id: (t.median_us, t.eager_us) for t in db.trials()} == {
            ids[a.key()]: (120.0, None),
            ids[b.key()]: (100.0, None),
        }
        assert db.best(W, H200X4, ENV).trial_id == ids[b.key()]
        assert len(db.picks()) == 2
    with (
        ResultsDB.open(path) as db,
        pytest.raises(SchemaError, match=r"revision 0001, older .*`syncopate db upgrade --db"),
    ):
        db.record_trial(db.start_sweep("more"), trial(a, 1.0))
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest  # read, refused: nothing written

    assert upgrade(locate(path)) == ("0001", HEAD)
    with ResultsDB.open(path) as db:
        assert {t.trial_id: (t.median_us, t.eager_us) for t in db.trials()} == {
            ids[a.key()]: (120.0, None),
            ids[b.key()]: (100.0, None),
        }
        db.record_trial(db.start_sweep("more"), trial(unfused_candidate(), 80.0, 90.0, 70.0))
        assert db.trials()[-1].record.host_us == 70.0
    clear_cache()
    now = lookup(W.shape, H200X4, db=path, environment=ENV)
    # the tuned trials have no eager figure: the guard is compared by device time
    assert (now.candidate, now.guard, now.objective) == (
        unfused_candidate(),
        "unfused",
        "device (no eager measurement)",
    )


def _committed_trial(path: Path) -> tuple[Workload, str, object, int]:
    """One workload, topology and environment of a committed database, and its fastest trial's id."""
    from syncopate.records import Environment

    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as c:
        (kind, m, n, k, dtype, topo, env_id, trial_id) = c.execute(
            "SELECT w.kind, w.m, w.n, w.k, w.dtype, t.key, tr.environment_id, tr.id FROM syncopate_trials tr "
            "JOIN syncopate_workloads w ON w.id = tr.workload_id JOIN syncopate_topologies t ON t.id = tr.topology_id "
            "WHERE tr.status = 'ok' AND tr.source = 'measured' AND tr.id = (SELECT f.id FROM syncopate_trials f "
            "WHERE f.workload_id = tr.workload_id AND f.topology_id = tr.topology_id "
            "AND f.environment_id = tr.environment_id AND f.status = 'ok' AND f.source = 'measured' "
            "ORDER BY f.median_us, f.id LIMIT 1) ORDER BY tr.id LIMIT 1"
        ).fetchone()
        env = c.execute(
            "SELECT syncopate, torch, triton, cuda, nccl, driver, gpu_model FROM syncopate_environments "
            "WHERE id = ?",
            (env_id,),
        ).fetchone()
    names = ("syncopate", "torch", "triton", "cuda", "nccl", "driver", "gpu_model")
    return (
        Workload(kind=kind, shape=(m, n, k), dtype=dtype),
        topo,
        Environment(**dict(zip(names, env))),
        trial_id,
    )


def test_a_committed_database_at_revision_0002_answers_lookup_read_only(tmp_path):
    """A results file written before revision 0003 on a read-only mount: lookup answers from it as
    the upgraded file does, its `nvshmem` trials read as `sm_copy`, and nothing is written to it."""
    head = REPO / "results" / "h200x2-tune.db"
    copy = tmp_path / "h200x2-tune.db"
    shutil.copy(head, copy)
    _downgrade(copy, "0002")
    with sqlite3.connect(f"file:{copy}?mode=ro", uri=True) as c:
        stored = c.execute("SELECT json_extract(candidate, '$.backend') FROM syncopate_trials").fetchall()
    assert ("nvshmem",) in stored and ("sm_copy",) not in stored
    copy.chmod(0o444)
    digest = hashlib.sha256(copy.read_bytes()).hexdigest()
    workload, topo, env, fastest = _committed_trial(copy)
    result = lookup(workload.shape, topo, kind=workload.kind, dtype=workload.dtype, db=copy, environment=env)
    assert (result.match, result.objective) == ("exact", "device (no eager measurement)")
    graph = lookup(
        workload.shape, topo, kind=workload.kind, dtype=workload.dtype, db=copy, environment=env, mode="graph"
    )
    assert result.trial_id == graph.trial_id == fastest  # no eager figure there: both rank by device time
    clear_cache()
    served = lookup(workload.shape, topo, kind=workload.kind, dtype=workload.dtype, db=head, environment=env)
    assert (served.trial_id, served.candidate) == (result.trial_id, result.candidate)
    assert hashlib.sha256(copy.read_bytes()).hexdigest() == digest
    with ResultsDB.open(copy, read_only=True) as old, ResultsDB.open(head, read_only=True) as new:
        assert old.revision == "0002" and new.revision == NAMES_REVISION  # committed files stay at 0003
        before = [(t.trial_id, t.median_us, t.record.candidate) for t in old.trials()]
        assert before == [(t.trial_id, t.median_us, t.record.candidate) for t in new.trials()]
        assert "sm_copy" in {c.backend for _, _, c in before}
        assert [(p.trial.trial_id, p.mode) for p in old.picks()] == [
            (p.trial.trial_id, p.mode) for p in new.picks()
        ]
    assert hashlib.sha256(copy.read_bytes()).hexdigest() == digest
    copy.chmod(0o644)
    assert upgrade(locate(copy)) == ("0002", HEAD)
    with ResultsDB.open(copy, read_only=True) as db:
        assert [(t.trial_id, t.median_us, t.record.candidate) for t in db.trials()] == before


def test_the_cli_lookup_takes_a_mode_and_refuses_an_unknown_one(tmp_path, capsys):
    host_bound, quick = tuned()
    store(tmp_path / "r.db", [trial(host_bound, 100.0, 400.0), trial(quick, 150.0, 160.0)])
    args = [
        "lookup",
        "--m",
        "8192",
        "--n",
        "11008",
        "--k",
        "4096",
        "--topology",
        "H200x4-nvswitch",
        "--db",
        str(tmp_path / "r.db"),
    ]
    assert main([*args, "--mode", "graph", "--json"]) == 0
    # this process's environment is not the stored one: the other-environment rung answers, in the mode
    graph = json.loads(capsys.readouterr().out)
    assert (graph["mode"], graph["objective"], graph["candidate"]) == (
        "graph",
        "device",
        host_bound.to_dict(),
    )
    assert main([*args, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["candidate"] == quick.to_dict()
    assert main([*args, "--mode", "eagerly"]) == 2
    assert "mode 'eagerly' is unknown" in capsys.readouterr().err


# -- the tuner's confirmation in a mode -----------------------------------------------------------


def test_the_confirmation_ranks_and_pools_in_the_mode_and_declares_a_faster_guard():
    a, b = tuned()
    unfused = unfused_candidate()
    conf = Confirmation(top_k=3, mode="eager", guards={"unfused": unfused.key()})
    for t in (trial(a, 100.0, 300.0), trial(b, 150.0, 200.0), trial(unfused, 210.0, 230.0)):
        conf.observe(t)
    assert conf.next() == b and conf.next() is None  # unfused lies beyond the noise of b's eager time
    conf.record(trial(b, 150.0, 260.0))
    conf.record(trial(b, 150.0, 250.0))
    v = conf.verdict()
    assert (v.candidate, v.guard, v.objective, v.pooled_median_us) == (unfused, "unfused", "eager", 230.0)
    graph = Confirmation(top_k=3, mode="graph", guards={"unfused": unfused.key()})
    for t in (trial(a, 100.0, 300.0), trial(b, 150.0, 200.0), trial(unfused, 210.0, 230.0)):
        graph.observe(t)
    assert graph.next() == a and graph.verdict().candidate == a


# -- the tuner in a mode ------------------------------------------------------------------------


SMALL_SPACE = {
    "backends": ["copy_engine", "nccl"],
    "templates": ["direct"],
    "num_splits": [1, 2],
    "tile_orders": ["arrival", "row_major"],
    "tile_configs": ["128x256x64w8s3", "128x128x64w8s4"],
    "group_m": [8],
}


def _tune(tmp_path: Path, name: str, mode: str, **fields):
    import io

    import yaml
    from rich.console import Console

    from syncopate.autotuner.tune import TuneOptions, run_tune

    data = {
        "name": name,
        "topology": "H200x2-nvlink",
        "workloads": [{"kind": "ag_gemm", "shapes": [[2048, 4096, 4096]]}],
        "strategy": {"name": "grid", "seed": 0},
        "space": SMALL_SPACE,
        **fields,
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    db = f"sqlite:///{tmp_path / f'{name}.db'}"
    result = run_tune(TuneOptions(config=path, db=db, mode=mode), console=Console(file=io.StringIO()))
    with ResultsDB.open(db, read_only=True) as d:
        return result, d.trials()


def test_a_sweep_measures_the_guards_first_and_ranks_its_best_in_its_mode(tmp_path):
    from syncopate.autotuner.synthetic import synthetic_sweep
    from syncopate.search_space import SpaceOptions, TileConfig
    from syncopate.workers.replay_runner import write_sweep

    two = Topology.from_key("H200x2-nvlink")
    w = Workload(kind="ag_gemm", shape=(2048, 4096, 4096))
    options = SpaceOptions(
        backends=("copy_engine", "nccl"),
        templates=("direct",),
        num_splits=(1, 2),
        tile_orders=("arrival", "row_major"),
        group_m=(8,),
        tile_configs=tuple(TileConfig.from_key(k) for k in SMALL_SPACE["tile_configs"]),
    )
    sweep_file = tmp_path / "sweep.json"
    write_sweep(sweep_file, synthetic_sweep([w], two, seed=1, options=options))
    best = {}
    for mode in ("eager", "graph"):
        result, trials = _tune(
            tmp_path, f"replay-{mode}", mode, runner="replay", replay={"source": str(sweep_file)}
        )
        guards = [c.key() for c in guard_candidates(w, two).values()]
        assert [t.candidate.key() for t in trials[:2]] == guards  # unfused, outside this space, measured too
        ok = [t for t in trials if t.status == "ok"]
        assert ok and all(t.eager_us is not None and t.host_us is not None for t in ok)
        (summary,) = result.summaries
        assert result.mode == mode and summary.objective == ("eager" if mode == "eager" else "device")
        figure = (lambda t: t.eager_us) if mode == "eager" else (lambda t: t.median_us)
        assert summary.best_us == min(figure(t) for t in ok)
        best[mode] = summary.best.candidate
    assert best["eager"] != best["graph"]  # a host-bound shape: the eager ranking is not the device's


def test_the_model_runner_predicts_host_and_eager_times(tmp_path):
    result, trials = _tune(
        tmp_path, "model", "eager", runner="model", strategy={"name": "random", "max_trials": 5, "seed": 0}
    )
    ok = [t for t in trials if t.status == "ok"]
    assert len(trials) == 5 and {t.record.source for t in trials} == {"predicted"}
    assert all(t.host_us > 0 and t.eager_us == max(t.median_us, t.host_us) for t in ok)
    assert result.summaries[0].objective == "eager"


def test_the_mode_of_a_sweep_is_checked(tmp_path):
    from syncopate.autotuner.tune import TuneOptions

    with pytest.raises(ConfigError, match="mode 'fast' is unknown"):
        TuneOptions(config=tmp_path / "x.yaml", mode="fast")
