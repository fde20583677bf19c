"""How fast `syncopate.lookup` answers: warm (cached) and first in a new process, on SQLite.

Fills a SQLite database with 100,000 trials (50 workloads × 2 environments × 1,000 candidates over
two sweeps, 15 % of them failed), then measures:

- warm: the median (and p90) of single cached lookups in this process;
- first in a new process: a fresh interpreter that has imported torch, triton and syncopate (as a
  job running Syncopate's Triton kernels has) times its first `lookup` call: the lookup modules'
  import, database open, schema check, environment fingerprint and ladder included. Each rung is
  measured in its own processes (the cost model's rung imports the model, numpy included); the
  median over the runs is reported;
- for reference, the environment fingerprint alone in a process that has imported torch but not
  triton (the fingerprint reads triton's version by importing it).

The package is byte-compiled first, as an installed one is.

Usage: python benchmarks/lookup_speed.py [--trials 100000] [--db PATH] [--runs 5]
Targets: warm median ≤ 20 µs; first lookup ≤ 50 ms.
"""

from __future__ import annotations

import argparse
import compileall
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import syncopate
from syncopate.records import Environment, TrialRecord
from syncopate.results_db import ResultsDB
from syncopate.results_db.lookups import clear_cache, lookup
from syncopate.search_space import Shape, Topology, Workload, space

TOPOLOGY = Topology.from_key("H200x2-nvlink")
STATUSES = ("wrong_result", "compile_error", "oom", "timeout", "crash")

CHILD = """
import json, sys, time
import torch, syncopate  # a job has torch imported at start; triton comes with the first fused op
t0 = time.perf_counter()
r = syncopate.lookup(tuple(json.loads(sys.argv[2])), sys.argv[3], db=sys.argv[1])
t1 = time.perf_counter()
print(json.dumps({"ms": (t1 - t0) * 1e3, "match": r.match, "sqlalchemy": "sqlalchemy" in sys.modules}))
"""


def workloads() -> list[Workload]:
    out = []
    for kind in ("ag_gemm", "gemm_rs"):
        for n in (1024, 2048, 4096, 11008, 14336):
            for k in (2048, 4096, 8192, 16384, 28672):
                out.append(Workload(kind=kind, shape=Shape(m=8192, n=n, k=k), dtype="bf16"))
    return out


def fill(path: Path, trials: int) -> tuple[float, int]:
    here = Environment.current()
    other = Environment.from_dict({**here.to_dict(), "torch": "0.0-other"})
    loads = workloads()
    per = trials // (len(loads) * 2)
    start = time.perf_counter()
    with ResultsDB.open(path, upgrade=True) as db:
        sweeps = [db.start_sweep("bench-a"), db.start_sweep("bench-b")]
        stored = 0
        for w in loads:
            cands = space(w, TOPOLOGY)
            for env in (here, other):
                for s, sweep in enumerate(sweeps):
                    batch = []
                    half = per // 2
                    for i in range(half):
                        c = cands[(s * half + i) % len(cands)]
                        failed = i % 7 == 3
                        batch.append(
                            TrialRecord(
                                workload=w,
                                topology=TOPOLOGY,
                                environment=env,
                                candidate=c,
                                status=STATUSES[i % len(STATUSES)] if failed else "ok",
                                median_us=None if failed else 500.0 + (i * 7919) % 1000,
                                samples_us=() if failed else tuple(500.0 + j for j in range(20)),
                                worker={"host": "bench", "gpus": [0, 1]},
                                strategy="grid",
                            )
                        )
                    stored += len(set(db.record_trials(sweep, batch)))
    return time.perf_counter() - start, stored


def warm(path: Path, n: int) -> tuple[float, float]:
    clear_cache()
    shape = (8192, 4096, 8192)
    lookup(shape, "H200x2-nvlink", db=str(path))
    samples = []
    clock = time.perf_counter_ns
    for _ in range(n):
        t0 = clock()
        lookup(shape, "H200x2-nvlink", db=str(path))
        samples.append(clock() - t0)
    samples.sort()
    return samples[len(samples) // 2] / 1e3, samples[int(len(samples) * 0.9)] / 1e3


def first(path: Path, shape: tuple[int, int, int], topology: str, runs: int) -> tuple[float, str, bool]:
    results = []
    for _ in range(runs):
        out = subprocess.run(
            [sys.executable, "-c", CHILD, str(path), json.dumps(shape), topology],
            capture_output=True,
            text=True,
            check=True,
        )
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return statistics.median(r["ms"] for r in results), results[0]["match"], results[0]["sqlalchemy"]


FINGERPRINT = """
import json, time
import torch
from syncopate.environment import current_environment
t0 = time.perf_counter()
current_environment()
print(json.dumps({"ms": (time.perf_counter() - t0) * 1e3}))
"""


def fingerprint(runs: int) -> float:
    times = []
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-c", FINGERPRINT], capture_output=True, text=True, check=True)
        times.append(json.loads(out.stdout.strip().splitlines()[-1])["ms"])
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=100_000)
    parser.add_argument(
        "--db", type=Path, default=None, help="SQLite file to fill (default: a temporary one)"
    )
    parser.add_argument("--runs", type=int, default=5, help="new processes per rung")
    parser.add_argument("--warm", type=int, default=100_000, help="cached lookups to time")
    args = parser.parse_args()
    # Byte-compile the package as `pip install` does, so that new processes import it as a job would
    # (with PYTHONDONTWRITEBYTECODE set, a source checkout is otherwise compiled on every import).
    compileall.compile_dir(Path(syncopate.__file__).parent, quiet=1)
    with tempfile.TemporaryDirectory() as tmp:
        path = args.db or Path(tmp) / "bench.db"
        if path.exists():
            path.unlink()
        seconds, stored = fill(path, args.trials)
        size = path.stat().st_size / 2**20
        print(f"filled {path}: {stored} trials in {seconds:.1f} s ({size:.0f} MiB)")
        median, p90 = warm(path, args.warm)
        rows = [("warm (cached) lookup", f"{median:.2f} µs median, {p90:.2f} µs p90", "≤ 20 µs median")]
        for label, shape, topology in (
            ("exact", (8192, 4096, 8192), "H200x2-nvlink"),
            ("nearest_shape", (8192, 5000, 8192), "H200x2-nvlink"),
            ("other_topology", (8192, 4096, 8192), "H100x2-nvlink"),
            ("cost_model", (8192, 4096, 8192), "H100x4-nvswitch"),
        ):
            ms, match, sqlalchemy = first(path, shape, topology, args.runs)
            assert match == label, (match, label)
            note = "" if not sqlalchemy else " (SQLAlchemy imported)"
            target = "≤ 50 ms" if label != "cost_model" else "(imports the model)"
            rows.append(
                (f"first lookup, new process, {label}", f"{ms:.2f} ms median of {args.runs}{note}", target)
            )
        rows.append(
            (
                "fingerprint alone, triton not imported",
                f"{fingerprint(args.runs):.2f} ms median of {args.runs}",
                "(reference)",
            )
        )
        width = max(len(r[0]) for r in rows)
        print(f"\n{'measure':<{width}}  {'result':<36}  target")
        for name, result, target in rows:
            print(f"{name:<{width}}  {result:<36}  {target}")


if __name__ == "__main__":
    main()
