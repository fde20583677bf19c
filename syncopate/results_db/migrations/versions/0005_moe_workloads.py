"""MoE workloads: `params` on workloads, the parameters of a workload of kind `a2a_gemm` or
`gemm_a2a`.

Revision ID: 0005
Revises: 0004

A MoE workload (tokens a rank, hidden, ffn, experts, top_k, routing, dtype) is no GEMM shape: its
row keeps kind and dtype, its GEMM-equivalent dims in m, n, k (so that readers of shapes show a
size), and every parameter in `params` (JSON, NULL for the dense kinds). Its trials and baselines
are rows like any other, their candidate the MoE candidate's JSON and key. A plain `ADD COLUMN`:
existing rows, the view `syncopate_best` and Optuna's tables are left as they are.

The downgrade refuses while any workload is of a MoE kind: below this revision such a row has no
parameters, and a Syncopate of that revision cannot read it. Delete those workloads' trials,
baselines and rows first (or keep the revision). The kinds are written out here, not imported, so
this script keeps its meaning whatever the code becomes.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

KINDS = ("a2a_gemm", "gemm_a2a")

_JSON = sa.JSON().with_variant(JSONB(), "postgresql")
_WORKLOADS = sa.table("syncopate_workloads", sa.column("id", sa.Integer), sa.column("kind", sa.String))


def upgrade() -> None:
    op.add_column("syncopate_workloads", sa.Column("params", _JSON, nullable=True))


def downgrade() -> None:
    rows = op.get_bind().execute(
        sa.select(_WORKLOADS.c.id).where(_WORKLOADS.c.kind.in_(KINDS)).order_by(_WORKLOADS.c.id)
    )
    ids = [row_id for (row_id,) in rows]
    if ids:
        raise RuntimeError(
            f"cannot downgrade below revision 0005: syncopate_workloads ids {', '.join(map(str, ids))} are of "
            f"a MoE kind ({', '.join(KINDS)}), which revision 0004 and older cannot hold; delete those "
            f"workloads with their trials and baselines first, or keep revision 0005"
        )
    op.drop_column("syncopate_workloads", "params")
