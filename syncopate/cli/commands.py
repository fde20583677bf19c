"""Imports every command module so that each registers its commands on the app."""

from syncopate.cli import (  # noqa: F401
    bench_cmds,
    calibrate_cmds,
    dashboard_cmds,
    db_cmds,
    import_cmds,
    space_cmds,
    tune_cmds,
    tune_model_cmds,  # after tune_cmds: extends its `tune` with --model
)
