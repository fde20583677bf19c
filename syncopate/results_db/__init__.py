"""The results database: every trial, baseline and calibration Syncopate measures, and `lookup`.

Public names (imported on first use, so `import syncopate.results_db` stays light and a lookup on
SQLite never imports SQLAlchemy):

- :class:`ResultsDB` (:mod:`.repository`): open, sweeps, `record_trial(s)`, `record_baseline(s)`,
  `record_calibration`, `trials`, `measured_keys`, `best`, `sweep_best`, `picks`, `best_configs`,
  `baselines`, `calibration(s)`, `export_best`, `import_best`;
- :func:`lookup`, :class:`LookupResult`, :func:`clear_cache`, :data:`MATCHES` (:mod:`.lookups`);
- :class:`StoredTrial`, :class:`StoredBaseline`, :class:`StoredCalibration`, :class:`SweepInfo`,
  :class:`ServedPick` (:mod:`.values`); :data:`SWEEP_STATUSES`;
- :func:`upgrade` (:mod:`.migrate`), :func:`locate`, :func:`default_path` (:mod:`.urls`);
- :func:`read_export`, :class:`ExportEntry` (:mod:`.transfer`).

Schema: :mod:`.models` (tables) and :mod:`.schema` (names, revisions); migrations ship in
`migrations/` and run with `syncopate db upgrade [--db URL]`.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "MATCHES",
    "SWEEP_STATUSES",
    "ExportEntry",
    "LookupResult",
    "ResultsDB",
    "ServedPick",
    "StoredBaseline",
    "StoredCalibration",
    "StoredTrial",
    "SweepInfo",
    "clear_cache",
    "default_path",
    "locate",
    "lookup",
    "read_export",
    "upgrade",
]

_LAZY: dict[str, str] = {
    "MATCHES": "syncopate.results_db.lookups",
    "LookupResult": "syncopate.results_db.lookups",
    "clear_cache": "syncopate.results_db.lookups",
    "lookup": "syncopate.results_db.lookups",
    "ResultsDB": "syncopate.results_db.repository",
    "SWEEP_STATUSES": "syncopate.results_db.models",
    "ServedPick": "syncopate.results_db.values",
    "StoredBaseline": "syncopate.results_db.values",
    "StoredCalibration": "syncopate.results_db.values",
    "StoredTrial": "syncopate.results_db.values",
    "SweepInfo": "syncopate.results_db.values",
    "upgrade": "syncopate.results_db.migrate",
    "default_path": "syncopate.results_db.urls",
    "locate": "syncopate.results_db.urls",
    "ExportEntry": "syncopate.results_db.transfer",
    "read_export": "syncopate.results_db.transfer",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'syncopate.results_db' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
