"""The export file: what is served in each mode, as JSON, for jobs that cannot reach the database.

```json
{"format": "syncopate-best", "version": 4, "exported_at": "<UTC time, ISO 8601>",
 "database": "sqlite:////home/me/.local/share/syncopate/results.db",
 "entries": [{"workload": {"kind": "ag_gemm", "m": 8192, "n": 4096, "k": 8192, "dtype": "bf16"},
              "topology": {"key": "H200x2-nvlink", "world_size": 2, …},
              "environment": {"syncopate": "0.1.0", "torch": "2.11.0", …},
              "candidate": {"backend": "copy_engine", …},
              "trial_id": 17, "sweep_id": 2, "median_us": 1523.4, "p20_us": 1519.0, "p80_us": 1530.2,
              "eager_us": 1544.0, "host_us": 231.5, "created_at": "<UTC time, ISO 8601>",
              "served_in": ["eager", "graph"], "guards": {}}]}
```

One entry per trial served in some mode (:meth:`ResultsDB.picks`): `served_in` lists the modes it
is served in (both picks of a workload, topology and environment are in the file), `guards` maps
a mode to the guard (`default`, `unfused`) it stands for there, where a guard was faster than every
tuned candidate. A version 1 file (device time only, one entry a workload) reads as served in
both modes. Files before version 3 were written before the backend rename: their `nvshmem` is
`sm_copy`; from version 3 on, `nvshmem` is the NVSHMEM backend. From version 4 on, an entry may
be of a MoE kind (`a2a_gemm`, `gemm_a2a`): its workload is the MoE workload's parameters (kind,
tokens, hidden, ffn, experts, top_k, routing, dtype), its candidate a MoE candidate's fields.

:func:`write_export` writes through a temporary file in the target folder renamed over the target,
so a failure leaves nothing behind and a reader never sees half a file. :func:`read_export`
checks every field and raises LookupFailedError naming the file and the entry. Non-finite floats are
tagged as in :mod:`~syncopate.results_db.codec`. A file written before a backend was renamed (a
version before :data:`NAMES_VERSION`) names it by its earlier name: its candidates read under the
new one (:meth:`~syncopate.search_space.Candidate.from_stored`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from syncopate.errors import ConfigError, LookupFailedError
from syncopate.files import write_atomically
from syncopate.records import GUARDS, MODES, Environment, TrialRecord, rank_key, utcnow
from syncopate.results_db import codec
from syncopate.results_db.kinds import stored_candidate, workload_from_dict
from syncopate.search_space import Candidate, MoeWorkload, Topology, Workload
from syncopate.search_space.moe_workload import MoeCandidate

if TYPE_CHECKING:
    from syncopate.results_db.repository import ResultsDB
    from syncopate.results_db.values import ServedPick

__all__ = ["FORMAT", "VERSION", "ExportEntry", "import_export", "read_export", "write_export"]

FORMAT = "syncopate-best"
VERSION = 4
READABLE_VERSIONS = (1, 2, 3, 4)
"""Export versions this code reads."""
NAMES_VERSION = 3
"""The first export version written after the backend rename (its `nvshmem` is the NVSHMEM backend)."""

MOE_VERSION = 4
"""The first export version that may hold MoE entries (a workload of kind `a2a_gemm` or `gemm_a2a`
with its parameters, and a MoE candidate); a reader of version 3 refuses such a file whole instead
of failing on its entries."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ExportEntry:
    """One best configuration read from an export file."""

    workload: Workload | MoeWorkload
    topology: Topology
    environment: Environment
    candidate: Candidate | MoeCandidate
    trial_id: int
    sweep_id: int | None
    median_us: float
    p20_us: float | None
    p80_us: float | None
    created_at: datetime | None
    eager_us: float | None = None
    host_us: float | None = None
    served_in: tuple[str, ...] = MODES
    """The modes this configuration is served in."""
    guards: dict[str, str] = field(default_factory=dict)
    """Mode → the guard (`default`, `unfused`) this entry stands for in it, where one was served."""

    def rank_key(self, mode: str) -> tuple[int, float]:
        return rank_key(mode, self.median_us, self.eager_us)


def _entry_dict(picked: list[ServedPick]) -> dict[str, Any]:
    t = picked[0].trial
    r = t.record
    return {
        "workload": r.workload.to_dict(),
        "topology": r.topology.to_dict(),
        "environment": r.environment.to_dict(),
        "candidate": r.candidate.to_dict(),
        "trial_id": t.trial_id,
        "sweep_id": t.sweep_id,
        "median_us": r.median_us,
        "p20_us": r.p20_us,
        "p80_us": r.p80_us,
        "eager_us": r.eager_us,
        "host_us": r.host_us,
        "created_at": r.created_at.isoformat(),
        "served_in": [p.mode for p in picked],
        "guards": {p.mode: p.guard for p in picked if p.guard},
    }


def write_export(path: Path, picks: list[ServedPick], *, database: str) -> int:
    """Write `picks` to `path` atomically, one entry per trial (with the modes it is served in);
    the number of entries."""
    by_trial: dict[int, list[ServedPick]] = {}
    for p in picks:
        by_trial.setdefault(p.trial.trial_id, []).append(p)
    doc = {
        "format": FORMAT,
        "version": VERSION,
        "exported_at": utcnow().isoformat(),
        "database": database,
        "entries": [
            _entry_dict(sorted(found, key=lambda p: MODES.index(p.mode))) for found in by_trial.values()
        ],
    }
    text = codec.dumps(doc, "export", indent=1) + "\n"
    write_atomically(path, text.encode("utf-8"))
    return len(by_trial)


