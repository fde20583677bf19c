"""`syncopate tune`: run a sweep on Ray gangs (or, with the model and replay runners, in this
process) and store every trial."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from syncopate.cli import app
from syncopate.cli import console as output_console
from syncopate.cli.tables import Column, Listing, show

if TYPE_CHECKING:
    from rich.console import Console

    from syncopate.autotuner.progress import WorkloadSummary
    from syncopate.autotuner.tune import TuneResult


def _not_an_interrupt(record: logging.LogRecord) -> bool:
    """Whether a record is worth printing: not one logged with a Ctrl-C or SIGTERM as its exception.
    A stop can land while a library is in the middle of something it logs the failure of (SQLAlchemy's
    pool, resetting a connection, logs the interrupt's traceback before passing it on); the command
    says itself that it was stopped and what was kept."""
    return not (record.exc_info and isinstance(record.exc_info[1], KeyboardInterrupt))


def _setup_logging(console: Console, verbose: bool) -> None:
    """Log records to `console`: through rich on a terminal; one plain line per record when stderr
    is piped or redirected (rich would pad every line to the console's width)."""
    root = logging.getLogger()
    if not any(getattr(h, "_syncopate_cli", False) for h in root.handlers):
        if console.is_terminal:
            from rich.logging import RichHandler

            handler: logging.Handler = RichHandler(
                console=console, show_path=False, show_time=False, markup=False
            )
            handler.setFormatter(logging.Formatter("%(message)s"))
        else:
            handler = logging.StreamHandler(console.file)
            handler.setFormatter(logging.Formatter("%(levelname)-8s %(message)s"))
        handler._syncopate_cli = True  # type: ignore[attr-defined]
        handler.addFilter(_not_an_interrupt)
        root.addHandler(handler)
    root.setLevel(logging.INFO if verbose else logging.WARNING)
    logging.getLogger("syncopate").setLevel(logging.INFO if verbose else logging.WARNING)


def _objective_note(result) -> str:
    """What the summary's times are, in the sweep's mode (and which rows had no eager figure)."""
    from syncopate.records import OBJECTIVE_NO_EAGER

    if result.mode == "graph":
        return "mode graph: best and torch_seq times are device times (calls replayed from CUDA graphs)"
    line = (
        "mode eager: best and torch_seq times are per call of back-to-back eager calls, the host on the path "
        "(--mode graph ranks by device time)"
    )
    fallback = [s.workload for s in result.summaries if s.objective == OBJECTIVE_NO_EAGER]
    if fallback:
        line += f"; no eager measurement for {', '.join(fallback)}: ranked and shown by device time"
    return line


@app.command("tune")
def tune_cmd(
    config: Path = typer.Argument(..., help="Sweep config (YAML)."),
    db: str | None = typer.Option(
        None,
        "--db",
        help="Database URL or SQLite path (default: the config's db, SYNCOPATE_DB, or the per-user SQLite "
        "file); a SQLite file that does not exist yet is created (its folder must exist).",
    ),
    resume: bool = typer.Option(
        False,
        "--resume",
        help="Continue the latest sweep of this name; stored trials are not measured again.",
    ),
    max_trials: int | None = typer.Option(
        None, "--max-trials", help="Trials per workload (overrides strategy.max_trials)."
    ),
    time_budget: float | None = typer.Option(
        None,
        "--time-budget",
        help="Seconds after which no new trial starts (overrides strategy.time_budget_s).",
    ),
    ray_address: str | None = typer.Option(
        None,
        "--ray-address",
        help="Ray cluster to join: HOST:PORT, ray://HOST:PORT or auto (default: the config's, RAY_ADDRESS, "
        "or a local cluster).",
    ),
    runner: str | None = typer.Option(
        None,
        "--runner",
        help="gpu, model (the cost model predicts; no GPU needed), replay (a stored sweep answers, named by the "
        "config's `replay:` section: see configs/replay_example.yaml), cpu-fixture, or cpu (the MoE kinds on gloo "
        "ranks, wall-clock times) (overrides the config's runner).",
    ),
    topology: str | None = typer.Option(
        None,
        "--topology",
        help="Topology key overriding the config's, e.g. H200x8-nvswitch (with --runner model: "
        "predict for GPUs not at hand), or `detect`: this machine's GPUs (with --runner gpu).",
    ),
    mode: str = typer.Option(
        "eager",
        "--mode",
        help="What the sweep's best and the re-measurements rank by: eager (back-to-back "
        "eager time per call, the host on the path) or graph (device time, calls replayed from CUDA graphs). "
        "Both are measured either way.",
    ),
    verbose: bool = typer.Option(
        False, "--verbose", "-v", help="Log at INFO and forward the workers' output."
    ),
    as_json: bool = typer.Option(
        False, "--json", help="Print the sweep and its per-workload results as JSON (notes go to stderr)."
    ),
    wide: bool = typer.Option(
        False, "--wide", help="Every column: trials, failures, torch_seq and bound times, re-measurements."
    ),
) -> None:
    """Tune the workloads of CONFIG on Ray GPU gangs; every trial, failures too, lands in the database."""
    from syncopate.autotuner.progress import below_bound_note, overhead_line
    from syncopate.autotuner.tune import TuneOptions, run_tune

    err = output_console(stderr=True)
    out = output_console()
    _setup_logging(err, verbose)
    options = TuneOptions(
        config=config,
        db=db,
        resume=resume,
        max_trials=max_trials,
        time_budget_s=time_budget,
        ray_address=ray_address,
        runner=runner,
        verbose=verbose,
        topology=topology,
        mode=mode,
    )
    result = run_tune(options, console=err)
    if as_json:
        print(json.dumps(summary_json(result), indent=1))
    else:
        show(summary_listing(result), out, wide=wide)
    notes = err if as_json else out
    failed = _failures_line(result.summaries)
    if failed and not wide and not as_json:
        notes.print(failed, highlight=False)
    for line in continued_lines(result.summaries):
        notes.print(line, highlight=False, markup=False)
    notes.print(_objective_note(result), highlight=False, markup=False)
    note = below_bound_note(result.summaries)
    if note:
        notes.print(note, highlight=False)
    if result.note:
        notes.print(result.note, highlight=False)
    if result.progress is not None:
        line = overhead_line(result.progress)
        if line:
            notes.print(line, highlight=False)
        if result.progress.rebuilds:
            notes.print(f"gangs rebuilt: {result.progress.rebuilds}")
    if not result.served:
        notes.print(
            f"these {result.source} times are not measurements: `syncopate best` and `syncopate lookup` "
            f"serve only measured trials",
            highlight=False,
        )
    if result.status == "stopped":
        notes.print(
            "the time budget ran out: run the same command with --resume to continue", highlight=False
        )


_LABELS = {
    "cpu-fixture": " (cpu-fixture: synthetic times, not measured, stored as source fixture)",
    "cpu": " (cpu: wall-clock times on gloo ranks, no GPU's, stored as source fixture)",
    "replay": " (replay: replayed times, not measured, stored as source fixture)",
    "model": " (PREDICTED by the cost model, not measured: stored as source predicted)",
}


def _us(x: float | None) -> str:
    return f"{x:.1f}" if x is not None else "–"


def summary_listing(result: TuneResult) -> Listing:
    """The closing table: compact, each workload's best time, its speedup over torch_seq and its
    configuration; `--wide` adds the trial counts, failures, baseline and bound times and the
    re-measurements. Predicted times say so in their headers."""
    summaries = result.summaries
    when = "predicted " if result.source == "predicted" else ""
    confirmed = any(s.verdict is not None for s in summaries)
    columns = (
        Column(name="workload", key=True),
        Column(name="trials", wide=True, numeric=True),
        Column(name="failed", wide=True),
        Column(name=f"{when or 'best '}µs", numeric=True),
        Column(name=f"{when}torch_seq µs", wide=True, numeric=True),
        Column(name="speedup", numeric=True),
        Column(name=f"{when}bound µs", wide=True, numeric=True),
        Column(name="best candidate", key=True),
        *((Column(name="re-measured", wide=True),) if confirmed else ()),
    )
    rows = []
    for s in summaries:
        trials = f"{s.stored_before + s.measured}/{s.planned}" + (
            f" ({s.stored_before} resumed)" if s.stored_before else ""
        )
        row = [
            s.workload,
            trials,
            ", ".join(f"{k} {v}" for k, v in sorted(s.failures.items())) or "0",
            _us(s.best_us),
            _us(s.torch_seq_us),
            f"{s.speedup:.2f}×" if s.speedup is not None else "–",
            _us(s.bound_us),
            s.best.candidate.short() if s.best else "–",
        ]
        if confirmed:
            v = s.verdict
            row.append(
                "–"
                if v is None
                else f"{v.contenders} again, {v.samples} samples" + (" (winner changed)" if v.changed else "")
            )
        rows.append(row)
    title = (
        f"sweep {result.sweep_name!r} (id {result.sweep_id}) on {result.topology}: {result.status}"
        f"{'' if result.served else _LABELS.get(result.runner, '')}"
    )
    return Listing(title=title, columns=columns, rows=rows)


def summary_json(result: TuneResult) -> dict[str, Any]:
    """What `tune --json` prints: the sweep, and per workload every number of the table."""
    workloads = []
    for s in result.summaries:
        workloads.append(
            {
                "workload": s.workload,
                "planned": s.planned,
                "stored_before": s.stored_before,
                "measured": s.measured,
                "failures": dict(sorted(s.failures.items())),
                "best_us": s.best_us,
                "torch_seq_us": s.torch_seq_us,
                "speedup": s.speedup,
                "bound_us": s.bound_us,
                "candidate": s.best.candidate.to_dict() if s.best else None,
                "re_measured": None
                if s.verdict is None
                else {
                    "contenders": s.verdict.contenders,
                    "samples": s.verdict.samples,
                    "changed": s.verdict.changed,
                },
                "continued_study": None
                if s.continued is None
                else {"name": s.continued.name, "trials": s.continued.trials, "best_us": s.continued.best_us},
            }
        )
    return {
        "sweep_id": result.sweep_id,
        "sweep_name": result.sweep_name,
        "status": result.status,
        "resumed": result.resumed,
        "topology": result.topology,
        "runner": result.runner,
        "source": result.source,
        "served": result.served,
        "workloads": workloads,
    }


def _failures_line(summaries: list[WorkloadSummary]) -> str | None:
    """The failed trials the compact table leaves out (None: there are none)."""
    failed = [(s.workload, sum(s.failures.values())) for s in summaries if s.failures]
    if not failed:
        return None
    return (
        "failed trials: "
        + ", ".join(f"{w} {n}" for w, n in failed)
        + " (`--wide` shows each status; `syncopate report` the errors)"
    )


def continued_lines(summaries: list[WorkloadSummary]) -> list[str]:
    """One line per workload whose strategy carried on a study from other sweeps: those candidates
    were not measured again, so this sweep's best may differ from the best stored."""
    lines = []
    for s in summaries:
        c = s.continued
        if c is None:
            continue
        best = f" (best {c.best_us:.1f} µs)" if c.best_us is not None else ""
        lines.append(
            f"{s.workload}: continued study {c.name}: {c.trials} earlier trial{'s' if c.trials != 1 else ''}{best}, "
            f"not measured again; the best above is this sweep's, among the other candidates (another --db starts "
            f"afresh)"
        )
    return lines
