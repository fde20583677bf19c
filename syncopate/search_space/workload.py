"""Workloads: an op kind, global GEMM dims and a dtype, with the sharding rule of each kind.

| kind      | each rank holds                  | communication                       | each rank returns |
|-----------|----------------------------------|-------------------------------------|-------------------|
| `ag_gemm` | A[M/ws, K], B[K, N/ws]           | A all-gathered along M              | out[M, N/ws]      |
| `gemm_rs` | A[M, K/ws], B[K/ws, N]           | partial out reduce-scattered on M   | out[M/ws, N]      |
| `gemm_ar` | A[M, K/ws], B[K/ws, N]           | partial out all-reduced             | out[M, N]         |

Dtype `fp8` is float8 e4m3 operands with float32 scales and a bf16 output: an all-gather moves A's
FP8 rows (1 byte an element) and their scales, a reduce-scatter or all-reduce moves bf16 partials
(each rank's partial dequantized by its own scales before the reduction).

Pure Python: nothing here imports torch.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

from syncopate.errors import ConfigError

__all__ = [
    "KINDS",
    "MOE_KINDS",
    "DTYPES",
    "FP8",
    "MAX_DIM",
    "MAX_ELEMENTS",
    "Shape",
    "Workload",
    "canonical_dtype",
    "dtype_bytes",
    "kind_refusal",
    "output_dtype",
]

KINDS: tuple[str, ...] = ("ag_gemm", "gemm_rs", "gemm_ar")
"""Op kinds Syncopate tunes."""

MOE_KINDS: tuple[str, ...] = ("a2a_gemm", "gemm_a2a")
"""The mixture-of-experts kinds (`syncopate.search_space.moe_workload`): run by `syncopate.moe`; their
workloads are no GEMM shape, so they are tuned from a sweep's `moe:` section and looked up by
`syncopate.moe.lookup_moe`."""

DTYPES: dict[str, int] = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1}
"""Canonical dtype names and the size in bytes of an operand's element."""

FP8 = "fp8"
"""float8 e4m3 operands with float32 scales, bf16 output (`torch._scaled_mm`'s conventions)."""

_OUTPUT_DTYPES: dict[str, str] = {"fp8": "bf16"}
"""The output dtype of a dtype whose output is not its operands' (the others: their own)."""

MAX_DIM = 1 << 20
"""The largest global M, N or K Syncopate tunes (1048576)."""
MAX_ELEMENTS = 1 << 34
"""The most elements of A, B or the output (32 GiB in bf16, before sharding)."""

_DTYPE_ALIASES: dict[str, str] = {
    "bf16": "bf16",
    "bfloat16": "bf16",
    "torch.bfloat16": "bf16",
    "fp16": "fp16",
    "float16": "fp16",
    "half": "fp16",
    "torch.float16": "fp16",
    "torch.half": "fp16",
    "fp32": "fp32",
    "float32": "fp32",
    "float": "fp32",
    "torch.float32": "fp32",
    "torch.float": "fp32",
    "fp8": "fp8",
    "float8_e4m3fn": "fp8",
    "torch.float8_e4m3fn": "fp8",
}


def canonical_dtype(dtype: Any) -> str:
    """Return the canonical name (`bf16`, `fp16`, `fp32`, `fp8`) of a dtype name or a torch dtype."""
    name = str(dtype).strip().lower()
    try:
        return _DTYPE_ALIASES[name]
    except KeyError:
        raise ConfigError(
            f"unknown dtype {dtype!r}: accepted are {', '.join(DTYPES)} "
            f"(or bfloat16, float16, float32, float8_e4m3fn, or the torch dtypes)"
        ) from None


def dtype_bytes(dtype: str) -> int:
    """Size in bytes of one operand element of the canonical dtype `dtype`."""
    return DTYPES[canonical_dtype(dtype)]


def output_dtype(dtype: str) -> str:
    """The canonical dtype of the output (and of reduced partials) of operands in `dtype`."""
    name = canonical_dtype(dtype)
    return _OUTPUT_DTYPES.get(name, name)


