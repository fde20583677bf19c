"""Backend `nvshmem` renamed `sm_copy`: stored candidates, sweep configs and calibrations say the new
name.

Revision ID: 0003
Revises: 0002

The backend stores chunks with SM copies into IPC-mapped peer memory and uses no NVSHMEM, so its
name now says so. Rows that name it by the old name are rewritten:

- trials: `candidate.backend`, and `candidate_hash`, the key of the candidate (the first 16 hex
  digits of the SHA-256 of its canonical JSON: sorted keys, no spaces), which names the backend
  too, recomputed from the rewritten document as the code computes it;
- sweeps: the search space of the stored config (`space.backends`, the keys of `space.comm_sms`),
  so that `--resume` compares it with the config as it now reads;
- calibrations: the `transfer` keys `nvshmem/intra` and `nvshmem/inter`, and the backend keys of
  `op_costs`' `overlap_slowdown` and `chunk_us`.

The downgrade rewrites the same fields back. Optuna's tables are not ours and are left as they
are: a study made over a space with the old name no longer matches the renamed space's
fingerprint, and resuming it says so (StudyMismatchError) and how to start it over. The names are
written out here, not imported, so this script keeps its meaning whatever the code becomes.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

OLD = "nvshmem"
NEW = "sm_copy"

_JSON = sa.JSON().with_variant(JSONB(), "postgresql")
_TRIALS = sa.table(
    "syncopate_trials",
    sa.column("id", sa.Integer),
    sa.column("candidate_hash", sa.String),
    sa.column("candidate", _JSON),
)
_SWEEPS = sa.table("syncopate_sweeps", sa.column("id", sa.Integer), sa.column("config", _JSON))
_CALIBRATIONS = sa.table(
    "syncopate_calibrations",
    sa.column("id", sa.Integer),
    sa.column("kind", sa.String),
    sa.column("key", sa.String),
    sa.column("payload", _JSON),
)
_OP_COST_MAPS = ("overlap_slowdown", "chunk_us")


def candidate_key(doc: dict[str, Any]) -> str:
    """The key of a stored candidate document: SHA-256 over its canonical JSON, 16 hex digits."""
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def _renamed_keys(mapping: Any, old: str, new: str) -> Any:
    """`mapping` with its key `old` renamed `new` (in place of it); anything else as it is."""
    if not isinstance(mapping, dict) or old not in mapping:
        return mapping
    return {new if k == old else k: v for k, v in mapping.items()}


def _sweep_config(config: Any, old: str, new: str) -> Any:
    space = config.get("space") if isinstance(config, dict) else None
    if not isinstance(space, dict):
        return config
    space = dict(space)
    if isinstance(space.get("backends"), list):
        space["backends"] = [new if b == old else b for b in space["backends"]]
    if isinstance(space.get("comm_sms"), dict):
        space["comm_sms"] = _renamed_keys(space["comm_sms"], old, new)
    return {**config, "space": space}


def _calibration(kind: str, key: str, payload: Any, old: str, new: str) -> tuple[str, Any]:
    if kind == "transfer" and key.partition("/")[0] == old:
        key = new + key[len(old) :]
    if kind == "op_costs" and isinstance(payload, dict):
        payload = {
            **payload,
            **{m: _renamed_keys(payload[m], old, new) for m in _OP_COST_MAPS if m in payload},
        }
    return key, payload


def _rename(old: str, new: str) -> None:
    bind = op.get_bind()
    trials = [
        {"row_id": row_id, "doc": {**doc, "backend": new}}
        for row_id, doc in bind.execute(
            sa.select(_TRIALS.c.id, _TRIALS.c.candidate).where(
                _TRIALS.c.candidate["backend"].as_string() == old
            )
        )
    ]
    for t in trials:
        t["hash"] = candidate_key(t["doc"])
    if trials:
        bind.execute(
            _TRIALS.update()
            .where(_TRIALS.c.id == sa.bindparam("row_id"))
            .values(candidate=sa.bindparam("doc", type_=_JSON), candidate_hash=sa.bindparam("hash")),
            trials,
        )

    sweeps = []
    for row_id, config in bind.execute(sa.select(_SWEEPS.c.id, _SWEEPS.c.config)):
        changed = _sweep_config(config, old, new)
        if changed != config:
            sweeps.append({"row_id": row_id, "doc": changed})
    if sweeps:
        bind.execute(
            _SWEEPS.update()
            .where(_SWEEPS.c.id == sa.bindparam("row_id"))
            .values(config=sa.bindparam("doc", type_=_JSON)),
            sweeps,
        )

    calibrations = []
    rows = bind.execute(
        sa.select(
            _CALIBRATIONS.c.id, _CALIBRATIONS.c.kind, _CALIBRATIONS.c.key, _CALIBRATIONS.c.payload
        ).where(_CALIBRATIONS.c.kind.in_(("transfer", "op_costs")))
    )
    for row_id, kind, key, payload in rows:
        new_key, new_payload = _calibration(kind, key, payload, old, new)
        if (new_key, new_payload) != (key, payload):
            calibrations.append({"row_id": row_id, "name": new_key, "doc": new_payload})
    if calibrations:
        bind.execute(
            _CALIBRATIONS.update()
            .where(_CALIBRATIONS.c.id == sa.bindparam("row_id"))
            .values(key=sa.bindparam("name"), payload=sa.bindparam("doc", type_=_JSON)),
            calibrations,
        )


def upgrade() -> None:
    _rename(OLD, NEW)


def downgrade() -> None:
    _rename(NEW, OLD)
