"""Eager and host times: `eager_us` and `host_us` on trials and baselines, and an index for the
lookup's eager rungs.

Revision ID: 0002
Revises: 0001

`eager_us` is the median time per call of back-to-back eager calls with the host on the path,
`host_us` the median host time to enqueue one call; both nullable, NULL for every row measured
before (the lookup then ranks those by device time and says so). Plain `ADD COLUMN`s: existing
rows, the view `syncopate_best` and Optuna's tables are left as they are.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

_FLOAT = sa.Float(precision=53)
_TABLES = ("syncopate_trials", "syncopate_baselines")


def upgrade() -> None:
    for table in _TABLES:
        op.add_column(table, sa.Column("eager_us", _FLOAT, nullable=True))
        op.add_column(table, sa.Column("host_us", _FLOAT, nullable=True))
    op.create_index(
        "ix_syncopate_trials_best_eager",
        "syncopate_trials",
        ["workload_id", "topology_id", "environment_id", "source", "status", "eager_us"],
    )


def downgrade() -> None:
    op.drop_index("ix_syncopate_trials_best_eager", table_name="syncopate_trials")
    for table in _TABLES:  # SQLite drops a column in place from 3.35 on
        op.drop_column(table, "host_us")
        op.drop_column(table, "eager_us")
