"""The result tables of README.md and docs/, generated from the committed result files.

A generated table sits between two comment lines in a Markdown file:

    <!-- generated: NAME -->
    ...
    <!-- end -->

`python -m syncopate.docs_tables [--root DIR]` rewrites every such block of README.md and
docs/*.md from the files under results/ that the table NAME reads; `--check` changes nothing and
exits 1 naming each block that differs from its data. The test suite runs the check, so a figure
in the documentation cannot drift from the data it quotes: a figure the data does not give has no
place in the documentation.

Pure Python (json, sqlite3; databases opened read-only): no torch, no GPU.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sqlite3
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from syncopate.errors import ConfigError

__all__ = ["TABLES", "BenchRow", "Block", "bench_rows", "blocks", "documents", "main", "render", "rewrite"]

BLOCK = re.compile(r"<!-- generated: (?P<name>[\w-]+) -->\n(?P<body>.*?)<!-- end -->", re.DOTALL)
"""One generated block: its name, then everything up to the closing comment."""

KIND_LABELS = {"ag_gemm": "AG+GEMM", "gemm_rs": "GEMM+RS", "gemm_ar": "GEMM+AR"}

SOURCES = "tables.json"
"""The file under results/ that names which result files each table reads (`Sources`): which runs
are current is data, changed when new results land, not code."""


@dataclass(frozen=True, slots=True)
class Sources:
    """The result files under results/ the tables read (`results/tables.json`)."""

    tp2_suite: tuple[str, ...]
    """Runs of the TP=2 suite (configs/llama_tp2.yaml); the first a whole suite, shown per shape."""
    tp4_suite: tuple[str, ...]
    """Runs of the TP=4 suite (configs/llama_tp4.yaml); the first a whole suite, shown per shape."""
    short_tp2: str
    """The results database of configs/short_tp2.yaml."""
    strategies: tuple[tuple[str, str], ...]
    """(label, file) of each `benchmarks/strategies.py` run."""
    layers: str
    """The `syncopate bench --layer` runs."""
    train_step: tuple[tuple[str, str], ...]
    """(file, where its configurations came from) of each `benchmarks/train_step.py` run; tables.json
    gives a file alone where the run says so itself (its `configurations`), or [file, label]."""
    train_profile: tuple[str, ...]
    """`benchmarks/train_step.py --profile` runs: GPU time a step by kernel category, a table each."""
    graph_calls: tuple[str, ...]
    """`benchmarks/graph_calls.py` runs, a table each."""
    layer_bound: tuple[str, ...]
    """`syncopate bench --layer` runs with the layers' bound (their communication left out)."""
    moe: tuple[str, ...]
    """`benchmarks/moe_bench.py` runs."""
    op_host: tuple[str, ...]
    """`benchmarks/op_host.py --json` runs: host time per call against torch's unfused path."""
    nvshmem: tuple[str, ...]
    """`benchmarks/nvshmem_bench.py` runs: the backends side by side in an NVSHMEM process."""
    fp8: tuple[tuple[str, str], ...] = ()
    """(ops, layer) of each `benchmarks/fp8_check.sh ops layer` run: the FP8 MLP layer's ops
    (`syncopate bench --suite`) and the layer on their configurations (`syncopate bench --layer`)."""
    model_ops: tuple[str, ...] = ()
    """`syncopate bench --model` runs: a model's decoder-layer ops, forward and backward."""
    ce_streams: tuple[str, ...] = ()
    """`benchmarks/ce_streams.py --json` runs: a rank's copy-engine pushes on 1–3 streams."""
    step_ceiling: tuple[tuple[str, str], ...] = ()
    """(database, train-step run) pairs: the step's ops measured alone at the run's token count
    (the database) set against the step (the run)."""
    train_timeline: tuple[str, ...] = ()
    """`benchmarks/train_step.py --trace` runs: a traced step's device idle time and host calls."""
    moe_backends: tuple[str, ...] = ()
    """`benchmarks/moe_bench.py --backends copy_engine,nvshmem` runs: the pipelined plans' backends
    side by side in an NVSHMEM process."""
    moe_kernel: tuple[str, ...] = ()
    """`benchmarks/moe_kernel.py --json` runs: the fused MoE dispatch kernel alone beside torch's
    grouped GEMM."""
    step_summary: tuple[str, ...] = ()
    """The train-step runs the README's step summary shows (empty: every run of `train_step`)."""


def _names(entry) -> tuple[str, ...]:
    """A sources entry that names one file or a list of them, as a tuple of names."""
    return (entry,) if isinstance(entry, str) else tuple(entry)


def sources(root: Path) -> Sources:
    """The result files the tables under `root` read."""
    doc = _read_json(root / "results" / SOURCES)
    try:
        return Sources(
            tp2_suite=tuple(doc["tp2_suite"]),
            tp4_suite=tuple(doc["tp4_suite"]),
            short_tp2=doc["short_tp2"],
            strategies=tuple((label, name) for label, name in doc["strategies"]),
            layers=doc["layers"],
            train_step=tuple((e, "") if isinstance(e, str) else (e[0], e[1]) for e in doc["train_step"]),
            train_profile=_names(doc["train_profile"]),
            train_timeline=tuple(doc.get("train_timeline", ())),
            graph_calls=_names(doc["graph_calls"]),
            layer_bound=tuple(doc["layer_bound"]),
            moe=_names(doc["moe"]),
            op_host=tuple(doc["op_host"]),
            nvshmem=tuple(doc["nvshmem"]),
            fp8=tuple((ops, layer) for ops, layer in doc.get("fp8", ())),
            model_ops=tuple(doc.get("model_ops", ())),
            ce_streams=tuple(doc.get("ce_streams", ())),
            step_ceiling=tuple((db, run) for db, run in doc.get("step_ceiling", ())),
            moe_backends=tuple(doc.get("moe_backends", ())),
            moe_kernel=tuple(doc.get("moe_kernel", ())),
            step_summary=tuple(doc.get("step_summary", ())),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError(
            f"results/{SOURCES} does not name every table's files ({e!r}): it needs tp2_suite, "
            f"tp4_suite, short_tp2, strategies, layers, train_step, train_profile, graph_calls, layer_bound, "
            f"moe, op_host and nvshmem"
        ) from None


# ---- reading the result files ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BenchRow:
    """One workload of a `syncopate bench` run: its baselines, the overlap bound and the best
    verified candidate (times in µs, medians)."""

    kind: str
    m: int
    n: int
    k: int
    seq: float
    async_tp: float | None
    gemm: float
    comm: float
    """The fastest collective timed alone (NCCL or the copy engine)."""
    ours: float
    best: str
    """The best candidate, short: its template, the backend of a Triton template, its splits."""

    @property
    def bound(self) -> float:
        """The overlap bound: max(GEMM alone, fastest collective alone)."""
        return max(self.gemm, self.comm)


def _short(candidate: dict) -> str:
    template, splits = candidate["template"], candidate["num_splits"]
    if template == "unfused":
        return "unfused"
    if candidate["backend"] == "copy_engine" and template in ("a_stationary", "c_stationary", "decomposed"):
        return f"{template} s{splits}"
    return f"{template} {candidate['backend']} s{splits}"


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"result file {str(path)!r} does not exist: a generated table reads it") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"result file {str(path)!r} is not valid JSON (line {e.lineno}): {e.msg}") from None


def bench_rows(path: Path) -> tuple[dict, list[BenchRow]]:
    """The run's header (topology, date, …) and one row per workload with a verified candidate."""
    doc = _read_json(path)
    rows = []
    for r in doc["rows"]:
        ok = [t for t in r["trials"] if t["status"] == "ok"]
        if not ok:
            continue
        best = min(ok, key=lambda t: t["median_us"])
        base = {name: b["median_us"] for name, b in r["baselines"].items()}
        w = r["workload"]
        rows.append(
            BenchRow(
                kind=w["kind"],
                m=w["m"],
                n=w["n"],
                k=w["k"],
                seq=base["torch_seq"],
                async_tp=base.get("torch_async_tp"),
                gemm=base["gemm_alone"],
                comm=min(v for name, v in base.items() if name.startswith("comm_alone")),
                ours=best["median_us"],
                best=_short(best["candidate"]),
            )
        )
    return doc, rows


