"""Initial schema: environments, topologies, workloads, sweeps, trials, baselines, calibrations,
and the view of the best trial per (workload, topology, environment).

Revision ID: 0001
Revises:

Types are spelled out as the storage types of :mod:`syncopate.results_db.types` (double precision,
JSON/JSONB, timestamp with time zone), so this script keeps its meaning whatever those classes
become.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_FLOAT = sa.Float(precision=53)
_JSON = sa.JSON().with_variant(JSONB(), "postgresql")
_TIME = sa.DateTime(timezone=True)
_STATUSES = "'ok', 'wrong_result', 'compile_error', 'oom', 'timeout', 'crash'"
_SOURCES = "'measured', 'predicted', 'fixture'"

BEST_VIEW_SQL = """
CREATE VIEW syncopate_best AS
SELECT r.trial_id, r.sweep_id, r.workload_id, r.topology_id, r.environment_id,
       w.key AS workload_key, w.kind, w.m, w.n, w.k, w.dtype,
       t.key AS topology_key, e.key AS environment_key,
       r.candidate_hash, r.candidate, r.median_us, r.p20_us, r.p80_us, r.created_at
FROM (
    SELECT tr.id AS trial_id, tr.sweep_id, tr.workload_id, tr.topology_id, tr.environment_id,
           tr.candidate_hash, tr.candidate, tr.median_us, tr.p20_us, tr.p80_us, tr.created_at,
           ROW_NUMBER() OVER (
               PARTITION BY tr.workload_id, tr.topology_id, tr.environment_id
               ORDER BY tr.median_us, tr.id
           ) AS pos
    FROM syncopate_trials tr
    WHERE tr.status = 'ok' AND tr.source = 'measured'
) r
JOIN syncopate_workloads w ON w.id = r.workload_id
JOIN syncopate_topologies t ON t.id = r.topology_id
JOIN syncopate_environments e ON e.id = r.environment_id
WHERE r.pos = 1
"""


def _id() -> sa.Column:
    return sa.Column("id", sa.Integer(), primary_key=True)


def _fk(
    column: str, table: str, owner: str, ondelete: str | None = None, nullable: bool = False
) -> sa.Column:
    return sa.Column(
        column,
        sa.Integer(),
        sa.ForeignKey(f"{table}.id", name=f"fk_{owner}_{column}", ondelete=ondelete),
        nullable=nullable,
    )


def upgrade() -> None:
    op.create_table(
        "syncopate_environments",
        _id(),
        sa.Column("key", sa.String(32), nullable=False),
        *(
            sa.Column(name, sa.String(64), nullable=False)
            for name in ("syncopate", "torch", "triton", "cuda", "nccl", "driver", "gpu_model")
        ),
        sa.Column("created_at", _TIME, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_syncopate_environments"),
        sa.UniqueConstraint("key", name="uq_syncopate_environments_key"),
    )
    op.create_table(
        "syncopate_topologies",
        _id(),
        sa.Column("key", sa.String(64), nullable=False),
        sa.Column("world_size", sa.Integer(), nullable=False),
        sa.Column("gpu_model", sa.String(64), nullable=False),
        sa.Column("interconnect", sa.String(16), nullable=False),
        sa.Column("nodes", sa.Integer(), nullable=False),
        sa.Column("sm_count", sa.Integer(), nullable=False),
        sa.Column("memory_gb", _FLOAT, nullable=False),
        sa.Column("link_gbps", _FLOAT, nullable=False),
        sa.Column("created_at", _TIME, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_syncopate_topologies"),
        sa.UniqueConstraint("key", name="uq_syncopate_topologies_key"),
    )
    op.create_table(
        "syncopate_workloads",
        _id(),
        sa.Column("key", sa.String(128), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("m", sa.Integer(), nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.Column("k", sa.Integer(), nullable=False),
        sa.Column("dtype", sa.String(16), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_syncopate_workloads"),
        sa.UniqueConstraint("key", name="uq_syncopate_workloads_key"),
    )
    op.create_index("ix_syncopate_workloads_kind_dtype", "syncopate_workloads", ["kind", "dtype"])
    op.create_table(
        "syncopate_sweeps",
        _id(),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("config", _JSON, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("started_at", _TIME, nullable=False),
        sa.Column("finished_at", _TIME, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_syncopate_sweeps"),
        sa.CheckConstraint(
            "status IN ('running', 'done', 'stopped', 'failed', 'interrupted')",
            name="ck_syncopate_sweeps_status",
        ),
    )
    op.create_index("ix_syncopate_sweeps_name", "syncopate_sweeps", ["name"])

    t = "syncopate_trials"
    op.create_table(
        t,
        _id(),
        _fk("sweep_id", "syncopate_sweeps", t, ondelete="CASCADE"),
        _fk("workload_id", "syncopate_workloads", t),
        _fk("topology_id", "syncopate_topologies", t),
        _fk("environment_id", "syncopate_environments", t),
        sa.Column("candidate_hash", sa.String(32), nullable=False),
        sa.Column("candidate", _JSON, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("median_us", _FLOAT, nullable=True),
        sa.Column("p20_us", _FLOAT, nullable=True),
        sa.Column("p80_us", _FLOAT, nullable=True),
        sa.Column("samples_us", _JSON, nullable=False),
        sa.Column("max_rel_error", _FLOAT, nullable=True),
        sa.Column("error", sa.Text(), nullable=False),
        sa.Column("worker", _JSON, nullable=False),
        sa.Column("strategy", sa.String(64), nullable=False),
        sa.Column("created_at", _TIME, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_syncopate_trials"),
        sa.UniqueConstraint(
            "workload_id",
            "topology_id",
            "environment_id",
            "sweep_id",
            "candidate_hash",
            name="uq_syncopate_trials_identity",
        ),
        sa.CheckConstraint(f"status IN ({_STATUSES})", name="ck_syncopate_trials_status"),
        sa.CheckConstraint(f"source IN ({_SOURCES})", name="ck_syncopate_trials_source"),
    )
    op.create_index(
        "ix_syncopate_trials_best",
        t,
        ["workload_id", "topology_id", "environment_id", "source", "status", "median_us"],
    )
    op.create_index(
        "ix_syncopate_trials_other_env", t, ["workload_id", "topology_id", "source", "status", "median_us"]
    )
    op.create_index("ix_syncopate_trials_sweep_id", t, ["sweep_id"])

    b = "syncopate_baselines"
    op.create_table(
        b,
        _id(),
        _fk("sweep_id", "syncopate_sweeps", b, ondelete="CASCADE"),
        _fk("workload_id", "syncopate_workloads", b),
        _fk("topology_id", "syncopate_topologies", b),
        _fk("environment_id", "syncopate_environments", b),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("median_us", _FLOAT, nullable=False),
        sa.Column("p20_us", _FLOAT, nullable=True),
        sa.Column("p80_us", _FLOAT, nullable=True),
        sa.Column("samples_us", _JSON, nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("created_at", _TIME, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_syncopate_baselines"),
        sa.UniqueConstraint(
            "workload_id",
            "topology_id",
            "environment_id",
            "sweep_id",
            "name",
            name="uq_syncopate_baselines_identity",
        ),
        sa.CheckConstraint(f"source IN ({_SOURCES})", name="ck_syncopate_baselines_source"),
    )
    op.create_index("ix_syncopate_baselines_sweep_id", b, ["sweep_id"])

    c = "syncopate_calibrations"
    op.create_table(
        c,
        _id(),
        sa.Column("kind", sa.String(64), nullable=False),
        _fk("topology_id", "syncopate_topologies", c),
        _fk("environment_id", "syncopate_environments", c),
        sa.Column("key", sa.String(200), nullable=False),
        sa.Column("payload", _JSON, nullable=False),
        sa.Column("source", sa.String(16), nullable=False),
        _fk("sweep_id", "syncopate_sweeps", c, ondelete="SET NULL", nullable=True),
        sa.Column("created_at", _TIME, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_syncopate_calibrations"),
        sa.UniqueConstraint(
            "kind", "topology_id", "environment_id", "key", name="uq_syncopate_calibrations_identity"
        ),
        sa.CheckConstraint(f"source IN ({_SOURCES})", name="ck_syncopate_calibrations_source"),
    )
    op.execute(BEST_VIEW_SQL)


def downgrade() -> None:
    op.execute("DROP VIEW syncopate_best")
    for table in (
        "syncopate_calibrations",
        "syncopate_baselines",
        "syncopate_trials",
        "syncopate_sweeps",
        "syncopate_workloads",
        "syncopate_topologies",
        "syncopate_environments",
    ):
        op.drop_table(table)
