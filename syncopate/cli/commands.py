"""Imports every command module so that each registers its commands on the app."""

from syncopate.cli import bench_cmds, dashboard_cmds, db_cmds, import_cmds, space_cmds, tune_cmds  # noqa: F401
