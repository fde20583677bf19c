"""The cost model's predictions of the LLaMA suites at tensor parallelism 2, 4 and 8, as markdown.

No GPU: `syncopate tune --runner model` predicts every candidate a sweep would measure and stores
the predictions (source `predicted`) in a results database; this script reads them back and
prints, per sweep and shape, the predicted torch_seq, overlap bound and best candidate, and the
speedup, then the speedups side by side per model across the world sizes. It refuses a database
whose rows are not all predictions, and its first line says what the numbers are.

    db=results/predicted-h200-tp2-tp4-tp8.db
    for tp in 2 4 8; do syncopate tune configs/llama_tp$tp.yaml --runner model --db $db; done
    python benchmarks/predict_tp.py --db $db --out results/predicted-tp4-tp8.md
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from syncopate.autotuner.sweep import SweepFile, parse_sweep  # noqa: E402
from syncopate.records import Environment  # noqa: E402
from syncopate.results_db import ResultsDB  # noqa: E402
from syncopate.search_space import Candidate, Workload, model_shape, space_size  # noqa: E402

SWEEPS = ("llama_tp2", "llama_tp4", "llama_tp8")


@dataclass(frozen=True)
class Row:
    """One workload of one sweep, as predicted."""

    workload: Workload
    label: str
    """The model whose MLP it is, or `heavy` for the communication-heavy shapes."""
    world_size: int
    torch_seq_us: float
    bound_us: float
    best_us: float
    candidate: Candidate
    trials: int
    """Candidates predicted (the config's grid)."""
    space: int
    """Candidates in the config's search space."""

    @property
    def speedup(self) -> float:
        return self.torch_seq_us / self.best_us


def _labels(config: dict) -> dict[str, str]:
    """Workload key → the model named for it in the sweep config (else `heavy`)."""
    out: dict[str, str] = {}
    for entry in config.get("workloads", []):
        tokens = entry.get("tokens") or config.get("tokens", 8192)
        dtype = entry.get("dtype") or config.get("dtype", "bf16")
        for model in entry.get("models", []):
            shape = model_shape(model, entry["kind"], tokens)
            out.setdefault(Workload(kind=entry["kind"], shape=shape, dtype=dtype).key(), model)
    return out


def sweep_rows(db: ResultsDB, name: str) -> tuple[list[Row], str, str]:
    """The rows of the latest sweep called `name`, its topology key and its calibration's source."""
    info = db.latest_sweep(name)
    if info is None:
        raise SystemExit(
            f"no sweep {name!r} in {db.url}: run "
            f"`syncopate tune configs/{name}.yaml --runner model --db {db.url}`"
        )
    trials = db.trials(sweep_id=info.sweep_id)
    if not trials:
        raise SystemExit(f"sweep {name!r} (id {info.sweep_id}) in {db.url} holds no trials")
    sources = {t.record.source for t in trials} | {
        b.record.source for b in db.baselines(sweep_id=info.sweep_id)
    }
    if sources != {"predicted"}:
        raise SystemExit(
            f"sweep {name!r} (id {info.sweep_id}) holds {sorted(sources)} rows: this script prints "
            f"predictions only"
        )
    calibrations = {t.record.worker.get("calibration", "?") for t in trials}
    environment = Environment.from_dict(info.config["environment"])
    labels = _labels(info.config)
    sweep = parse_sweep({k: v for k, v in info.config.items() if k in SweepFile.model_fields})
    rows: list[Row] = []
    topology = trials[0].topology
    for w in dict.fromkeys(t.workload for t in trials):
        base = {b.name: b.median_us for b in db.baselines(workload=w, sweep_id=info.sweep_id)}
        comm = min(v for k, v in base.items() if k.startswith("comm_alone"))
        best = db.sweep_best(info.sweep_id, w, topology, environment)
        rows.append(
            Row(
                workload=w,
                label=labels.get(w.key(), "heavy"),
                world_size=topology.world_size,
                torch_seq_us=base["torch_seq"],
                bound_us=max(base["gemm_alone"], comm),
                best_us=best.median_us,
                candidate=best.candidate,
                trials=sum(1 for t in trials if t.workload == w),
                space=space_size(w, topology, sweep.space),
            )
        )
    return rows, topology.key(), "+".join(sorted(calibrations))


def _candidate(c: Candidate) -> str:
    return f"{c.backend}/{c.template}/s{c.num_splits}/{c.tile_order}/sms{c.comm_sms}"


def _tile(c: Candidate) -> str:
    return f"{c.block_m}x{c.block_n}x{c.block_k} g{c.group_m} w{c.num_warps} st{c.num_stages}"


def _width(r: Row) -> str:
    w, ws = r.workload, r.world_size
    return f"N/{ws}={w.shape.n // ws}" if w.kind == "ag_gemm" else f"K/{ws}={w.shape.k // ws}"


def report(sweeps: dict[str, tuple[list[Row], str, str]]) -> str:
    calibrations = {c for _, _, c in sweeps.values()}
    which = (
        "its DEFAULT calibration (documented leads, nothing measured)"
        if calibrations == {"default"}
        else (f"calibration(s) {', '.join(sorted(calibrations))}")
    )
    lines = [
        f"PREDICTIONS of Syncopate's cost model under {which}, NOT measurements: no GPU ran any of this.",
        "",
        "Made by `syncopate tune configs/llama_tpN.yaml --runner model` (N = 2, 4, 8) and "
        "`python benchmarks/predict_tp.py`; the rows are in `results/predicted-h200-tp2-tp4-tp8.db` "
        "(source `predicted`). Each sweep predicted the candidates its config's grid strategy measures "
        "on GPUs (`trials` of the `space` per shape, evenly spaced); `best` is the fastest of those, not of "
        "the whole space. Times in µs; speedup = torch_seq / best; bound = max(GEMM "
        "alone, fastest collective alone). `*`: gemm_ar's baselines hold only NCCL's all-reduce (no "
        "copy-engine all-reduce is measured or predicted), so its bound is no lower bound and a "
        "copy-engine candidate can beat it.",
    ]
    for name, (rows, topology, _) in sweeps.items():
        lines += [
            "",
            f"## {name} on {topology} (predicted)",
            "",
            "| kind | shape (M×N×K) | model | per rank | trials / space | torch_seq | bound | best | speedup | "
            "best candidate (backend/template/splits/order/comm_sms) | tile |",
            "|---|---|---|---|---:|---:|---:|---:|---:|---|---|",
        ]
        for r in rows:
            s = r.workload.shape
            star = "*" if r.workload.kind == "gemm_ar" and r.best_us < r.bound_us else ""
            lines.append(
                f"| {r.workload.kind} | {s.m}×{s.n}×{s.k} | {r.label} | {_width(r)} | {r.trials} / {r.space} | "
                f"{r.torch_seq_us:.1f} | "
                f"{r.bound_us:.1f}{star} | {r.best_us:.1f} | {r.speedup:.2f}× | {_candidate(r.candidate)} | "
                f"{_tile(r.candidate)} |"
            )
    names = list(sweeps)
    lines += [
        "",
        "## Predicted speedup over torch_seq by world size (model shapes)",
        "",
        "| kind | model | " + " | ".join(f"{sweeps[n][1]}" for n in names) + " |",
        "|---|---|" + "---:|" * len(names),
    ]
    by_label = {n: {(r.workload.kind, r.label): r for r in sweeps[n][0] if r.label != "heavy"} for n in names}
    keys = [k for k in by_label[names[0]] if all(k in by_label[n] for n in names)]
    for kind, label in keys:
        cells = [
            f"{by_label[n][(kind, label)].speedup:.2f}× ({by_label[n][(kind, label)].best_us:.0f} µs)"
            for n in names
        ]
        lines.append(f"| {kind} | {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--db", default="results/predicted-h200-tp2-tp4-tp8.db", help="results database (URL or path)"
    )
    ap.add_argument("--sweeps", default=",".join(SWEEPS), help="sweep names, comma-separated")
    ap.add_argument("--out", help="also write the markdown to this file")
    args = ap.parse_args(argv)
    if "://" not in args.db and not Path(args.db).exists():
        raise SystemExit(
            f"{args.db} does not exist: fill it with `syncopate tune … --runner model --db {args.db}`"
        )
    with ResultsDB.open(args.db, upgrade=False) as db:
        sweeps = {name: sweep_rows(db, name) for name in (s.strip() for s in args.sweeps.split(",")) if name}
    text = report(sweeps)
    print(text, end="")
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
