"""Commands filled in by later work; each says it is not implemented yet and exits 1."""

from __future__ import annotations

import typer

from syncopate.cli import app, db_app, fail


@app.command("lookup", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def lookup_cmd(ctx: typer.Context) -> None:
    """Not implemented yet."""
    fail("'syncopate lookup' is not implemented yet", code=1)

@app.command("best", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def best_cmd(ctx: typer.Context) -> None:
    """Not implemented yet."""
    fail("'syncopate best' is not implemented yet", code=1)

@app.command("export", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def export_cmd(ctx: typer.Context) -> None:
    """Not implemented yet."""
    fail("'syncopate export' is not implemented yet", code=1)


@db_app.command("upgrade", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def db_upgrade_cmd(ctx: typer.Context) -> None:
    """Not implemented yet."""
    fail("'syncopate db upgrade' is not implemented yet", code=1)
