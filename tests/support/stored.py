"""What `syncopate tune` stored, read back from the results database: plain SQL on its tables
(`syncopate_sweeps`, `syncopate_trials`, `syncopate_baselines`, …) or :class:`ResultsDB`."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from syncopate.results_db import ResultsDB, StoredTrial

TRIALS = (
    "SELECT w.key, t.candidate_hash, t.status, t.source FROM syncopate_trials t "
    "JOIN syncopate_workloads w ON w.id = t.workload_id ORDER BY t.id"
)
"""Every trial as (workload key, candidate key, status, source), in the order stored."""

BASELINES = (
    "SELECT w.key, b.name, b.source, b.median_us FROM syncopate_baselines b "
    "JOIN syncopate_workloads w ON w.id = b.workload_id ORDER BY w.key, b.name"
)
"""Every baseline as (workload key, name, source, median µs)."""


def rows(url: str, sql: str, **params: Any) -> list[tuple]:
    """The rows of one query on the database at `url`."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            return [tuple(r) for r in connection.execute(sa.text(sql), params)]
    finally:
        engine.dispose()


def stored_trials(url: str, **filters: Any) -> list[StoredTrial]:
    """Trials through the repository (filters as :meth:`ResultsDB.trials`), in the order stored."""
    with ResultsDB.open(url) as db:
        return db.trials(**filters)


def by_candidate(url: str) -> dict[str, StoredTrial]:
    """The trials of a one-workload database by candidate key."""
    return {t.candidate.key(): t for t in stored_trials(url)}