def kind_refusal(kind: str) -> str:
    """The message that refuses `kind` where a tuned kind (:data:`KINDS`) is needed."""
    if kind in MOE_KINDS:
        return (
            f"kind {kind!r} is a mixture-of-experts op, run by syncopate.moe (docs/moe.md), whose "
            f"workload is a layer, not a GEMM shape: tune it from a sweep's `moe:` section and look it "
            f"up with syncopate.moe.lookup_moe; accepted here are {', '.join(KINDS)}"
        )
    return f"unknown kind {kind!r}: accepted are {', '.join(KINDS)}"


def _check_kind(kind: str) -> str:
    if kind not in KINDS:
        raise ConfigError(kind_refusal(kind))
    return kind


@dataclass(frozen=True, kw_only=True, slots=True)
class Shape:
    """Global GEMM dims: out[M, N] = A[M, K] @ B[K, N], before any sharding."""

    m: int
    """Rows of A and of the output (tokens)."""
    n: int
    """Columns of B and of the output."""
    k: int
    """The reduction dim."""

    def __post_init__(self) -> None:
        for name in ("m", "n", "k"):
            value = getattr(self, name)
            try:
                if isinstance(value, bool):
                    raise TypeError
                value = operator.index(value)  # numpy's integers too
            except TypeError:
                raise ConfigError(f"shape dim {name.upper()}={value!r} must be an integer") from None
            if value <= 0:
                raise ConfigError(f"shape dim {name.upper()}={value} must be positive")
            if value > MAX_DIM:
                raise ConfigError(
                    f"shape dim {name.upper()}={value} is larger than {MAX_DIM}, the largest accepted"
                )
            object.__setattr__(self, name, value)
        for label, rows, cols in (
            ("A", self.m, self.k),
            ("B", self.k, self.n),
            ("the output", self.m, self.n),
        ):
            if rows * cols > MAX_ELEMENTS:
                raise ConfigError(
                    f"shape (M={self.m}, N={self.n}, K={self.k}): {label} would have {rows * cols} elements, "
                    f"more than {MAX_ELEMENTS} (2^34), the most accepted"
                )

    @classmethod
    def of(cls, value: Shape | tuple[int, int, int] | list[int] | dict[str, int]) -> Shape:
        """Build a shape from a `Shape`, three integers `(M, N, K)` in any sequence (tuple, list,
        torch.Size, numpy array), or a dict with keys m, n, k."""
        if isinstance(value, Shape):
            return value
        if isinstance(value, dict):
            try:
                return cls(m=value["m"], n=value["n"], k=value["k"])
            except KeyError as e:
                raise ConfigError(f"shape {value!r} lacks key {e.args[0]!r}: give m, n and k") from None
        if not isinstance(value, (str, bytes)) and hasattr(value, "__iter__"):
            dims = list(value)  # a tuple, a list, torch.Size, a numpy array
            if len(dims) == 3:
                return cls(m=dims[0], n=dims[1], k=dims[2])
        raise ConfigError(f"shape {value!r} is not understood: give (M, N, K) or a Shape")

    def as_tuple(self) -> tuple[int, int, int]:
        return (self.m, self.n, self.k)

    def key(self) -> str:
        return f"{self.m}x{self.n}x{self.k}"

    @classmethod
    def from_key(cls, key: str) -> Shape:
        parts = key.lower().split("x")
        try:
            m, n, k = (int(p) for p in parts)
        except ValueError:
            raise ConfigError(
                f"shape key {key!r} does not parse: expected MxNxK such as 8192x4096x8192"
            ) from None
        return cls(m=m, n=n, k=k)

    def __str__(self) -> str:
        return f"(M={self.m}, N={self.n}, K={self.k})"


