"""How fast the dashboard's data functions answer on a database of 100,000 trials.

Fills a SQLite database (or a given URL) with synthetic trials: 25 workloads × 2 topologies × 2
environments × 1,000 candidates, four sweeps with baselines, 15 % of the trials failed, a tenth of
them of source `predicted`. Then times, each the median of `--runs` calls on a warm connection
pool: the overview over everything, the filter choices, the sweeps table, and the drill-down of one
(workload, topology, environment) (convergence, backend × num_splits, tile orders, failures).

Usage: python benchmarks/dashboard_speed.py [--trials 100000] [--db URL] [--runs 5]
Target: the overview in well under a second on SQLite.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from syncopate.records import Environment
from syncopate.results_db import ResultsDB
from syncopate.results_db.models import BaselineModel, TrialModel
from syncopate.search_space import Candidate, Shape, Topology, Workload

TOPOLOGIES = (Topology.from_key("H200x2-nvlink"), Topology.from_key("H100x8-nvswitch"))
ENVIRONMENTS = (
    Environment(
        syncopate="0.1.0",
        torch="2.11.0+cu130",
        triton="3.6.0",
        cuda="13.0",
        nccl="2.28.3",
        driver="580.159.04",
        gpu_model="H200",
    ),
    Environment(
        syncopate="0.1.0",
        torch="2.12.0+cu130",
        triton="3.7.0",
        cuda="13.0",
        nccl="2.29.1",
        driver="580.159.04",
        gpu_model="H200",
    ),
)
FAILED = ("wrong_result", "compile_error", "oom", "timeout", "crash")
BASELINE_FACTORS = {
    "torch_seq": 1.35,
    "torch_async_tp": 1.25,
    "gemm_alone": 0.8,
    "comm_alone": 0.6,
    "comm_alone_copy_engine": 0.45,
}


def workloads() -> list[Workload]:
    out = []
    for kind, n, k in itertools.product(
        ("ag_gemm", "gemm_rs"), (2048, 4096, 11008, 14336, 28672), (4096, 8192)
    ):
        out.append(Workload(kind=kind, shape=Shape(m=8192, n=n, k=k), dtype="bf16"))
    for n in (2048, 4096, 11008, 14336, 28672):
        out.append(Workload(kind="gemm_ar", shape=Shape(m=8192, n=n, k=4096), dtype="fp16"))
    return out


def candidates(count: int) -> list[Candidate]:
    out = []
    grid = itertools.product(
        (("copy_engine", 0), ("sm_copy", 16), ("sm_copy", 32), ("nccl", 16)),
        ("direct", "ring"),
        (1, 2, 4, 8),
        ("arrival", "arrival_colmajor", "swizzle", "row_major"),
        ((128, 256, 64, 8), (128, 128, 64, 8)),
        (4, 8),
        (2, 3, 4, 5),
    )
    for (backend, sms), template, splits, order, (bm, bn, bk, w), group_m, stages in grid:
        out.append(
            Candidate(
                backend=backend,
                template=template,
                num_splits=splits,
                tile_order=order,
                comm_sms=sms,
                block_m=bm,
                block_n=bn,
                block_k=bk,
                group_m=group_m,
                num_warps=w,
                num_stages=stages,
            )
        )
        if len(out) == count:
            return out
    raise ValueError(f"the grid has fewer than {count} candidates")


def fill(db: ResultsDB, trials: int) -> tuple[float, int]:
    """Store about `trials` synthetic trials (bulk inserts); (seconds, trials stored)."""
    loads = workloads()
    groups = len(loads) * len(TOPOLOGIES) * len(ENVIRONMENTS)
    per = max(1, trials // groups)
    cands = candidates(per)
    docs = [(c.key(), c.to_dict()) for c in cands]
    start = time.perf_counter()
    t0 = datetime(2026, 11, 20, tzinfo=timezone.utc)
    stored = 0
    for (ti, topo), (ei, env) in itertools.product(enumerate(TOPOLOGIES), enumerate(ENVIRONMENTS)):
        began = t0 + timedelta(days=ti * 2 + ei)
        sweep = db.start_sweep(
            f"synthetic-{topo.key()}-{ei}", {"synthetic": True}, host=f"node{ti}", started_at=began
        )
        # The first trial and baseline of each workload through the repository make the dimension rows.
        rows, base = [], []
        with db.session_scope() as session:
            from syncopate.results_db.writes import DimensionIds

            dims = DimensionIds()
            for wi, w in enumerate(loads):
                w_id, tp_id, e_id = (
                    dims.workload(session, w),
                    dims.topology(session, topo),
                    dims.environment(session, env),
                )
                scale = 200.0 + 40.0 * wi + 30.0 * ti + 5.0 * ei
                for i, (h, doc) in enumerate(docs):
                    failed = (i * 7 + wi) % 20 < 3
                    median = (
                        None
                        if failed
                        else scale * (1.0 + ((i * 7919 + wi * 31) % 1000) / 400.0 + 3.0 / (i + 1))
                    )
                    rows.append(
                        {
                            "sweep_id": sweep,
                            "workload_id": w_id,
                            "topology_id": tp_id,
                            "environment_id": e_id,
                            "candidate_hash": h,
                            "candidate": doc,
                            "status": FAILED[(i + wi) % len(FAILED)] if failed else "ok",
                            "source": "predicted" if i % 10 == 9 else "measured",
                            "median_us": median,
                            "p20_us": None if failed else median * 0.98,
                            "p80_us": None if failed else median * 1.03,
                            "samples_us": [],
                            "max_rel_error": None,
                            "error": f"{FAILED[(i + wi) % len(FAILED)]} at candidate {i % 7}"
                            if failed
                            else "",
                            "worker": {"host": f"node{ti}"},
                            "strategy": ("grid", "random", "optuna-tpe")[i % 3],
                            "created_at": began + timedelta(seconds=wi * per + i),
                        }
                    )
                for name, f in BASELINE_FACTORS.items():
                    base.append(
                        {
                            "sweep_id": sweep,
                            "workload_id": w_id,
                            "topology_id": tp_id,
                            "environment_id": e_id,
                            "name": name,
                            "source": "measured",
                            "median_us": scale * f,
                            "p20_us": None,
                            "p80_us": None,
                            "samples_us": [],
                            "detail": "synthetic",
                            "created_at": began,
                        }
                    )
            for chunk in range(0, len(rows), 5000):
                session.execute(TrialModel.__table__.insert(), rows[chunk : chunk + 5000])
            session.execute(BaselineModel.__table__.insert(), base)
        db.finish_sweep(sweep, "done", finished_at=began + timedelta(seconds=len(rows)))
        stored += len(rows)
    return time.perf_counter() - start, stored


def timed(fn, runs: int) -> float:
    """Median milliseconds of `runs` calls of fn (after one untimed call)."""
    fn()
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def measure(db: ResultsDB, runs: int) -> dict[str, float]:
    from syncopate.dashboard import data

    overview = data.overview(db)
    sel = data.Selection.of(overview.iloc[0])
    return {
        "overview": timed(lambda: data.overview(db), runs),
        "overview, filtered (one topology, measured)": timed(
            lambda: data.overview(db, data.Filters(topologies=(TOPOLOGIES[0].key(),), sources=("measured",))),
            runs,
        ),
        "filter choices": timed(lambda: data.filter_options(db), runs),
        "sweeps": timed(lambda: data.sweeps(db), runs),
        "drill-down (4 queries)": timed(
            lambda: (
                data.convergence(db, sel),
                data.backend_splits(db, sel),
                data.tile_orders(db, sel),
                data.failures(db, sel),
            ),
            runs,
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=100_000)
    parser.add_argument("--db", default=None, help="an empty database URL (default: a temporary SQLite file)")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = args.db or f"sqlite:///{Path(tmp) / 'dashboard.db'}"
        with ResultsDB.open(url, upgrade=True) as db:
            seconds, stored = fill(db, args.trials)
            print(f"filled {db.url}: {stored} trials in {seconds:.1f} s")
            results = measure(db, args.runs)
    width = max(map(len, results))
    for name, ms in results.items():
        print(f"{name:<{width}}  {ms:8.1f} ms (median of {args.runs})")


if __name__ == "__main__":
    main()
