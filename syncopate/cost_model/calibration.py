"""Calibrations: the measured curves the cost model predicts from, as plain values.

A :class:`Calibration` holds, for one topology:

| part                | what                                                                 | record (kind / key)        |
|---------------------|----------------------------------------------------------------------|----------------------------|
| :class:`TransferModel` | per backend and scope (`intra` node, `inter` node): time of one chunk transfer against its size, one curve per `comm_sms` (`copy_engine`: one curve, 0) and a fixed cost per call | `transfer` / `BACKEND/SCOPE` |
| :class:`GemmRate`   | per tile configuration: TFLOP/s of the persistent GEMM against the number of programs (SMs), and a fixed cost per tile | `gemm` / tile key (`128x256x64w8s3`) |
| :class:`OpCosts`    | kernel launch, one signal wait, local copy rate, HBM rate, GEMM slowdown while each backend communicates | `op_costs` / `op` |

Each part says where it came from (`origin`): measured by `syncopate calibrate` (with the
environment and date), or a documented default (:mod:`syncopate.cost_model.calibration_defaults`).
:func:`resolve_calibration` picks, part by part, the best source a database holds and falls back
to the defaults where the policy allows.

Pure Python: nothing here imports torch.
"""

from __future__ import annotations

import bisect
import logging
import math
from dataclasses import dataclass, field, replace
from typing import Any

from syncopate.errors import CalibrationError, ConfigError
from syncopate.records import CalibrationRecord, Environment
from syncopate.search_space import BACKENDS, DEFAULT_BACKENDS, TileConfig, Topology, unknown_backend

__all__ = [
    "CALIBRATION_POLICIES",
    "SCOPES",
    "Calibration",
    "Curve",
    "GemmRate",
    "OpCosts",
    "TransferModel",
    "records_from_measurements",
    "resolve_calibration",
]

log = logging.getLogger(__name__)

SCOPES: tuple[str, ...] = ("intra", "inter")
"""Where a transfer goes: to a GPU of the same node, or of another node."""

CALIBRATION_POLICIES: tuple[str, ...] = ("auto", "measured", "default")
"""`auto`: measured parts where stored, documented defaults for the rest; `measured`: every part
measured (an error names `syncopate calibrate` otherwise); `default`: the defaults only."""


def _check_positive(what: str, values) -> None:
    for v in values:
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            raise ConfigError(f"{what}: {v!r} must be a positive finite number")


