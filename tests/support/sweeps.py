"""Sweep configs for the tests of `syncopate tune` on the CPU fixture, and the plans they make."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from syncopate.autotuner.strategies import SearchProblem, make_strategy
from syncopate.autotuner.sweep import load_sweep
from syncopate.search_space import Topology


def fixture_sweep(
    tmp_path: Path,
    *,
    name: str = "fx",
    topology: str = "H200x2-nvlink",
    shapes: tuple[tuple[str, tuple[int, int, int]], ...] = (("ag_gemm", (4096, 4096, 4096)),),
    strategy: str = "random",
    max_trials: int = 8,
    deadline_s: float = 20.0,
    fixture: dict[str, Any] | None = None,
    runner: str = "cpu-fixture",
    top_k_remeasure: int | None = None,
    **extra: Any,
) -> Path:
    """Write a sweep config for the fixture runner; return its path. `top_k_remeasure` set asks
    the fixture, which re-measures only when told, to measure the best few again."""
    data = {
        "name": name,
        "topology": topology,
        "workloads": [{"kind": kind, "shapes": [list(shape)]} for kind, shape in shapes],
        "strategy": {"name": strategy, "max_trials": max_trials, "seed": 0},
        "runner": runner,
        "timing": {"warmup": 0, "repetitions": 5, "deadline_s": deadline_s},
        **extra,
    }
    if top_k_remeasure is not None:
        data["strategy"]["top_k_remeasure"] = top_k_remeasure
    if fixture is not None:
        data["fixture"] = fixture
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def planned_keys(config: Path, workload_index: int = 0) -> list[str]:
    """Candidate keys the config's strategy proposes for one workload, in order."""
    sweep = load_sweep(config)
    problem = SearchProblem(
        workload=sweep.workloads[workload_index],
        topology=Topology.from_key(sweep.topology_key),
        options=sweep.space,
    )
    strategy = make_strategy(
        sweep.strategy.name, problem, max_trials=sweep.strategy.max_trials, seed=sweep.strategy.seed
    )
    return [c.key() for c in strategy.ask(strategy.planned)]
