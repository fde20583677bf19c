"""The dashboard over the results database: a Streamlit app and a static HTML report of the same views.

Public names (imported on first use, so that `import syncopate.dashboard` needs neither Streamlit
nor Altair):

- the data functions of :mod:`.data`: :func:`overview`, :func:`convergence`, :func:`backend_splits`,
  :func:`tile_orders`, :func:`failures`, :func:`sweeps`, :func:`compare_sweeps`,
  :func:`environment_diff`, :func:`environments`, :func:`filter_options`, :func:`counts`, and the
  values :class:`Filters`, :class:`Selection`, :class:`FilterOptions`;
- :func:`build_report`, :func:`write_report`, :class:`ReportOptions` (:mod:`.report`);
- :func:`serve` (:mod:`.serve`): what `syncopate dashboard` runs.

The pages are in :mod:`.ui` (script `app.py`), the charts in :mod:`.charts`, the shared table
layouts and messages in :mod:`.views`.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "FilterOptions",
    "Filters",
    "ReportOptions",
    "Selection",
    "backend_splits",
    "build_report",
    "compare_sweeps",
    "convergence",
    "counts",
    "environment_diff",
    "environments",
    "failures",
    "filter_options",
    "overview",
    "serve",
    "sweeps",
    "tile_orders",
    "write_report",
]

_LAZY: dict[str, str] = {
    **{
        name: "syncopate.dashboard.data"
        for name in (
            "FilterOptions",
            "Filters",
            "Selection",
            "backend_splits",
            "compare_sweeps",
            "convergence",
            "counts",
            "environment_diff",
            "environments",
            "failures",
            "filter_options",
            "overview",
            "sweeps",
            "tile_orders",
        )
    },
    "ReportOptions": "syncopate.dashboard.report",
    "build_report": "syncopate.dashboard.report",
    "write_report": "syncopate.dashboard.report",
    "serve": "syncopate.dashboard.serve",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'syncopate.dashboard' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
