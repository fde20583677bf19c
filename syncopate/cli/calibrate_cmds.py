"""`syncopate calibrate`: measure the cost model's curves on the GPUs at hand and store them."""

from __future__ import annotations

import dataclasses
from typing import Any

import typer

from syncopate.cli import app, console
from syncopate.cli.tables import Column, Listing, show
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
    quick: bool = typer.Option(
        False, "--quick", help="Fewer sizes, SM counts and repetitions (a first look)."
    ),
    tiles: str | None = typer.Option(
        None,
        "--tiles",
        help="Comma-separated tile configs to measure, such as 128x256x64w8s3,128x128x64w8s4 "
        "(default: every tile config of the space; the cost model uses its defaults for the others).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the table's rows as JSON."),
    nvshmem: bool = typer.Option(
        False,
        "--nvshmem",
        help="Also measure the NVSHMEM copier (backend nvshmem): every rank's symmetric memory is then "
        "NVSHMEM's (the other measurements run on it too).",
    ),
) -> None:
    """Measure transfer time against chunk size per backend (and against comm_sms for the SM-driven
    copiers) and GEMM throughput per tile configuration and SM count, on the GPUs of this machine;
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
    from syncopate.cost_model.calibration import records_from_measurements
    from syncopate.cost_model.calibration_defaults import default_calibration
    from syncopate.measure.calibrate import CalibrateOptions, run_calibration
    from syncopate.results_db import ResultsDB
    from syncopate.search_space import TILE_CONFIGS, Topology

    options = CalibrateOptions()
    if quick:
        options = CalibrateOptions(
            sizes=tuple(256 * 1024 * 16**i for i in range(3)),
            comm_sms=(16, 64),
            tile_configs=TILE_CONFIGS[:3],
            program_fractions=(1.0, 0.5),
            repetitions=10,
        )
    if tile_configs is not None:
        options = dataclasses.replace(options, tile_configs=tile_configs)
    if nvshmem:
        options = dataclasses.replace(options, backends=(*options.backends, "nvshmem"))
    out = console()
    with ResultsDB.open(db) as database:
        result = run_calibration(options, world)
        records = records_from_measurements(result)
        for r in records:
            database.record_calibration(r)
        topology = Topology.from_dict(result["topology"])
        stored = f"stored {len(records)} calibration(s) for {topology.key()} in {database.url}"
    try:
        defaults = default_calibration(topology)
    except Exception:
        defaults = None
    show(calibration_listing(records, defaults, stored), out, as_json=as_json)


def calibration_listing(records: list, defaults: Any, title: str) -> Listing:
    """Each stored curve's headline figure (bandwidth at the largest size, GEMM throughput on the
    most SMs) beside the documented default it replaces, where there is one."""
    rows, records_out = [], []
    for r in records:
        if r.kind == "transfer":
            for sms, curve in r.payload["curves"].items():
                size, us = curve["sizes"][-1], curve["us"][-1]
                lead = None
                if defaults is not None and defaults.has_transfer(*r.key.split("/")):
                    lead = size / defaults.transfer(*r.key.split("/")).time_us(size, int(sms)) / 1e3
                measured = size / us / 1e3
                rows.append(
                    (
                        f"{r.key} sms={sms} at {size >> 20} MiB",
                        f"{measured:.0f} GB/s",
                        f"{lead:.0f} GB/s" if lead is not None else "–",
                    )
                )
                records_out.append(
                    {
                        "kind": r.kind,
                        "key": r.key,
                        "comm_sms": int(sms),
                        "bytes": size,
                        "gbps": measured,
                        "default_gbps": lead,
                    }
                )
        elif r.kind == "gemm":
            sms, tflops = max(r.payload["tflops_by_sms"].items(), key=lambda kv: int(kv[0]))
            lead = (
                defaults.gemm[r.key].tflops(int(sms))
                if defaults is not None and r.key in defaults.gemm
                else None
            )
            rows.append(
                (
                    f"gemm {r.key} on {sms} SMs",
                    f"{tflops:.0f} TFLOP/s",
                    f"{lead:.0f} TFLOP/s" if lead is not None else "–",
                )
            )
            records_out.append(
                {"kind": r.kind, "key": r.key, "sms": int(sms), "tflops": tflops, "default_tflops": lead}
            )
    return Listing(
        title=title,
        columns=(
            Column(name="calibration", key=True),
            Column(name="measured", numeric=True),
            Column(name="default (lead)", numeric=True),
        ),
        rows=rows,
        records=records_out,
    )
