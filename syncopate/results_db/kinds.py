"""Rows of either family of kinds: the dense kinds (a GEMM shape) and the MoE kinds.

A workload row holds kind, m, n, k and dtype for every kind; a MoE workload's (kind `a2a_gemm` or
`gemm_a2a`) also holds its parameters, routing included, in the JSON column `params` (revision
0005 on), and its m, n, k are the GEMM-equivalent dims
(:meth:`~syncopate.search_space.MoeWorkload.gemm_dims`), so that readers of dense shapes show a
size. Which family a row is of is read off its kind, never off `params`: a database older than
0005 has no MoE rows and no `params` column, and nothing here reads that column for a dense row.
"""

from __future__ import annotations

from typing import Any

from syncopate.errors import ConfigError, describe
from syncopate.search_space import MOE_KINDS, Candidate, MoeWorkload, Shape, Workload
from syncopate.search_space.moe_workload import MoeCandidate

__all__ = ["is_moe", "stored_candidate", "stored_workload", "workload_from_dict", "workload_values"]


def is_moe(kind: str) -> bool:
    return kind in MOE_KINDS


def workload_values(workload: Workload | MoeWorkload) -> dict[str, Any]:
    """The columns of a workload row (but its key): `params` only for a MoE workload."""
    if isinstance(workload, MoeWorkload):
        m, n, k = workload.gemm_dims()
        return {
            "kind": workload.kind,
            "m": m,
            "n": n,
            "k": k,
            "dtype": workload.dtype,
            "params": workload.to_dict(),
        }
    s = workload.shape
    return {"kind": workload.kind, "m": s.m, "n": s.n, "k": s.k, "dtype": workload.dtype}


def stored_workload(
    kind: str, m: int, n: int, k: int, dtype: str, params: Any = None
) -> Workload | MoeWorkload:
    """The workload a row stands for; ConfigError where a MoE row lacks its parameters."""
    if is_moe(kind):
        if not isinstance(params, dict):
            raise ConfigError(
                f"stored {kind} workload has no parameters (params={describe(params)}): the row is damaged"
            )
        return MoeWorkload.from_dict(params)
    return Workload(kind=kind, shape=Shape(m=m, n=n, k=k), dtype=dtype)


def workload_from_dict(d: dict[str, Any]) -> Workload | MoeWorkload:
    """A workload written by `to_dict` of either family (an export entry's)."""
    if isinstance(d, dict) and d.get("kind") in MOE_KINDS:
        return MoeWorkload.from_dict(d)
    return Workload.from_dict(d)


def stored_candidate(kind: str, doc: Any, *, renamed: bool = False) -> Candidate | MoeCandidate:
    """The candidate a trial row of `kind` holds (`renamed`: a dense row stored before the backend
    rename, see :meth:`~syncopate.search_space.Candidate.from_stored`)."""
    if is_moe(kind):
        return MoeCandidate.from_dict(doc)
    return Candidate.from_stored(doc, renamed=renamed)