def _connect(path: Path) -> sqlite3.Connection:
    if not path.is_file():
        raise ConfigError(f"results database {str(path)!r} does not exist: a generated table reads it")
    return sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)


# ---- formatting ------------------------------------------------------------------------------------


def _t(us: float | None) -> str:
    return "–" if us is None else f"{us:.1f}"


def _r(x: float | None) -> str:
    return "–" if x is None else f"{x:.3f}"


def _span(values: Sequence[float]) -> str:
    if not values:
        return "–"
    lo, hi = min(values), max(values)
    return _r(lo) if f"{lo:.3f}" == f"{hi:.3f}" else f"{lo:.3f}–{hi:.3f}"


def _table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _files(names: Sequence[str]) -> str:
    return ", ".join(f"`results/{n}`" for n in names)


# ---- the tables ------------------------------------------------------------------------------------


def summary(root: Path) -> str:
    """Per machine and kind, the range over shapes and runs of each ratio to our best candidate."""
    out_rows = []
    src = sources(root)
    for runs in (src.tp2_suite, src.tp4_suite):
        by_kind: dict[str, list[BenchRow]] = {}
        topology = ""
        for name in runs:
            doc, rows = bench_rows(root / "results" / name)
            topology = doc["topology"]["key"]
            for row in rows:
                by_kind.setdefault(row.kind, []).append(row)
        for kind, label in KIND_LABELS.items():
            rows = by_kind.get(kind, [])
            out_rows.append(
                [
                    topology,
                    label,
                    str(len({(r.n, r.k) for r in rows})),
                    _span([r.bound / r.ours for r in rows]),
                    _span([r.seq / r.ours for r in rows]),
                    _span([r.async_tp / r.ours for r in rows if r.async_tp is not None]),
                ]
            )
    table = _table(
        ["machine", "op", "shapes", "bound / ours", "torch seq / ours", "torch async-TP / ours"], out_rows
    )
    return (
        f"{table}\n\nM = 8192, bf16; each ratio is from one run, the range is over the shapes and the runs "
        f"of {_files(src.tp2_suite + src.tp4_suite)}. Above 1: ours is faster (for the bound: it overlaps better than "
        f"the slower of the GEMM alone and the fastest collective alone).\n"
    )


def step_summary(root: Path) -> str:
    """A training step per run of `step_summary` (else of the train-step table): torch's fastest TP
    variant, our fastest, and async-TP, all from the same run."""
    rows, devices = [], set()
    src = sources(root)
    for name in src.step_summary or [name for name, _ in src.train_step]:
        doc = _read_json(root / "results" / name)
        ms = _step_ms(doc)
        torch_tp = _best_torch_tp_variant(ms)
        ours = min((v for v in ms if v.startswith("syncopate")), key=ms.get, default=None)
        if torch_tp is None or ours is None:
            continue
        devices.add(doc["device"])
        async_tp = ms.get("async-tp")
        rows.append(
            [
                f"{doc['world']} × {doc['device'].replace('NVIDIA ', '')}",
                str(doc["tokens"]),
                f"{torch_tp} {ms[torch_tp]:.1f}",
                f"{ours} {ms[ours]:.1f}",
                _r(ms[torch_tp] / ms[ours]),
                _r(None if async_tp is None else async_tp / ms[ours]),
            ]
        )
    table = _table(
        [
            "GPUs (TP)",
            "tokens",
            "torch TP, fastest mode: ms",
            "ours, fastest mode: ms",
            "torch TP / ours",
            "async-TP / ours",
        ],
        rows,
    )
    return (
        f"{table}\n\nLlama-3-8B's widths, 8 layers, AdamW fused; each row one run on {', '.join(sorted(devices))}, "
        f"its variants side by side; every variant, other machines' runs and the files in "
        f"[docs/results.md](docs/results.md).\n"
    )


def _suite(root: Path, name: str) -> str:
    doc, rows = bench_rows(root / "results" / name)
    dtypes = ", ".join(sorted({r["workload"]["dtype"] for r in doc["rows"]}))
    table = _table(
        [
            "op",
            "N",
            "K",
            "torch seq",
            "async-TP",
            "GEMM alone",
            "comm alone",
            "bound",
            "ours",
            "best candidate",
            "bound / ours",
            "seq / ours",
            "async-TP / ours",
        ],
        [
            [
                KIND_LABELS[r.kind],
                str(r.n),
                str(r.k),
                _t(r.seq),
                _t(r.async_tp),
                _t(r.gemm),
                _t(r.comm),
                _t(r.bound),
                _t(r.ours),
                r.best,
                _r(r.bound / r.ours),
                _r(r.seq / r.ours),
                _r(None if r.async_tp is None else r.async_tp / r.ours),
            ]
            for r in rows
        ],
    )
    return (
        f"{table}\n\n{doc['topology']['key']} ({doc['gpu']}, torch {doc['environment']['torch']}, triton "
        f"{doc['environment']['triton']}, NCCL {doc['environment']['nccl']}), M = "
        f"{', '.join(sorted({str(r.m) for r in rows}))}, {dtypes}, µs (medians); comm alone is the fastest "
        f"collective timed alone (NCCL or the copy engine); from `results/{name}`.\n"
    )


def suite_tp2(root: Path) -> str:
    """Every shape of one whole TP=2 suite run."""
    return _suite(root, sources(root).tp2_suite[0])


def suite_tp4(root: Path) -> str:
    """Every shape of one whole TP=4 suite run."""
    return _suite(root, sources(root).tp4_suite[0])


def winners(root: Path) -> str:
    """Which template gave each shape's best candidate, in the whole suite runs."""
    won: dict[str, dict[str, list[str]]] = {}
    columns = []
    src = sources(root)
    for name in (src.tp2_suite[0], src.tp4_suite[0]):
        doc, rows = bench_rows(root / "results" / name)
        column = f"{doc['topology']['key']} ({len(rows)} shapes)"
        columns.append(column)
        for r in rows:
            template = r.best.split(" ")[0]
            won.setdefault(template, {}).setdefault(column, []).append(f"{KIND_LABELS[r.kind]} {r.n}×{r.k}")
    out_rows = [[f"`{t}`", *("; ".join(won[t].get(c, [])) or "–" for c in columns)] for t in sorted(won)]
    return (
        f"{_table(['template', *columns], out_rows)}\n\nShapes as N×K at M = 8192; from "
        f"{_files((src.tp2_suite[0], src.tp4_suite[0]))}.\n"
    )


def short_tp2(root: Path) -> str:
    """Short GEMMs at TP=2: the best fused and the unfused candidate, measured side by side."""
    short = sources(root).short_tp2
    with _connect(root / "results" / short) as db:
        best = db.execute(
            "SELECT w.kind, w.m, w.n, w.k, json_extract(t.candidate, '$.template') = 'unfused', min(t.median_us) "
            "FROM syncopate_trials t JOIN syncopate_workloads w ON w.id = t.workload_id "
            "WHERE t.status = 'ok' AND t.source = 'measured' GROUP BY w.id, 5"
        ).fetchall()
        seq = {
            (kind, m): us
            for kind, m, us in db.execute(
                "SELECT w.kind, w.m, min(b.median_us) FROM syncopate_baselines b "
                "JOIN syncopate_workloads w ON w.id = b.workload_id WHERE b.name = 'torch_seq' GROUP BY w.id"
            )
        }
        topology = db.execute("SELECT key FROM syncopate_topologies").fetchone()[0]
    times: dict[tuple[str, int], dict[bool, float]] = {}
    dims = set()
    for kind, m, n, k, unfused, us in best:
        times.setdefault((kind, m), {})[bool(unfused)] = us
        dims.add((n, k))
    out_rows = []
    for kind, m in sorted(times, key=lambda x: (list(KIND_LABELS).index(x[0]), x[1])):
        t = times[(kind, m)]
        fused, unfused = t.get(False), t.get(True)
        faster = "–" if fused is None or unfused is None else ("fused" if fused < unfused else "unfused")
        out_rows.append(
            [
                KIND_LABELS[kind],
                str(m),
                _t(seq.get((kind, m))),
                _t(fused),
                _t(unfused),
                _r(None if fused is None or unfused is None else unfused / fused),
                faster,
            ]
        )
    n = "/".join(sorted({str(n) for n, _ in dims}))
    k = "/".join(sorted({str(k) for _, k in dims}))
    table = _table(["op", "M", "torch seq", "best fused", "unfused", "unfused / fused", "served"], out_rows)
    return (
        f"{table}\n\n{topology}, N = {n}, K = {k}, bf16, µs: each the best median measured, over the sweep "
        f"and its confirmation; `served` is what `syncopate lookup` answers (the faster); from "
        f"`results/{short}` (`configs/short_tp2.yaml`).\n"
    )