@dataclass(frozen=True, kw_only=True, slots=True)
class Curve:
    """Time of one transfer against its size: points (bytes, µs), interpolated on log-log axes.

    Below the smallest size the time stays that of the smallest (latency-bound); above the
    largest, it grows in proportion to the size (the last point's bandwidth)."""

    sizes: tuple[int, ...]
    """Transfer sizes in bytes, increasing."""
    us: tuple[float, ...]
    """Time of one transfer of each size, µs (back-to-back transfers: the cost of each)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "sizes", tuple(int(s) for s in self.sizes))
        object.__setattr__(self, "us", tuple(float(t) for t in self.us))
        if not self.sizes or len(self.sizes) != len(self.us):
            raise ConfigError(
                f"a curve needs as many times as sizes, at least one: got {len(self.sizes)} size(s) and "
                f"{len(self.us)} time(s)"
            )
        _check_positive("curve size", self.sizes)
        _check_positive("curve time", self.us)
        if any(b <= a for a, b in zip(self.sizes, self.sizes[1:])):
            raise ConfigError(f"curve sizes {list(self.sizes)} must increase strictly")

    def time_us(self, nbytes: float) -> float:
        """Time of one transfer of `nbytes`."""
        if nbytes <= 0:
            return 0.0
        s, t = self.sizes, self.us
        if nbytes <= s[0]:
            return t[0]
        if nbytes >= s[-1]:
            return t[-1] * nbytes / s[-1]
        i = bisect.bisect_right(s, nbytes)
        x0, x1 = math.log(s[i - 1]), math.log(s[i])
        y0, y1 = math.log(t[i - 1]), math.log(t[i])
        return math.exp(y0 + (y1 - y0) * (math.log(nbytes) - x0) / (x1 - x0))

    def gbps(self, nbytes: float) -> float:
        """Bandwidth of one transfer of `nbytes`, GB/s."""
        return nbytes / self.time_us(nbytes) / 1e3

    def scaled(self, factor: float) -> Curve:
        """The same curve with every time multiplied by `factor`."""
        return Curve(sizes=self.sizes, us=tuple(t * factor for t in self.us))

    @classmethod
    def saturating(
        cls, *, latency_us: float, peak_gbps: float, half_bytes: float, sizes: tuple[int, ...]
    ) -> Curve:
        """t(s) = latency + s / B(s) with B(s) = peak · s / (s + half): the usual shape of a link."""
        return cls(sizes=sizes, us=tuple(latency_us + (s + half_bytes) / (peak_gbps * 1e3) for s in sizes))

    def to_dict(self) -> dict[str, Any]:
        return {"sizes": list(self.sizes), "us": list(self.us)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Curve:
        try:
            return cls(sizes=tuple(d["sizes"]), us=tuple(d["us"]))
        except (KeyError, TypeError) as e:
            raise ConfigError(f"a curve must be {{'sizes': [...], 'us': [...]}}, got {d!r} ({e})") from None


def _interpolate_by_sms(points: dict[int, float], sms: int) -> float:
    """A rate at `sms` from rates measured at some SM counts: linear between the neighbours,
    proportional below the smallest, flat above the largest."""
    keys = sorted(points)
    if sms in points:
        return points[sms]
    if sms <= keys[0]:
        return points[keys[0]] * sms / keys[0] if keys[0] > 0 else points[keys[0]]
    if sms >= keys[-1]:
        return points[keys[-1]]
    i = bisect.bisect_right(keys, sms)
    lo, hi = keys[i - 1], keys[i]
    return points[lo] + (points[hi] - points[lo]) * (sms - lo) / (hi - lo)


@dataclass(frozen=True, kw_only=True, slots=True)
class TransferModel:
    """How long a backend takes to move chunks within a node or between nodes."""

    backend: str
    """One of :data:`~syncopate.search_space.BACKENDS`."""
    scope: str
    """`intra` (same node) or `inter` (another node)."""
    curves: dict[int, Curve]
    """comm_sms → per-chunk time curve; the copy engine has one curve, under 0."""
    call_us: float
    """Fixed cost of one call of the fused op with this backend (entry handshake, side-stream
    launches), µs."""

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ConfigError(unknown_backend(self.backend, " in a transfer calibration"))
        if self.scope not in SCOPES:
            raise ConfigError(f"unknown transfer scope {self.scope!r}: accepted are {', '.join(SCOPES)}")
        if not self.curves:
            raise ConfigError(f"transfer calibration {self.key()} has no curve")
        object.__setattr__(self, "curves", {int(k): v for k, v in self.curves.items()})
        if not (self.call_us >= 0):
            raise ConfigError(f"transfer calibration {self.key()}: call_us={self.call_us!r} must be >= 0")

    def key(self) -> str:
        return f"{self.backend}/{self.scope}"

    def time_us(self, nbytes: float, comm_sms: int = 0) -> float:
        """Time of one chunk of `nbytes` with `comm_sms` SMs given to communication."""
        if nbytes <= 0:
            return 0.0
        if len(self.curves) == 1:
            return next(iter(self.curves.values())).time_us(nbytes)
        rates = {sms: nbytes / c.time_us(nbytes) for sms, c in self.curves.items()}
        return nbytes / _interpolate_by_sms(rates, max(comm_sms, 1))

    def to_payload(self) -> dict[str, Any]:
        return {
            "call_us": self.call_us,
            "curves": {str(k): c.to_dict() for k, c in sorted(self.curves.items())},
        }

    @classmethod
    def from_payload(cls, key: str, payload: dict[str, Any]) -> TransferModel:
        backend, _, scope = key.partition("/")
        try:
            curves = {int(k): Curve.from_dict(v) for k, v in payload["curves"].items()}
            return cls(
                backend=backend, scope=scope or "intra", curves=curves, call_us=float(payload["call_us"])
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ConfigError(f"transfer calibration {key!r} does not parse: {e}") from None


@dataclass(frozen=True, kw_only=True, slots=True)
class GemmRate:
    """Throughput of the persistent GEMM with one tile configuration."""

    tile: str
    """The tile configuration's key (:meth:`~syncopate.search_space.TileConfig.key`)."""
    tflops_by_sms: dict[int, float]
    """Programs (one per SM) → TFLOP/s of the whole GEMM, on a large reference shape."""
    tile_overhead_us: float = 1.0
    """Fixed cost of one output tile (prologue, epilogue store), µs."""

    def __post_init__(self) -> None:
        TileConfig.from_key(self.tile)
        if not self.tflops_by_sms:
            raise ConfigError(f"GEMM calibration {self.tile} has no point")
        object.__setattr__(self, "tflops_by_sms", {int(k): float(v) for k, v in self.tflops_by_sms.items()})
        _check_positive(f"GEMM calibration {self.tile} TFLOP/s", self.tflops_by_sms.values())
        _check_positive(f"GEMM calibration {self.tile} SM count", self.tflops_by_sms.keys())
        if not (self.tile_overhead_us >= 0):
            raise ConfigError(
                f"GEMM calibration {self.tile}: tile_overhead_us={self.tile_overhead_us!r} must be >= 0"
            )

    def tflops(self, programs: int) -> float:
        """TFLOP/s with `programs` persistent programs."""
        return _interpolate_by_sms(self.tflops_by_sms, programs)

    def tile_us(self, flops_per_tile: float, programs: int) -> float:
        """Time one program takes for one tile of `flops_per_tile`."""
        per_program = self.tflops(programs) * 1e12 / programs
        return flops_per_tile / per_program * 1e6 + self.tile_overhead_us

    def to_payload(self) -> dict[str, Any]:
        return {
            "tflops_by_sms": {str(k): v for k, v in sorted(self.tflops_by_sms.items())},
            "tile_overhead_us": self.tile_overhead_us,
        }

    @classmethod
    def from_payload(cls, key: str, payload: dict[str, Any]) -> GemmRate:
        try:
            return cls(
                tile=key,
                tflops_by_sms={int(k): float(v) for k, v in payload["tflops_by_sms"].items()},
                tile_overhead_us=float(payload.get("tile_overhead_us", 1.0)),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ConfigError(f"GEMM calibration {key!r} does not parse: {e}") from None


CHUNK_US = {"copy_engine": 5.0}
"""The documented `OpCosts.chunk_us`, also for calibrations stored before it was a field: inside a
fused call a copy-engine chunk takes longer than the same transfer calibrated alone (the stream
waits and signal writes around it), by about this much (`benchmarks/timeline.py` shows both)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class OpCosts:
    """Costs of the fused op that are neither a transfer nor a tile."""

    launch_us: float
    """Kernel launch and stream fork/join of one call, µs."""
    wait_us: float
    """One signal wait that finds its chunk already there (poll, fence), µs."""
    local_copy_gbps: float
    """Copy-engine copy of a rank's own shard into the gathered buffer, GB/s."""
    hbm_gbps: float
    """Device memory bandwidth a kernel reaches, GB/s (epilogue reads, memory-bound waves)."""
    overlap_slowdown: dict[str, float] = field(default_factory=dict)
    """Backend → fraction by which tiles run slower while that backend communicates."""
    chunk_us: dict[str, float] = field(default_factory=lambda: dict(CHUNK_US))
    """Backend → µs each chunk's transfer takes inside a fused call beyond a calibrated transfer of
    its size (the side stream's wait passing, the copy's issue, the GEMM's memory traffic)."""

    def __post_init__(self) -> None:
        _check_positive("op costs", (self.local_copy_gbps, self.hbm_gbps))
        for name in ("launch_us", "wait_us"):
            if not (getattr(self, name) >= 0):
                raise ConfigError(f"op costs: {name}={getattr(self, name)!r} must be >= 0")
        for b, f in self.overlap_slowdown.items():
            if b not in BACKENDS or not (0 <= f < 1):
                raise ConfigError(
                    f"op costs: overlap_slowdown[{b!r}]={f!r}: a backend and a fraction in [0, 1)"
                )
        for b, us in self.chunk_us.items():
            if b not in BACKENDS or not (0 <= us < 1000):
                raise ConfigError(f"op costs: chunk_us[{b!r}]={us!r}: a backend and µs in [0, 1000)")

    def to_payload(self) -> dict[str, Any]:
        return {
            "launch_us": self.launch_us,
            "wait_us": self.wait_us,
            "local_copy_gbps": self.local_copy_gbps,
            "hbm_gbps": self.hbm_gbps,
            "overlap_slowdown": dict(self.overlap_slowdown),
            "chunk_us": dict(self.chunk_us),
        }

    @classmethod
    def from_payload(cls, payload: dict[str, Any]) -> OpCosts:
        try:
            return cls(
                launch_us=float(payload["launch_us"]),
                wait_us=float(payload["wait_us"]),
                local_copy_gbps=float(payload["local_copy_gbps"]),
                hbm_gbps=float(payload["hbm_gbps"]),
                overlap_slowdown={k: float(v) for k, v in payload.get("overlap_slowdown", {}).items()},
                chunk_us={k: float(v) for k, v in payload.get("chunk_us", CHUNK_US).items()},
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ConfigError(f"op-cost calibration does not parse: {e}") from None


@dataclass(frozen=True, kw_only=True, slots=True)
class Calibration:
    """Everything the cost model needs for one topology, with where each part came from."""

    topology: str
    """The topology key the calibration stands for."""
    gpu_model: str
    transfers: dict[str, TransferModel]
    """`BACKEND/SCOPE` → transfer model."""
    gemm: dict[str, GemmRate]
    """Tile key → GEMM rate."""
    costs: OpCosts
    origin: dict[str, str] = field(default_factory=dict)
    """Part (`transfer/copy_engine/intra`, `gemm/128x256x64w8s3`, `op_costs`) → where it came from:
    `measured …` or `default …`."""

    def transfer(self, backend: str, scope: str = "intra") -> TransferModel:
        """The transfer model of `backend` in `scope`; CalibrationError when there is none."""
        model = self.transfers.get(f"{backend}/{scope}")
        if model is None:
            raise CalibrationError(
                f"the calibration of {self.topology} has no {scope}-node transfer curve for backend {backend}: "
                f"run `syncopate calibrate` on a machine with this topology"
            )
        return model

    def has_transfer(self, backend: str, scope: str = "intra") -> bool:
        return f"{backend}/{scope}" in self.transfers

    def gemm_rate(self, tile: TileConfig) -> GemmRate:
        """The GEMM rate of `tile`; a tile not calibrated takes the nearest calibrated one by
        (log) tile area and warps, scaled by nothing (a lead)."""
        rate = self.gemm.get(tile.key())
        if rate is not None:
            return rate
        if not self.gemm:
            raise CalibrationError(
                f"the calibration of {self.topology} has no GEMM rate: run `syncopate calibrate` on a "
                f"machine with {self.gpu_model} GPUs"
            )

        def distance(key: str) -> tuple[float, str]:
            other = TileConfig.from_key(key)
            return (
                abs(math.log(other.block_m * other.block_n / (tile.block_m * tile.block_n)))
                + 0.1 * abs(math.log(other.num_warps / tile.num_warps))
                + 0.01 * abs(other.num_stages - tile.num_stages),
                key,
            )

        return self.gemm[min(self.gemm, key=distance)]

    @property
    def source(self) -> str:
        """`measured` when every part was measured, `default` when none was, else `mixed`. The
        default transfer curves of a backend outside the default search (`nvshmem`, which only a
        calibration run in an NVSHMEM process measures) do not count against `measured`."""
        kinds = {o.split()[0] for k, o in self.origin.items() if not _opt_in_default(k, o)}
        kinds = kinds or {o.split()[0] for o in self.origin.values()} or {"default"}
        return kinds.pop() if len(kinds) == 1 else "mixed"

    def describe(self) -> str:
        """One line: which parts are measured and which are defaults."""
        measured = sorted(k for k, o in self.origin.items() if o.startswith("measured"))
        if self.source == "default":
            return f"default calibration for {self.topology} (documented leads, no measurement stored)"
        if self.source == "measured":
            envs = sorted({o.partition(" ")[2] for o in self.origin.values()})
            return f"measured calibration for {self.topology} ({'; '.join(envs)})"
        return (
            f"calibration for {self.topology}: {len(measured)} part(s) measured ({', '.join(measured[:4])}"
            f"{', …' if len(measured) > 4 else ''}), the rest defaults"
        )

    def records(
        self, topology: Topology, environment: Environment, source: str = "measured"
    ) -> list[CalibrationRecord]:
        """The calibration as rows of the calibrations table."""
        out = [
            CalibrationRecord(
                kind="transfer",
                topology=topology,
                environment=environment,
                key=k,
                payload=t.to_payload(),
                source=source,
            )
            for k, t in sorted(self.transfers.items())
        ]
        out += [
            CalibrationRecord(
                kind="gemm",
                topology=topology,
                environment=environment,
                key=k,
                payload=g.to_payload(),
                source=source,
            )
            for k, g in sorted(self.gemm.items())
        ]
        out.append(
            CalibrationRecord(
                kind="op_costs",
                topology=topology,
                environment=environment,
                key="op",
                payload=self.costs.to_payload(),
                source=source,
            )
        )
        return out

    def merged(self, records: list[CalibrationRecord], label: str) -> Calibration:
        """This calibration with every part that `records` holds replaced by it (origin `label`)."""
        transfers, gemm, costs, origin = dict(self.transfers), dict(self.gemm), self.costs, dict(self.origin)
        for r in records:
            if r.kind == "transfer":
                transfers[r.key] = TransferModel.from_payload(r.key, r.payload)
                origin[f"transfer/{r.key}"] = label
            elif r.kind == "gemm":
                gemm[r.key] = GemmRate.from_payload(r.key, r.payload)
                origin[f"gemm/{r.key}"] = label
            elif r.kind == "op_costs":
                costs = OpCosts.from_payload(r.payload)
                origin["op_costs"] = label
        return replace(self, transfers=transfers, gemm=gemm, costs=costs, origin=origin)


def records_from_measurements(result: dict[str, Any]) -> list[CalibrationRecord]:
    """The calibration rows of what `syncopate calibrate` measured (rank 0's result: topology,
    environment, and payloads by kind and key); every payload is parsed first, so a bad
    measurement raises ConfigError before anything is stored."""
    topology = Topology.from_dict(result["topology"])
    environment = Environment.from_dict(result["environment"])
    out = []
    for key, payload in sorted(result.get("transfer", {}).items()):
        TransferModel.from_payload(key, payload)
        out.append(
            CalibrationRecord(
                kind="transfer", topology=topology, environment=environment, key=key, payload=payload
            )
        )
    for key, payload in sorted(result.get("gemm", {}).items()):
        GemmRate.from_payload(key, payload)
        out.append(
            CalibrationRecord(
                kind="gemm", topology=topology, environment=environment, key=key, payload=payload
            )
        )
    if result.get("op_costs"):
        OpCosts.from_payload(result["op_costs"])
        out.append(
            CalibrationRecord(
                kind="op_costs",
                topology=topology,
                environment=environment,
                key="op",
                payload=result["op_costs"],
            )
        )
    return out


def _label(record: CalibrationRecord, same_environment: bool) -> str:
    when = record.created_at.strftime("%Y-%m-%d")
    env = record.environment.short()
    return f"measured {when} on {record.topology.key()}, {env}" + (
        "" if same_environment else " (another environment)"
    )


def _newest(records: list[CalibrationRecord]) -> list[CalibrationRecord]:
    """The newest record of each (kind, key)."""
    best: dict[tuple[str, str], CalibrationRecord] = {}
    for r in records:
        k = (r.kind, r.key)
        if k not in best or r.created_at > best[k].created_at:
            best[k] = r
    return list(best.values())


def _opt_in_default(part: str, origin: str) -> bool:
    """Whether calibration part `part` (such as `transfer/nvshmem/intra`) is a default curve of a
    backend that is not searched by default."""
    kind, _, key = part.partition("/")
    return (
        kind == "transfer"
        and key.partition("/")[0] not in DEFAULT_BACKENDS
        and not origin.startswith("measured")
    )


def resolve_calibration(
    topology: Topology,
    environment: Environment | None = None,
    db: Any = None,
    policy: str = "auto",
) -> Calibration:
    """The calibration the cost model uses for `topology`, part by part, best source first:

    1. measured on this topology under `environment`;
    2. measured on this topology under another environment (newest);
    3. GEMM rates measured on another topology of the same GPU model;
    4. the documented defaults (:func:`~syncopate.cost_model.calibration_defaults.default_calibration`),
       unless `policy` is `measured`.

    `db` is an open :class:`~syncopate.results_db.ResultsDB` (or None: defaults only). Raises
    CalibrationError, naming `syncopate calibrate`, when the policy cannot be met.
    """
    from syncopate.cost_model.calibration_defaults import default_calibration

    if policy not in CALIBRATION_POLICIES:
        raise ConfigError(
            f"unknown calibration policy {policy!r}: accepted are {', '.join(CALIBRATION_POLICIES)}"
        )
    where = f" --db {db.url}" if db is not None and getattr(db, "url", None) else ""
    try:
        base = default_calibration(topology)
    except CalibrationError:
        if policy != "measured" and db is None:
            raise
        base = None
    if policy == "default" or db is None:
        if policy == "measured":
            raise CalibrationError(
                f"no measured calibration for {topology.key()} (no database given): run `syncopate calibrate{where}` "
                f"on a machine with this topology"
            )
        if base is None:
            raise CalibrationError(f"no calibration for {topology.key()}: run `syncopate calibrate{where}`")
        return base
    stored = [s.record for s in db.calibrations(topology=topology)]
    same = [r for r in stored if environment is not None and r.environment == environment]
    other = [r for r in stored if not (environment is not None and r.environment == environment)]
    gemm_elsewhere = [
        s.record
        for s in db.calibrations(kind="gemm")
        if s.record.topology.gpu_model == topology.gpu_model and s.record.topology.key() != topology.key()
    ]
    if base is None and not stored:
        raise CalibrationError(
            f"no calibration for {topology.key()} and no default for GPU model {topology.gpu_model}: run "
            f"`syncopate calibrate{where}` on a machine with this topology"
        )
    cal = base if base is not None else _empty(topology)
    layers = [(_newest(gemm_elsewhere), False), (_newest(other), False), (_newest(same), True)]
    for records, same_env in layers:
        for r in records:
            cal = cal.merged([r], _label(r, same_env))
    if policy == "measured":
        missing = sorted(k for k, o in cal.origin.items() if not o.startswith("measured"))
        if missing or not stored:
            raise CalibrationError(
                f"calibrations missing for {topology.key()} ({', '.join(missing[:5]) or 'everything'}"
                f"{', …' if len(missing) > 5 else ''}): run `syncopate calibrate{where}` on a machine with this "
                f"topology, or let the cost model use its defaults (calibration: auto)"
            )
    log.info("%s", cal.describe())
    return cal


def _empty(topology: Topology) -> Calibration:
    return Calibration(
        topology=topology.key(),
        gpu_model=topology.gpu_model,
        transfers={},
        gemm={},
        costs=OpCosts(launch_us=5.0, wait_us=1.0, local_copy_gbps=1000.0, hbm_gbps=1000.0),
        origin={"op_costs": "default (no figure for this GPU)"},
    )
