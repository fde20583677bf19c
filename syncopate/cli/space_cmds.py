"""`syncopate space` and `syncopate validate`: look at the search space and check sweep configs."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import typer

from syncopate.cli import app, console
from syncopate.cli.tables import Column, Listing, show

_JSON_HELP = "Print the table's rows as JSON."
_WIDE_HELP = "Every column of the table."


@app.command("space")
def space_cmd(
    kind: str = typer.Option("ag_gemm", help="Op kind: ag_gemm, gemm_rs or gemm_ar."),
    m: int = typer.Option(..., help="Global M (rows of A and of the output)."),
    n: int = typer.Option(..., help="Global N."),
    k: int = typer.Option(..., help="Global K."),
    dtype: str = typer.Option("bf16", help="bf16, fp16, fp32 or fp8."),
    topology: str = typer.Option(..., help="Topology key such as H200x2-nvlink."),
    as_json: bool = typer.Option(
        False, "--json", help="Print the candidates as a JSON list (with --predict: the ranked predictions)."
    ),
    predict: int = typer.Option(
        0,
        "--predict",
        min=0,
        help="Also rank the space with the cost model and show its best N (predictions).",
    ),
    db: str | None = typer.Option(None, "--db", help="Where stored calibrations are read (with --predict)."),
    wide: bool = typer.Option(False, "--wide", help=_WIDE_HELP),
) -> None:
    """Count (or list, with --json) the valid candidates of one workload on one topology."""
    from syncopate.search_space import (
        Shape,
        SpaceOptions,
        Topology,
        Workload,
        empty_space_message,
        space,
        too_short_for_tiles,
    )

    out = console()
    workload = Workload(kind=kind, shape=Shape(m=m, n=n, k=k), dtype=dtype)
    topo = Topology.from_key(topology)
    candidates = space(workload, topo, SpaceOptions())
    if not candidates and not as_json:
        out.print(f"{workload} on {topo.key()}: 0 valid candidates", highlight=False)
        out.print(empty_space_message(workload, topo), highlight=False)
        return
    short = too_short_for_tiles(workload, topo)
    if short and not as_json:
        out.print(f"{workload} on {topo.key()}: no fused candidate; {short}", highlight=False)
    if predict:
        _predict(workload, topo, candidates, predict, db, as_json=as_json, wide=wide)
        return
    if as_json:
        print(json.dumps([c.to_dict() for c in candidates], indent=1))
        return
    counts = sorted(Counter((c.backend, c.template) for c in candidates).items())
    listing = Listing(
        title=f"{workload} on {topo.key()}: {len(candidates)} valid candidates",
        columns=(
            Column(name="backend", key=True),
            Column(name="template", key=True),
            Column(name="candidates", numeric=True),
        ),
        rows=[(backend, template, str(count)) for (backend, template), count in counts],
    )
    show(listing, out, wide=wide)


@app.command("validate")
def validate_cmd(
    config: Path = typer.Argument(..., help="Sweep config (YAML)."),
    as_json: bool = typer.Option(False, "--json", help="Print the sweep and its workloads as JSON."),
    wide: bool = typer.Option(False, "--wide", help=_WIDE_HELP),
) -> None:
    """Check a sweep config and show what it would tune."""
    from syncopate.autotuner.sweep import load_sweep
    from syncopate.search_space import Topology, space

    sweep = load_sweep(config)
    topo = None if sweep.detect_topology else Topology.from_key(sweep.topology_key)
    counts = [len(space(w, topo, sweep.space)) if topo else None for w in sweep.workloads]
    if as_json:
        print(
            json.dumps(
                {
                    "config": str(config),
                    "name": sweep.name,
                    "topology": sweep.topology_key,
                    "runner": sweep.runner,
                    "strategy": sweep.strategy.name,
                    "max_trials": sweep.strategy.max_trials,
                    "workloads": [
                        {"workload": w.key(), "candidates": c} for w, c in zip(sweep.workloads, counts)
                    ],
                },
                indent=1,
            )
        )
        return
    out = console()
    out.print(
        f"{config}: valid. sweep {sweep.name!r}, topology {sweep.topology_key}, runner {sweep.runner}, "
        f"strategy {sweep.strategy.name}"
        + (f" (max {sweep.strategy.max_trials} trials per workload)" if sweep.strategy.max_trials else ""),
        highlight=False,
    )
    listing = Listing(
        title="",
        columns=(Column(name="workload", key=True), Column(name="candidates", numeric=True)),
        rows=[
            (w.key(), str(c) if c is not None else "(topology detected at run time)")
            for w, c in zip(sweep.workloads, counts)
        ],
    )
    show(listing, out, wide=wide)


def _predict(
    workload, topo, candidates: list, top: int, db: str | None, *, as_json: bool, wide: bool
) -> None:
    from syncopate.autotuner.runs import load_calibration
    from syncopate.cost_model.model import CostModel

    out = console()
    calibration = load_calibration(topo, None, db, "auto")
    model = CostModel(calibration)
    ranked = model.rank(workload, topo, candidates)
    feasible = [p for p in ranked if p.feasible]
    kept = model.prune(workload, topo, candidates)
    base = model.baselines(workload, topo)
    seq = base.get("torch_seq")
    best = feasible[:top]
    listing = Listing(
        title=(
            f"{workload} on {topo.key()}: {len(candidates)} valid candidates, {len(ranked) - len(feasible)} cannot "
            f"run here, {len(kept)} worth measuring. PREDICTED by the cost model, not measured "
            f"({calibration.describe()})."
        ),
        columns=(
            Column(name="rank", numeric=True),
            Column(name="predicted µs", numeric=True),
            Column(name="vs torch_seq", numeric=True),
            Column(name="waves", numeric=True, wide=True),
            Column(name="stall µs", numeric=True, wide=True),
            Column(name="candidate", key=True),
        ),
        rows=[
            (
                str(i),
                f"{p.time_us:.1f}",
                f"{seq / p.time_us:.2f}×" if seq else "–",
                str(p.waves),
                f"{p.stall_us:.1f}",
                p.candidate.short(),
            )
            for i, p in enumerate(best, 1)
        ],
        records=[
            {
                "rank": i,
                "predicted_us": p.time_us,
                "vs_torch_seq": seq / p.time_us if seq else None,
                "waves": p.waves,
                "stall_us": p.stall_us,
                "candidate": p.candidate.to_dict(),
            }
            for i, p in enumerate(best, 1)
        ],
    )
    show(listing, out, wide=wide, as_json=as_json)