def _strategy_runs(root: Path) -> list[tuple[str, dict]]:
    runs = []
    for label, name in sources(root).strategies:
        doc = _read_json(root / "results" / name)
        if doc["synthetic"]:
            raise ConfigError(
                f"results/{name} holds a SYNTHETIC ground truth: the strategy table quotes measured sweeps"
            )
        runs.append((label, doc))
    return runs


def strategies(root: Path) -> str:
    """Trials each strategy needs to get within the tolerance of an exhaustive measured sweep's best."""
    runs = _strategy_runs(root)
    names = list(dict.fromkeys(o["strategy"] for _, doc in runs for o in doc["outcomes"]))
    out_rows = []
    for name in names:
        row = [f"`{name}`"]
        for _, doc in runs:
            mine = [
                o["trials"] / o["total"] if o["trials"] is not None else math.inf
                for o in doc["outcomes"]
                if o["strategy"] == name
            ]
            median = statistics.median(mine)
            row += [
                f">{doc['cap']:.0%}" if math.isinf(median) else f"{median:.1%}",
                f"{sum(1 for f in mine if math.isfinite(f))}/{len(mine)}",
            ]
        out_rows.append(row)
    head = ["strategy"]
    for label, _doc in runs:
        head += [f"{label}: median fraction", f"{label}: runs reaching it"]
    first = runs[0][1]
    return (
        f"{_table(head, out_rows)}\n\nTrials until one is within {first['tolerance']:.0%} of the exhaustive "
        f"best, as a fraction of the exhaustive count (median over workloads and seeds; runs stop at "
        f"{first['cap']:.0%}); replayed from the measured sweeps "
        + ", ".join(f"`{doc['label'].split(' sweep ')[0].removeprefix('sqlite:///')}`" for _, doc in runs)
        + f"; from {_files([n for _, n in sources(root).strategies])}.\n"
    )


def cost_model(root: Path) -> str:
    """How well the cost model ranks the candidates of the measured sweeps."""
    out_rows = []
    for label, doc in _strategy_runs(root):
        model = doc["model"]
        out_rows.append(
            [
                f"{label} ({doc['topology']})",
                str(len(model)),
                _r(statistics.median(m["spearman"] for m in model)),
                _r(min(m["spearman"] for m in model)),
                f"{statistics.median(m['pick_gap'] for m in model):+.1%}",
                f"{max(m['pick_gap'] for m in model):+.1%}",
            ]
        )
    head = [
        "sweep",
        "workloads",
        "Spearman, median",
        "Spearman, lowest",
        "model's pick vs best, median",
        "model's pick vs best, worst",
    ]
    return (
        f"{_table(head, out_rows)}\n\nThe cost model's predictions of every candidate of a measured "
        f"exhaustive sweep against the measurements: rank correlation, and how much slower than the best "
        f"the candidate it ranks first measured; from {_files([n for _, n in sources(root).strategies])}.\n"
    )


LAYER_KEYS = ("eager/forward", "eager/forward_backward", "graph/forward", "graph/forward_backward")
"""The mode/pass entries of a `syncopate bench --layer` result, in table order."""


def _layer_times(res: dict, key: str):
    """For one mode/pass of a layer result: `t(impl)`, that implementation's µs (None where not
    measured), and `ratio(num, den)`, t(num) / t(den) (None where either is missing)."""

    def t(impl):
        return res.get(impl, {}).get(key)

    def ratio(num, den):
        a, d = t(num), t(den)
        return None if a is None or not d else a / d

    return t, ratio


LAYER_HEAD = (
    "mode/pass",
    "torch",
    "async-TP",
    "ours",
    "defaults",
    "torch / ours",
    "async-TP / ours",
    "defaults / ours",
)
"""The columns of `_layer_row`."""


def _layer_row(res: dict, key: str) -> list[str]:
    """One mode/pass of a `syncopate bench --layer` result: each path's µs and torch's, async-TP's
    and the defaults' over ours."""
    t, ratio = _layer_times(res, key)
    return [
        key.replace("_", "+"),
        *(_t(t(impl)) for impl in ("torch", "async_tp", "syncopate", "default")),
        *(_r(ratio(impl, "syncopate")) for impl in ("torch", "async_tp", "default")),
    ]


def _bound_cells(res: dict, key: str) -> list[str]:
    """The layer's bound (its communication left out) and torch's path over it: the most overlap
    can win there."""
    t, ratio = _layer_times(res, key)
    return [_t(t("bound")), _r(ratio("torch", "bound"))]


def layers(root: Path) -> str:
    """Tensor-parallel MLP layers as a job runs them: per mode and pass, each path's time an
    iteration and torch's, async-TP's and the untuned defaults' over the looked-up configurations'."""
    layer_runs = sources(root).layers
    doc = _read_json(root / "results" / layer_runs)
    rows = []
    gpu = torch_version = ""
    for run in doc["runs"]:
        b, res = run["bench"], run["results"]
        if b.get("launch", "auto") != "auto":  # `layer-launch` sets the launches side by side
            continue
        gpu, torch_version = run["gpu"], run["torch"]
        for key in (k for k in LAYER_KEYS if k in res.get("syncopate", {})):
            rows.append(
                [f"TP={b['tp']}", f"{b['hidden']}/{b['ffn']}", str(b["tokens"]), *_layer_row(res, key)]
            )
    table = _table(["TP", "hidden/ffn", "tokens", *LAYER_HEAD], rows)
    return (
        f"{table}\n\nSwiGLU MLP layers (gate and up in one column layer), sequence parallel, bf16; µs an "
        f"iteration (median of seven repetitions of ten back to back; `graph`: one iteration captured and "
        f"replayed; eager calls launched `auto`); {gpu}, torch {torch_version}; from `results/{layer_runs}`. "
        f"Above 1: ours is faster.\n"
    )


def layer_launch(root: Path) -> str:
    """The layers' eager iterations with Syncopate's calls launched each way (`syncopate.set_launch`),
    torch's path timed in the same run, and how `auto` launched the layer's programs
    (`syncopate.tp.bench.launch_rows`)."""
    from syncopate.tp.bench import launch_rows

    layer_runs = sources(root).layers
    head, rows = launch_rows(_read_json(root / "results" / layer_runs)["runs"])
    return (
        f"{_table(head, rows)}\n\nThe layers above, eager, with Syncopate's calls launched `auto`, always replayed "
        f"(`graph`) and never (`direct`), one run each, torch's path timed in each run; µs an iteration; the last "
        f"column counts the fused programs `auto` replays of those it launched eagerly in the run (ours and the "
        f"defaults'); from `results/{layer_runs}`.\n"
    )


