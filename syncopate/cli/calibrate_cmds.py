"""`syncopate calibrate`: measure the cost model's curves on the GPUs at hand and store them."""

from __future__ import annotations

import dataclasses

import typer
from rich.table import Table

from syncopate.cli import app, console
from syncopate.errors import ConfigError, RuntimeUnavailableError


def _gpu_count() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@app.command("calibrate")
def calibrate_cmd(
    db: str | None = typer.Option(
        None, "--db", help="Database URL (default: SYNCOPATE_DB or the per-user SQLite file)."
    ),
    gpus: int | None = typer.Option(None, "--gpus", min=1, help="GPUs to use (default: all visible)."),
    quick: bool = typer.Option(False, "--quick", help="Fewer sizes, SM counts and repetitions (a first look)."),
    tiles: str | None = typer.Option(
        None, "--tiles", help="Comma-separated tile configs to measure, such as 128x256x64w8s3,128x128x64w8s4 "
        "(default: every tile config of the space; the cost model uses its defaults for the others)."
    ),
) -> None:
    """Measure transfer time against chunk size per backend (and against comm_sms for the SM-driven
    copier) and GEMM throughput per tile configuration and SM count, on the GPUs of this machine;
    store them as calibrations of the detected topology and this environment."""
    from syncopate.search_space import TileConfig

    tile_configs = None
    if tiles is not None:
        tile_configs = tuple(TileConfig.from_key(t.strip()) for t in tiles.split(",") if t.strip())
        if not tile_configs:
            raise ConfigError(f"--tiles {tiles!r} names no tile config: give keys such as 128x256x64w8s3")
    count = _gpu_count()
    if count == 0:
        raise RuntimeUnavailableError(
            "no CUDA GPU on this machine: `syncopate calibrate` measures the GPUs at hand; run it on the GPU "
            "machine with the same --db. Here the cost model uses its documented defaults "
            "(`syncopate tune CONFIG --runner model` says which calibration it used)"
        )
    world = gpus or count
    if world > count:
        raise RuntimeUnavailableError(f"--gpus {world}: only {count} CUDA GPU(s) are visible")
    from syncopate.autotuner.calibration import records_from_measurements
    from syncopate.autotuner.calibration_defaults import default_calibration
    from syncopate.kernels.calibrate import CalibrateOptions, run_calibration
    from syncopate.results_db import ResultsDB
    from syncopate.search_space import TILE_CONFIGS, Topology

    options = CalibrateOptions()
    if quick:
        options = CalibrateOptions(sizes=tuple(256 * 1024 * 16**i for i in range(3)), comm_sms=(16, 64),
                                   tile_configs=TILE_CONFIGS[:3], program_fractions=(1.0, 0.5), repetitions=10)
    if tile_configs is not None:
        options = dataclasses.replace(options, tile_configs=tile_configs)
    out = console()
    with ResultsDB.open(db) as database:
        result = run_calibration(options, world)
        records = records_from_measurements(result)
        for r in records:
            database.record_calibration(r)
        topology = Topology.from_dict(result["topology"])
        out.print(f"stored {len(records)} calibration(s) for {topology.key()} in {database.url}")
    try:
        defaults = default_calibration(topology)
    except Exception:
        defaults = None
    table = Table("calibration", "measured", "default (lead)")
    for r in records:
        if r.kind == "transfer":
            for sms, curve in r.payload["curves"].items():
                size, us = curve["sizes"][-1], curve["us"][-1]
                lead = ""
                if defaults is not None and defaults.has_transfer(*r.key.split("/")):
                    lead = f"{size / defaults.transfer(*r.key.split('/')).time_us(size, int(sms)) / 1e3:.0f} GB/s"
                table.add_row(f"{r.key} sms={sms} at {size >> 20} MiB", f"{size / us / 1e3:.0f} GB/s", lead)
        elif r.kind == "gemm":
            best = max(r.payload["tflops_by_sms"].items(), key=lambda kv: int(kv[0]))
            lead = ""
            if defaults is not None and r.key in defaults.gemm:
                lead = f"{defaults.gemm[r.key].tflops(int(best[0])):.0f} TFLOP/s"
            table.add_row(f"gemm {r.key} on {best[0]} SMs", f"{best[1]:.0f} TFLOP/s", lead)
    out.print(table)
