"""`syncopate lookup`, `best`, `export` and `db upgrade`: the results database from the shell.

`--db` takes a URL (`sqlite:///PATH`, `postgresql+psycopg://…`) or a SQLite path; without it,
SYNCOPATE_DB, else the per-user default. `lookup` also takes an export file.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from syncopate.cli import app, console, db_app
from syncopate.cli.tables import Column, Listing, show
from syncopate.errors import ConfigError

_DB_HELP = "Database URL or SQLite path (default: $SYNCOPATE_DB, else the per-user database)."


@app.command("lookup")
def lookup_cmd(
    kind: str = typer.Option(
        "ag_gemm", help="Op kind: ag_gemm, gemm_rs, gemm_ar, or the MoE kinds a2a_gemm, gemm_a2a."
    ),
    m: int = typer.Option(None, help="Global M (rows of A and of the output); the dense kinds."),
    n: int = typer.Option(None, help="Global N; the dense kinds."),
    k: int = typer.Option(None, help="Global K; the dense kinds."),
    tokens: int = typer.Option(None, "--tokens", help="MoE kinds: tokens a rank."),
    hidden: int = typer.Option(None, "--hidden", help="MoE kinds: the hidden width."),
    ffn: int = typer.Option(None, "--ffn", help="MoE kinds: each expert's ffn width."),
    experts: int = typer.Option(None, "--experts", help="MoE kinds: experts of the layer."),
    top_k: int = typer.Option(None, "--top-k", help="MoE kinds: experts a token is routed to."),
    routing: str = typer.Option("uniform", "--routing", help="MoE kinds: uniform or skewed."),
    skew: float = typer.Option(1.2, "--skew", help="MoE kinds: the Zipf exponent of a skewed routing."),
    seed: int = typer.Option(0, "--seed", help="MoE kinds: the routing's seed."),
    dtype: str = typer.Option("bf16", help="bf16, fp16, fp32 or fp8 (the MoE kinds: not fp8)."),
    topology: str = typer.Option(
        None, help="Topology key such as H200x2-nvlink (default: detect this machine's)."
    ),
    db: str = typer.Option(None, help=_DB_HELP + " An export file (syncopate export) works too."),
    mode: str = typer.Option(
        "eager",
        "--mode",
        help="How the job calls the op: eager (back to back, the host on the path) or graph "
        "(replayed from CUDA graphs): what the answer is ranked by.",
    ),
    as_json: bool = typer.Option(
        False,
        "--json",
        help="Print the answer as JSON: candidate, match, mode, objective, reason, trial_id, time_us; "
        "where a trial answers its eager and host times, measured_on, measured_topology and environment; where none "
        "does, what the database holds.",
    ),
) -> None:
    """The configuration to run for one workload, the rung of the ladder it came from (exact,
    nearest_shape, other_environment, other_topology, cost_model, default) and why. The MoE kinds
    (a2a_gemm, gemm_a2a) take the layer's options instead of --m/--n/--k, and climb their own
    ladder (syncopate.moe.lookup_moe: exact, nearest_tokens, other_environment, other_topology,
    cost_model, default)."""
    from syncopate.results_db.lookups import lookup
    from syncopate.search_space import MOE_KINDS, Shape

    if kind in MOE_KINDS:
        _lookup_moe(
            kind, tokens, hidden, ffn, experts, top_k, routing, skew, seed, dtype, topology, db, mode, as_json
        )
        return
    missing = [f"--{name}" for name, v in (("m", m), ("n", n), ("k", k)) if v is None]
    if missing:
        raise ConfigError(f"kind {kind} looks up a GEMM shape: give {', '.join(missing)}")

    result = _quiet_lookup(
        "syncopate.results_db.lookups",
        lambda: lookup(Shape(m=m, n=n, k=k), topology, kind=kind, dtype=dtype, db=db, mode=mode),
    )
    if as_json:
        print(json.dumps(result.to_dict()))
        return
    for line in _lookup_lines(result):
        print(line)


def _lookup_moe(
    kind, tokens, hidden, ffn, experts, top_k, routing, skew, seed, dtype, topology, db, mode, as_json
) -> None:
    """`syncopate lookup --kind a2a_gemm|gemm_a2a …`: :func:`syncopate.moe.lookup_moe`."""
    from syncopate.results_db.moe_lookups import lookup_moe
    from syncopate.search_space import MoeWorkload, RoutingSpec

    given = {"--tokens": tokens, "--hidden": hidden, "--ffn": ffn, "--experts": experts, "--top-k": top_k}
    missing = [name for name, v in given.items() if v is None]
    if missing:
        raise ConfigError(f"kind {kind} is a MoE op: give {', '.join(missing)} (not --m/--n/--k)")
    workload = MoeWorkload(
        kind=kind,
        tokens=tokens,
        hidden=hidden,
        ffn=ffn,
        experts=experts,
        top_k=top_k,
        routing=RoutingSpec(distribution=routing, skew=skew, seed=seed),
        dtype=dtype,
    )
    result = _quiet_lookup(
        "syncopate.results_db.moe_lookups", lambda: lookup_moe(workload, topology, db=db, mode=mode)
    )
    if as_json:
        print(json.dumps(result.to_dict()))
        return
    where = " (unfused, the default)"
    if result.match == "cost_model":
        where = f" (predicted {result.predicted_us:.1f} µs, {result.objective})"
    elif result.trial_id is not None:
        where = f" from trial {result.trial_id} ({result.time_us:.1f} µs"
        if result.measured_on != workload:
            where += f" on {result.measured_on.key()}"
        if result.measured_topology.key() != result.topology.key():
            where += f" on {result.measured_topology.key()}"
        where += ")" + (f", {result.guard} served" if result.guard else "")
    print(f"{workload} on {result.topology.key()}: {result.match}{where}")
    print(result.candidate.short())
    print(f"why: {result.reason}")


def _quiet_lookup(logger: str, answer: Callable[[], Any]) -> Any:
    """answer() with `logger`'s warnings held back (the lines printed say what they warn of: another
    environment answered), and an undetected topology said as the option to pass."""
    from syncopate.errors import RuntimeUnavailableError
    from syncopate.results_db.lookups import TopologyUndetected

    quiet = logging.getLogger(logger)
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        return answer()
    except TopologyUndetected as e:
        raise RuntimeUnavailableError(
            f"cannot detect this machine's topology ({e.reason}): pass --topology KEY, such as "
            f"--topology H200x2-nvlink"
        ) from None
    finally:
        quiet.setLevel(level)


def _lookup_lines(result: Any) -> list[str]:
    """The human answer of `syncopate lookup`: what to run, from where, and why (a figure that was
    not measured is said in words)."""

    def us(value: float | None) -> str:
        return f"{value:.1f} µs" if value is not None else "not measured"

    if result.trial_id is not None:
        where = f" from trial {result.trial_id} ({us(result.time_us)}"
        if result.measured_on.shape != result.workload.shape:
            where += f" on {result.measured_on.shape}"
        if result.measured_topology.key() != result.topology.key():
            where += f" on {result.measured_topology.key()}"
        if result.match in ("other_environment", "other_topology"):
            where += f", under {result.environment.short()}"
        where += ")"
        if result.guard:
            where += f", {result.guard} served"
    elif result.match == "cost_model":
        where = f" (predicted {result.predicted_us:.1f} µs)"
    else:
        where = " (the documented default)"
    lines = [f"{result.workload} on {result.topology.key()}: {result.match}{where}", result.candidate.short()]
    if result.trial_id is not None:
        lines.append(
            f"mode {result.mode}, objective {result.objective}; a call: device {us(result.time_us)}, eager "
            f"{us(result.eager_us)}, host {us(result.host_us)}"
        )
    elif result.objective:
        lines.append(f"mode {result.mode}, objective {result.objective}")
    lines.append(f"why: {result.reason}")
    return lines


def _bound(names: dict[str, float]) -> float | None:
    comm = [v for k, v in names.items() if k.startswith("comm_alone")]
    if "gemm_alone" not in names or not comm:
        return None
    return max(names["gemm_alone"], min(comm))


def _best_listing(rows: list[dict[str, Any]], where: str) -> Listing:
    """The `best` table: compact, the shape, the configuration, its time and speedup over torch_seq
    (topology and environment too where the rows hold several); `--wide` adds the other baselines'
    speedups, the fraction of the bound, the trial and the sweep."""
    topologies = {row["topology"] for row in rows}
    envs = {row["_row"].environment.key()[:8] for row in rows}
    names = sorted({name for row in rows for name in row["speedups"]})
    compact = ["torch_seq"] if "torch_seq" in names else []
    columns = (
        Column(name="workload", key=True),
        Column(name="topology", wide=len(topologies) == 1),
        Column(name="env", wide=len(envs) == 1),
        Column(name="best configuration", key=True),
        Column(name="median µs", numeric=True),
        *(Column(name=f"× {name}", numeric=True, wide=name not in compact) for name in compact),
        *(Column(name=f"× {name}", numeric=True, wide=True) for name in names if name not in compact),
        Column(name="bound/best", numeric=True, wide=True),
        Column(name="trial", numeric=True, wide=True),
        Column(name="sweep", numeric=True, wide=True),
    )
    order = compact + [name for name in names if name not in compact]
    cells = []
    for row in rows:
        t = row["_row"]
        cells.append(
            (
                row["workload"],
                row["topology"],
                t.environment.key()[:8],
                t.candidate.short(),
                f"{t.median_us:.1f}",
                *(f"{row['speedups'][name]:.2f}" if name in row["speedups"] else "–" for name in order),
                f"{row['of_bound']:.2f}" if row["of_bound"] else "–",
                str(t.trial_id),
                str(t.sweep_id),
            )
        )
    return Listing(
        title=f"best configurations in {where}",
        columns=columns,
        rows=cells,
        records=[{k: v for k, v in row.items() if k != "_row"} for row in rows],
    )


def _environment_legend(rows: list[dict[str, Any]]) -> list[str]:
    """One line per environment of the rows: its key's first 8 digits (the `env` column, what
    `report --environment` takes) and its versions."""
    envs = {row["_row"].environment.key(): row["_row"].environment for row in rows}
    return [f"env {key[:8]}: {env.short()}" for key, env in sorted(envs.items())]


@app.command("best")
def best_cmd(
    db: str = typer.Option(None, help=_DB_HELP),
    kind: str = typer.Option(None, help="Only this op kind."),
    topology: str = typer.Option(None, help="Only this topology key."),
    as_json: bool = typer.Option(False, "--json", help="Print the rows as JSON, every field."),
    wide: bool = typer.Option(
        False,
        "--wide",
        help="Every column: each baseline's speedup, the fraction of the bound, the trial and the sweep.",
    ),
) -> None:
    """The best configuration of every stored workload, topology and environment, with its speedup
    over each baseline measured in the same sweep (baseline time / best time)."""
    from syncopate.results_db.repository import ResultsDB
    from syncopate.results_db.urls import locate

    out = console()
    location = locate(db)
    if location.is_default and location.sqlite_path is not None and not location.sqlite_path.exists():
        if as_json:
            print("[]")
        else:
            out.print(f"no results stored yet in {location.shown()}", highlight=False)
        return
    with ResultsDB.open(db, read_only=True) as rdb:
        best = rdb.best_configs(kind=kind, topology=topology, mode="graph")
        # sources stored but never served, named where nothing measured is there to show
        others = (
            []
            if best
            else [
                src
                for src in ("fixture", "predicted")
                if rdb.trials(kind=kind, topology=topology, source=src, status="ok", limit=1)
            ]
        )
        index: dict[tuple[str, str, str, int], dict[str, float]] = {}
        for b in rdb.baselines(topology=topology):
            r = b.record
            index.setdefault((r.workload.key(), r.topology.key(), r.environment.key(), b.sweep_id), {})[
                r.name
            ] = r.median_us
    rows: list[dict[str, Any]] = []
    for t in best:
        found = index.get((t.workload.key(), t.topology.key(), t.environment.key(), t.sweep_id), {})
        speedups = {name: base / t.median_us for name, base in sorted(found.items()) if t.median_us}
        bound = _bound(found)
        rows.append(
            {
                "workload": t.workload.key(),
                "topology": t.topology.key(),
                "environment": t.environment.to_dict(),
                "candidate": t.candidate.to_dict(),
                "trial_id": t.trial_id,
                "sweep_id": t.sweep_id,
                "median_us": t.median_us,
                "speedups": speedups,
                "of_bound": (bound / t.median_us) if bound and t.median_us else None,
                "_row": t,
            }
        )
    if not rows and not as_json:
        filtered = " matching the filters" if kind or topology else ""
        unserved = ""
        if others:
            unserved = f" (its {' and '.join(others)} trials are not measurements and are never served)"
        out.print(f"no ok measured trials in {location.shown()}{filtered}{unserved}", highlight=False)
        return
    show(_best_listing(rows, location.shown()), out, wide=wide, as_json=as_json)
    if not as_json:
        for line in _environment_legend(rows):
            out.print(line, highlight=False, markup=False, soft_wrap=True)


@app.command("export")
def export_cmd(
    out: Path = typer.Option(..., "--out", help="The JSON file to write (replaced atomically)."),
    db: str = typer.Option(None, help=_DB_HELP),
    kind: str = typer.Option(None, help="Only this op kind."),
    topology: str = typer.Option(None, help="Only this topology key."),
) -> None:
    """Write the best configurations to a JSON file that `lookup` (and syncopate.lookup) accept
    as --db / db=, for jobs that cannot reach the database."""
    from syncopate.files import check_writable
    from syncopate.results_db.repository import ResultsDB

    check_writable(out, "best.json")
    with ResultsDB.open(db, read_only=True) as rdb:
        count = rdb.export_best(out, kind=kind, topology=topology)
        shown = rdb.url
    console().print(
        f"wrote {count} best configuration{'s' if count != 1 else ''} from {shown} to {out}", highlight=False
    )


@db_app.command("upgrade")
def db_upgrade_cmd(db: str = typer.Option(None, help=_DB_HELP)) -> None:
    """Create the results database, or bring its schema to this version's (Optuna's tables in the
    same database are left alone). A database from a newer Syncopate is refused, untouched."""
    from syncopate.results_db.migrate import upgrade
    from syncopate.results_db.urls import locate

    location = locate(db)
    if location.in_memory:
        raise ConfigError(
            f"database {location.subject()} is in memory: an upgrade there keeps nothing; give a "
            f"file path or a server URL"
        )
    before, after = upgrade(location)
    out = console()
    if before == after:
        out.print(f"{location.shown()}: schema at revision {after}, nothing to do", highlight=False)
    else:
        out.print(
            f"{location.shown()}: schema upgraded from {before or 'nothing'} to revision {after}",
            highlight=False,
        )
