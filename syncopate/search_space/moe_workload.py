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

These kinds are not in :data:`~syncopate.search_space.workload.KINDS`: they run unfused only
(`syncopate.moe`), and tuning, lookup and the results database do not take them yet.

Pure Python: nothing here imports torch.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

from syncopate.errors import ConfigError
from syncopate.search_space.workload import DTYPES, MAX_DIM, MOE_KINDS, canonical_dtype

__all__ = ["DISTRIBUTIONS", "MOE_KINDS", "MoeWorkload", "RoutingSpec"]

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

    def __str__(self) -> str:
        return (
            f"{self.kind} T={self.tokens} H={self.hidden} F={self.ffn} E={self.experts} "
            f"top{self.top_k} {self.routing.key()} {self.dtype}"
        )
