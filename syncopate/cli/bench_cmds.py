"""Commands filled in by later work; each says it is not implemented yet and exits 1."""

from __future__ import annotations

import typer

from syncopate.cli import app, fail


@app.command("bench", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def bench_cmd(ctx: typer.Context) -> None:
    """Not implemented yet."""
    fail("'syncopate bench' is not implemented yet", code=1)
