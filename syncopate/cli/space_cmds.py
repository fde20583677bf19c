"""`syncopate space` and `syncopate validate`: look at the search space and check sweep configs."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import typer
from rich.table import Table

from syncopate.cli import app, console
from syncopate.errors import ConfigError
from syncopate.search_space import (
    Shape,
    SpaceOptions,
    Topology,
    Workload,
    empty_space_message,
    space,
    too_short_for_tiles,
)

_out = console()


@app.command("space")
def space_cmd(
    kind: str = typer.Option("ag_gemm", help="Op kind: ag_gemm, gemm_rs or gemm_ar."),
    m: int = typer.Option(..., help="Global M (rows of A and of the output)."),
    n: int = typer.Option(..., help="Global N."),
    k: int = typer.Option(..., help="Global K."),
    dtype: str = typer.Option("bf16", help="bf16, fp16 or fp32."),
    topology: str = typer.Option(..., help="Topology key such as H200x2-nvlink."),
    as_json: bool = typer.Option(False, "--json", help="Print the candidates as a JSON list."),
    predict: int = typer.Option(
        0, "--predict", min=0, help="Also rank the space with the cost model and show its best N (predictions)."
    ),
    db: str | None = typer.Option(None, "--db", help="Where stored calibrations are read (with --predict)."),
) -> None:
    """Count (or list, with --json) the valid candidates of one workload on one topology."""
    if as_json and predict:
        raise ConfigError(f"--json and --predict {predict} exclude each other: --json lists the candidates, "
                          f"--predict ranks them in a table; give one")
    workload = Workload(kind=kind, shape=Shape(m=m, n=n, k=k), dtype=dtype)
    topo = Topology.from_key(topology)
    candidates = space(workload, topo, SpaceOptions())
    if not candidates and not as_json:
        _out.print(f"{workload} on {topo.key()}: 0 valid candidates", highlight=False)
        _out.print(empty_space_message(workload, topo), highlight=False)
        return
    short = too_short_for_tiles(workload, topo)
    if short and not as_json:
        _out.print(f"{workload} on {topo.key()}: no fused candidate; {short}", highlight=False)
    if predict:
        _predict(workload, topo, candidates, predict, db)
        return
    if as_json:
        print(json.dumps([c.to_dict() for c in candidates], indent=1))
        return
    _out.print(f"{workload} on {topo.key()}: {len(candidates)} valid candidates")
    table = Table("backend", "template", "candidates")
    for (backend, template), count in sorted(Counter((c.backend, c.template) for c in candidates).items()):
        table.add_row(backend, template, str(count))
    _out.print(table)


@app.command("validate")
def validate_cmd(config: Path = typer.Argument(..., help="Sweep config (YAML).")) -> None:
    """Check a sweep config and show what it would tune."""
    from syncopate.autotuner.sweep import load_sweep

    sweep = load_sweep(config)
    topo = None if sweep.detect_topology else Topology.from_key(sweep.topology_key)
    _out.print(
        f"{config}: valid. sweep {sweep.name!r}, topology {sweep.topology_key}, runner {sweep.runner}, "
        f"strategy {sweep.strategy.name}"
        + (f" (max {sweep.strategy.max_trials} trials per workload)" if sweep.strategy.max_trials else "")
    )
    table = Table("workload", "candidates")
    for w in sweep.workloads:
        table.add_row(w.key(), str(len(space(w, topo, sweep.space))) if topo else "(topology detected at run time)")
    _out.print(table)


def _predict(workload: Workload, topo: Topology, candidates: list, top: int, db: str | None) -> None:
    from syncopate.autotuner.cost_model import CostModel
    from syncopate.autotuner.runs import load_calibration

    calibration = load_calibration(topo, None, db, "auto")
    model = CostModel(calibration)
    ranked = model.rank(workload, topo, candidates)
    feasible = [p for p in ranked if p.feasible]
    kept = model.prune(workload, topo, candidates)
    base = model.baselines(workload, topo)
    _out.print(
        f"{workload} on {topo.key()}: {len(candidates)} valid candidates, {len(ranked) - len(feasible)} cannot run "
        f"here, {len(kept)} worth measuring. PREDICTED by the cost model, not measured ({calibration.describe()})."
    )
    table = Table("rank", "predicted µs", "vs torch_seq", "waves", "stall µs")
    table.add_column("candidate", no_wrap=True)
    seq = base.get("torch_seq")
    for i, p in enumerate(feasible[:top], 1):
        table.add_row(str(i), f"{p.time_us:.1f}", f"{seq / p.time_us:.2f}×" if seq else "–", str(p.waves),
                      f"{p.stall_us:.1f}", p.candidate.short())
    _out.print(table)
