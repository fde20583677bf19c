"""The `replay` runner: answers trials from a stored sweep, so strategies run on the CPU.

A stored sweep is every trial (and baseline) of one sweep for some workloads on one topology: a
results database (`sqlite:///…`, `postgresql+psycopg://…`, with the sweep's name or id) or a JSON
file in the format :func:`write_sweep` writes:

```json
{"format": "syncopate-sweep", "version": 1, "label": "…", "synthetic": false,
 "topology": {…}, "environment": {…},
 "workloads": [{"workload": {…}, "baselines": {"torch_seq": 464.5, …},
                "baselines_eager": {"torch_seq": 480.0, …},
                "trials": [{"candidate": {…}, "status": "ok", "median_us": 290.3, "p20_us": …,
                            "p80_us": …, "samples_us": [...], "eager_us": 301.2, "host_us": 210.4,
                            "error": ""}]}]}
```

(`eager_us`, `host_us` and `baselines_eager` are left out, or null, where not measured.)

A replayed trial returns the stored samples and eager and host times (each multiplied by a fresh
log-normal factor of sigma `noise` when the replay is asked to add noise, so that re-measuring
means something). A
candidate the sweep does not hold comes back as `crash` saying so. Replayed rows are copies, not
measurements: they are stored with source `fixture`, which `best` and `lookup` never serve.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import random
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from syncopate.errors import ConfigError
from syncopate.records import Environment, TrialRecord
from syncopate.results_db.schema import SQLITE_HEADER
from syncopate.search_space import Candidate, Topology, Workload
from syncopate.workers.outcomes import BaselineOutcome, CandidateOutcome, DeviceInfo
from syncopate.workers.runner import Runner, RunnerSpec

__all__ = ["FORMAT", "ReplayOptions", "ReplayRunner", "StoredSweep", "load_sweep_file", "write_sweep"]

FORMAT = "syncopate-sweep"
VERSION = 1


@dataclass(frozen=True, kw_only=True, slots=True)
class ReplayOptions:
    """Where the stored sweep is and how to replay it (the sweep config's `replay:` section)."""

    source: str
    """A JSON file (`.json` or `.json.gz`) or a database URL."""
    sweep: str | None = None
    """In a database: the sweep's name (its latest run) or id; None: every trial of the topology."""
    noise: float = 0.0
    """Sigma of a log-normal factor applied afresh to each replayed sample (0: the stored samples)."""
    seed: int = 0


@dataclass(kw_only=True, slots=True)
class StoredSweep:
    """The trials and baselines of a stored sweep, by workload key and candidate key."""

    label: str
    topology: Topology
    environment: Environment | None
    synthetic: bool
    trials: dict[str, dict[str, TrialRecord]] = field(default_factory=dict)
    baselines: dict[str, dict[str, float]] = field(default_factory=dict)
    """Workload key → baseline name → median device time, µs."""
    baselines_eager: dict[str, dict[str, float]] = field(default_factory=dict)
    """Workload key → baseline name → eager time per call, µs (where measured)."""

    def trial(self, workload: Workload, candidate: Candidate) -> TrialRecord | None:
        return self.trials.get(workload.key(), {}).get(candidate.key())

    def workloads(self) -> list[Workload]:
        return [Workload.from_key(k) for k in self.trials]


def write_sweep(path: str | os.PathLike[str], sweep: StoredSweep) -> None:
    """Write `sweep` as a JSON file (gzip-compressed when the name ends in `.gz`)."""
    doc = {
        "format": FORMAT,
        "version": VERSION,
        "label": sweep.label,
        "synthetic": sweep.synthetic,
        "topology": sweep.topology.to_dict(),
        "environment": sweep.environment.to_dict() if sweep.environment is not None else None,
        "workloads": [
            {
                "workload": Workload.from_key(wk).to_dict(),
                "baselines": sweep.baselines.get(wk, {}),
                **({"baselines_eager": sweep.baselines_eager[wk]} if sweep.baselines_eager.get(wk) else {}),
                "trials": [
                    {
                        "candidate": t.candidate.to_dict(),
                        "status": t.status,
                        "median_us": t.median_us,
                        "p20_us": t.p20_us,
                        "p80_us": t.p80_us,
                        "samples_us": list(t.samples_us),
                        **({"eager_us": t.eager_us} if t.eager_us is not None else {}),
                        **({"host_us": t.host_us} if t.host_us is not None else {}),
                        "error": t.error,
                    }
                    for t in trials.values()
                ],
            }
            for wk, trials in sweep.trials.items()
        ],
    }
    text = json.dumps(doc, separators=(",", ":"))
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    if p.name.endswith(".gz"):
        with gzip.open(p, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        p.write_text(text)


def load_sweep_file(path: str | os.PathLike[str]) -> StoredSweep:
    """Read a sweep file that :func:`write_sweep` wrote; ConfigError naming the file otherwise."""
    p = Path(path)
    try:
        if p.name.endswith(".gz"):
            with gzip.open(p, "rt", encoding="utf-8") as f:
                doc = json.load(f)
        else:
            doc = json.loads(p.read_text())
    except FileNotFoundError:
        raise ConfigError(f"replay source {str(p)!r} does not exist") from None
    except (OSError, ValueError) as e:
        raise ConfigError(f"replay source {p} cannot be read as a sweep file: {e}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ConfigError(
            f"replay source {p} is not a {FORMAT} file "
            f"(format {doc.get('format') if isinstance(doc, dict) else None!r})"
        )
    if doc.get("version") != VERSION:
        raise ConfigError(
            f"replay source {p} has version {doc.get('version')!r}; this syncopate reads version {VERSION}"
        )
    try:
        topology = Topology.from_dict(doc["topology"])
        environment = Environment.from_dict(doc["environment"]) if doc.get("environment") else None
        sweep = StoredSweep(
            label=str(doc.get("label", p.name)),
            topology=topology,
            environment=environment,
            synthetic=bool(doc.get("synthetic", False)),
        )
        env = environment or Environment(
            syncopate="?", torch="?", triton="?", cuda="?", nccl="?", driver="?", gpu_model=topology.gpu_model
        )
        for entry in doc["workloads"]:
            w = Workload.from_dict(entry["workload"])
            sweep.baselines[w.key()] = {k: float(v) for k, v in entry.get("baselines", {}).items()}
            eager = {k: float(v) for k, v in (entry.get("baselines_eager") or {}).items() if v is not None}
            if eager:
                sweep.baselines_eager[w.key()] = eager
            table = sweep.trials.setdefault(w.key(), {})
            for t in entry["trials"]:
                c = Candidate.from_dict(t["candidate"])
                table[c.key()] = TrialRecord(
                    workload=w,
                    topology=topology,
                    environment=env,
                    candidate=c,
                    status=t["status"],
                    source="fixture",
                    median_us=t.get("median_us"),
                    p20_us=t.get("p20_us"),
                    p80_us=t.get("p80_us"),
                    samples_us=tuple(t.get("samples_us") or ()),
                    eager_us=t.get("eager_us"),
                    host_us=t.get("host_us"),
                    error=t.get("error", ""),
                )
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError(f"replay source {p}: entry does not parse: {e}") from None
    return sweep


def load_sweep_db(
    url: str, sweep: str | None, topology: Topology | None, source: str = "measured"
) -> StoredSweep:
    """The trials of a sweep stored in a results database (rows of `source`, of any status)."""
    from syncopate.results_db import ResultsDB

    with ResultsDB.open(url, read_only=True) as db:
        sweep_id = None
        if sweep is not None:
            info = db.sweep(int(sweep)) if str(sweep).isdigit() else db.latest_sweep(sweep)
            if info is None:
                raise ConfigError(f"replay source {db.url} has no sweep named {sweep!r}")
            sweep_id = info.sweep_id
        rows = db.trials(sweep_id=sweep_id, topology=topology, source=source)
        if not rows:
            raise ConfigError(
                f"replay source {db.url} holds no {source} trial"
                + (f" in sweep {sweep!r}" if sweep else "")
                + (f" on {topology.key()}" if topology else "")
            )
        first = rows[0].record
        out = StoredSweep(
            label=f"{db.url} sweep {sweep or 'all'}",
            topology=first.topology,
            environment=first.environment,
            synthetic=False,
        )
        for row in rows:
            out.trials.setdefault(row.workload.key(), {})[row.candidate.key()] = row.record
        for b in db.baselines(sweep_id=sweep_id, topology=first.topology):
            out.baselines.setdefault(b.record.workload.key(), {})[b.name] = b.median_us
            if b.eager_us is not None:
                out.baselines_eager.setdefault(b.record.workload.key(), {})[b.name] = b.eager_us
    return out


def load_stored_sweep(options: ReplayOptions, topology: Topology | None = None) -> StoredSweep:
    """The stored sweep `options` names (a file, or a database URL)."""
    if "://" in options.source:
        return load_sweep_db(options.source, options.sweep, topology)
    if _is_sqlite(Path(options.source)):
        return load_sweep_db(f"sqlite:///{Path(options.source).resolve()}", options.sweep, topology)
    return load_sweep_file(options.source)


def _is_sqlite(path: Path) -> bool:
    """Whether `path` is a SQLite database (its header says so)."""
    try:
        with path.open("rb") as f:
            return f.read(len(SQLITE_HEADER)) == SQLITE_HEADER
    except OSError:
        return False


class ReplayRunner(Runner):
    """Answers every trial from a :class:`StoredSweep` (see the module docstring)."""

    name = "replay"
    source = "fixture"
    dist_backend = "gloo"
    cpus_per_rank = 0.0

    def __init__(self, spec: RunnerSpec, stored: StoredSweep | None = None) -> None:
        super().__init__(spec)
        options = spec.options
        if stored is None:
            if not isinstance(options, ReplayOptions):
                raise ConfigError(
                    "runner replay needs a `replay:` section naming the stored sweep: {source: FILE.json or "
                    "DB URL, sweep: NAME}"
                )
            stored = load_stored_sweep(options, spec.topology)
        self.stored = stored
        self.unheld = 0
        """How many trials asked for a candidate the stored sweep does not hold (answered `crash`)."""
        self.noise = getattr(options, "noise", 0.0) or 0.0
        self._rng = random.Random(getattr(options, "seed", 0))
        if spec.topology is not None and spec.topology.key() != stored.topology.key():
            raise ConfigError(
                f"the replayed sweep ({stored.label}) was measured on {stored.topology.key()}, but the config "
                f"names {spec.topology.key()}: set `topology: {stored.topology.key()}`"
            )

    def bind_device(self, rank: int, gpu_ids: Sequence[int]) -> DeviceInfo:
        return DeviceInfo(
            model=self.stored.topology.gpu_model,
            uuid=f"REPLAY-{socket.gethostname()}-{rank}",
            index=rank,
            name=f"replay of {self.stored.label}",
        )

    def setup(self, rank: int, world_size: int, group: Any) -> None:
        return None

    def topology(self) -> Topology:
        return self.stored.topology

    def baselines(self, workload: Workload) -> list[BaselineOutcome]:
        stored = self.stored.baselines.get(workload.key(), {})
        eager = self.stored.baselines_eager.get(workload.key(), {})
        return [
            BaselineOutcome(
                name=name,
                samples_us=(us,),
                detail=f"replayed from {self.stored.label}",
                eager_us=eager.get(name),
            )
            for name, us in stored.items()
        ]

    def holds(self, workload: Workload, candidate: Candidate) -> bool:
        """Whether the replayed sweep has a trial of `candidate` on `workload`."""
        return self.stored.trial(workload, candidate) is not None

    def run(self, workload: Workload, candidate: Candidate, deadline_s: float) -> CandidateOutcome:
        t = self.stored.trial(workload, candidate)
        if t is None:
            self.unheld += 1
            return CandidateOutcome(
                status="crash",
                healthy=True,
                error=f"candidate {candidate.key()} is not in the replayed sweep {self.stored.label}",
            )
        samples = t.samples_us or ((t.median_us,) if t.median_us is not None else ())
        eager, host = t.eager_us, t.host_us
        if self.noise and samples:
            samples = tuple(x * math.exp(self._rng.gauss(0.0, self.noise)) for x in samples)
            eager, host = (
                None if v is None else v * math.exp(self._rng.gauss(0.0, self.noise)) for v in (eager, host)
            )
        return CandidateOutcome(
            status=t.status,
            samples_us=samples,
            eager_us=eager,
            host_us=host,
            max_rel_error=t.max_rel_error,
            error=t.error,
            extra={"replayed_from": self.stored.label},
        )
