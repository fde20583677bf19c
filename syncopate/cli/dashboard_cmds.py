"""`syncopate dashboard` (the web dashboard) and `syncopate report` (the same views as one HTML file)."""

from __future__ import annotations

from pathlib import Path

import typer

from syncopate.cli import app
from syncopate.errors import ConfigError

_DB_HELP = "Database URL or SQLite path (default: $SYNCOPATE_DB, else the per-user database)."


def _split(value: str | None) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip()) if value else ()


@app.command("dashboard")
def dashboard_cmd(
    db: str = typer.Option(None, help=_DB_HELP),
    port: int = typer.Option(8501, help="TCP port to serve on."),
    host: str = typer.Option("127.0.0.1", help="Address to listen on (0.0.0.0: every interface)."),
) -> None:
    """Serve the web dashboard over the results database: what won where, by how much, and why
    (needs the `dashboard` extra). Reads only; an empty database shows how to fill it."""
    from syncopate.dashboard.serve import serve

    serve(db, host=host, port=port)


@app.command("report")
def report_cmd(
    out: Path = typer.Option(..., "--out", help="The HTML file to write (replaced atomically)."),
    db: str = typer.Option(None, help=_DB_HELP),
    topology: str = typer.Option(None, help="Only these topology keys, comma-separated."),
    environment: str = typer.Option(
        None, help="Only these environment keys (or their first 8 digits), comma-separated."
    ),
    dtype: str = typer.Option(None, help="Only these dtypes, comma-separated."),
    kind: str = typer.Option(None, help="Only these op kinds, comma-separated."),
    source: str = typer.Option(
        None, help="Only these sources (measured, predicted, fixture), comma-separated."
    ),
    drill_down: int = typer.Option(
        30, "--drill-down", min=0, help="Shapes given a drill-down section (0: none)."
    ),
    compare: str = typer.Option(None, help="Two sweep ids A,B to compare (default: the two most recent)."),
    title: str = typer.Option("Syncopate results", help="The report's title."),
) -> None:
    """Write the dashboard's views (overview, drill-downs, sweeps, environments) as one
    self-contained HTML file: tables in HTML, charts as inline SVG."""
    from syncopate.dashboard.data import Filters, filter_options
    from syncopate.dashboard.report import ReportOptions, write_report
    from syncopate.files import check_writable
    from syncopate.results_db.repository import ResultsDB

    check_writable(out, "report.html")
    pair = None
    if compare:
        parts = _split(compare)
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            raise ConfigError(f"--compare {compare!r} must be two sweep ids, such as 3,5")
        pair = (int(parts[0]), int(parts[1]))
        if pair[0] == pair[1]:
            raise ConfigError(
                f"--compare {compare!r} names sweep {pair[0]} twice: give two different sweep ids, "
                f"such as 3,5"
            )
    with ResultsDB.open(db, read_only=True) as rdb:
        envs = _split(environment)
        if envs:
            known = list(filter_options(rdb).environments)
            full = []
            for e in envs:
                matches = [k for k in known if k.startswith(e)]
                if len(matches) != 1:
                    raise ConfigError(
                        f"environment {e!r} matches {len(matches)} of the stored environments "
                        f"({', '.join(k[:8] for k in known) or 'none'}): give one that matches one"
                    )
                full.append(matches[0])
            envs = tuple(full)
        filters = Filters(
            topologies=_split(topology),
            environments=envs,
            dtypes=_split(dtype),
            kinds=_split(kind),
            sources=_split(source),
        )
        size = write_report(
            rdb, out, ReportOptions(filters=filters, drill_down=drill_down, compare=pair, title=title)
        )
        shown = rdb.url
    print(f"wrote {out} ({size / 1024:.0f} KiB) from {shown}")