@dataclass(frozen=True, kw_only=True, slots=True)
class Workload:
    """An op kind applied to a global shape in one dtype."""

    kind: str
    """One of :data:`KINDS`."""
    shape: Shape
    """Global GEMM dims."""
    dtype: str = "bf16"
    """Element type of A and B, canonicalised to `bf16`, `fp16`, `fp32` or `fp8` (whose output is
    bf16; the others' is their own)."""

    def __post_init__(self) -> None:
        _check_kind(self.kind)
        object.__setattr__(self, "shape", Shape.of(self.shape))
        object.__setattr__(self, "dtype", canonical_dtype(self.dtype))

    @property
    def flops(self) -> int:
        """Floating-point operations of the whole (unsharded) GEMM."""
        return 2 * self.shape.m * self.shape.n * self.shape.k

    @property
    def element_bytes(self) -> int:
        """Bytes of one element of A or B."""
        return DTYPES[self.dtype]

    @property
    def output_bytes(self) -> int:
        """Bytes of one element of the output and of the partials a reduction moves."""
        return DTYPES[output_dtype(self.dtype)]

    @property
    def scaled(self) -> bool:
        """Whether the operands carry scales (`fp8`)."""
        return self.dtype == FP8

    def check_world_size(self, world_size: int) -> None:
        """Raise ConfigError unless the dims this kind shards divide by `world_size`."""
        if world_size < 1:
            raise ConfigError(f"world size {world_size} must be at least 1")
        s = self.shape
        sharded = {"ag_gemm": ("m", "n"), "gemm_rs": ("m", "k"), "gemm_ar": ("k",)}[self.kind]
        for dim in sharded:
            value = getattr(s, dim)
            if value % world_size:
                raise ConfigError(
                    f"{self.kind} shards {dim.upper()}: {dim.upper()}={value} is not divisible by "
                    f"world size {world_size}"
                )

    def local_shapes(self, world_size: int) -> dict[str, tuple[int, int]]:
        """Per-rank shapes of `a`, `b` and `out` under this kind's sharding."""
        self.check_world_size(world_size)
        m, n, k, ws = self.shape.m, self.shape.n, self.shape.k, world_size
        if self.kind == "ag_gemm":
            return {"a": (m // ws, k), "b": (k, n // ws), "out": (m, n // ws)}
        if self.kind == "gemm_rs":
            return {"a": (m, k // ws), "b": (k // ws, n), "out": (m // ws, n)}
        return {"a": (m, k // ws), "b": (k // ws, n), "out": (m, n)}

    def local_gemm(self, world_size: int) -> tuple[int, int, int]:
        """(M, N, K) of the GEMM each rank computes."""
        self.check_world_size(world_size)
        m, n, k, ws = self.shape.m, self.shape.n, self.shape.k, world_size
        if self.kind == "ag_gemm":
            return (m, n // ws, k)
        return (m, n, k // ws)

    def comm_row_bytes(self) -> int:
        """Bytes of one row of the communicated tensor: A's row for ag_gemm (with an fp8 A, its FP8
        bytes and its float32 scale), the partial output's otherwise (bf16 for fp8)."""
        if self.kind == "ag_gemm":
            return self.shape.k * self.element_bytes + (4 if self.scaled else 0)
        return self.shape.n * self.output_bytes

    def key(self) -> str:
        return f"{self.kind}/{self.shape.key()}/{self.dtype}"

    @classmethod
    def from_key(cls, key: str) -> Workload:
        parts = key.split("/")
        if len(parts) != 3:
            raise ConfigError(f"workload key {key!r} does not parse: expected KIND/MxNxK/DTYPE")
        return cls(kind=parts[0], shape=Shape.from_key(parts[1]), dtype=parts[2])

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "m": self.shape.m,
            "n": self.shape.n,
            "k": self.shape.k,
            "dtype": self.dtype,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Workload:
        return cls(kind=d["kind"], shape=Shape(m=d["m"], n=d["n"], k=d["k"]), dtype=d.get("dtype", "bf16"))

    def __str__(self) -> str:
        return f"{self.kind} {self.shape} {self.dtype}"
