"""Mixture-of-experts workloads under expert parallelism (EP): the two op kinds, their routing spec.

- `a2a_gemm` (dispatch): each rank holds x[T, H], its routing (each token's top_k expert ids) and
  W1[E/ws, H, 2F]; every (token, expert) pair's row of x goes to its expert's rank (all-to-all), and
  each local expert's W1 multiplies its received rows; each rank returns h[R, 2F].
- `gemm_a2a` (combine): each rank holds h[R, F], W2[E/ws, F, H] and its tokens' gate weights; each
  local expert's W2 multiplies its rows, every output row goes back to its token's rank
  (all-to-all), and there a token's top_k rows are summed weighted by its gate weights: out[T, H].

T tokens a rank, H hidden, F the experts' ffn width, E experts (rank r owns experts
[r·E/ws, (r+1)·E/ws)), R the rows the routing sends to this rank's experts. W1 holds each expert's
gate and up projections side by side (columns [0, F) the gate's, [F, 2F) the up's), the layout of a
SwiGLU MLP's fused first GEMM. The routing is input, never tuned: a `RoutingSpec` says how a
benchmark or a test draws it (`syncopate.moe.routing`).

`MoeCandidate` is one configuration of these ops (`unfused`; `pipelined`: the all-to-all cut
into pieces, one grouped GEMM a piece; `fused`: the same pieces consumed or produced tile by tile
by one persistent Triton grouped GEMM) and `moe_space` the candidates a search tries for a
workload. These kinds are not in :data:`~syncopate.search_space.workload.KINDS` (the dense kinds,
whose workloads are a GEMM shape): `syncopate.moe` runs them, `syncopate tune` sweeps them
(a config's `moe:` section), the results database stores them beside the dense kinds (the
workload's parameters in a JSON column, its GEMM-equivalent dims in M, N, K:
:meth:`MoeWorkload.gemm_dims`), and `syncopate.moe.lookup_moe` serves the best one.

Pure Python: nothing here imports torch.
"""

from __future__ import annotations

import json
import operator
import re
from dataclasses import dataclass, fields
from typing import Any

from syncopate.errors import ConfigError, describe
from syncopate.search_space.candidate import CanonicalJson
from syncopate.search_space.workload import DTYPES, MAX_DIM, MOE_KINDS, canonical_dtype

__all__ = [
    "DISTRIBUTIONS",
    "MOE_BACKENDS",
    "MOE_CHUNKS",
    "MOE_COMM_SMS",
    "MOE_COMM_SMS_DEFAULT",
    "MOE_DEFAULT_BACKENDS",
    "MOE_KINDS",
    "MOE_ORDERS",
    "MOE_TEMPLATES",
    "FUSED_TEMPLATES",
    "MOE_TILE_DEFAULTS",
    "MoeCandidate",
    "MoeWorkload",
    "RoutingSpec",
    "check_moe_candidate",
    "moe_guards",
    "moe_space",
]

DISTRIBUTIONS: tuple[str, ...] = ("uniform", "skewed")
"""How a routing is drawn: `uniform` (every expert equally likely) or `skewed` (Zipf-like)."""

MAX_EXPERTS = 1 << 16
"""The most experts a workload may have."""


def _positive_int(label: str, value: Any, largest: int = MAX_DIM) -> int:
    try:
        if isinstance(value, bool):
            raise TypeError
        value = operator.index(value)
    except TypeError:
        raise ConfigError(f"{label}={value!r} must be an integer") from None
    if value <= 0:
        raise ConfigError(f"{label}={value} must be positive")
    if value > largest:
        raise ConfigError(f"{label}={value} is larger than {largest}, the largest accepted")
    return value


