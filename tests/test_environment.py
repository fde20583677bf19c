"""Layer: pure CPU. The environment fingerprint holds the one kernel setting (SYNCOPATE_GLUON), so
that a trial measured with the Gluon kernels is never an exact match for a job without them."""

from __future__ import annotations

import pytest
from db_data import CANDIDATES, TOPO, W

from syncopate.environment import GLUON_SUFFIX, GLUON_VAR, current_environment, with_kernels
from syncopate.records import TrialRecord
from syncopate.results_db import ResultsDB
from syncopate.results_db.lookups import clear_cache, lookup


@pytest.fixture(autouse=True)
def fresh_cache(monkeypatch, tmp_path):
    monkeypatch.delenv("SYNCOPATE_DB", raising=False)
    monkeypatch.delenv(GLUON_VAR, raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    clear_cache()
    yield
    clear_cache()


def test_the_gluon_setting_changes_the_fingerprint_s_key(monkeypatch):
    plain = current_environment()
    assert not plain.triton.endswith(GLUON_SUFFIX)
    monkeypatch.setenv(GLUON_VAR, "1")
    gluon = current_environment()
    assert gluon.triton == plain.triton + GLUON_SUFFIX and gluon.key() != plain.key()
    assert gluon.to_dict() == {**plain.to_dict(), "triton": plain.triton + GLUON_SUFFIX}
    for off in ("0", ""):
        monkeypatch.setenv(GLUON_VAR, off)
        assert current_environment().key() == plain.key()
    assert with_kernels(gluon, True) == gluon, "marked once"
    assert with_kernels(plain, False) == plain


def test_a_gluon_trial_is_an_exact_match_only_for_a_job_with_the_gluon_kernels(monkeypatch, tmp_path, caplog):
    path = tmp_path / "results.db"
    monkeypatch.setenv(GLUON_VAR, "1")
    measured = current_environment()
    with ResultsDB.open(path, upgrade=True) as db:
        db.record_trial(
            db.start_sweep("s"),
            TrialRecord(
                workload=W,
                topology=TOPO,
                environment=measured,
                candidate=CANDIDATES[0],
                status="ok",
                median_us=100.0,
            ),
        )
    with_gluon = lookup(W.shape, TOPO, db=path)
    assert with_gluon.match == "exact" and with_gluon.environment == measured
    monkeypatch.delenv(GLUON_VAR)  # the same process, its lookups cached: the setting is part of the key
    without = lookup(W.shape, TOPO, db=path)
    assert without.match == "other_environment", "served to a job without the Gluon kernels as an exact match"
    assert "measured under another" in caplog.text
    monkeypatch.setenv(GLUON_VAR, "1")
    assert lookup(W.shape, TOPO, db=path).match == "exact"