def layer_bound(root: Path) -> str:
    """The layers beside their bound (the same layer without its communication): torch / bound, the
    most any overlap can gain over torch's path there, and bound / ours, how much of the
    communication ours hides."""
    rows = []
    notes = []
    names = sources(root).layer_bound
    for name in names:
        doc = _read_json(root / "results" / name)
        for run in doc["runs"]:
            b, res = run["bench"], run["results"]
            gpus = f"{b['tp']} × {run['gpu'].replace('NVIDIA ', '')}"
            notes.append((run["gpu"], run["torch"]))
            for key in LAYER_KEYS:
                t, ratio = _layer_times(res, key)
                if t("syncopate") is None or t("bound") is None:
                    continue
                rows.append(
                    [
                        gpus,
                        f"{b['hidden']}/{b['ffn']}",
                        str(b["tokens"]),
                        key.replace("_", "+"),
                        _t(t("torch")),
                        _t(t("async_tp")),
                        _t(t("syncopate")),
                        _t(t("bound")),
                        _r(ratio("torch", "bound")),
                        _r(ratio("async_tp", "bound")),
                        _r(ratio("bound", "syncopate")),
                        _r(ratio("torch", "syncopate")),
                        _r(ratio("async_tp", "syncopate")),
                    ]
                )
    table = _table(
        [
            "GPUs (TP)",
            "hidden/ffn",
            "tokens",
            "mode/pass",
            "torch",
            "async-TP",
            "ours",
            "bound",
            "torch / bound",
            "async-TP / bound",
            "bound / ours",
            "torch / ours",
            "async-TP / ours",
        ],
        rows,
    )
    versions = "; ".join(f"{gpu}, torch {t}" for gpu, t in sorted(set(notes)))
    files = ", ".join(f"`results/{name}`" for name in names)
    return (
        f"{table}\n\nSwiGLU MLP layers (sequence parallel, bf16, lookup's configurations, eager calls launched "
        f"`auto` as the code of each run chose, `results/README.md`) and `bound`: the layer with its communication "
        f"left out (its matmuls and activation on each "
        f"rank's shapes), which no overlap can beat. torch / bound is the most any overlap could gain over "
        f"torch's path; bound / ours how close ours comes. µs an iteration, as above; each row's implementations "
        f"timed in one run; {versions}; from {files}.\n"
    )


def _moe_gpus(doc: dict) -> str:
    """A `benchmarks/moe_bench.py` run's GPUs: its EP (its ops', else its layers') × the GPU model."""
    ep = doc["ops"][0]["ep"] if doc["ops"] else (doc["layers"][0]["ep"] if doc["layers"] else "?")
    return f"{ep} × {doc['environment']['gpu_model']}"


def _moe_copy_note(doc: dict) -> str:
    """What to read a `benchmarks/moe_bench.py` run's torch and GEMM-alone times with: runs that do
    not say `torch_copies_output` timed torch's dispatch and the grouped GEMM alone with a copy of
    the result into the output, which raises both (and a dispatch's bound) by that copy's time."""
    if all("torch_copies_output" in op for op in doc["ops"]):
        return ""
    return (
        " (torch's dispatch and the grouped GEMM alone timed with a copy of their result into the output, "
        "which later runs leave out: their torch / ours and bound / ours read high)"
    )


def _moe_layer_times(doc: dict, keep=lambda config: True) -> list[tuple[dict, str, float, float]]:
    """(layer, configuration, torch µs, ours µs) of each layer configuration of a
    `benchmarks/moe_bench.py` run that ran and that `keep` accepts."""
    return [
        (layer, c["config"], layer["times"]["torch"]["median_us"], c["times"]["median_us"])
        for layer in doc["layers"]
        for c in layer["configs"]
        if c.get("status") == "ok" and keep(c["config"])
    ]


def _moe_layer_rows(doc: dict, keep=lambda config: True) -> list[list[str]]:
    """(model, tokens, routing, configuration, torch µs, ours µs, torch / ours) of each layer
    configuration of a `benchmarks/moe_bench.py` run that ran and that `keep` accepts."""
    return [
        [
            layer["model"],
            str(layer["tokens"]),
            layer["routing"],
            config,
            _t(torch_us),
            _t(us),
            _r(torch_us / us),
        ]
        for layer, config, torch_us, us in _moe_layer_times(doc, keep)
    ]


def moe(root: Path) -> str:
    """The MoE ops and layer against torch's path: each op's fastest verified candidate beside the
    all-to-all alone, the grouped GEMM alone and their bound; the layer forward + backward. One row
    set a run (`moe` in tables.json: a file or a list of them), each with its GPUs."""
    names = sources(root).moe
    rows, layer_rows, notes = [], [], []
    for name in names:
        doc = _read_json(root / "results" / name)
        env = doc["environment"]
        gpus = _moe_gpus(doc)
        notes.append(
            f"{gpus}: torch {env['torch']}, NCCL {env['nccl']}, `results/{name}`{_moe_copy_note(doc)}"
        )
        for op in doc["ops"]:
            times = op["times"]
            ok = [c for c in op["candidates"] if c.get("status") == "ok" and c.get("times")]
            best = min(ok, key=lambda c: c["times"]["median_us"]) if ok else None
            ours = best["times"]["median_us"] if best else None
            torch_us = times["torch"]["median_us"]
            rows.append(
                [
                    gpus,
                    op["model"],
                    op["kind"],
                    str(op["tokens"]),
                    op["routing"],
                    _t(torch_us),
                    _t(times["a2a"]["median_us"]),
                    _t(times["a2a_copy_engine"]["median_us"]) if "a2a_copy_engine" in times else "–",
                    _t(times["gemm"]["median_us"]),
                    _t(op["bound_us"]),
                    _t(ours),
                    _r(None if not ours else op["bound_us"] / ours),
                    _r(None if not ours else torch_us / ours),
                    _r(op.get("eager_torch_over_ours")),
                    best["short"] if best else "–",
                ]
            )
        layer_rows += [[gpus, *row] for row in _moe_layer_rows(doc)]
    ops_table = _table(
        [
            "GPUs (EP)",
            "model",
            "kind",
            "tokens a rank",
            "routing",
            "torch",
            "all-to-all alone",
            "copy engine alone",
            "grouped GEMM alone",
            "bound",
            "ours",
            "bound / ours",
            "torch / ours",
            "as a layer calls it: torch / ours",
            "fastest candidate",
        ],
        rows,
    )
    layers_table = _table(
        ["GPUs (EP)", "model", "tokens a rank", "routing", "ours", "torch µs", "ours µs", "torch / ours"],
        layer_rows,
    )
    return (
        f"{ops_table}\n\n{layers_table}\n\nµs a call, medians; bf16; `all-to-all alone`: torch's "
        f"all_to_all_single; `copy engine alone`: the copy engine's transfers of the pipelined plan with no GEMM "
        f"(runs before that column have none); the bound: the larger of the grouped GEMM alone and the faster "
        f"all-to-all alone; the op rows' `ours` is the fastest candidate "
        f"verified against float32 among those the run timed (device time); `as a layer calls it`: the same two "
        f"calls back to back with the host on the path, each on a routing layout made for it (runs before "
        f"that column have none); the layer rows are `MoELayer` forward + backward, "
        f"calls back to back; each run's rows timed in one run, H100 and H200 runs not to be compared. "
        f"{'; '.join(notes)}.\n"
    )


def moe_model(root: Path) -> str:
    """The MoE cost model (`syncopate.cost_model.moe`, default calibration of each run's GPUs) against
    every op case of the MoE runs: its device-time pick's measured time against the measured best."""
    from syncopate.cost_model import default_calibration
    from syncopate.cost_model.moe import MoeCostModel, against_measurements
    from syncopate.search_space import Topology

    rows, pooled, gaps = [], [], []
    names = sources(root).moe
    for name in names:
        doc = _read_json(root / "results" / name)
        gpu = doc["environment"]["gpu_model"]
        for op in doc["ops"]:
            model = MoeCostModel(default_calibration(Topology(world_size=op["ep"], gpu_model=gpu)))
            case = against_measurements(model, op)
            pooled += case.ratios
            gaps.append(case.best_us / case.pick_us)
            rows.append(
                [
                    f"{op['ep']} × {gpu}",
                    op["model"],
                    op["kind"],
                    str(op["tokens"]),
                    op["routing"],
                    case.best.short(),
                    _t(case.best_us),
                    case.pick.short(),
                    _t(case.pick_us),
                    _r(case.best_us / case.pick_us),
                    _r(case.spearman),
                ]
            )
    head = [
        "GPUs (EP)",
        "model",
        "kind",
        "tokens a rank",
        "routing",
        "fastest measured",
        "µs",
        "model's pick",
        "its measured µs",
        "best / pick",
        "Spearman",
    ]
    return (
        f"{_table(head, rows)}\n\nThe MoE cost model's device-time ranking of each case's verified candidates "
        f"(its default calibration for the run's GPUs) against their measurements: the fastest measured, the "
        f"model's pick and what it measured, and the rank correlation of predictions and measurements; best / "
        f"pick {_span(gaps)} (median {_r(statistics.median(gaps))}); predicted over measured device time, every "
        f"candidate, median {_r(statistics.median(pooled))}, from {_r(min(pooled))} to {_r(max(pooled))}. The "
        f"model's leads were read off these runs: this holds it to them, it is no test elsewhere. From "
        f"{_files(names)}.\n"
    )


