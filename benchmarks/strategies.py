"""Strategies against an exhaustive sweep: how many trials each needs, and how well the cost model ranks.

For every workload of a sweep config (default: configs/llama_tp2.yaml) and every strategy, over
several seeds: the trials needed until one is within 3 % of the exhaustive best, as a fraction of
the exhaustive trial count (median over workloads and seeds; a run that does not get there
within `--cap` of the sweep counts as not reaching it). Per workload: the Spearman rank
correlation between the cost model's predictions (the default calibration, or what the database
holds) and the sweep, and how far the model's own pick is from the best.

The targets (optuna-tpe and model-guided within 20 % of the exhaustive count, Spearman >= 0.7, the
model's pick within 10 %) are about a *measured* exhaustive sweep:

    syncopate tune configs/llama_tp2.yaml --runner gpu --max-trials 100000   # strategy grid: every candidate
    python benchmarks/strategies.py --sweep postgresql+psycopg://…/syncopate --sweep-name llama_tp2

Without `--sweep`, the sweep is SYNTHETIC (:mod:`syncopate.autotuner.synthetic`: the cost model
under a randomly perturbed calibration, times a log-normal factor per candidate), and every line
of the output says so.

    python benchmarks/strategies.py                       # synthetic, 5 seeds, every strategy
    python benchmarks/strategies.py --seeds 1 --workloads 3 --out /tmp/quick.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from syncopate.autotuner.evaluation import model_agreement, trials_to_target  # noqa: E402
from syncopate.autotuner.runs import load_calibration  # noqa: E402
from syncopate.autotuner.sweep import load_sweep  # noqa: E402
from syncopate.autotuner.synthetic import synthetic_sweep  # noqa: E402
from syncopate.cost_model.model import CostModel  # noqa: E402
from syncopate.search_space import Topology  # noqa: E402
from syncopate.workers.replay_runner import ReplayOptions, load_stored_sweep  # noqa: E402

STRATEGIES = ("grid", "seeded", "random", "optuna-tpe", "model-guided")


def _fmt_fraction(x: float, cap: float) -> str:
    return f">{cap:.0%}" if math.isinf(x) else f"{x:.1%}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/llama_tp2.yaml")
    ap.add_argument("--sweep", help="a measured sweep to replay: a sweep file or a results database URL")
    ap.add_argument("--sweep-name", help="with a database: the sweep's name or id")
    ap.add_argument("--topology", help="topology key, for a config that detects it (e.g. H200x2-nvlink)")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--truth-seed", type=int, default=0, help="seed of the synthetic ground truth")
    ap.add_argument("--strategies", default=",".join(STRATEGIES))
    ap.add_argument("--workloads", type=int, help="only the first N workloads of the config")
    ap.add_argument("--cap", type=float, default=0.5, help="stop a run after this fraction of the sweep")
    ap.add_argument("--tolerance", type=float, default=0.03)
    ap.add_argument(
        "--calibration-db",
        help="a results database whose calibrations the cost model uses (those "
        "`syncopate calibrate` measured for the topology; default: the documented defaults)",
    )
    ap.add_argument("--out", help="a JSON file to write every number to (and the table beside it, as .md)")
    args = ap.parse_args(argv)
    sweep_cfg = load_sweep(args.config)
    key = args.topology or sweep_cfg.topology_key
    if key == "detect":
        ap.error(
            f"{args.config} detects its topology: name the one its sweep ran on with --topology (e.g. H200x2-nvlink)"
        )
    topology = Topology.from_key(key)
    workloads = list(sweep_cfg.workloads)[: args.workloads]
    started = time.time()
    if args.sweep:
        stored = load_stored_sweep(ReplayOptions(source=args.sweep, sweep=args.sweep_name), topology)
        workloads = [w for w in workloads if w.key() in stored.trials]
    else:
        stored = synthetic_sweep(workloads, topology, seed=args.truth_seed, options=sweep_cfg.space)
    synthetic = stored.synthetic
    header = (
        f"SYNTHETIC GROUND TRUTH, NOT A MEASUREMENT: {stored.label}.\n"
        f"The issue's targets need a measured exhaustive sweep from `syncopate tune` on the GPUs "
        f"(see this script's docstring); these numbers only show that the search machinery works."
        if synthetic
        else f"Measured sweep: {stored.label}"
    )
    print(header, flush=True)
    calibration = load_calibration(
        topology, None, args.calibration_db, "auto" if args.calibration_db else "default"
    )
    model = CostModel(calibration)
    names = [s.strip() for s in args.strategies.split(",") if s.strip()]
    outcomes, agreements = [], []
    for w in workloads:
        a = model_agreement(model, stored, w)
        agreements.append(a)
        print(
            f"{w.key()}: {a.candidates} ok candidates, Spearman {a.spearman:.3f}, model pick {a.pick_gap:+.1%} "
            f"from the best",
            flush=True,
        )
        for name in names:
            seeds = [0] if name == "grid" else list(range(args.seeds))
            for seed in seeds:
                o = trials_to_target(
                    name,
                    stored,
                    w,
                    seed=seed,
                    tolerance=args.tolerance,
                    cap=args.cap,
                    options=sweep_cfg.space,
                    calibration=model,
                )
                outcomes.append(o)
                print(
                    f"  {name:13s} seed {seed}: {o.trials if o.trials is not None else '—'} / {o.total} trials "
                    f"({_fmt_fraction(o.fraction, args.cap)})",
                    flush=True,
                )
    label = "SYNTHETIC" if synthetic else "measured"
    lines = [
        header,
        "",
        f"Strategies ({label} sweep of {len(workloads)} workloads of {args.config} on "
        f"{topology.key()}, {args.seeds} seeds; trials to get within {args.tolerance:.0%} of the exhaustive "
        f"best, as a fraction of the exhaustive trial count; runs capped at {args.cap:.0%}):",
        "",
        "| strategy | median fraction | runs within 20% | runs reaching the target |",
        "|---|---|---|---|",
    ]
    for name in names:
        mine = [o.fraction for o in outcomes if o.strategy == name]
        reached = sum(1 for f in mine if math.isfinite(f))
        within = sum(1 for f in mine if f <= 0.2)
        lines.append(
            f"| {name} | {_fmt_fraction(statistics.median(mine), args.cap)} | {within}/{len(mine)} | "
            f"{reached}/{len(mine)} |"
        )
    lines += [
        "",
        f"Cost model ({calibration.describe()}) against the {label} sweep:",
        "",
        "| workload | candidates | Spearman | model's pick vs best |",
        "|---|---|---|---|",
    ]
    for a in agreements:
        lines.append(f"| {a.workload} | {a.candidates} | {a.spearman:.3f} | {a.pick_gap:+.1%} |")
    spear = [a.spearman for a in agreements]
    lines.append(
        f"| median | | {statistics.median(spear):.3f} | {statistics.median(a.pick_gap for a in agreements):+.1%} |"
    )
    lines.append(f"\n({time.time() - started:.0f} s)")
    report = "\n".join(lines)
    print("\n" + report)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(
            json.dumps(
                {
                    "synthetic": synthetic,
                    "label": stored.label,
                    "config": args.config,
                    "topology": topology.key(),
                    "seeds": args.seeds,
                    "cap": args.cap,
                    "tolerance": args.tolerance,
                    "outcomes": [
                        {
                            "strategy": o.strategy,
                            "seed": o.seed,
                            "workload": o.workload,
                            "trials": o.trials,
                            "total": o.total,
                        }
                        for o in outcomes
                    ],
                    "model": [
                        {
                            "workload": a.workload,
                            "spearman": a.spearman,
                            "pick_gap": a.pick_gap,
                            "candidates": a.candidates,
                        }
                        for a in agreements
                    ],
                },
                indent=1,
            )
        )
        out.with_suffix(".md").write_text(report + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
