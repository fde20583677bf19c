"""Layer: pure CPU logic. The coordinator's TrialStore seam: the conformance suite on the tests'
SQLite store (the results database's adapter runs the same suite)."""

from __future__ import annotations

import pytest
from support.sqlite_store import SqliteTrialStore
from support.store_suite import TrialStoreSuite

from syncopate.autotuner.store import open_store
from syncopate.errors import DatabaseError


class TestSqliteTrialStore(TrialStoreSuite):
    @pytest.fixture
    def store(self, tmp_path):
        s = SqliteTrialStore.open(f"sqlite:///{tmp_path / 'trials.db'}")
        yield s
        s.close()


def test_the_default_store_says_why_it_cannot_open():
    with pytest.raises(DatabaseError) as e:
        open_store("sqlite:////nonexistent-dir/x.db")
    assert "/nonexistent-dir/x.db" in str(e.value) and "\n" not in str(e.value)