def moe_kernel(root: Path) -> str:
    """The fused MoE dispatch kernel alone (`benchmarks/moe_kernel.py`): on pair rows and on
    deduplicated rows read by index, against torch's grouped GEMM over the same rows."""
    rows, notes = [], []
    names = sources(root).moe_kernel
    for name in names:
        doc = _read_json(root / "results" / name)
        notes.append(f"{doc['device']}, torch {doc['torch']}, triton {doc['triton']}, `results/{name}`")
        for case in doc["cases"]:
            gmm = case["grouped_mm_us"]
            by = {(k["template"], k["tiles"]): k for k in case["kernels"]}
            for tiles in dict.fromkeys(k["tiles"] for k in case["kernels"]):
                pair, once = by[("fused", tiles)], by[("fused_dedup", tiles)]
                rows.append(
                    [
                        f"EP={case['ep']}",
                        case["model"],
                        str(case["tokens"]),
                        case["routing"],
                        f"{case['peer_pair_rows']} / {case['peer_dedup_rows']}",
                        _t(gmm),
                        tiles,
                        _t(pair["us"]),
                        _t(once["us"]),
                        _r(gmm / pair["us"]),
                        _r(gmm / once["us"]),
                    ]
                )
    head = [
        "EP",
        "model",
        "tokens a rank",
        "routing",
        "peer rows: pairs / tokens",
        "torch._grouped_mm",
        "tiles",
        "fused",
        "fused_dedup",
        "grouped_mm / fused",
        "grouped_mm / fused_dedup",
    ]
    return (
        f"{_table(head, rows)}\n\nThe fused dispatch kernel of rank 0 alone, every peer's rows landed and "
        f"their words raised (no transfer beside it): on the pair rows `fused` receives and on the "
        f"deduplicated rows `fused_dedup` receives, read through its index; `peer rows`: how many rows "
        f"each way brings from the peers; µs, medians of 20 calls, L2 flushed; every output equal to "
        f"torch's. {'; '.join(notes)}.\n"
    )


def train_step(root: Path) -> str:
    """Training steps of a transformers Llama model under tensor parallelism, torch's styles and ours:
    each variant against torch's TP in its faster mode (eager or compiled) and against async-TP, both
    from the same run."""
    rows = []
    notes = []
    runs = sources(root).train_step
    for name, label in runs:
        doc = _read_json(root / "results" / name)
        m = doc["model"]
        configurations = label or doc.get("configurations", "–")
        ms = _step_ms(doc)
        best_torch = _best_torch_tp(ms)
        async_tp = ms.get("async-tp")
        curves = {v["variant"]: v["losses"] for v in doc["variants"] if v.get("losses")}
        reference = next((curves[v] for v in TORCH_TP_VARIANTS if v in curves), None)
        for v in doc["variants"]:
            step = v.get("step_ms")
            loss = (
                None
                if reference is None or v["variant"] not in curves
                else max(abs(a - b) for a, b in zip(curves[v["variant"]], reference))
            )
            rows.append(
                [
                    m["name"],
                    str(m["layers"]),
                    str(m["vocab"]),
                    "sharded (loss parallel)" if doc.get("loss_parallel") else "replicated",
                    f"{doc['world']} × {doc['device'].replace('NVIDIA ', '')}",
                    str(doc["tokens"]),
                    v["variant"],
                    configurations if v["variant"].startswith("syncopate") else "",
                    "–" if not step else f"{step:.2f}",
                    _enqueue(v, doc["warmup"]),
                    "–" if not step else f"{v['tokens_per_s']:.0f}",
                    "–" if not step else f"{v['peak_bytes'] / 2**30:.2f}",
                    "–" if loss is None else f"{loss:.2e}",
                    _r(None if not step or best_torch is None else best_torch / step),
                    _r(None if not step or async_tp is None else async_tp / step),
                ]
            )
        notes.append(
            (
                doc["device"],
                doc["steps"],
                doc["warmup"],
                doc["versions"]["torch"],
                doc["versions"]["transformers"],
                doc.get("optimizer", "foreach"),
            )
        )
    table = _table(
        [
            "model",
            "layers",
            "vocab",
            "logits",
            "GPUs (TP)",
            "tokens",
            "variant",
            "configurations",
            "step ms",
            "enqueue ms",
            "tokens/s",
            "peak GiB",
            "max |Δloss| vs torch TP",
            "torch TP (fastest mode) / variant",
            "async-TP / variant",
        ],
        rows,
    )
    said = "; ".join(
        f"{gpu}, median of {steps} steps after {warmup}, AdamW {opt}, torch {t}, transformers {tf}"
        for gpu, steps, warmup, t, tf, opt in sorted(set(notes))
    )
    files = ", ".join(f"`results/{name}`" for name, _ in runs)
    return (
        f"{table}\n\n{said}; `enqueue ms`: the host's time to enqueue a step (the slowest rank's, median), "
        f"near the step's own where the host paces it; from {files}.\n"
    )


def _enqueue(variant: dict, warmup: int) -> str:
    """A train-step variant's median over its timed steps of the slowest rank's enqueue time, ms."""
    ranks = variant.get("enqueue_ms_by_rank")
    if not ranks:
        return "–"
    return f"{statistics.median(max(step) for step in list(zip(*ranks))[warmup:]):.2f}"


TORCH_TP_VARIANTS = ("torch", "torch-compiled", "torch-graphs")
"""The variants of torch's TP without async-TP: the train-step table sets each variant against the
fastest of those its run timed."""


def _step_ms(doc: dict) -> dict[str, float]:
    """A train-step run's median step ms by variant, of the variants that ran."""
    return {v["variant"]: v["step_ms"] for v in doc["variants"] if v.get("step_ms")}


def _best_torch_tp_variant(ms: dict[str, float]) -> str | None:
    """The fastest of torch's TP variants in `ms` (`_step_ms`), None where none ran."""
    return min((v for v in TORCH_TP_VARIANTS if v in ms), key=ms.get, default=None)


def _best_torch_tp(ms: dict[str, float]) -> float | None:
    """The step of the fastest of torch's TP variants in `ms` (`_step_ms`), None where none ran."""
    best = _best_torch_tp_variant(ms)
    return None if best is None else ms[best]


def train_profile(root: Path) -> str:
    """Where a training step's GPU time goes, per variant: `benchmarks/train_step.py --profile`'s
    kernel categories (rank 0, ms a step) beside the step time, a table a run."""
    src = sources(root)
    return "\n".join(_train_profile(root, name, dict(src.train_step).get(name)) for name in src.train_profile)


def _train_profile(root: Path, name: str, label: str | None) -> str:
    doc = _read_json(root / "results" / name)
    label = label or doc.get("configurations", "")
    profiled = [v for v in doc["variants"] if v.get("profile")]
    if not profiled:
        raise ConfigError(f"results/{name} has no profiled variant: run train_step.py with --profile STEPS")
    categories = list(dict.fromkeys(c for v in profiled for c in v["profile"]["category_us"]))
    rows = [
        [c] + [f"{v['profile']['category_us'].get(c, 0.0) / 1e3:.2f}" for v in profiled] for c in categories
    ]
    rows.append(["step (wall)"] + [f"{v['step_ms']:.2f}" for v in profiled])
    table = _table(["kernels", *(v["variant"] for v in profiled)], rows)
    m = doc["model"]
    return (
        f"{table}\n\nms a step on rank 0 ({profiled[0]['profile']['steps']} steps profiled after the timed ones); "
        f"kernels on several streams overlap, so a column can sum to more than its step. {m['name']}, "
        f"{m['layers']} layers, {doc['tokens']} tokens, TP={doc['world']} on {doc['device']}, torch "
        f"{doc['versions']['torch']}; configurations: {label or '–'}; from `results/{name}`.\n"
    )


