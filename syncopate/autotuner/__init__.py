"""The coordinator: sweep configs, strategies, the cost model, dispatch to gangs, resume."""

from syncopate.autotuner.sweep import RUNNERS, STRATEGIES, Sweep, load_sweep, parse_sweep

__all__ = ["RUNNERS", "STRATEGIES", "Sweep", "load_sweep", "parse_sweep"]
