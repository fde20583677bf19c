"""The candidate configuration: one point of the search space.

A candidate is a frozen value that checks itself, round-trips through JSON and has a stable hash
(its `key()`), used by the database and the caches. Rules that depend on the workload or the
hardware (shared memory, SM budget, divisibility) are in :mod:`syncopate.search_space.space`.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from syncopate.errors import ConfigError, describe
from syncopate.search_space.chunk_plan import CANDIDATE_TEMPLATES, PLANLESS_KINDS, UNFUSED
from syncopate.search_space.tile_order import TILE_ORDERS

__all__ = [
    "BACKENDS",
    "BACKEND_NAMES",
    "COPIER_BACKENDS",
    "DEFAULT_BACKENDS",
    "KERNELS",
    "NCCL_CAPTURE_SETTING",
    "RENAMED_BACKENDS",
    "CanonicalJson",
    "Candidate",
    "nccl_chunks_replay",
    "stored_backend",
    "unknown_backend",
]

NCCL_CAPTURE_SETTING = ("NCCL_GRAPH_REGISTER", "0")
"""The environment setting under which the `nccl` backend's chunk plans replay from a CUDA graph:
NCCL's registration of a captured send's or receive's buffer off. With it on, a graph of two calls
of one chunk plan stalls in its first replay (on H100s, NCCL 2.28)."""


def nccl_chunks_replay(env: Mapping[str, str] | None = None) -> bool:
    """Whether this process's NCCL replays the `nccl` backend's chunk plans from a CUDA graph:
    `NCCL_CAPTURE_SETTING` in `env` (default: the process's environment, which NCCL reads when it
    starts, so it must be set before the job's first collective)."""
    name, value = NCCL_CAPTURE_SETTING
    return (os.environ if env is None else env).get(name) == value


BACKENDS: tuple[str, ...] = ("copy_engine", "sm_copy", "nvshmem", "nccl")
"""How chunks move: copy-engine copies on a side stream; SM copies (`sm_copy`: stores into the
peers' IPC-mapped symmetric memory by `comm_sms` programs of a Triton chunk-copy kernel, which raise
the receivers' signal words from GPU threads); NVSHMEM transfers (`nvshmem`: the same job lists,
moved by `comm_sms` programs with NVSHMEM puts and gets, in a process whose symmetric memory is
NVSHMEM's: `syncopate.use_nvshmem()`); chunked NCCL transfers on a side stream."""

DEFAULT_BACKENDS: tuple[str, ...] = ("copy_engine", "sm_copy", "nccl")
"""The backends searched and benchmarked unless a config or `--backends` names others: `nvshmem`
only runs in a process that opted into NVSHMEM symmetric memory, where torch async-TP (a baseline
of every run) does not."""

COPIER_BACKENDS: tuple[str, ...] = ("sm_copy", "nvshmem")
"""Backends whose communication is one job list per rank run by `comm_sms` programs of a copier
kernel (same plans, waits and signals; only how a job's bytes move differs)."""

RENAMED_BACKENDS: dict[str, tuple[str, str]] = {
    "nvshmem": ("sm_copy", "this backend stores chunks with SM copies; no NVSHMEM is used"),
}
"""Earlier names of backends in what was stored before a rename: old name → (new name, why).
`nvshmem` named `sm_copy` until migration 0003; the name now belongs to the real NVSHMEM backend,
so only data stored before the rename reads it as `sm_copy` (:func:`stored_backend` with
`renamed=True`): rows of a database at a revision before 0003, which rewrote them, export files
before version 3 and `syncopate bench` files without `backend_names` (never rewritten)."""


KERNELS: tuple[str, ...] = ("triton", "gluon")
"""The code a fused candidate's GEMM runs: `triton`, the Triton kernels (every GPU, the
interpreter), or `gluon`, the Gluon kernels (Hopper only: the pipeline written out across tiles,
the partials' loads issued ahead of the epilogue). The cuBLAS templates run neither."""

GLUON_TILE_RULE = (
    "a gluon candidate takes 64, 128 or 256 rows a tile, 4 or 8 warps with at least 16 rows each, "
    "and 2 stages or more"
)
"""What the Gluon kernels' wgmma layout and operand ring take of a tile configuration."""


def gluon_tile_ok(block_m: int, num_warps: int, num_stages: int) -> bool:
    """Whether the Gluon kernels take a tile of `block_m` rows, `num_warps` warps, `num_stages`
    operand buffers (:data:`GLUON_TILE_RULE`)."""
    return block_m in (64, 128, 256) and num_warps in (4, 8) and block_m >= 16 * num_warps and num_stages >= 2


def gluon_refusal_of(
    block_m: int, block_k: int, num_warps: int, num_stages: int, k: int, element_bytes: int
) -> str | None:
    """Why the Gluon kernels cannot compute tiles of this configuration over a local K of `k` with
    operands of `element_bytes` (None where they can): 16-bit or FP8 operands (FP8 in the producer
    only: `space.gluon_refusal` says so for an all-gather), :data:`GLUON_TILE_RULE`, and K of at
    least the num_stages - 1 steps their operand ring loads ahead. What the search space
    (`space.gluon_refusal`) and a launch (`launch._gluon_fits`) both ask."""
    if element_bytes not in (1, 2):
        return f"the Gluon kernels take bf16, fp16 and fp8 operands, not {element_bytes}-byte elements"
    if not gluon_tile_ok(block_m, num_warps, num_stages):
        return (
            f"the Gluon kernels do not take {block_m} rows, {num_warps} warps, {num_stages} stages: "
            f"{GLUON_TILE_RULE}"
        )
    if -(-k // block_k) < num_stages - 1:
        return f"K={k} is shorter than the {num_stages - 1} steps of {block_k} the Gluon kernels load ahead"
    return None


BACKEND_NAMES = 2
"""What `syncopate bench` files say (`"backend_names": 2`) to be read with the current names;
a file without it was written before the rename (:data:`RENAMED_BACKENDS`)."""


def unknown_backend(name: object, where: str = "") -> str:
    """The message refusing backend `name`, not one of :data:`BACKENDS`; `where` (such as
    `" in space.backends"`) says where it was given."""
    return f"unknown backend {name!r}{where}: accepted are {', '.join(BACKENDS)}"


def stored_backend(name: Any, *, renamed: bool) -> Any:
    """The backend that stored data names, by its current name. `renamed`: the data was stored
    before the rename (see :data:`RENAMED_BACKENDS`), so an earlier name reads as the new one, the
    backend that ran; otherwise, and for any other name, `name` as it is, for :class:`Candidate`
    to check."""
    new = RENAMED_BACKENDS.get(name) if renamed and isinstance(name, str) else None
    return name if new is None else new[0]


def check_pow2(name: str, value: Any, what: str) -> None:
    """Raise ConfigError unless `value` is a power of two in the range a candidate's field `name`
    accepts (block_m, block_n, block_k, group_m, num_warps); `what` names it in the message."""
    lo, hi = _POW2[name]
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi or value & (value - 1):
        raise ConfigError(f"{what}={value!r} must be a power of two in [{lo}, {hi}]")


_POW2 = {
    "block_m": (16, 256),
    "block_n": (16, 256),
    "block_k": (16, 256),
    "group_m": (1, 64),
    "num_warps": (1, 16),
}


class CanonicalJson:
    """A frozen config's fields as a dict, their canonical JSON, and the stable key hashed from it
    (what the results database and the caches know a config by)."""

    __slots__ = ()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        """Canonical JSON: sorted keys, no spaces; the input of :meth:`key`."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    def key(self) -> str:
        """Stable hash: the first 16 hex digits of SHA-256 over the canonical JSON."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:16]


@dataclass(frozen=True, kw_only=True, slots=True)
class Candidate(CanonicalJson):
    """Backend, chunk plan, tile order and tile configuration of one fused-kernel launch."""

    backend: str = "copy_engine"
    """One of :data:`BACKENDS`."""
    template: str = "direct"
    """Chunk-plan template, one of :data:`~syncopate.search_space.chunk_plan.TEMPLATES`, or one with
    no chunk plan (:data:`~syncopate.search_space.chunk_plan.PLANLESS_KINDS`): `a_stationary`,
    `c_stationary`, `unfused` (the matmul, then the whole collective; backend `nccl`, comm_sms 0)."""
    num_splits: int = 1
    """Chunks per rank's block."""
    tile_order: str = "arrival"
    """One of :data:`~syncopate.search_space.tile_order.TILE_ORDERS`."""
    comm_sms: int = 0
    """SMs given to communication: the communication programs (`sm_copy`, `nvshmem`), the SMs left free for
    NCCL's kernels (`nccl`); always 0 for `copy_engine`, which spends no SM."""
    block_m: int = 128
    """Output tile rows."""
    block_n: int = 128
    """Output tile columns."""
    block_k: int = 64
    """Reduction step."""
    group_m: int = 8
    """m-tiles that walk one column block together (L2 swizzle)."""
    num_warps: int = 8
    """Warps per program."""
    num_stages: int = 3
    """Software-pipelining depth of the K loop."""
    kernel: str = "triton"
    """One of :data:`KERNELS`. Left out of :meth:`to_dict` (so of the JSON and the key) where it is
    `triton`: a candidate stored before the field existed keeps its key."""

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ConfigError(unknown_backend(self.backend))
        if self.template not in CANDIDATE_TEMPLATES:
            raise ConfigError(
                f"unknown plan template {self.template!r}: accepted are {', '.join(CANDIDATE_TEMPLATES)}"
            )
        if self.tile_order not in TILE_ORDERS:
            raise ConfigError(
                f"unknown tile order {self.tile_order!r}: accepted are {', '.join(TILE_ORDERS)}"
            )
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type in ("int", int) and (isinstance(value, bool) or not isinstance(value, int)):
                raise ConfigError(f"candidate field {f.name}={value!r} must be an integer")
        for name in _POW2:
            check_pow2(name, getattr(self, name), f"candidate field {name}")
        if not 1 <= self.num_splits <= 64:
            raise ConfigError(f"candidate field num_splits={self.num_splits} must be in [1, 64]")
        if not 1 <= self.num_stages <= 8:
            raise ConfigError(f"candidate field num_stages={self.num_stages} must be in [1, 8]")
        if self.kernel not in KERNELS:
            raise ConfigError(f"unknown kernel {self.kernel!r}: accepted are {', '.join(KERNELS)}")
        if self.kernel == "gluon":
            if self.template in PLANLESS_KINDS:
                raise ConfigError(
                    f"template {self.template} runs cuBLAS, not a fused kernel: its kernel is 'triton' "
                    f"(the default), not 'gluon'"
                )
            if not gluon_tile_ok(self.block_m, self.num_warps, self.num_stages):
                raise ConfigError(
                    f"{GLUON_TILE_RULE}; got block_m={self.block_m}, num_warps={self.num_warps}, "
                    f"num_stages={self.num_stages}"
                )
        if self.template == "bidirectional_ring" and self.num_splits < 2:
            raise ConfigError(
                f"template bidirectional_ring needs num_splits >= 2 (got {self.num_splits}): half of "
                f"the chunks go each way round"
            )
        if self.backend == "copy_engine" and self.comm_sms != 0:
            raise ConfigError(f"backend copy_engine spends no SM: comm_sms must be 0, got {self.comm_sms}")
        if self.template == UNFUSED:
            if self.backend != "nccl" or self.comm_sms != 0:
                raise ConfigError(
                    f"template unfused runs the group's collective after the matmul: it takes backend "
                    f"'nccl' with comm_sms=0, got {self.backend!r} with comm_sms={self.comm_sms}"
                )
        elif self.backend != "copy_engine" and self.comm_sms < 1:
            raise ConfigError(
                f"backend {self.backend} needs comm_sms >= 1 (SMs for communication), got {self.comm_sms}"
            )

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if d["kernel"] == "triton":
            del d["kernel"]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Candidate:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(
                f"unknown candidate field(s) {', '.join(unknown)}: accepted are {', '.join(sorted(known))}"
            )
        return cls(**d)

    @classmethod
    def from_stored(cls, d: dict[str, Any], *, renamed: bool) -> Candidate:
        """A candidate as stored (a database row, an export or bench file): :meth:`from_dict`; with
        `renamed` (stored before the rename), a backend's earlier name read as its new one
        (:func:`stored_backend`)."""
        if renamed and isinstance(d, dict) and "backend" in d:
            d = {**d, "backend": stored_backend(d["backend"], renamed=True)}
        return cls.from_dict(d)

    @classmethod
    def from_json(cls, text: str) -> Candidate:
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"candidate JSON does not parse: {e}") from None
        if not isinstance(d, dict):
            raise ConfigError(f"candidate JSON must be an object, got {describe(d)}")
        return cls.from_dict(d)

    def replace(self, **changes: Any) -> Candidate:
        d = self.to_dict()
        d.update(changes)
        return Candidate.from_dict(d)

    @property
    def replays_in_graph(self) -> bool:
        """Whether a call on this candidate may be captured in a CUDA graph and replayed under any
        NCCL setting: all but the `nccl` backend's chunk plans, whose replay stalls (its send/receive
        pairs per chunk beside the fused kernel) unless NCCL registers no captured buffer
        (`nccl_chunks_replay`, which lets a given configuration be captured but is no property of
        the candidate: lookup's graph mode passes over these plans); `unfused`, the group's whole
        collective then the matmul, replays."""
        return self.backend != "nccl" or self.template == UNFUSED

    def short(self) -> str:
        """A one-line summary for tables."""
        sms = f" sms={self.comm_sms}" if self.comm_sms else ""
        if self.template in PLANLESS_KINDS:  # no fused kernel: its tile fields are unused
            return f"{self.backend}/{self.template}/s{self.num_splits} cuBLAS"
        gluon = " gluon" if self.kernel == "gluon" else ""
        return (
            f"{self.backend}/{self.template}/s{self.num_splits}/{self.tile_order}{sms} "
            f"{self.block_m}x{self.block_n}x{self.block_k} g{self.group_m} w{self.num_warps} st{self.num_stages}{gluon}"
        )