def train_timeline(root: Path) -> str:
    """A traced training step per variant (`benchmarks/train_step.py --trace`, rank 0): how much of
    the step its GPU was busy, its idle gaps, and the host's time in CUDA's calls that launch work."""
    rows, notes = [], []
    for name in sources(root).train_timeline:
        doc = _read_json(root / "results" / name)
        traced = [v for v in doc["variants"] if v.get("timeline")]
        if not traced:
            raise ConfigError(f"results/{name} has no traced variant: run train_step.py with --trace DIR")
        for v in traced:
            t = v["timeline"]
            calls = {c["call"]: c for c in t.get("host_calls", ())}
            launch = calls.get("cudaGraphLaunch")
            kernels = [calls[c]["us"] for c in ("cudaLaunchKernel", "cuLaunchKernelEx") if c in calls]
            rows.append(
                [
                    f"{doc['world']} × {doc['device'].replace('NVIDIA ', '')}",
                    str(doc["tokens"]),
                    v["variant"],
                    f"{v['step_ms']:.2f}",
                    f"{t['span_ms']:.2f}",
                    f"{t['busy_ms']:.2f}",
                    f"{t['idle_ms']:.2f}",
                    f"{t['gap_count']} / {t['gap_ms']:.2f}",
                    "–" if launch is None else f"{launch['calls']} / {launch['us'] / 1e3:.2f}",
                    f"{sum(kernels) / 1e3:.2f}" if kernels else "–",
                ]
            )
        notes.append(f"`results/{name}`")
    table = _table(
        [
            "GPUs (TP)",
            "tokens",
            "variant",
            "step ms (timed)",
            "traced step: GPU span ms",
            "busy",
            "idle",
            "gaps ≥ 20 µs: count / ms",
            "graph launches: calls / host ms",
            "kernel launches: host ms",
        ],
        rows,
    )
    return (
        f"{table}\n\nOne step after the timed ones under torch's profiler (host and device), rank 0: the span "
        f"from its first device work to its last, busy the union of every stream's kernels, copies and "
        f"memsets (a kernel that waits for a peer counts as busy), idle the rest; the host's time in "
        f"`cudaGraphLaunch` and in kernel launches over the step (the profiler adds to both); from "
        f"{', '.join(notes)}.\n"
    )


def graph_calls(root: Path) -> str:
    """The ops called one by one and replayed from a CUDA graph, each against torch's unfused path,
    with what a replay costs the host; a table a run."""
    return "\n".join(_graph_calls_run(root, name) for name in sources(root).graph_calls)


def _graph_calls_run(root: Path, name: str) -> str:
    doc = _read_json(root / "results" / name)
    torch_us = {
        (r["kind"], tuple(r["shape"])): (r["eager_us"], r["graph_us"])
        for r in doc["rows"]
        if r["impl"] == "torch"
    }
    rows = []
    for r in sorted(doc["rows"], key=lambda r: r["kind"] != "entry"):  # the entry first, as runs now write it
        shape = tuple(r["shape"])
        base = torch_us.get((r["kind"], shape))
        host = r.get("replay_host_us")
        nodes = r.get("nodes")
        rows.append(
            [
                r["kind"],
                "–" if not any(shape) else "×".join(map(str, shape)),
                {"fused": "Syncopate (lookup)", "torch": "torch", "async_tp": "async-TP"}.get(
                    r["impl"], r["impl"]
                ),
                f"{r['eager_us']:.1f}",
                f"{r['graph_us']:.1f}",
                _r(None if base is None else base[0] / r["eager_us"]),
                _r(None if base is None else base[1] / r["graph_us"]),
                "–" if host is None else f"{host:.1f}",
                "–" if not nodes else ", ".join(f"{t} {c:g}" for t, c in nodes.items()),
            ]
        )
    table = _table(
        [
            "op",
            "M×N×K",
            "path",
            "eager µs",
            "graph µs",
            "torch / path, eager",
            "torch / path, graph",
            "replay host µs",
            "graph nodes a call",
        ],
        rows,
    )
    return (
        f"{table}\n\nµs a call, median of 15 rounds of 10 calls back to back, eagerly and replayed from one CUDA "
        f"graph; {doc['ranks']} × {doc['gpu']}, torch {doc['torch']}; `Syncopate (lookup)`: the configuration "
        f"`lookup` serves with an empty results database, the other named paths a configuration given; "
        f"`replay host µs`: the host's time a call to launch the replay (the graph's launch over its 10 calls, "
        f"the device kept busy, the slowest rank's); `entry`: what a captured call adds before its work, "
        f"alone; from `results/{name}`.\n"
    )


def op_host(root: Path) -> str:
    """Host time per call of each template, launched directly and replayed from its own graph,
    over torch's unfused path's for the same op (timed in turn with it, batch for batch)."""
    rows, notes = [], set()
    names = sources(root).op_host
    for name in names:
        doc = _read_json(root / "results" / name)
        env = doc["environment"]
        notes.add(f"{env['gpu_model']}, torch {env['torch']}, NCCL {env['nccl']}")
        by = {}
        for r in doc["rows"]:
            template, _, launch = r["label"].rpartition(" ")
            by.setdefault((r["ranks"], r["kind"], tuple(r["shape"]), template), {})[launch] = r
        for (ranks, kind, shape, template), launches in by.items():
            cells = []
            for launch in ("direct", "graph"):
                r = launches.get(launch)
                cells += (
                    ["–", "–"]
                    if r is None
                    else [
                        f"{r['host_us']:.0f} / {r['torch_host_us']:.0f}",
                        _r(r["host_us"] / r["torch_host_us"]),
                    ]
                )
            rows.append([str(ranks), kind, "×".join(map(str, shape)), template, *cells])
    table = _table(
        [
            "ranks",
            "op",
            "shape",
            "template",
            "direct: ours / torch µs",
            "direct: ours / torch",
            "replayed: ours / torch µs",
            "replayed: ours / torch",
        ],
        rows,
    )
    files = ", ".join(f"`results/{name}`" for name in names)
    return (
        f"{table}\n\nHost time to enqueue one call (µs, 20 calls back to back with the GPU busy, median of 7 "
        f"batches, the slowest rank), each template's batches alternating with batches of torch's unfused path "
        f"(its collective and cuBLAS matmul) for the same op; `unfused` is never replayed (its row under "
        f"replayed is a second direct run). {'; '.join(sorted(notes))}; from {files} "
        f"(`python benchmarks/op_host.py direct stationary decomposed unfused --ranks N --launch direct graph`, "
        f"each op at the shape the table gives).\n"
    )


def nvshmem(root: Path) -> str:
    """The copiers side by side in one NVSHMEM process: each backend's device time per shape (the
    copy engine; `sm_copy` and `nvshmem` at 16 and 32 communication programs), torch's unfused path
    and the bound, and nvshmem's best over sm_copy's best."""
    rows, notes = [], []
    names = sources(root).nvshmem
    for name in names:
        doc = _read_json(root / "results" / name)
        env = doc["environment"]
        notes.append(
            f"{doc['gpu'].replace('NVIDIA ', '')}, torch {env['torch']}, NCCL {env['nccl']}, `results/{name}`"
        )
        for r in doc["results"]:
            by: dict[str, float] = {}
            for c in r["candidates"]:
                if c["status"] == "ok":
                    cand = c["candidate"]
                    label = cand["backend"] + (f" {cand['comm_sms']}" if cand["comm_sms"] else "")
                    by[label] = min(by.get(label, float("inf")), c["us"])
            best = {
                b: min((v for k, v in by.items() if k.split()[0] == b), default=None)
                for b in ("sm_copy", "nvshmem")
            }
            base = r["baselines"]
            rows.append(
                [
                    str(r["world_size"]),
                    r["kind"],
                    "×".join(map(str, r["shape"])),
                    _t(base["torch"]),
                    _t(base["bound"]),
                    *(
                        _t(by.get(k))
                        for k in ("copy_engine", "sm_copy 16", "sm_copy 32", "nvshmem 16", "nvshmem 32")
                    ),
                    _r(best["sm_copy"] / best["nvshmem"] if best["sm_copy"] and best["nvshmem"] else None),
                ]
            )
    table = _table(
        [
            "ranks",
            "op",
            "shape",
            "torch",
            "bound",
            "copy_engine",
            "sm_copy 16",
            "sm_copy 32",
            "nvshmem 16",
            "nvshmem 32",
            "sm_copy / nvshmem (best of each)",
        ],
        rows,
    )
    return (
        f"{table}\n\nµs a call (device time, median), the direct plan with two splits, tiles 128×256×64, every "
        f"candidate checked against float32 first; `sm_copy N` / `nvshmem N`: N communication programs. All in "
        f"one NVSHMEM process a rank (`torchrun --nproc-per-node 4 benchmarks/nvshmem_bench.py`). "
        f"{'; '.join(notes)}.\n"
    )


