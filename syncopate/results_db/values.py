"""What the repository returns: stored records with their ids, and sweeps.

Plain frozen values (no database state), safe to keep after the database is closed.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from syncopate.records import BaselineRecord, CalibrationRecord, Environment, TrialRecord
from syncopate.search_space import Candidate, Topology, Workload

__all__ = ["ServedPick", "StoredBaseline", "StoredCalibration", "StoredTrial", "SweepInfo"]


@dataclass(frozen=True, kw_only=True, slots=True)
class SweepInfo:
    """A tuning run."""

    sweep_id: int
    name: str
    config: dict[str, Any]
    """The sweep config as given to :meth:`ResultsDB.start_sweep`."""
    status: str
    """One of :data:`~syncopate.results_db.models.SWEEP_STATUSES`."""
    host: str
    started_at: datetime
    finished_at: datetime | None


@dataclass(frozen=True, kw_only=True, slots=True)
class StoredTrial:
    """A trial as stored: its row id, its sweep and the record."""

    trial_id: int
    sweep_id: int
    record: TrialRecord

    @property
    def workload(self) -> Workload:
        return self.record.workload

    @property
    def topology(self) -> Topology:
        return self.record.topology

    @property
    def environment(self) -> Environment:
        return self.record.environment

    @property
    def candidate(self) -> Candidate:
        return self.record.candidate

    @property
    def status(self) -> str:
        return self.record.status

    @property
    def median_us(self) -> float | None:
        return self.record.median_us

    @property
    def eager_us(self) -> float | None:
        return self.record.eager_us

    @property
    def host_us(self) -> float | None:
        return self.record.host_us


@dataclass(frozen=True, kw_only=True, slots=True)
class ServedPick:
    """What is served in one mode for one (workload, topology, environment): the trial, what ranked
    it, and the guard it is where one was faster than every tuned trial."""

    trial: StoredTrial
    mode: str
    """One of :data:`~syncopate.records.MODES`."""
    objective: str
    """What ranked it: `eager`, `device`, or `device (no eager measurement)`."""
    guard: str = ""
    """`default` or `unfused` where the trial is that guard's and no tuned trial is as fast; '' otherwise."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StoredBaseline:
    """A baseline as stored: its row id, its sweep and the record."""

    baseline_id: int
    sweep_id: int
    record: BaselineRecord

    @property
    def name(self) -> str:
        return self.record.name

    @property
    def median_us(self) -> float:
        return self.record.median_us

    @property
    def eager_us(self) -> float | None:
        return self.record.eager_us


@dataclass(frozen=True, kw_only=True, slots=True)
class StoredCalibration:
    """A calibration as stored: its row id, the sweep that measured it (if any) and the record."""

    calibration_id: int
    sweep_id: int | None
    record: CalibrationRecord

    @property
    def payload(self) -> dict[str, Any]:
        return self.record.payload
