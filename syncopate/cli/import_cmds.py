"""`syncopate import-bench`: store a `syncopate bench --json` file in the results database."""

from __future__ import annotations

from pathlib import Path

import typer

from syncopate.cli import app


@app.command("import-bench")
def import_bench_cmd(
    bench: Path = typer.Argument(..., help="A JSON file written by `syncopate bench --json`."),
    db: str = typer.Option(
        None,
        help="Database URL or SQLite path (default: $SYNCOPATE_DB, else the per-user "
        "database); a new one is made with `syncopate db upgrade --db URL`.",
    ),
    syncopate: str = typer.Option(
        None, help="Syncopate version the bench ran (default: the file's, else this one's)."
    ),
    torch: str = typer.Option(None, help="torch version (default: the file's)."),
    triton: str = typer.Option(None, help="Triton version, where the file does not say."),
    cuda: str = typer.Option(None, help="CUDA version torch was built for, where the file does not say."),
    nccl: str = typer.Option(None, help="NCCL version, where the file does not say."),
    driver: str = typer.Option(None, help="NVIDIA driver version, where the file does not say."),
    gpu_model: str = typer.Option(None, help="GPU model such as H200 (default: the file's)."),
    topology: str = typer.Option(None, help="Topology key (default: the file's, e.g. H200x2-nvlink)."),
) -> None:
    """Store a bench run's baselines and candidates as measured rows of one sweep (importing the same
    file again adds nothing); the file's host and time are kept."""
    from syncopate.results_db.bench_import import prepare_bench, read_bench, store_bench
    from syncopate.results_db.repository import ResultsDB
    from syncopate.version import __version__

    doc = read_bench(bench)  # a bad file fails before the database is touched
    if syncopate is None and not (
        isinstance(doc.get("environment"), dict) and "syncopate" in doc["environment"]
    ):
        syncopate = __version__
    prepared = prepare_bench(
        bench,
        syncopate=syncopate,
        torch=torch,
        triton=triton,
        cuda=cuda,
        nccl=nccl,
        driver=driver,
        gpu_model=gpu_model,
        topology=topology,
    )  # all of it, before the database
    with ResultsDB.open(db) as rdb:
        result = store_bench(rdb, prepared)
        shown = rdb.url
    verb = "stored" if result.created else "already stored"
    print(
        f"{verb}: {bench} as sweep {result.sweep_id} ({result.sweep_name}) in {shown}: {result.workloads} "
        f"workload(s), {result.trials} trial(s), {result.baselines} baseline(s) on {result.topology.key()} "
        f"under {result.environment.short()}"
    )