@dataclass(frozen=True, kw_only=True, slots=True)
class RoutingSpec:
    """How the routing of a MoE workload is drawn: a distribution over experts and a seed.

    `uniform`: each token's top_k experts drawn uniformly without replacement. `skewed`: expert e
    has weight 1 / (1 + π(e))^skew, π a seeded permutation of the experts (so the popular ones are
    spread over the ranks), and each token's top_k are drawn without replacement in proportion to
    the weights; with a large exponent and few tokens, experts in the tail get no token at all.
    """

    distribution: str = "uniform"
    """One of :data:`DISTRIBUTIONS`."""
    skew: float = 1.2
    """The Zipf exponent s of `skewed` (ignored by `uniform`); 0 is uniform."""
    seed: int = 0
    """Seeds the draw: the same spec, shape and world size give the same routing everywhere."""

    def __post_init__(self) -> None:
        if self.distribution not in DISTRIBUTIONS:
            raise ConfigError(
                f"unknown routing distribution {self.distribution!r}: accepted are {', '.join(DISTRIBUTIONS)}"
            )
        if isinstance(self.skew, bool) or not isinstance(self.skew, (int, float)):
            raise ConfigError(f"routing skew={self.skew!r} must be a number")
        if not 0 <= float(self.skew) <= 16:
            raise ConfigError(f"routing skew={self.skew} must be between 0 and 16")
        object.__setattr__(self, "skew", float(self.skew))
        try:
            if isinstance(self.seed, bool):
                raise TypeError
            seed = operator.index(self.seed)
        except TypeError:
            raise ConfigError(f"routing seed={self.seed!r} must be an integer") from None
        if seed < 0:
            raise ConfigError(f"routing seed={seed} must be non-negative")
        object.__setattr__(self, "seed", seed)

    def key(self) -> str:
        if self.distribution == "uniform":
            return f"uniform-seed{self.seed}"
        return f"skewed{self.skew:g}-seed{self.seed}"

    def to_dict(self) -> dict[str, Any]:
        return {"distribution": self.distribution, "skew": self.skew, "seed": self.seed}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RoutingSpec:
        unknown = sorted(set(d) - {"distribution", "skew", "seed"})
        if unknown:
            raise ConfigError(f"routing has unknown key(s) {unknown}: accepted are distribution, skew, seed")
        return cls(**d)


