"""`syncopate tune`: run a sweep on Ray gangs (or, with the model and replay runners, in this
process) and store every trial."""

from __future__ import annotations

import logging
from pathlib import Path

import typer
from rich.console import Console
from rich.logging import RichHandler

from syncopate.cli import app
from syncopate.cli import console as output_console


def _not_an_interrupt(record: logging.LogRecord) -> bool:
    """Whether a record is worth printing: not one logged with a Ctrl-C or SIGTERM as its exception.
    A stop can land while a library is in the middle of something it logs the failure of (SQLAlchemy's
    pool, resetting a connection, logs the interrupt's traceback before passing it on); the command
    says itself that it was stopped and what was kept."""
    return not (record.exc_info and isinstance(record.exc_info[1], KeyboardInterrupt))


def _setup_logging(console: Console, verbose: bool) -> None:
    root = logging.getLogger()
    if not any(isinstance(h, RichHandler) for h in root.handlers):
        handler = RichHandler(console=console, show_path=False, show_time=False, markup=False)
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler.addFilter(_not_an_interrupt)
        root.addHandler(handler)
    root.setLevel(logging.INFO if verbose else logging.WARNING)
    logging.getLogger("syncopate").setLevel(logging.INFO if verbose else logging.WARNING)


def _objective_note(result) -> str:
    """What the summary's times are, in the sweep's mode (and which rows had no eager figure)."""
    from syncopate.records import OBJECTIVE_NO_EAGER

    if result.mode == "graph":
        return "mode graph: best and torch_seq times are device times (calls replayed from CUDA graphs)"
    line = ("mode eager: best and torch_seq times are per call of back-to-back eager calls, the host on the path "
            "(--mode graph ranks by device time)")
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
        help="gpu, model (the cost model predicts; no GPU needed), replay (a stored sweep answers) or "
        "cpu-fixture (overrides the config's runner).",
    ),
    topology: str | None = typer.Option(
        None, "--topology", help="Topology key overriding the config's, e.g. H200x8-nvswitch (with --runner model: "
        "predict for GPUs not at hand)."
    ),
    mode: str = typer.Option(
        "eager", "--mode", help="What the sweep's best and the re-measurements rank by: eager (back-to-back "
        "eager time per call, the host on the path) or graph (device time, calls replayed from CUDA graphs). "
        "Both are measured either way."
    ),
    verbose: bool = typer.Option(
        False, "--verbose", "-v", help="Log at INFO and forward the workers' output."
    ),
) -> None:
    """Tune the workloads of CONFIG on Ray GPU gangs; every trial, failures too, lands in the database."""
    from syncopate.autotuner.progress import below_bound_note, overhead_line, summary_table
    from syncopate.autotuner.tune import TuneOptions, run_tune

    err = Console(stderr=True)
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
    labels = {
        "cpu-fixture": " (cpu-fixture: synthetic times, not measured, stored as source fixture)",
        "replay": " (replay: replayed times, not measured, stored as source fixture)",
        "model": " (PREDICTED by the cost model, not measured: stored as source predicted)",
    }
    out.print(
        summary_table(
            result.summaries,
            f"sweep {result.sweep_name!r} (id {result.sweep_id}) on {result.topology}: "
            f"{result.status}{'' if result.served else labels.get(result.runner, '')}",
            predicted=result.source == "predicted",
        )
    )
    out.print(_objective_note(result), highlight=False)
    note = below_bound_note(result.summaries)
    if note:
        out.print(note, highlight=False)
    if result.note:
        out.print(result.note, highlight=False)
    if result.progress is not None:
        line = overhead_line(result.progress)
        if line:
            out.print(line)
        if result.progress.rebuilds:
            out.print(f"gangs rebuilt: {result.progress.rebuilds}")
    if not result.served:
        out.print(
            f"these {result.source} times are not measurements: `syncopate best` and `syncopate lookup` "
            f"serve only measured trials",
            highlight=False,
        )
    if result.status == "stopped":
        out.print("the time budget ran out: run the same command with --resume to continue")
