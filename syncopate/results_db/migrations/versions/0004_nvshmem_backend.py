"""Backend `nvshmem` again, now the NVSHMEM backend: rows from this revision on may name it.

Revision ID: 0004
Revises: 0003

Until 0003 the SM-copy backend was named `nvshmem` (0003 renamed it `sm_copy`). The name now
belongs to a backend that moves chunks with NVSHMEM puts and gets, and rows written from here on
may name it. Nothing in the tables changes; the revision marks that the name has a new meaning, so
that a Syncopate that still reads a stored `nvshmem` as `sm_copy` finds a revision newer than it
knows and leaves the database alone instead of serving NVSHMEM results as SM-copy ones.

The downgrade refuses while any row names `nvshmem` (a trial's candidate, a sweep config's space,
a calibration's `transfer` key or `op_costs` maps): below this revision such a row would read as
`sm_copy`, and 0003's downgrade would merge it with the rows it renames. Delete those rows first
(or keep the revision). The names are written out here, not imported, so this script keeps its
meaning whatever the code becomes.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

NAME = "nvshmem"

_JSON = sa.JSON().with_variant(JSONB(), "postgresql")
_TRIALS = sa.table("syncopate_trials", sa.column("id", sa.Integer), sa.column("candidate", _JSON))
_SWEEPS = sa.table("syncopate_sweeps", sa.column("id", sa.Integer), sa.column("config", _JSON))
_CALIBRATIONS = sa.table(
    "syncopate_calibrations",
    sa.column("id", sa.Integer),
    sa.column("kind", sa.String),
    sa.column("key", sa.String),
    sa.column("payload", _JSON),
)
_OP_COST_MAPS = ("overlap_slowdown", "chunk_us")


def _names_it(space: Any) -> bool:
    if not isinstance(space, dict):
        return False
    backends = space.get("backends")
    comm_sms = space.get("comm_sms")
    return (isinstance(backends, list) and NAME in backends) or (
        isinstance(comm_sms, dict) and NAME in comm_sms
    )


def rows_naming_it(bind) -> dict[str, list[int]]:
    """Ids of the rows that name backend `nvshmem`, by table (tables with none left out)."""
    found: dict[str, list[int]] = {}
    trials = bind.execute(
        sa.select(_TRIALS.c.id)
        .where(_TRIALS.c.candidate["backend"].as_string() == NAME)
        .order_by(_TRIALS.c.id)
    )
    found["syncopate_trials"] = [row_id for (row_id,) in trials]
    found["syncopate_sweeps"] = [
        row_id
        for row_id, config in bind.execute(sa.select(_SWEEPS.c.id, _SWEEPS.c.config).order_by(_SWEEPS.c.id))
        if isinstance(config, dict) and _names_it(config.get("space"))
    ]
    calibrations = []
    rows = bind.execute(
        sa.select(_CALIBRATIONS.c.id, _CALIBRATIONS.c.kind, _CALIBRATIONS.c.key, _CALIBRATIONS.c.payload)
        .where(_CALIBRATIONS.c.kind.in_(("transfer", "op_costs")))
        .order_by(_CALIBRATIONS.c.id)
    )
    for row_id, kind, key, payload in rows:
        if kind == "transfer" and key.partition("/")[0] == NAME:
            calibrations.append(row_id)
        elif kind == "op_costs" and isinstance(payload, dict):
            if any(isinstance(payload.get(m), dict) and NAME in payload[m] for m in _OP_COST_MAPS):
                calibrations.append(row_id)
    found["syncopate_calibrations"] = calibrations
    return {table: ids for table, ids in found.items() if ids}


def upgrade() -> None:
    pass  # no table changes: the revision says what `nvshmem` means from here on


def downgrade() -> None:
    found = rows_naming_it(op.get_bind())
    if found:
        listed = "; ".join(f"{table} ids {', '.join(map(str, ids))}" for table, ids in found.items())
        raise RuntimeError(
            f"cannot downgrade below revision 0004: rows name backend {NAME!r}, the NVSHMEM backend, which "
            f"revision 0003 and older read as 'sm_copy' ({listed}); delete those rows first, or keep "
            f"revision 0004"
        )