def fp8(root: Path) -> str:
    """Each FP8 run: the MLP layer's ops per shape, then the layer forward and forward + backward
    on their configurations against torch's FP8 path and async-TP's scaled ops (and the layer's
    FP8 bound, where the run measured it)."""
    parts = []
    for ops_name, layer_name in sources(root).fp8:
        run = _read_json(root / "results" / layer_name)
        b, res = run["bench"], run["results"]
        keys = [key for key in LAYER_KEYS if key in res.get("syncopate", {})]
        if all(key in res.get("bound", {}) for key in keys):  # the FP8 bound, where the run has it
            rows = [[*_layer_row(res, key), *_bound_cells(res, key)] for key in keys]
            layer_table = _table((*LAYER_HEAD, "bound", "torch / bound"), rows)
        else:
            layer_table = _table(LAYER_HEAD, [_layer_row(res, key) for key in keys])
        parts.append(
            f"{_suite(root, ops_name)}\n{layer_table}\n\nThe MLP layer (hidden {b['hidden']}, ffn {b['ffn']}, "
            f"{b['tokens']} tokens, TP={b['tp']}, sequence parallel) with every GEMM in FP8 (row-wise scales), µs an "
            f"iteration; ours on the configurations of the ops above; {run['gpu']}, torch {run['torch']}; from "
            f"`results/{layer_name}`.\n"
        )
    return "\n".join(parts)


def model_ops(root: Path) -> str:
    """Each `syncopate bench --model` run: the decoder layer's ops per shape."""
    return "\n".join(_suite(root, name) for name in sources(root).model_ops)


def _layer_op_sums(path: Path, m: int) -> tuple[int, float, float, float]:
    """(ops, Σ torch seq, Σ ours, Σ bound) in µs over the workloads of M = `m` in a results database:
    torch's collective and matmul in sequence, the fastest verified trial (device time), and
    max(GEMM alone, the fastest collective alone)."""
    with _connect(path) as db:
        rows = db.execute(
            "SELECT w.id, "
            "MAX(CASE WHEN b.name = 'torch_seq' THEN b.median_us END), "
            "MAX(CASE WHEN b.name = 'gemm_alone' THEN b.median_us END), "
            "MIN(CASE WHEN b.name LIKE 'comm_alone%' THEN b.median_us END), "
            "(SELECT MIN(t.median_us) FROM syncopate_trials t WHERE t.workload_id = w.id AND t.status = 'ok' "
            "AND t.source = 'measured') "
            "FROM syncopate_workloads w JOIN syncopate_baselines b ON b.workload_id = w.id WHERE w.m = ? GROUP BY w.id",
            (m,),
        ).fetchall()
    rows = [r for r in rows if None not in r]
    if not rows:
        raise ConfigError(f"results database {str(path)!r} holds no measured op at M = {m}")
    return (
        len(rows),
        sum(r[1] for r in rows),
        sum(r[4] for r in rows),
        sum(max(r[2], r[3]) for r in rows),
    )


def step_ceiling(root: Path) -> str:
    """What a training step can gain from overlapping its ops, from the ops measured alone: the
    step of torch's fastest TP variant less, for each layer, the ops' time saved by ours and by
    the overlap bound, beside the step ours measured in the same run as torch's."""
    rows = []
    for db_name, run_name in sources(root).step_ceiling:
        doc = _read_json(root / "results" / run_name)
        layers, tokens = doc["model"]["layers"], doc["tokens"]
        ops, seq, ours, bound = _layer_op_sums(root / "results" / db_name, tokens)
        ms = _step_ms(doc)
        torch_tp = _best_torch_tp(ms)
        if torch_tp is None:
            raise ConfigError(
                f"results/{run_name} has no step of torch's TP ({', '.join(TORCH_TP_VARIANTS)})"
            )
        mine = min((t for v, t in ms.items() if v.startswith("syncopate")), default=None)
        by_ours = torch_tp - layers * (seq - ours) / 1e3
        by_bound = torch_tp - layers * (seq - bound) / 1e3
        rows.append(
            [
                f"{doc['world']} × {doc['device'].replace('NVIDIA ', '')}",
                str(tokens),
                f"{ops} × {layers}",
                f"{seq / 1e3:.2f}",
                f"{ours / 1e3:.2f}",
                f"{bound / 1e3:.2f}",
                f"{torch_tp:.2f}",
                f"{by_ours:.2f}",
                f"{by_bound:.2f}",
                "–" if mine is None else f"{mine:.2f}",
                _r(torch_tp / by_ours),
                _r(torch_tp / by_bound),
                _r(None if mine is None else torch_tp / mine),
            ]
        )
    table = _table(
        [
            "GPUs (TP)",
            "tokens",
            "ops × layers",
            "Σ torch seq ms a layer",
            "Σ ours",
            "Σ bound",
            "torch TP step ms",
            "step, ops as ours",
            "step, ops at the bound",
            "ours, measured",
            "torch / ops as ours",
            "torch / bound (the ceiling)",
            "torch / ours, measured",
        ],
        rows,
    )
    files = ", ".join(f"`results/{db}` with `results/{run}`" for db, run in sources(root).step_ceiling)
    return (
        f"{table}\n\nA layer's ops (forward and backward) each timed alone (device time, medians): torch's "
        f"collective and matmul in sequence, our fastest verified configuration, and the overlap bound (the "
        f"slower of the GEMM alone and the fastest collective alone). `step, ops as …`: the step of torch's "
        f"fastest TP variant (eager, compiled or graphs) with each layer's ops' time replaced so; `ours, "
        f"measured`: our fastest variant's step in the same run as torch's. From {files}.\n"
    )


def ce_streams(root: Path) -> str:
    """A rank's copy-engine pushes to its peers spread over one, two or three streams, against
    NCCL's all-gather of the same bytes."""
    parts = []
    for name in sources(root).ce_streams:
        doc = _read_json(root / "results" / name)
        rows = [
            [r["what"], str(r["mib"]), _t(r["us"]), f"{r['gb_per_s']:.1f}", "yes" if r["landed"] else "no"]
            for r in doc["rows"]
        ]
        table = _table(["transfer", "MiB to each peer", "µs", "GB/s a rank sends", "every byte landed"], rows)
        parts.append(f"{table}\n\n{doc['device']}; median µs of a whole all-gather; from `results/{name}`.\n")
    return "\n".join(parts)


MOE_OPS = {"a2a_gemm": "dispatch", "gemm_a2a": "combine"}
"""The MoE op kinds and the names docs/moe.md gives them."""


def _programs(plan: str) -> int | None:
    """The copier programs of an `nvshmem` plan's short name (its `/smN`); None for another plan."""
    found = re.search(r"/nvshmem/.*/sm(\d+)$", plan)
    return int(found[1]) if found else None


def _pipelined_alone(config: str) -> bool:
    """A layer configuration that is one pipelined plan for both ops, neither checked against the
    unfused ops nor with the unfused backward."""
    return config.startswith("pipelined/") and ", " not in config


