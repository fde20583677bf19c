"""Store a `syncopate bench` JSON file in the results database as measured trials and baselines.

A bench file (written by :func:`syncopate.measure.bench.run_bench`) holds the topology, the host,
the GPU's name, torch's version, the UTC time the run ended (`date`) and, per workload, the
baselines (median, samples, what was run), every candidate tried (status, error, samples) and the
seconds the workload took. It does not hold the rest of the environment fingerprint (triton, CUDA,
NCCL, driver) unless it has an `environment` object; the caller supplies those, and what the file
does say (torch's version, the GPU) must agree with them.

What is stored:

- one sweep named `bench:<first 12 hex digits of the file's SHA-256>` on the file's host, started
  at `date` minus the workloads' seconds and finished (`done`) at `date`; importing the same file
  again adds nothing;
- every candidate as a trial of source `measured` and strategy `bench`, failures included, with
  p20/p80 interpolated from its samples as the timing harness does, and its host and eager times
  per call (`host_us`, `eager_us`) where the file has them; its time stamp is the end of its
  workload's run (the file has no finer one);
- every baseline under its name, with its detail text (and its `host_us`, `eager_us` where given).

A file without `"backend_names": BACKEND_NAMES` was written before the backend rename: its
`nvshmem` candidates are `sm_copy`'s.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from syncopate.environment import gluon_on, with_kernels
from syncopate.errors import ConfigError
from syncopate.records import BASELINES, BaselineRecord, Environment, TrialRecord
from syncopate.search_space import BACKEND_NAMES, Candidate, Topology, Workload

if TYPE_CHECKING:
    from syncopate.results_db.repository import ResultsDB

__all__ = [
    "BenchImport",
    "PreparedBench",
    "bench_environment",
    "import_bench",
    "prepare_bench",
    "quantile",
    "read_bench",
    "store_bench",
]

log = logging.getLogger(__name__)

STRATEGY = "bench"
"""Strategy name of imported bench trials: the fixed small grid of `syncopate bench`."""


@dataclass(frozen=True, kw_only=True, slots=True)
class BenchImport:
    """What :func:`import_bench` stored (or found stored already)."""

    sweep_id: int
    sweep_name: str
    created: bool
    """False where this file had been imported before (nothing new was stored)."""
    workloads: int
    trials: int
    baselines: int
    environment: Environment
    topology: Topology


@dataclass(frozen=True, kw_only=True, slots=True)
class PreparedBench:
    """A bench file read and checked whole, with the rows it stores; no database touched yet."""

    path: Path
    doc: dict[str, Any]
    environment: Environment
    topology: Topology
    name: str
    digest: str
    started: datetime
    finished: datetime
    trials: list[Any]
    baselines: list[Any]


def quantile(samples: list[float], q: float) -> float:
    """The q-quantile of `samples` by linear interpolation between order statistics (the timing
    harness's p20/p80 rule)."""
    s = sorted(samples)
    if not s:
        raise ConfigError("a quantile of no samples is undefined")
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def read_bench(path: Path) -> dict[str, Any]:
    """The parsed bench file `path`, checked for the fields an import needs (ConfigError naming the
    file and what is missing)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"bench file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read bench file {path}: {e}") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"bench file {path} is not valid JSON: {e}") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"bench file {path} is not a JSON object")
    for name in ("topology", "rows", "host", "gpu", "torch", "date"):
        if name not in doc:
            raise ConfigError(f"{path} is not a `syncopate bench --json` file: it has no {name!r}")
    if not isinstance(doc["rows"], list) or not doc["rows"]:
        raise ConfigError(f"bench file {path} has no workloads in 'rows'")
    return doc


def _gpu_model(raw: str) -> str:
    words = raw.replace("NVIDIA", "").split()
    return words[0] if words else "unknown"


def bench_environment(doc: dict[str, Any], path: Path, given: dict[str, str | None]) -> Environment:
    """The environment fingerprint of a bench file: its own `environment` object where it has one,
    else the fields in `given` (syncopate, triton, cuda, nccl, driver; torch and gpu_model default
    to the file's), each checked against what the file says; with the Gluon kernels marked where
    its `switches` say they were on (files written before the fingerprint held them)."""
    from_file: dict[str, str] = {"torch": str(doc["torch"]), "gpu_model": _gpu_model(str(doc["gpu"]))}
    if isinstance(doc.get("environment"), dict):
        from_file.update({k: str(v) for k, v in doc["environment"].items()})
    values: dict[str, str] = dict(from_file)
    for name, value in given.items():
        if value is None:
            continue
        if name in from_file and from_file[name] != value:
            raise ConfigError(
                f"bench file {path} says {name} {from_file[name]!r} but {value!r} was given: "
                f"leave --{name.replace('_', '-')} out or correct it"
            )
        values[name] = value
    fields = ("syncopate", "torch", "triton", "cuda", "nccl", "driver", "gpu_model")
    missing = [f for f in fields if not values.get(f)]
    if missing:
        flags = ", ".join(f"--{f.replace('_', '-')}" for f in missing)
        raise ConfigError(
            f"bench file {path} does not say which {', '.join(missing)} it ran under: give {flags} "
            f"(the environment fingerprint of every stored row)"
        )
    switches = doc.get("switches")
    gluon = isinstance(switches, dict) and gluon_on({str(k): str(v) for k, v in switches.items()})
    return with_kernels(Environment(**{f: values[f] for f in fields}), gluon)


def _stored_topology(db: ResultsDB, sweep: Any) -> str | None:
    """The topology key an earlier import of the same file was stored under (None: nothing stored)."""
    key = sweep.config.get("topology")
    if key:
        return str(key)
    rows = db.trials(sweep_id=sweep.sweep_id, limit=1)  # imports from before the key was kept
    return rows[0].topology.key() if rows else None


def _date(doc: dict[str, Any], path: Path) -> datetime:
    try:
        when = datetime.fromisoformat(str(doc["date"]).replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(f"bench file {path} has date {doc['date']!r}, not an ISO 8601 time") from None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def _optional_us(row: dict[str, Any], name: str) -> float | None:
    """A time a bench row may carry (older files have none): µs, or None."""
    value = row.get(name)
    return None if value is None else float(value)


def _records(
    doc: dict[str, Any],
    path: Path,
    topology: Topology,
    env: Environment,
    started: datetime,
    worker: dict[str, Any],
) -> tuple[list[TrialRecord], list[BaselineRecord]]:
    trials: list[TrialRecord] = []
    baselines: list[BaselineRecord] = []
    clock = started
    renamed = doc.get("backend_names") != BACKEND_NAMES
    for i, row in enumerate(doc["rows"]):
        try:
            workload = Workload.from_dict(row["workload"])
            clock = clock + timedelta(seconds=float(row.get("seconds", 0.0)))
            for name, b in row["baselines"].items():
                if name not in BASELINES:
                    raise ConfigError(f"baseline {name!r} is unknown: accepted are {', '.join(BASELINES)}")
                samples = [float(x) for x in b.get("samples_us", [])]
                baselines.append(
                    BaselineRecord(
                        workload=workload,
                        topology=topology,
                        environment=env,
                        name=name,
                        median_us=float(b["median_us"]),
                        p20_us=quantile(samples, 0.2) if samples else None,
                        p80_us=quantile(samples, 0.8) if samples else None,
                        samples_us=tuple(samples),
                        eager_us=_optional_us(b, "eager_us"),
                        host_us=_optional_us(b, "host_us"),
                        source="measured",
                        detail=str(b.get("detail", "")),
                        created_at=clock,
                    )
                )
            for t in row["trials"]:
                samples = [float(x) for x in t.get("samples_us", [])]
                median = t.get("median_us")
                trials.append(
                    TrialRecord(
                        workload=workload,
                        topology=topology,
                        environment=env,
                        # a file written before a backend was renamed reads under the new name (never rewritten:
                        # its sweep is named by the file's digest)
                        candidate=Candidate.from_stored(t["candidate"], renamed=renamed),
                        status=t["status"],
                        source="measured",
                        median_us=float(median) if median is not None else None,
                        p20_us=quantile(samples, 0.2) if samples else None,
                        p80_us=quantile(samples, 0.8) if samples else None,
                        samples_us=tuple(samples),
                        eager_us=_optional_us(t, "eager_us"),
                        host_us=_optional_us(t, "host_us"),
                        max_rel_error=t.get("max_rel_error"),
                        error=str(t.get("error", "")),
                        worker=worker,
                        strategy=STRATEGY,
                        created_at=clock,
                    )
                )
        except KeyError as e:
            raise ConfigError(f"bench file {path}: workload {i} lacks {e.args[0]!r}") from None
        except (ConfigError, TypeError, ValueError) as e:
            raise ConfigError(f"bench file {path}: workload {i}: {e}") from None
    return trials, baselines


def import_bench(
    db: ResultsDB,
    path: str | Path,
    *,
    syncopate: str | None = None,
    torch: str | None = None,
    triton: str | None = None,
    cuda: str | None = None,
    nccl: str | None = None,
    driver: str | None = None,
    gpu_model: str | None = None,
    topology: Topology | str | None = None,
) -> BenchImport:
    """Store the bench file `path` in `db` as the module docstring says; what was stored.

    The environment fields fill in what the file does not say (see :func:`bench_environment`);
    `topology` overrides the file's (which must then have the same world size).
    """
    return store_bench(
        db,
        prepare_bench(
            path,
            syncopate=syncopate,
            torch=torch,
            triton=triton,
            cuda=cuda,
            nccl=nccl,
            driver=driver,
            gpu_model=gpu_model,
            topology=topology,
        ),
    )


def prepare_bench(
    path: str | Path,
    *,
    syncopate: str | None = None,
    torch: str | None = None,
    triton: str | None = None,
    cuda: str | None = None,
    nccl: str | None = None,
    driver: str | None = None,
    gpu_model: str | None = None,
    topology: Topology | str | None = None,
) -> PreparedBench:
    """Read and check the bench file `path` whole (see :func:`import_bench`): a ConfigError naming
    what is wrong before any database is opened."""
    path = Path(path)
    doc = read_bench(path)
    env = bench_environment(
        doc,
        path,
        {
            "syncopate": syncopate,
            "torch": torch,
            "triton": triton,
            "cuda": cuda,
            "nccl": nccl,
            "driver": driver,
            "gpu_model": gpu_model,
        },
    )
    try:
        found = Topology.from_dict(doc["topology"])
    except (KeyError, TypeError, ConfigError) as e:
        raise ConfigError(f"bench file {path} has an invalid topology {doc['topology']!r}: {e}") from None
    written = doc["topology"].get("key")
    if topology is None and written is not None and written != found.key():
        raise ConfigError(
            f"bench file {path} names its topology {written!r}, but its other fields give {found.key()}: the file "
            f"was edited or is damaged; fix the key or the fields (or give --topology)"
        )
    topo = found
    if topology is not None:
        topo = Topology.of(topology)
        if topo.world_size != found.world_size:
            raise ConfigError(
                f"topology {topo.key()} has world size {topo.world_size}; bench file {path} "
                f"ran on {found.world_size} GPUs ({found.key()})"
            )
    if topo.gpu_model != env.gpu_model:
        raise ConfigError(
            f"topology {topo.key()} is of {topo.gpu_model} GPUs, but bench file {path} ran on {env.gpu_model} "
            f"(its environment's gpu_model): give a topology of {env.gpu_model} GPUs"
        )
    finished = _date(doc, path)
    seconds = sum(float(row.get("seconds", 0.0)) for row in doc["rows"])
    started = finished - timedelta(seconds=seconds)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    name = f"bench:{digest}"
    worker = {"host": str(doc["host"]), "gpu": str(doc["gpu"]), "imported_from": path.name, "sha256": digest}
    if isinstance(doc.get("switches"), dict):  # the kernel switches the benchmark ran with (newer files)
        worker["switches"] = {str(k): str(v) for k, v in doc["switches"].items()}
    trials, baselines = _records(doc, path, topo, env, started, worker)
    return PreparedBench(
        path=path,
        doc=doc,
        environment=env,
        topology=topo,
        name=name,
        digest=digest,
        started=started,
        finished=finished,
        trials=trials,
        baselines=baselines,
    )


def store_bench(db: ResultsDB, bench: PreparedBench) -> BenchImport:
    """Store what :func:`prepare_bench` read in `db` (nothing new where the file is stored already)."""
    path, doc, topo, name, digest = bench.path, bench.doc, bench.topology, bench.name, bench.digest
    trials, baselines, started, finished = bench.trials, bench.baselines, bench.started, bench.finished
    existing = db.latest_sweep(name)
    if existing is not None:
        stored_on = _stored_topology(db, existing)
        if stored_on is not None and stored_on != topo.key():
            raise ConfigError(
                f"bench file {path} is already stored as sweep {existing.sweep_id} on {stored_on}, not "
                f"{topo.key()}: one file is stored once; import it into another database to keep both"
            )
    created = existing is None or existing.status != "done"
    if created:  # new, or an import that stopped half-way: the inserts keep what is there once
        config = {
            "imported_from": path.name,
            "sha256": digest,
            "kind": "syncopate bench",
            "workloads": [row["key"] for row in doc["rows"] if "key" in row],
            "topology": topo.key(),
        }
        sweep_id = (
            existing.sweep_id
            if existing
            else db.start_sweep(name, config, host=str(doc["host"]), started_at=started)
        )
        db.record_trials(sweep_id, trials)
        for b in baselines:
            db.record_baseline(sweep_id, b)
        db.finish_sweep(sweep_id, "done", finished_at=finished)
        log.info(
            "stored %d trials and %d baselines of %s as sweep %d", len(trials), len(baselines), path, sweep_id
        )
    else:
        sweep_id = existing.sweep_id
    return BenchImport(
        sweep_id=sweep_id,
        sweep_name=name,
        created=created,
        workloads=len(doc["rows"]),
        trials=len(trials),
        baselines=len(baselines),
        environment=bench.environment,
        topology=topo,
    )
