"""`syncopate space` and `syncopate validate`: look at the search space and check sweep configs."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from syncopate.cli import app
from syncopate.search_space import Shape, SpaceOptions, Topology, Workload, space

_out = Console()


@app.command("space")
def space_cmd(
    kind: str = typer.Option("ag_gemm", help="Op kind: ag_gemm, gemm_rs or gemm_ar."),
    m: int = typer.Option(..., help="Global M (rows of A and of the output)."),
    n: int = typer.Option(..., help="Global N."),
    k: int = typer.Option(..., help="Global K."),
    dtype: str = typer.Option("bf16", help="bf16, fp16 or fp32."),
    topology: str = typer.Option(..., help="Topology key such as H200x2-nvlink."),
    as_json: bool = typer.Option(False, "--json", help="Print the candidates as a JSON list."),
) -> None:
    """Count (or list, with --json) the valid candidates of one workload on one topology."""
    workload = Workload(kind=kind, shape=Shape(m=m, n=n, k=k), dtype=dtype)
    topo = Topology.from_key(topology)
    candidates = space(workload, topo, SpaceOptions())
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