def moe_backends(root: Path) -> str:
    """The pipelined MoE plans' backends side by side (`moe_backends` in tables.json): first, per
    run, the ranges over its cases of nvshmem against copy_engine on each op, of nvshmem's most
    copier programs against its fewest, and of the layer against torch's on each backend; then
    per run each op's pipelined candidates with the same chunks and order, one column a backend
    (and copier program count), beside the all-to-all alone and the grouped GEMM alone, and the
    layer forward + backward on each backend's pipelined plan."""
    runs = [(name, _read_json(root / "results" / name)) for name in sources(root).moe_backends]
    programs = sorted(
        {n for _, doc in runs for op in doc["ops"] for c in op["candidates"] if (n := _programs(c["short"]))}
    )
    fewest, most = (programs[0], programs[-1]) if programs else (None, None)
    parts, ranges = [], []
    for name, doc in runs:
        env = doc["environment"]
        plans = sorted(
            {c["short"] for op in doc["ops"] for c in op["candidates"] if c["short"].startswith("pipelined/")}
        )
        rows = []
        # torch's path on its NVSHMEM all-to-all, where the run timed it (moe_bench in NVSHMEM processes)
        nvshmem_torch = all("torch_nvshmem" in op["times"] for op in doc["ops"])
        nv_over_ce: dict[str, list[float]] = {kind: [] for kind in MOE_OPS}
        most_over_fewest = []
        for op in doc["ops"]:
            got = {c["short"]: c for c in op["candidates"] if c.get("status") == "ok" and c.get("times")}
            times = [got[p]["times"]["median_us"] if p in got else None for p in plans]
            ce = [t for p, t in zip(plans, times, strict=True) if "/copy_engine/" in p and t]
            nv = [t for p, t in zip(plans, times, strict=True) if "/nvshmem/" in p and t]
            ratio = min(nv) / min(ce) if ce and nv else None
            if ratio is not None:
                nv_over_ce.setdefault(op["kind"], []).append(ratio)
            on: dict[int, float] = {}
            for p, t in zip(plans, times, strict=True):
                if t and (n := _programs(p)):
                    on[n] = min(on.get(n, t), t)
            if most != fewest and most in on and fewest in on:
                most_over_fewest.append(on[most] / on[fewest])
            t = op["times"]
            rows.append(
                [op["model"], op["kind"], str(op["tokens"]), op["routing"]]
                + [_t(t["a2a"]["median_us"]), _t(t["gemm"]["median_us"])]
                + (
                    [_t(t["torch"]["median_us"]), _t(t["torch_nvshmem"]["median_us"])]
                    if nvshmem_torch
                    else []
                )
                + [_t(t) for t in times]
                + [_r(ratio)]
            )
        ops_table = _table(
            ["model", "kind", "tokens a rank", "routing", "all-to-all alone", "grouped GEMM alone"]
            + (["torch (NCCL all-to-all)", "torch (NVSHMEM all-to-all)"] if nvshmem_torch else [])
            + [f"`{p}`" for p in plans]
            + ["nvshmem / copy_engine (best of each)"],
            rows,
        )
        layer_table = _table(
            ["model", "tokens a rank", "routing", "layer's plans", "torch µs", "ours µs", "torch / ours"],
            _moe_layer_rows(doc, _pipelined_alone),
        )
        layer_ratios: dict[str, list[float]] = {"copy_engine": [], "nvshmem": []}
        for _, config, torch_us, us in _moe_layer_times(doc, _pipelined_alone):
            layer_ratios.setdefault(config.split("/")[1], []).append(torch_us / us)
        gpus = _moe_gpus(doc)
        ranges.append(
            [gpus]
            + [_span(nv_over_ce[kind]) for kind in MOE_OPS]
            + [_span(most_over_fewest), _span(layer_ratios["copy_engine"]), _span(layer_ratios["nvshmem"])]
        )
        parts.append(
            f"{ops_table}\n\n{layer_table}\n\nµs, medians; ops timed by the project's method, the layer "
            f"forward + backward in calls back to back; every column of a table timed in one run, in processes "
            f"whose symmetric memory is NVSHMEM's; {gpus}, torch {env['torch']}, "
            f"NCCL {env['nccl']}; from `results/{name}`{_moe_copy_note(doc)}.\n"
        )
    ranges_table = _table(
        ["GPUs (EP)"]
        + [f"{label} (`{kind}`): nvshmem / copy_engine" for kind, label in MOE_OPS.items()]
        + [
            f"`sm{most}` / `sm{fewest}`",
            "layer on copy_engine: torch / ours",
            "layer on nvshmem: torch / ours",
        ],
        ranges,
    )
    return (
        f"{ranges_table}\n\nThe range of each ratio over a run's cases (tokens a rank and routing) in the tables "
        f"below it: an op's best `nvshmem` plan over its `copy_engine` plan (above 1: `nvshmem` slower); an op's "
        f"`nvshmem` plan on {most} copier programs over {fewest} (below 1: more programs faster); torch's layer "
        f"forward + backward over ours with each backend's pipelined plan on both ops (above 1: ours faster).\n\n"
        + "\n".join(parts)
    )


TABLES: dict[str, Callable[[Path], str]] = {
    "summary": summary,
    "step-summary": step_summary,
    "suite-tp2": suite_tp2,
    "suite-tp4": suite_tp4,
    "winners": winners,
    "short-tp2": short_tp2,
    "strategies": strategies,
    "cost-model": cost_model,
    "layers": layers,
    "layer-bound": layer_bound,
    "layer-launch": layer_launch,
    "moe": moe,
    "moe-backends": moe_backends,
    "moe-model": moe_model,
    "moe-kernel": moe_kernel,
    "train-step": train_step,
    "train-profile": train_profile,
    "train-timeline": train_timeline,
    "graph-calls": graph_calls,
    "op-host": op_host,
    "nvshmem": nvshmem,
    "fp8": fp8,
    "model-ops": model_ops,
    "ce-streams": ce_streams,
    "step-ceiling": step_ceiling,
}
"""Table name (as in `<!-- generated: NAME -->`) → its generator, given the repository root."""


# ---- the blocks in the documents -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Block:
    """One generated block of a document: where it is, its name, and whether it matches its data."""

    path: Path
    name: str
    current: bool


def documents(root: Path) -> list[Path]:
    """README.md and the pages under docs/, those that exist."""
    return [p for p in [root / "README.md", *sorted((root / "docs").glob("**/*.md"))] if p.is_file()]


def render(text: str, root: Path, source: str = "<text>", cache: dict[str, str] | None = None) -> str:
    """`text` with every generated block's body regenerated from the data under `root`."""
    cache = {} if cache is None else cache

    def body(match: re.Match) -> str:
        name = match["name"]
        if name not in TABLES:
            raise ConfigError(f"{source}: no generated table named {name!r}; known: {', '.join(TABLES)}")
        if name not in cache:
            cache[name] = TABLES[name](root)
        return f"<!-- generated: {name} -->\n{cache[name]}<!-- end -->"

    return BLOCK.sub(body, text)


def blocks(root: Path) -> list[Block]:
    """Every generated block of the documents under `root`, each compared with its data."""
    cache: dict[str, str] = {}
    out = []
    for path in documents(root):
        text = path.read_text()
        for match in BLOCK.finditer(text):
            fresh = render(match[0], root, str(path), cache)
            out.append(Block(path=path, name=match["name"], current=fresh == match[0]))
    return out


def rewrite(root: Path) -> list[Path]:
    """Regenerate every block of the documents under `root`; return the files that changed."""
    cache: dict[str, str] = {}
    changed = []
    for path in documents(root):
        text = path.read_text()
        fresh = render(text, root, str(path), cache)
        if fresh != text:
            path.write_text(fresh)
            changed.append(path)
    return changed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m syncopate.docs_tables", description=__doc__.splitlines()[0])
    ap.add_argument(
        "--root", type=Path, default=Path("."), help="the repository root (default: the current folder)"
    )
    ap.add_argument(
        "--check", action="store_true", help="change nothing; exit 1 if a block differs from its data"
    )
    args = ap.parse_args(argv)
    root = args.root
    if not (root / "results").is_dir():
        print(
            f"docs_tables: error: {str(root)!r} has no results/ folder: give the repository root with --root",
            file=sys.stderr,
        )
        return 2
    try:
        if args.check:
            stale = [b for b in blocks(root) if not b.current]
            for b in stale:
                print(
                    f"{b.path}: table {b.name!r} differs from its data: run `python -m syncopate.docs_tables`"
                )
            return 1 if stale else 0
        for path in rewrite(root):
            print(f"rewrote {path}")
    except ConfigError as e:
        print(f"docs_tables: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
