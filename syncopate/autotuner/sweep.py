"""Sweep configs: YAML files that say what to tune, where, how, and where results go.

```yaml
name: llama_tp2
topology: H200x2-nvlink        # a key, or "detect"
dtype: bf16
tokens: 8192                   # M for the model entries
workloads:
  - kind: ag_gemm
    models: [llama-7b, llama-3.1-70b]
    shapes: [[8192, 4096, 8192]]   # (M, N, K), global dims
strategy: {name: seeded, max_trials: 200, time_budget_s: 3600, seed: 0}
                                  # seeded | grid | random | optuna-tpe | model-guided
space: {backends: [copy_engine, nccl], num_splits: [1, 2, 4]}
runner: gpu                    # gpu | model | replay | cpu-fixture | cpu (MoE kinds on gloo ranks)
calibration: auto              # the cost model's: auto (measured where stored) | measured | default
replay: {source: results/llama_tp2-sweep.db, sweep: llama_tp2_sweep, noise: 0.0}   # replay runner only
db: sqlite:///results/h200.db  # optional; else --db, SYNCOPATE_DB, or the per-user default
timing: {warmup: 5, repetitions: 20, deadline_s: 120}
fixture: {hang: [KEY], crash: [KEY], fail: {KEY: oom}}   # cpu-fixture runner only: planted faults
moe:                           # mixture-of-experts layers (kinds a2a_gemm, gemm_a2a), beside or instead of workloads
  - kinds: [a2a_gemm, gemm_a2a]              # the default: both
    models:                                  # configs/moe_ep.yaml's `models:` mapping, as it is
      qwen3_30b_a3b: {hidden: 2048, ffn: 768, experts: 128, top_k: 8}
    # or one layer: hidden: 2048, ffn: 768, experts: 128, top_k: 8
    tokens: [4096, 8192]                     # tokens a rank
    routings: [{distribution: uniform, seed: 0}, {distribution: skewed, skew: 1.2, seed: 0}]
    backends: [nccl, copy_engine]            # moe_space's default; nvshmem where the workers opt in
    chunks: [1, 2, 4]                        # chunks_per_source tried (the default)
```

A MoE entry expands to one workload per model (or its one layer), kind, token count and routing;
its candidates are :func:`~syncopate.search_space.moe_space`'s, its guard `unfused`. Strategies
`grid` and `seeded` measure that space in its order, `random` in a seeded shuffle; the Optuna ones
take the grid's order for MoE workloads (their spaces are a few dozen candidates at most).

Loading validates everything: a bad file gives one ConfigError naming the file, the field, the
value and what is accepted. A config is named by its path, or, for one shipped inside the package
(`syncopate/configs/`, e.g. `quickstart`), by its bare name, so an installed wheel runs it without a
checkout.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from syncopate.autotuner.confirm import CONFIRM_SUFFIX
from syncopate.errors import ConfigError, describe
from syncopate.search_space import (
    BACKENDS,
    CANDIDATE_TEMPLATES,
    KINDS,
    MAX_DIM,
    TILE_ORDERS,
    SpaceOptions,
    TileConfig,
    Topology,
    Workload,
    canonical_dtype,
    model_shape,
    unknown_backend,
)
from syncopate.search_space.moe_workload import (
    MOE_BACKENDS,
    MOE_CHUNKS,
    MOE_DEFAULT_BACKENDS,
    MOE_KINDS,
    MoeWorkload,
    RoutingSpec,
)
from syncopate.search_space.workload import kind_refusal

__all__ = [
    "STRATEGIES",
    "RUNNERS",
    "SWEEP_FIELDS",
    "CALIBRATIONS",
    "FixtureConfig",
    "ReplayConfig",
    "Sweep",
    "StrategyConfig",
    "TimingConfig",
    "load_sweep",
    "packaged_configs",
    "parse_sweep",
    "resolve_config",
]

STRATEGIES: tuple[str, ...] = ("grid", "seeded", "random", "optuna-tpe", "model-guided")
RUNNERS: tuple[str, ...] = ("gpu", "model", "replay", "cpu-fixture", "cpu")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class WorkloadEntry(_Strict):
    kind: str
    models: list[str] = Field(default_factory=list)
    shapes: list[tuple[int, int, int]] = Field(default_factory=list)
    dtype: str | None = None
    tokens: int | None = Field(default=None, gt=0, le=MAX_DIM)

    @field_validator("kind")
    @classmethod
    def _kind(cls, v: str) -> str:
        if v in MOE_KINDS:
            raise ValueError(
                f"kind {v!r} is a mixture-of-experts op: list it under `moe:` with its layer (hidden, ffn, "
                f"experts, top_k), tokens and routings, not under workloads"
            )
        if v not in KINDS:
            raise ValueError(kind_refusal(v))
        return v


_LAYER_FIELDS = ("hidden", "ffn", "experts", "top_k")


class MoeLayerEntry(_Strict):
    hidden: int
    ffn: int
    experts: int
    top_k: int


class MoeEntry(_Strict):
    """One `moe:` entry: layers (`models`, or one layer's fields), kinds, tokens, routings, and the
    backends and chunk counts of its space."""

    kinds: list[str] = Field(default_factory=lambda: list(MOE_KINDS))
    models: dict[str, MoeLayerEntry] = Field(default_factory=dict)
    hidden: int | None = None
    ffn: int | None = None
    experts: int | None = None
    top_k: int | None = None
    tokens: list[int]
    routings: list[dict[str, Any]] = Field(default_factory=lambda: [{"distribution": "uniform", "seed": 0}])
    dtype: str | None = None
    backends: list[str] = Field(default_factory=lambda: list(MOE_DEFAULT_BACKENDS))
    chunks: list[int] = Field(default_factory=lambda: [1, 2, 4])

    @field_validator("kinds")
    @classmethod
    def _kinds(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError(f"kinds is empty: list one or both of {', '.join(MOE_KINDS)}")
        for k in v:
            if k not in MOE_KINDS:
                raise ValueError(
                    f"kind {k!r} is not a MoE kind: accepted here are {', '.join(MOE_KINDS)} (the dense kinds "
                    f"go under workloads)"
                )
        return v

    @field_validator("tokens")
    @classmethod
    def _tokens(cls, v: list[int]) -> list[int]:
        if not v:
            raise ValueError("tokens is empty: list the tokens a rank, such as [4096]")
        return v

    @field_validator("routings")
    @classmethod
    def _routings(cls, v: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if not v:
            raise ValueError("routings is empty: list at least one, such as {distribution: uniform, seed: 0}")
        return v

    @field_validator("backends")
    @classmethod
    def _backends(cls, v: list[str]) -> list[str]:
        for b in v:
            if b not in MOE_BACKENDS:
                raise ValueError(f"unknown MoE backend {b!r}: accepted are {', '.join(MOE_BACKENDS)}")
        if not v:
            raise ValueError(f"backends is empty: list one or more of {', '.join(MOE_BACKENDS)}")
        return v

    @field_validator("chunks")
    @classmethod
    def _chunks(cls, v: list[int]) -> list[int]:
        for c in v:
            if c not in MOE_CHUNKS:
                raise ValueError(
                    f"chunks_per_source {c!r} is not accepted: give values of {', '.join(map(str, MOE_CHUNKS))}"
                )
        if not v:
            raise ValueError(f"chunks is empty: list values of {', '.join(map(str, MOE_CHUNKS))}")
        return v

    def layers(self) -> list[dict[str, int]]:
        """The layers of the entry: each model's, or its own fields' (exactly one of the two)."""
        own = {name: getattr(self, name) for name in _LAYER_FIELDS}
        given = [name for name, value in own.items() if value is not None]
        if self.models and given:
            raise ConfigError(
                f"gives both models and {', '.join(given)}: give the layers as models, or one layer's "
                f"{', '.join(_LAYER_FIELDS)}"
            )
        if self.models:
            return [layer.model_dump() for layer in self.models.values()]
        missing = [name for name in _LAYER_FIELDS if own[name] is None]
        if missing:
            raise ConfigError(
                f"lacks {', '.join(missing)}: give the layer's {', '.join(_LAYER_FIELDS)}, or models (a mapping "
                f"of names to them, as configs/moe_ep.yaml's)"
            )
        return [own]

    def workloads(self, dtype: str) -> list[MoeWorkload]:
        routings = [RoutingSpec.from_dict(r) for r in self.routings]
        return [
            MoeWorkload(kind=kind, tokens=tokens, routing=routing, dtype=self.dtype or dtype, **layer)
            for layer in self.layers()
            for kind in self.kinds
            for tokens in self.tokens
            for routing in routings
        ]


class StrategyConfig(_Strict):
    name: str = "seeded"
    """Default `seeded`: the suites' grid first, so that a run cut short by its budget or its time
    has measured the candidates that won the suites."""
    max_trials: int | None = Field(
        default=None, description="Trials per workload; None: the whole space (grid, seeded)."
    )
    time_budget_s: float | None = None
    seed: int = 0
    top_k_remeasure: int = Field(default=3, ge=0)
    """How many of the best candidates are measured once more before a winner is declared
    (those within noise of the best; 0: none). Applies to GPU runs and to replays with noise;
    cpu-fixture runs re-measure only when the config sets it; predictions never do."""
    model_top_k: int | None = Field(default=None, ge=1)
    """model-guided: how many of the cost model's best candidates are measured first."""

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if v not in STRATEGIES:
            raise ValueError(f"unknown strategy {v!r}: accepted are {', '.join(STRATEGIES)}")
        return v

    @field_validator("max_trials")
    @classmethod
    def _max_trials(cls, v: int | None) -> int | None:
        if v is not None and v <= 0:
            raise ValueError(f"max_trials={v} must be positive")
        return v

    @field_validator("time_budget_s")
    @classmethod
    def _budget(cls, v: float | None) -> float | None:
        if v is not None and not 0 < v < math.inf:
            raise ValueError(
                f"time_budget_s={v} must be a positive, finite number of seconds (leave it out for no limit)"
            )
        return v


class TimingConfig(_Strict):
    warmup: int = Field(default=5, ge=0)
    repetitions: int = Field(default=20, ge=1)
    deadline_s: float = Field(default=120.0, gt=0)
    flush_l2: bool = True


PLANTED_FAILURES: tuple[str, ...] = ("wrong_result", "compile_error", "oom", "error")
"""What the fixture can make a candidate do besides hang and crash: return a wrong result, raise a
compilation error, run out of memory, or raise an unexpected exception."""


def _check_keys(keys) -> None:
    for k in keys:
        if not (isinstance(k, str) and len(k) == 16 and all(c in "0123456789abcdef" for c in k)):
            raise ValueError(f"{k!r} is not a candidate key (16 hex digits, as `Candidate.key()` gives)")


class FixtureConfig(_Strict):
    """Settings of the `cpu-fixture` runner, a deterministic stand-in for tests: synthetic times,
    and faults planted on chosen candidates (named by their key)."""

    hang: list[str] = Field(default_factory=list)
    """Candidates that sleep forever on every rank."""
    crash: list[str] = Field(default_factory=list)
    """Candidates whose last rank ends its own process."""
    fail: dict[str, str] = Field(default_factory=dict)
    """Candidate key → one of :data:`PLANTED_FAILURES`."""
    delay_s: float = Field(default=0.0, ge=0)
    """Seconds each candidate takes."""
    gpu_models: list[str] = Field(default_factory=list)
    """GPU models the ranks report, by rank, cycled; empty: the topology's model."""
    gpus: int | None = Field(default=None, ge=1)
    """GPUs a local Ray cluster started for the fixture declares (default: the topology's world size)."""

    @field_validator("hang", "crash")
    @classmethod
    def _keys(cls, v):
        _check_keys(v)
        return v

    @field_validator("fail")
    @classmethod
    def _fail(cls, v):
        _check_keys(v)
        for key, what in v.items():
            if what not in PLANTED_FAILURES:
                raise ValueError(
                    f"candidate {key}: unknown failure {what!r}: accepted are {', '.join(PLANTED_FAILURES)}"
                )
        return v


class ReplayConfig(_Strict):
    """Settings of the `replay` runner: the stored sweep it answers from."""

    source: str
    """A sweep file (JSON, optionally gzip) or a results database URL."""
    sweep: str | None = None
    """In a database: the sweep's name (its latest run) or id."""
    noise: float = Field(default=0.0, ge=0)
    """Sigma of a fresh log-normal factor on every replayed sample."""
    seed: int = 0

    def options(self) -> Any:
        from syncopate.workers.replay_runner import ReplayOptions

        return ReplayOptions(source=self.source, sweep=self.sweep, noise=self.noise, seed=self.seed)


CALIBRATIONS: tuple[str, ...] = ("auto", "measured", "default")


class SpaceEntry(_Strict):
    backends: list[str] | None = None
    templates: list[str] | None = None
    num_splits: list[int] | None = None
    tile_orders: list[str] | None = None
    comm_sms: dict[str, list[int]] | None = None
    tile_configs: list[str] | None = None
    group_m: list[int] | None = None
    kernels: list[str] | None = None

    @field_validator("backends")
    @classmethod
    def _backends(cls, v):
        for b in v or []:
            if b not in BACKENDS:
                raise ValueError(unknown_backend(b))
        return v

    @field_validator("templates")
    @classmethod
    def _templates(cls, v):
        for t in v or []:
            if t not in CANDIDATE_TEMPLATES:
                raise ValueError(
                    f"unknown plan template {t!r}: accepted are {', '.join(CANDIDATE_TEMPLATES)}"
                )
        return v

    @field_validator("tile_orders")
    @classmethod
    def _orders(cls, v):
        for o in v or []:
            if o not in TILE_ORDERS:
                raise ValueError(f"unknown tile order {o!r}: accepted are {', '.join(TILE_ORDERS)}")
        return v

    def options(self) -> SpaceOptions:
        kw: dict[str, Any] = {}
        for name in ("backends", "templates", "num_splits", "tile_orders", "group_m", "kernels"):
            value = getattr(self, name)
            if value is not None:
                kw[name] = tuple(value)
        if self.comm_sms is not None:
            kw["comm_sms"] = {b: tuple(v) for b, v in self.comm_sms.items()}
        if self.tile_configs is not None:
            kw["tile_configs"] = tuple(TileConfig.from_key(k) for k in self.tile_configs)
        return SpaceOptions(**kw)


_MAX_NAME = 200 - len(CONFIRM_SUFFIX)
"""The longest sweep name: the database holds 200 characters, and NAME+confirm is stored as well."""


class SweepFile(_Strict):
    name: str
    description: str = ""
    topology: str = "detect"
    dtype: str = "bf16"
    tokens: int = Field(default=8192, gt=0, le=MAX_DIM)
    workloads: list[WorkloadEntry] = Field(default_factory=list)
    moe: list[MoeEntry] = Field(default_factory=list)
    strategy: StrategyConfig = StrategyConfig()
    space: SpaceEntry = SpaceEntry()
    runner: str = "gpu"
    db: str | None = None
    timing: TimingConfig = TimingConfig()
    ray_address: str | None = None
    fixture: FixtureConfig | None = None
    replay: ReplayConfig | None = None
    calibration: str = "auto"

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not v.strip() or len(v) > _MAX_NAME:
            raise ValueError(
                f"sweep name {v!r} must be a non-empty string of at most {_MAX_NAME} characters (its companion "
                f"sweep NAME+confirm is stored too)"
            )
        return v

    @field_validator("db")
    @classmethod
    def _db(cls, v: str | None) -> str | None:
        if v is not None:
            from syncopate.results_db.urls import locate

            locate(v)  # an unsupported URL is refused here, as on the command line
        return v

    @field_validator("calibration")
    @classmethod
    def _calibration(cls, v: str) -> str:
        if v not in CALIBRATIONS:
            raise ValueError(f"unknown calibration policy {v!r}: accepted are {', '.join(CALIBRATIONS)}")
        return v

    @field_validator("runner")
    @classmethod
    def _runner(cls, v: str) -> str:
        if v not in RUNNERS:
            raise ValueError(f"unknown runner {v!r}: accepted are {', '.join(RUNNERS)}")
        return v


SWEEP_FIELDS: tuple[str, ...] = tuple(SweepFile.model_fields)
"""The fields a sweep config may have."""


class Sweep(BaseModel):
    """A validated sweep: the file's settings with workloads expanded and checked."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    name: str
    description: str
    source: str
    raw: dict[str, Any]
    topology_key: str
    workloads: tuple[Workload | MoeWorkload, ...]
    """The dense workloads, then the MoE ones, in config order."""
    moe_space: dict[str, tuple[tuple[str, ...], tuple[int, ...]]] = {}
    """MoE workload key → the (backends, chunks) of its space."""
    strategy: StrategyConfig
    space: SpaceOptions
    runner: Literal["gpu", "model", "replay", "cpu-fixture", "cpu"]
    db: str | None
    timing: TimingConfig
    ray_address: str | None
    fixture: FixtureConfig | None = None
    """Planted faults and settings of the cpu-fixture runner; None elsewhere."""
    replay: ReplayConfig | None = None
    """The stored sweep of the replay runner; None elsewhere."""
    calibration: str = "auto"
    """Which calibrations the cost model may use: `auto`, `measured` or `default`."""

    @property
    def detect_topology(self) -> bool:
        return self.topology_key == "detect"

    def topology(self) -> Topology:
        """The configured topology (detected on the current machine when the config says `detect`)."""
        if self.detect_topology:
            from syncopate.platform import detect_topology

            return detect_topology()
        return Topology.from_key(self.topology_key)


def _format_validation(source: str, e: ValidationError) -> str:
    err = e.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "(top level)"
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        msg = "unknown field"
    elif err["type"] == "missing":
        msg = "required field is missing"
    got = ""
    if err["type"] not in ("missing", "value_error") and "input" in err:
        got = " (got nothing: the field is empty)" if err["input"] is None else f" (got {err['input']!r})"
    more = f" (and {len(e.errors()) - 1} more problem(s))" if len(e.errors()) > 1 else ""
    return f"{source}: {where}: {msg}{got}{more}"


def parse_sweep(data: Any, source: str = "<config>") -> Sweep:
    """Validate a sweep given as a parsed YAML mapping."""
    if not isinstance(data, dict):
        if data is None:
            raise ConfigError(
                f"{source} is empty: a sweep config is a mapping of fields (name, topology, workloads, "
                f"strategy, …), such as configs/quickstart.yaml"
            )
        raise ConfigError(f"{source}: a sweep config must be a mapping of fields, got {describe(data)}")
    try:
        f = SweepFile.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_format_validation(source, e)) from None
    try:
        if f.topology != "detect":
            topology: Topology | None = Topology.from_key(f.topology)
        else:
            topology = None
        dtype = canonical_dtype(f.dtype)
        workloads: list[Workload] = []
        for i, entry in enumerate(f.workloads):
            shapes = [
                model_shape(m, entry.kind, f.tokens if entry.tokens is None else entry.tokens)
                for m in entry.models
            ]
            shapes += [tuple(s) for s in entry.shapes]
            if not shapes:
                raise ConfigError(f"workloads.{i}: give models or shapes for kind {entry.kind}")
            for shape in shapes:
                w = Workload(kind=entry.kind, shape=shape, dtype=entry.dtype or dtype)
                if topology is not None:
                    w.check_world_size(topology.world_size)
                if w not in workloads:
                    workloads.append(w)
        moe_space: dict[str, tuple[tuple[str, ...], tuple[int, ...]]] = {}
        for i, entry in enumerate(f.moe):
            try:
                found = entry.workloads(dtype)
                for w in found:
                    if topology is not None:
                        w.check_world_size(topology.world_size)
            except ConfigError as e:
                raise ConfigError(f"moe.{i}: {e}") from None
            for w in found:
                if w not in workloads:
                    workloads.append(w)
                    moe_space[w.key()] = (tuple(entry.backends), tuple(entry.chunks))
        if not workloads:
            raise ConfigError(
                "workloads is empty, and there is no moe section: list at least one workload (or MoE layer)"
            )
        options = f.space.options()
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None
    return Sweep(
        name=f.name,
        description=f.description,
        source=source,
        raw=data,
        topology_key=f.topology,
        workloads=tuple(workloads),
        moe_space=moe_space,
        strategy=f.strategy,
        space=options,
        runner=f.runner,
        db=f.db,
        timing=f.timing,
        ray_address=f.ray_address,
        fixture=f.fixture,
        replay=f.replay,
        calibration=f.calibration,
    )


def _stem(name: str) -> str:
    return name.removesuffix(".yaml")


def _packaged(name: str) -> Path | None:
    """The packaged config `name` (`quickstart` or `quickstart.yaml`), or None."""
    from importlib.resources import files

    stem = _stem(name)
    if not stem or not stem.replace("_", "").replace("-", "").isalnum():
        return None
    found = files("syncopate") / "configs" / f"{stem}.yaml"
    return Path(str(found)) if found.is_file() else None


def packaged_configs() -> list[str]:
    """Names of the sweep configs shipped inside the package, sorted (`syncopate tune NAME` runs one)."""
    from importlib.resources import files

    folder = files("syncopate") / "configs"
    return sorted(_stem(f.name) for f in folder.iterdir() if f.name.endswith(".yaml"))


def resolve_config(path: str | Path) -> Path:
    """The file a config argument names: the path itself where it exists; else, for a bare name
    (no folder), the packaged config of that name. Anything else is returned as given, for
    :func:`load_sweep` to report."""
    p = Path(path)
    if p.exists() or len(p.parts) != 1:
        return p
    return _packaged(p.name) or p


def load_sweep(path: str | Path) -> Sweep:
    """Read and validate the sweep config at `path` (or the packaged config named `path`, see
    :func:`resolve_config`)."""
    p = resolve_config(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        hint = (
            f"; `{_stem(p.name)}` alone names the copy shipped with syncopate"
            if _packaged(p.name) is not None
            else ""
        )
        raise ConfigError(f"config file {str(p)!r} does not exist{hint}") from None
    except IsADirectoryError:
        raise ConfigError(f"config file {str(p)!r} is a directory: give the YAML file in it") from None
    except OSError as e:
        raise ConfigError(f"config file {str(p)!r} cannot be read: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"config file {str(p)!r} is not UTF-8 text (byte {e.start}): save it as UTF-8 YAML"
        ) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{p}: malformed YAML{where}: {problem}") from None
    return parse_sweep(data, str(p))
