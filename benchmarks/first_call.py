"""One GPU: what a job pays before its first fused call returns, with Triton's cache cold and warm.

Each measurement runs in a fresh process (as a job starts) with its own TRITON_CACHE_DIR:

- `import syncopate` (torch already imported), and `syncopate.lookup` of one LLaMA shape from the
  committed results database (the first lookup opens it; the second is the cache);
- the first launch of the all-gather's consumer, of the reduce-scatter's producer and of the
  all-reduce's producer (compiled, or loaded from the cache, then run), the second launch (from the
  context's relaunch cache), and the steady time of one call; communication is already complete or
  emulated on the same GPU (benchmarks/gpu_single.py's cases, which also check every output).

`python benchmarks/first_call.py` runs the matrix: Triton kernels cold then warm, Gluon kernels
(SYNCOPATE_GLUON=1) cold then warm; prints a table last, and the details as JSON to
$OUT/first_call.json when OUT is set. `python benchmarks/first_call.py child` is one measurement.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHAPE = (8192, 28672, 8192)  # LLaMA-3.1-70B's up projection at 8192 tokens
CASES = (
    ("consumer ag_gemm", "consumer", dict(m=8192, n=14336, k=8192, cfg=(128, 256, 64, 8, 3))),
    ("producer gemm_rs", "producer", dict(m=8192, n=8192, k=14336, cfg=(128, 256, 64, 8, 3))),
    (
        "producer gemm_ar",
        "producer",
        dict(m=8192, n=8192, k=14336, cfg=(128, 256, 64, 8, 3), all_reduce=True),
    ),
)


def child() -> dict:
    import torch

    torch.cuda.init()
    t = time.perf_counter()
    import syncopate

    out: dict = {"import_s": time.perf_counter() - t}
    t = time.perf_counter()
    found = syncopate.lookup(SHAPE, "H200x2-nvlink", db=str(ROOT / "results" / "h200x2.db"))
    out["lookup_first_ms"] = (time.perf_counter() - t) * 1e3
    t = time.perf_counter()
    syncopate.lookup(SHAPE, "H200x2-nvlink", db=str(ROOT / "results" / "h200x2.db"))
    out["lookup_again_ms"] = (time.perf_counter() - t) * 1e3
    out["lookup_match"] = found.match

    import syncopate.kernels.launch as launch

    launches: list[float] = []

    def timed(fn):
        def run(*args, **kwargs):
            if len(launches) >= 2:
                return fn(*args, **kwargs)
            torch.cuda.synchronize()
            start = time.perf_counter()
            result = fn(*args, **kwargs)
            torch.cuda.synchronize()
            launches.append(time.perf_counter() - start)
            return result

        return run

    launch.launch_consumer = timed(launch.launch_consumer)
    launch.launch_producer = timed(launch.launch_producer)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_single  # binds the timed launchers

    out["cases"] = []
    for label, which, kwargs in CASES:
        launches.clear()
        case = getattr(gpu_single, f"{which}_case")(**kwargs)
        out["cases"].append(
            {
                "case": label,
                "detail": case["case"],
                "first_s": launches[0],
                "second_ms": launches[1] * 1e3,
                "steady_us": case["ours_us"],
                "rel_err": case["rel_err"],
                "error_flag": case["error_flag"],
            }
        )
    return out


def measure(cache: str, gluon: bool) -> dict:
    env = {**os.environ, "TRITON_CACHE_DIR": cache, "PYTHONPATH": str(ROOT)}
    env.pop("SYNCOPATE_GLUON", None)
    if gluon:
        env["SYNCOPATE_GLUON"] = "1"
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, __file__, "child"], env=env, capture_output=True, text=True, timeout=540
    )
    if done.returncode != 0:
        raise RuntimeError(f"child failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["process_s"] = time.perf_counter() - start
    return result


def main() -> None:
    rows = []
    for gluon in (False, True):
        with tempfile.TemporaryDirectory(prefix="triton-cache-") as cache:
            for state in ("cold", "warm"):
                r = measure(cache, gluon)
                r.update(kernels="gluon" if gluon else "triton", cache=state)
                rows.append(r)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "first_call.json").write_text(json.dumps(rows, indent=1))
    import torch

    print(
        f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )
    print(
        f"{'kernels':8} {'cache':5} {'import s':>8} {'lookup ms':>9} {'again ms':>8} "
        f"{'case':18} {'first s':>8} {'second ms':>9} {'steady us':>9} {'rel err':>8}"
    )
    for r in rows:
        for i, c in enumerate(r["cases"]):
            head = (
                f"{r['kernels']:8} {r['cache']:5} {r['import_s']:8.2f} {r['lookup_first_ms']:9.1f} "
                f"{r['lookup_again_ms']:8.3f}"
                if i == 0
                else " " * 43
            )
            print(
                f"{head} {c['case']:18} {c['first_s']:8.2f} {c['second_ms']:9.2f} {c['steady_us']:9.1f} "
                f"{c['rel_err']:8.1e}{'  ERROR FLAG' if c['error_flag'] else ''}"
            )


if __name__ == "__main__":
    if sys.argv[1:] in (["-h"], ["--help"]):
        print(f"usage: python benchmarks/first_call.py [child]\n\n{__doc__.strip()}")
        sys.exit(0)
    if sys.argv[1:] not in ([], ["child"]):
        print(
            f"first_call: unknown arguments {sys.argv[1:]}: give none (the matrix) or `child`",
            file=sys.stderr,
        )
        sys.exit(2)
    import torch

    if not torch.cuda.is_available():
        print("first_call: needs a CUDA GPU; none is visible", file=sys.stderr)
        sys.exit(1)
    if sys.argv[1:] == ["child"]:
        print(json.dumps(child()))
    else:
        main()
