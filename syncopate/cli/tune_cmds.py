"""Commands filled in by later work; each says it is not implemented yet and exits 1."""

from __future__ import annotations

import typer

from syncopate.cli import app, fail


@app.command("tune", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def tune_cmd(ctx: typer.Context) -> None:
    """Not implemented yet."""
    fail("'syncopate tune' is not implemented yet", code=1)

@app.command("calibrate", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def calibrate_cmd(ctx: typer.Context) -> None:
    """Not implemented yet."""
    fail("'syncopate calibrate' is not implemented yet", code=1)
