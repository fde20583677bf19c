"""Calibrations stored before a backend was renamed, read under the backend's current name.

A database at a revision before 0003, which renamed backend `nvshmem` `sm_copy` in stored rows, is
read as it is (:data:`~syncopate.results_db.schema.READ_COMPATIBLE`): its rows name the backend that
ran by its earlier name (:data:`~syncopate.search_space.RENAMED_BACKENDS`). Every reader of such a
database maps them as they are read, as migration 0003 rewrites them: a candidate through
:meth:`~syncopate.search_space.Candidate.from_stored`, a calibration through
:func:`stored_calibration` (the backend of a `transfer` key, the backend keys of `op_costs`' maps),
each told `renamed=True`. Rows of a later revision are read as they are: their `nvshmem` is the
NVSHMEM backend. Nothing here imports SQLAlchemy: the light lookup path reads calibrations too.
"""

from __future__ import annotations

from typing import Any

from syncopate.search_space import RENAMED_BACKENDS, stored_backend

__all__ = ["OP_COST_MAPS", "stored_calibration", "stored_calibration_keys"]

OP_COST_MAPS: tuple[str, ...] = ("overlap_slowdown", "chunk_us")
"""The maps of an `op_costs` payload keyed by backend."""


def _by_backend(mapping: dict[str, Any]) -> dict[str, Any]:
    return {stored_backend(k, renamed=True): v for k, v in mapping.items()}


def stored_calibration(kind: str, key: str, payload: Any, *, renamed: bool) -> tuple[str, Any]:
    """(key, payload) of a stored calibration with backends named by their current names: with
    `renamed` (stored before the rename), a `transfer` key `BACKEND/SCOPE` and the backend keys of
    an `op_costs` payload's maps under the current names; otherwise, or for any other calibration,
    as it is."""
    if not renamed:
        return key, payload
    if kind == "transfer" and isinstance(key, str):
        backend, slash, scope = key.partition("/")
        if slash and stored_backend(backend, renamed=True) != backend:
            key = f"{stored_backend(backend, renamed=True)}/{scope}"
    elif kind == "op_costs" and isinstance(payload, dict):
        maps = {m: _by_backend(payload[m]) for m in OP_COST_MAPS if isinstance(payload.get(m), dict)}
        if maps:
            payload = {**payload, **maps}
    return key, payload


def stored_calibration_keys(key: str, *, renamed: bool) -> tuple[str, ...]:
    """The stored keys that read as `key` (:func:`stored_calibration`): itself and, for a transfer
    key of a renamed backend in rows stored before the rename (`renamed`), the same key under each
    of the backend's earlier names."""
    backend, slash, scope = key.partition("/")
    if not slash or not renamed:
        return (key,)
    return (key, *(f"{old}/{scope}" for old, (new, _) in RENAMED_BACKENDS.items() if new == backend))