@dataclass(frozen=True, kw_only=True, slots=True)
class MoeWorkload:
    """A MoE op kind on one expert layer's shapes, a routing spec and a dtype (module docstring)."""

    kind: str
    """One of :data:`MOE_KINDS`."""
    tokens: int
    """Tokens a rank (T)."""
    hidden: int
    """The model's hidden width (H)."""
    ffn: int
    """Each expert's intermediate width (F)."""
    experts: int
    """Experts of the layer (E), spread evenly over the EP ranks."""
    top_k: int
    """Experts a token is routed to."""
    routing: RoutingSpec = RoutingSpec()
    """How the routing is drawn."""
    dtype: str = "bf16"
    """Element type of activations and weights: `bf16`, `fp16` or `fp32`."""

    def __post_init__(self) -> None:
        if self.kind not in MOE_KINDS:
            raise ConfigError(f"unknown MoE kind {self.kind!r}: accepted are {', '.join(MOE_KINDS)}")
        for name in ("tokens", "hidden", "ffn"):
            object.__setattr__(self, name, _positive_int(name, getattr(self, name)))
        object.__setattr__(self, "experts", _positive_int("experts", self.experts, MAX_EXPERTS))
        top_k = _positive_int("top_k", self.top_k, MAX_EXPERTS)
        if top_k > self.experts:
            raise ConfigError(
                f"top_k={top_k} is more than experts={self.experts}: a token has distinct experts"
            )
        object.__setattr__(self, "top_k", top_k)
        if isinstance(self.routing, dict):
            object.__setattr__(self, "routing", RoutingSpec.from_dict(self.routing))
        if not isinstance(self.routing, RoutingSpec):
            raise ConfigError(f"routing={self.routing!r} must be a RoutingSpec or its dict")
        dtype = canonical_dtype(self.dtype)
        if dtype not in ("bf16", "fp16", "fp32"):
            raise ConfigError(f"MoE dtype {dtype!r} is not supported: accepted are bf16, fp16, fp32")
        object.__setattr__(self, "dtype", dtype)

    @property
    def element_bytes(self) -> int:
        return DTYPES[self.dtype]

    def check_world_size(self, world_size: int) -> None:
        """Raise ConfigError unless the experts spread evenly over `world_size` EP ranks."""
        if world_size < 1:
            raise ConfigError(f"world size {world_size} must be at least 1")
        if self.experts % world_size:
            raise ConfigError(
                f"{self.kind} spreads experts over the ranks: experts={self.experts} is not divisible "
                f"by world size {world_size}"
            )

    def local_shapes(self, world_size: int) -> dict[str, tuple[int, ...]]:
        """Per-rank shapes of the inputs and weights; the rows each rank's experts receive depend on
        the routing, so `rows` is their mean (T · top_k)."""
        self.check_world_size(world_size)
        t, h, f, el = self.tokens, self.hidden, self.ffn, self.experts // world_size
        rows = t * self.top_k
        if self.kind == "a2a_gemm":
            return {"x": (t, h), "w": (el, h, 2 * f), "out": (rows, 2 * f)}
        return {"h": (rows, f), "w": (el, f, h), "out": (t, h)}

    def flops(self, world_size: int) -> int:
        """Floating-point operations of the grouped GEMM summed over the group."""
        rows = world_size * self.tokens * self.top_k
        n = 2 * self.ffn if self.kind == "a2a_gemm" else self.hidden
        k = self.hidden if self.kind == "a2a_gemm" else self.ffn
        return 2 * rows * n * k

    def gemm_dims(self) -> tuple[int, int, int]:
        """The grouped GEMM of one rank as one GEMM of mean rows (M, N, K): (T·top_k, 2F, H) for
        the dispatch, (T·top_k, H, F) for the combine. What the results database stores in a MoE
        workload's m, n, k, so that its readers of dense shapes (tables, the dashboard) show a
        size; the workload itself is the `params` JSON beside them."""
        rows = self.tokens * self.top_k
        if self.kind == "a2a_gemm":
            return rows, 2 * self.ffn, self.hidden
        return rows, self.hidden, self.ffn

    def expert_key(self) -> str:
        """Everything of the key but the tokens: the workloads among which lookup's
        `nearest_tokens` rung looks (same kind, expert shapes, routing distribution and dtype)."""
        routing = self.routing.key().rsplit("-seed", 1)[0]
        return f"{self.kind}/h{self.hidden}-f{self.ffn}-e{self.experts}-k{self.top_k}/{routing}/{self.dtype}"

    def comm_row_bytes(self) -> int:
        """Bytes of one row the all-to-all moves: a token's hidden row, both ways."""
        return self.hidden * self.element_bytes

    def key(self) -> str:
        return (
            f"{self.kind}/t{self.tokens}-h{self.hidden}-f{self.ffn}-e{self.experts}-k{self.top_k}/"
            f"{self.routing.key()}/{self.dtype}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "tokens": self.tokens,
            "hidden": self.hidden,
            "ffn": self.ffn,
            "experts": self.experts,
            "top_k": self.top_k,
            "routing": self.routing.to_dict(),
            "dtype": self.dtype,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MoeWorkload:
        fields = {"kind", "tokens", "hidden", "ffn", "experts", "top_k", "routing", "dtype"}
        unknown = sorted(set(d) - fields)
        if unknown:
            raise ConfigError(
                f"MoE workload has unknown key(s) {unknown}: accepted are {', '.join(sorted(fields))}"
            )
        missing = sorted(fields - {"routing", "dtype"} - set(d))
        if missing:
            raise ConfigError(f"MoE workload {d!r} lacks key(s) {missing}")
        return cls(**d)

    @classmethod
    def from_key(cls, key: str) -> MoeWorkload:
        """The workload whose `key()` is `key` (`a2a_gemm/t4096-h2048-f768-e128-k8/uniform-seed0/bf16`)."""
        found = _KEY.fullmatch(key) if isinstance(key, str) else None
        if found is None:
            raise ConfigError(
                f"MoE workload key {key!r} does not parse: expected KIND/tT-hH-fF-eE-kK/ROUTING/DTYPE, such as "
                f"a2a_gemm/t4096-h2048-f768-e128-k8/uniform-seed0/bf16 (ROUTING: uniform-seedS or skewedX-seedS)"
            )
        kind, t, h, f, e, k, skew, seed, dtype = found.groups()
        routing = (
            RoutingSpec(seed=int(seed))
            if skew is None
            else RoutingSpec(distribution="skewed", skew=float(skew), seed=int(seed))
        )
        return cls(
            kind=kind,
            tokens=int(t),
            hidden=int(h),
            ffn=int(f),
            experts=int(e),
            top_k=int(k),
            routing=routing,
            dtype=dtype,
        )

    def __str__(self) -> str:
        return (
            f"{self.kind} T={self.tokens} H={self.hidden} F={self.ffn} E={self.experts} "
            f"top{self.top_k} {self.routing.key()} {self.dtype}"
        )


_KEY = re.compile(r"(\w+)/t(\d+)-h(\d+)-f(\d+)-e(\d+)-k(\d+)/(?:uniform|skewed([0-9.e+-]+))-seed(\d+)/(\w+)")
"""What `MoeWorkload.key()` writes."""

MOE_TEMPLATES: tuple[str, ...] = ("unfused", "pipelined", "fused", "dedup", "fused_dedup")
"""`unfused`: torch's all_to_all_single, then one grouped GEMM (or the GEMM, then the all-to-all).
`pipelined`: the all-to-all cut into pieces, one grouped GEMM a piece, each starting as soon as its
rows are in (dispatch) or each piece sent as soon as its GEMM is done (combine). `fused`: the same
pieces, and one persistent Triton grouped GEMM a call whose tiles wait for their piece's rows
(dispatch) or store their rows straight into the destination rank's buffer (combine). `dedup`: as
`unfused`, but a token's row crosses to a rank once however many of its experts are there (the
rank reads it once per expert; the combine sums a token's rows on the expert's rank, weighted by
its gates, before they go back): on `nccl` by torch's all-to-all, on `copy_engine` in one piece a
source rank, overlapped with the grouped GEMMs as `pipelined` is. `fused_dedup`: the dispatch of
`fused` on `dedup`'s rows (the kernel reads each landed row once for each of its experts), the
combine `dedup`'s on the copy engine (a token's rows are summed before they leave, which a tile
cannot do)."""

FUSED_TEMPLATES: tuple[str, ...] = ("fused", "fused_dedup")
"""The templates that run a persistent Triton grouped GEMM of their own, which the tile fields
configure."""

MOE_BACKENDS: tuple[str, ...] = ("nccl", "copy_engine", "nvshmem")
"""How a plan's pieces move: NCCL (or gloo) send/receive pairs on a side stream; or the symmetric
buffers of every rank, written by copy-engine copies (and, in the `fused` combine, by the GEMM's
own stores), each piece signalled in the receiver's pad (CUDA only); or the same buffers written
by `comm_sms` programs of an NVSHMEM copier (block puts, the signal an NVSHMEM put), in a process
whose symmetric memory is NVSHMEM's (`syncopate.use_nvshmem()`; CUDA only, `pipelined` only)."""

MOE_DEFAULT_BACKENDS: tuple[str, ...] = ("nccl", "copy_engine")
"""The backends a MoE search tries unless told: `nvshmem` is an opt-in of the process, as it is
for the dense kinds, so a sweep names it."""

MOE_COMM_SMS: tuple[int, ...] = (8, 16, 32, 64)
"""Programs of the `nvshmem` backend's copier (`comm_sms`), each on an SM beside the GEMMs."""

MOE_COMM_SMS_DEFAULT = 16
"""`comm_sms` of a candidate that does not name it; the only value of the other backends, which
spend no program of their own, and left out of their JSON."""

MOE_BLOCKS: tuple[int, ...] = (16, 32, 64, 128, 256)
"""Tile sizes a `fused` candidate's block_m, block_n and block_k take."""

MOE_WARPS: tuple[int, ...] = (2, 4, 8)
MOE_STAGES: tuple[int, ...] = (1, 2, 3, 4, 5)

MOE_TILE_DEFAULTS: dict[str, int] = {
    "block_m": 64,
    "block_n": 128,
    "block_k": 64,
    "num_warps": 4,
    "num_stages": 3,
}
"""The Triton tile fields of a `fused` candidate and their defaults; the other templates keep them at
these values and leave them out of their JSON (so their keys do not depend on them)."""

MOE_TILE_CONFIGS: tuple[dict[str, int], ...] = (
    MOE_TILE_DEFAULTS,
    {"block_m": 128, "block_n": 128, "block_k": 64, "num_warps": 8, "num_stages": 4},
    {"block_m": 128, "block_n": 256, "block_k": 64, "num_warps": 8, "num_stages": 4},
    {"block_m": 128, "block_n": 256, "block_k": 32, "num_warps": 8, "num_stages": 5},
)
"""The tile configurations `moe_space` tries for `fused`: wider tiles do more of a tile's work a
load, and 4 to 5 stages of loads in flight keep the tensor cores fed (the kernels load through
pointers, so their pipeline depth is what hides the loads' latency; 3 stages left the 128×256
tiles slower on every expert layer of configs/moe_ep.yaml)."""

MOE_ORDERS: tuple[str, ...] = ("ring", "pairwise")
"""The peers of a pipelined plan's exchanges, step s = 1 … ws-1 after the rank's own rows: `ring`
(rank r sends to r+s and receives from r-s: every rank sends on one link and receives on another
at each step) or `pairwise` (r exchanges with r xor s both ways: each step is ws/2 two-way pairs;
a power-of-two world size only)."""

MOE_CHUNKS: tuple[int, ...] = (1, 2, 4, 8)
"""Pieces a peer's rows are cut into (`chunks_per_source`)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class MoeCandidate(CanonicalJson):
    """One configuration of the MoE ops (`a2a_gemm`, `gemm_a2a`): a frozen value that checks
    itself, round-trips through JSON and has a stable `key()`, as
    :class:`~syncopate.search_space.candidate.Candidate` does for the other kinds."""

    template: str = "unfused"
    """One of :data:`MOE_TEMPLATES`."""
    backend: str = "nccl"
    """One of :data:`MOE_BACKENDS`; `unfused` takes `nccl` (torch's collective)."""
    chunks_per_source: int = 1
    """Pieces each peer's rows are cut into, one of :data:`MOE_CHUNKS`; 1 for `unfused`."""
    order: str = "ring"
    """The peers' order, one of :data:`MOE_ORDERS`; `ring` for `unfused`."""
    block_m: int = 64
    """`fused`: rows of an output tile (within one expert's rows of one piece), one of :data:`MOE_BLOCKS`."""
    block_n: int = 128
    """`fused`: columns of an output tile, one of :data:`MOE_BLOCKS`."""
    block_k: int = 64
    """`fused`: the reduction step, one of :data:`MOE_BLOCKS`."""
    num_warps: int = 4
    """`fused`: warps a program, one of :data:`MOE_WARPS`."""
    num_stages: int = 3
    """`fused`: software-pipeline stages of the reduction loop, one of :data:`MOE_STAGES`."""
    comm_sms: int = MOE_COMM_SMS_DEFAULT
    """`nvshmem`: the copier's programs, one of :data:`MOE_COMM_SMS`."""

    def __post_init__(self) -> None:
        if self.template not in MOE_TEMPLATES:
            raise ConfigError(
                f"unknown MoE template {self.template!r}: accepted are {', '.join(MOE_TEMPLATES)}"
            )
        if self.backend not in MOE_BACKENDS:
            raise ConfigError(f"unknown MoE backend {self.backend!r}: accepted are {', '.join(MOE_BACKENDS)}")
        if self.order not in MOE_ORDERS:
            raise ConfigError(f"unknown MoE piece order {self.order!r}: accepted are {', '.join(MOE_ORDERS)}")
        c = self.chunks_per_source
        if isinstance(c, bool) or not isinstance(c, int) or c not in MOE_CHUNKS:
            raise ConfigError(
                f"chunks_per_source={c!r} is not accepted: give one of {', '.join(map(str, MOE_CHUNKS))}"
            )
        if self.template == "unfused" and (self.backend, c, self.order) != ("nccl", 1, "ring"):
            raise ConfigError(
                f"template unfused runs torch's all_to_all_single and one grouped GEMM: it takes backend "
                f"'nccl', chunks_per_source=1 and order 'ring', got backend {self.backend!r}, "
                f"chunks_per_source={c} and order {self.order!r}"
            )
        if self.template == "dedup" and self.backend == "nccl" and (c, self.order) != (1, "ring"):
            raise ConfigError(
                f"template dedup on backend 'nccl' runs torch's all_to_all_single and one grouped GEMM: it "
                f"takes chunks_per_source=1 and order 'ring', got chunks_per_source={c} and order "
                f"{self.order!r} (backend 'copy_engine' pipelines it by source rank, in either order)"
            )
        if self.template in ("dedup", "fused_dedup") and c != 1:
            raise ConfigError(
                f"template {self.template} moves one piece a source rank (a token's rows there are summed in "
                f"one place): it takes chunks_per_source=1, got {c}"
            )
        self._check_comm_sms()
        self._check_tiles()

    def _check_comm_sms(self) -> None:
        n = self.comm_sms
        if self.backend != "nvshmem":
            if n != MOE_COMM_SMS_DEFAULT:
                raise ConfigError(
                    f"comm_sms={n!r} applies to backend 'nvshmem' only (its copier's programs); backend "
                    f"{self.backend!r} spends no program on communication: leave comm_sms at its default"
                )
            return
        if self.template != "pipelined":
            raise ConfigError(
                f"backend nvshmem moves the pieces of template 'pipelined' only, got template "
                f"{self.template!r}; use template 'pipelined' (or backend 'copy_engine' for 'fused')"
            )
        if isinstance(n, bool) or not isinstance(n, int) or n not in MOE_COMM_SMS:
            raise ConfigError(
                f"comm_sms={n!r} is not accepted for backend nvshmem: give one of {', '.join(map(str, MOE_COMM_SMS))}"
            )

    def _check_tiles(self) -> None:
        tiles = {name: getattr(self, name) for name in MOE_TILE_DEFAULTS}
        if self.template not in FUSED_TEMPLATES:
            changed = {k: v for k, v in tiles.items() if v != MOE_TILE_DEFAULTS[k]}
            if changed:
                given = ", ".join(f"{k}={v!r}" for k, v in changed.items())
                raise ConfigError(
                    f"template {self.template} runs no Triton kernel of its own: {given} applies to "
                    "templates 'fused' and 'fused_dedup' only; leave the tile fields at their defaults"
                )
            return
        if self.backend != "copy_engine":
            raise ConfigError(
                f"template {self.template} moves its pieces through the symmetric buffers of backend "
                f"'copy_engine', got backend {self.backend!r}; use backend 'copy_engine' (or template "
                f"'pipelined' for 'nccl')"
            )
        for name, accepted in (
            ("block_m", MOE_BLOCKS),
            ("block_n", MOE_BLOCKS),
            ("block_k", MOE_BLOCKS),
            ("num_warps", MOE_WARPS),
            ("num_stages", MOE_STAGES),
        ):
            v = tiles[name]
            if isinstance(v, bool) or not isinstance(v, int) or v not in accepted:
                raise ConfigError(
                    f"{name}={v!r} is not accepted for template {self.template}: give one of "
                    f"{', '.join(map(str, accepted))}"
                )

    def to_dict(self) -> dict[str, Any]:
        """The fields; the tile fields only for `fused` and `fused_dedup` (the other templates have
        none), `comm_sms` only for `nvshmem`."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        if self.template not in FUSED_TEMPLATES:
            for name in MOE_TILE_DEFAULTS:
                del d[name]
        if self.backend != "nvshmem":
            del d["comm_sms"]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MoeCandidate:
        if not isinstance(d, dict):
            raise ConfigError(f"a MoE candidate is a mapping, got {describe(d)}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(
                f"unknown MoE candidate field(s) {', '.join(unknown)}: accepted are {', '.join(sorted(known))}"
            )
        return cls(**d)

    @classmethod
    def from_json(cls, text: str) -> MoeCandidate:
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"MoE candidate JSON does not parse: {e}") from None
        return cls.from_dict(d)

    def replace(self, **changes: Any) -> MoeCandidate:
        return MoeCandidate.from_dict({**self.to_dict(), **changes})

    def short(self) -> str:
        """A one-line summary for tables."""
        if self.template == "unfused" or (self.template == "dedup" and self.backend == "nccl"):
            return self.template
        if self.template == "dedup":
            return f"dedup/{self.backend}/{self.order}"
        if self.template == "fused_dedup":
            tiles = f"{self.block_m}x{self.block_n}x{self.block_k}w{self.num_warps}s{self.num_stages}"
            return f"fused_dedup/{self.backend}/{self.order}/{tiles}"
        plan = f"{self.template}/{self.backend}/c{self.chunks_per_source}/{self.order}"
        if self.backend == "nvshmem":
            plan += f"/sm{self.comm_sms}"
        if self.template in FUSED_TEMPLATES:
            plan += f"/{self.block_m}x{self.block_n}x{self.block_k}w{self.num_warps}s{self.num_stages}"
        return plan

    def as_pipelined(self) -> MoeCandidate:
        """The `pipelined` candidate with this one's backend, chunks and order (a `fused` op's
        backward runs it)."""
        return MoeCandidate(
            template="pipelined",
            backend=self.backend,
            chunks_per_source=self.chunks_per_source,
            order=self.order,
            comm_sms=self.comm_sms,
        )


def check_moe_candidate(candidate: MoeCandidate, world_size: int) -> None:
    """Raise ConfigError unless `candidate` can run on `world_size` ranks: `pairwise` pairs rank r
    with r xor s, which is a rank of the group only where ws is a power of two."""
    ws = world_size
    if candidate.order == "pairwise" and (ws < 1 or ws & (ws - 1)):
        raise ConfigError(
            f"order 'pairwise' exchanges rank r's rows with rank r xor s: it needs a power-of-two world "
            f"size, got {ws}; use order 'ring'"
        )


def moe_guards() -> dict[str, MoeCandidate]:
    """The references a MoE sweep measures first and a served configuration is never slower than,
    by name: `unfused` (torch's all_to_all_single and one grouped GEMM). The dense kinds' `default`
    has no MoE counterpart: `unfused` is the path `MoELayer` runs without a configuration."""
    return {"unfused": MoeCandidate()}


def moe_space(
    workload: MoeWorkload,
    world_size: int,
    *,
    backends: tuple[str, ...] = MOE_DEFAULT_BACKENDS,
    chunks: tuple[int, ...] = (1, 2, 4),
    comm_sms: tuple[int, ...] = (16, 32),
) -> list[MoeCandidate]:
    """The candidates a search tries for `workload` on `world_size` ranks: `unfused` first (the
    path a served configuration must beat), `dedup` where `nccl` is among the backends (torch's
    all-to-all moves its rows too), then `pipelined` for each backend, chunk count and
    order (and, for `nvshmem`, each of `comm_sms`), then, where `copy_engine` is among the
    backends, `dedup` on it for each order, `fused` for each chunk count, order and tile
    configuration and, for the dispatch, `fused_dedup` for each order and tile configuration of
    :data:`MOE_TILE_CONFIGS`. `pairwise` only where it differs from `ring` (more than two ranks)
    and is possible (a power of two); chunk counts above the rows a source sends a rank on average
    (T·top_k/ws) are left out, since their pieces would mostly be empty."""
    workload.check_world_size(world_size)
    for b in backends:
        if b not in MOE_BACKENDS:
            raise ConfigError(
                f"unknown MoE backend {b!r} in backends: accepted are {', '.join(MOE_BACKENDS)}"
            )
    for c in chunks:
        if c not in MOE_CHUNKS:
            raise ConfigError(
                f"chunks_per_source={c!r} in chunks is not accepted: give values of {', '.join(map(str, MOE_CHUNKS))}"
            )
    for n in comm_sms:
        if n not in MOE_COMM_SMS:
            raise ConfigError(
                f"comm_sms={n!r} in comm_sms is not accepted: give values of {', '.join(map(str, MOE_COMM_SMS))}"
            )
    ws = world_size
    orders = ["ring"] + (["pairwise"] if ws > 2 and not ws & (ws - 1) else [])
    rows = max(1, workload.tokens * workload.top_k // ws)
    out = [MoeCandidate()]
    if "nccl" in backends:
        out.append(MoeCandidate(template="dedup"))
    for backend in backends:
        for c in chunks:
            if c > 1 and c > rows:
                continue
            for order in orders:
                for n in comm_sms if backend == "nvshmem" else (MOE_COMM_SMS_DEFAULT,):
                    out.append(
                        MoeCandidate(
                            template="pipelined",
                            backend=backend,
                            chunks_per_source=c,
                            order=order,
                            comm_sms=n,
                        )
                    )
    if "copy_engine" in backends:
        out.extend(MoeCandidate(template="dedup", backend="copy_engine", order=o) for o in orders)
        for c in chunks:
            if c > 1 and c > rows:
                continue
            for order in orders:
                for tiles in MOE_TILE_CONFIGS:
                    out.append(
                        MoeCandidate(
                            template="fused", backend="copy_engine", chunks_per_source=c, order=order, **tiles
                        )
                    )
        if workload.kind == "a2a_gemm":  # the combine of fused_dedup is dedup's, tried above
            for order in orders:
                for tiles in MOE_TILE_CONFIGS:
                    out.append(
                        MoeCandidate(template="fused_dedup", backend="copy_engine", order=order, **tiles)
                    )
    return out