def _field(d: dict[str, Any], name: str, types: type | tuple[type, ...], optional: bool = False) -> Any:
    value = d.get(name)
    if value is None:
        if optional:
            return None
        raise ConfigError(f"lacks {name!r}")
    if isinstance(value, bool) or not isinstance(value, types):
        raise ConfigError(f"field {name!r}={value!r} has the wrong type")
    return value


def _modes(d: dict[str, Any], version: int) -> tuple[tuple[str, ...], dict[str, str]]:
    if version == 1:
        return MODES, {}
    served = _field(d, "served_in", list)
    if not served or any(m not in MODES for m in served):
        raise ConfigError(f"field 'served_in'={served!r} must list modes among {', '.join(MODES)}")
    guards = _field(d, "guards", dict, optional=True) or {}
    for mode, name in guards.items():
        if mode not in served or name not in GUARDS:
            raise ConfigError(
                f"field 'guards'={guards!r} must map modes of 'served_in' to one of {', '.join(GUARDS)}"
            )
    return tuple(m for m in MODES if m in served), dict(guards)


def _entry(d: Any, version: int) -> ExportEntry:
    if not isinstance(d, dict):
        raise ConfigError("is not an object")
    created = _field(d, "created_at", str, optional=True)
    served_in, guards = _modes(d, version)
    workload = workload_from_dict(_field(d, "workload", dict))
    if isinstance(workload, MoeWorkload) and version < MOE_VERSION:
        raise ConfigError(f"holds a {workload.kind} workload, which only version {MOE_VERSION} files hold")
    return ExportEntry(
        workload=workload,
        topology=Topology.from_dict(_field(d, "topology", dict)),
        environment=Environment.from_dict(_field(d, "environment", dict)),
        candidate=stored_candidate(
            workload.kind, _field(d, "candidate", dict), renamed=version < NAMES_VERSION
        ),
        trial_id=_field(d, "trial_id", int),
        sweep_id=_field(d, "sweep_id", int, optional=True),
        median_us=float(_field(d, "median_us", (int, float))),
        p20_us=_field(d, "p20_us", (int, float), optional=True),
        p80_us=_field(d, "p80_us", (int, float), optional=True),
        created_at=datetime.fromisoformat(created) if created else None,
        eager_us=_time(d, "eager_us"),
        host_us=_time(d, "host_us"),
        served_in=served_in,
        guards=guards,
    )


def _time(d: dict[str, Any], name: str) -> float | None:
    value = _field(d, name, (int, float), optional=True)
    if value is not None and not value >= 0:
        raise ConfigError(f"field {name!r}={value!r} must be a non-negative number of microseconds")
    return None if value is None else float(value)


def read_export(path: Path) -> list[ExportEntry]:
    """The entries of the export file `path`; LookupFailedError naming what is wrong with it."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise LookupFailedError(f"export file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        raise LookupFailedError(f"cannot read export file {path}: {e}") from None
    try:
        doc = codec.loads(text)
    except json.JSONDecodeError as e:
        raise LookupFailedError(
            f"export file {path} is not valid JSON ({e}): write it again with `syncopate export`"
        ) from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise LookupFailedError(f'{path} is not a Syncopate export file (no "format": "{FORMAT}")')
    version = doc.get("version")
    if isinstance(version, bool) or version not in READABLE_VERSIONS:
        raise LookupFailedError(
            f"export file {path} has version {version!r}; this Syncopate reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS))}"
        )
    entries = doc.get("entries")
    if not isinstance(entries, list):
        raise LookupFailedError(f'export file {path} has no list of "entries"')
    out = []
    for i, d in enumerate(entries):
        try:
            out.append(_entry(d, version))
        except KeyError as e:
            raise LookupFailedError(f"export file {path} is corrupt: entry {i} lacks {e.args[0]!r}") from None
        except (ConfigError, TypeError, ValueError) as e:
            raise LookupFailedError(f"export file {path} is corrupt: entry {i}: {e}") from None
    return out


def import_export(db: ResultsDB, path: Path) -> int:
    """Store the entries of export file `path` in `db` as `ok` measured trials of a sweep
    `import:<first 12 hex digits of the file's SHA-256>`; a second import of the same file adds
    nothing. The number of entries."""
    entries = read_export(path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    name = f"import:{digest}"
    existing = db.latest_sweep(name)
    sweep_id = (
        existing.sweep_id
        if existing
        else db.start_sweep(name, {"imported_from": str(path), "sha256": digest})
    )
    db.record_trials(
        sweep_id,
        [
            TrialRecord(
                workload=e.workload,
                topology=e.topology,
                environment=e.environment,
                candidate=e.candidate,
                status="ok",
                source="measured",
                median_us=e.median_us,
                p20_us=e.p20_us,
                p80_us=e.p80_us,
                eager_us=e.eager_us,
                host_us=e.host_us,
                worker={"imported_from": str(path), "trial_id": e.trial_id, "sweep_id": e.sweep_id},
                strategy="import",
                created_at=e.created_at or utcnow(),
            )
            for e in entries
        ],
    )
    if existing is None:
        db.finish_sweep(sweep_id)
    return len(entries)
