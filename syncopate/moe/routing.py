"""Routings and the tables the all-to-alls and the grouped GEMM need.

A routing gives each token of each rank its top_k distinct expert ids and gate weights. It is input
to the MoE ops, never tuned: `draw_routing` draws one from a `RoutingSpec` (uniform or Zipf-like
skewed, see its docstring), the same one on every process; a layer computes its own from the
router's scores.

Experts are spread evenly over the EP ranks: rank r owns experts [r·El, (r+1)·El), El = E / ws.
A rank's (token, slot) pairs are numbered t·top_k + slot ("pairs"). `ExpertLayout` holds one rank's
tables:

| table | what it is |
|-------|------------|
| `order` | the pairs sorted by expert id (stable): grouped by destination rank, then expert, then token |
| `order_inverse` | its inverse: `order_inverse[order[i]] == i` |
| `send_splits` / `recv_splits` | rows sent to / received from each rank (`all_to_all_single`'s sizes) |
| `recv_counts` | [ws, El]: rows each source rank sends to each of this rank's experts |
| `expert_order` | the received rows (by source rank, then expert) sorted by local expert (stable) |
| `expert_order_inverse` | its inverse |
| `group_sizes` | rows of each local expert: the grouped GEMM's groups |
| `counts` | [ws, E]: the pairs every rank routes to each expert (all ranks' counts; None where a
layout was made from this rank's receive counts alone) |

The received rows, in `expert_order`, are grouped by local expert, then source rank, then the
source's token order: the row order of the dispatch op's output and of the combine op's input.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from syncopate.errors import ConfigError
from syncopate.search_space.moe_workload import RoutingSpec

__all__ = [
    "ExpertLayout",
    "Routing",
    "check_id_tensor",
    "check_ids",
    "draw_routing",
    "expert_counts",
    "expert_layout",
    "id_problem",
    "inverse",
    "layout_tables",
    "pair_stats",
    "sorted_pairs",
    "to_device",
    "to_device_all",
]


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class Routing:
    """Every rank's routing: `expert_ids[r]` [tokens, top_k] int64 and `gate_weights[r]` [tokens,
    top_k] float32 (positive, each token's summing to 1). Compared by identity (it holds tensors)."""

    experts: int
    """Experts of the layer, spread evenly over the ranks."""
    expert_ids: tuple[torch.Tensor, ...]
    """Per rank: each token's distinct expert ids."""
    gate_weights: tuple[torch.Tensor, ...]
    """Per rank: each token's gate weight for each of its experts."""

    def __post_init__(self) -> None:
        if len(self.expert_ids) != len(self.gate_weights) or not self.expert_ids:
            raise ConfigError(
                f"routing has expert ids of {len(self.expert_ids)} ranks and gate weights of "
                f"{len(self.gate_weights)}: give one of each a rank"
            )
        for ids, w in zip(self.expert_ids, self.gate_weights, strict=True):
            check_ids(ids, self.experts)
            if w.shape != ids.shape:
                raise ConfigError(
                    f"gate weights of shape {tuple(w.shape)} beside expert ids of {tuple(ids.shape)}"
                )
        if self.experts % self.world_size:
            raise ConfigError(
                f"experts={self.experts} is not divisible by world size {self.world_size}: "
                "experts are spread evenly over the ranks"
            )

    @property
    def world_size(self) -> int:
        return len(self.expert_ids)

    @property
    def top_k(self) -> int:
        return self.expert_ids[0].shape[1]

    def counts(self) -> torch.Tensor:
        """[ws, E] int64: the pairs each source rank routes to each expert."""
        return torch.stack([expert_counts(ids, self.experts) for ids in self.expert_ids])

    def layout(self, rank: int) -> ExpertLayout:
        """Rank `rank`'s tables, from the whole routing (no collective: `expert_layout` exchanges
        the counts where a rank knows only its own routing)."""
        el = self.experts // self.world_size
        counts = self.counts()
        recv_counts = counts[:, rank * el : (rank + 1) * el]
        return expert_layout(self.expert_ids[rank], self.experts, recv_counts, counts=counts)


def check_id_tensor(ids: torch.Tensor) -> None:
    """Raise ConfigError unless `ids` is a [tokens, top_k] integer tensor (its values unread)."""
    if ids.dim() != 2 or ids.dtype.is_floating_point or ids.dtype == torch.bool:
        raise ConfigError(
            f"expert ids must be a [tokens, top_k] integer tensor, got {tuple(ids.shape)} {ids.dtype}"
        )


def id_problem(low: int, high: int, repeats: bool, experts: int) -> str | None:
    """What is wrong with ids whose smallest is `low`, largest `high`, where `repeats` says whether a
    token names an expert twice (`sorted_pairs`'s flags); None when nothing is."""
    if low < 0 or high >= experts:
        return f"expert ids span [{low}, {high}]: accepted are 0 to {experts - 1} ({experts} experts)"
    if repeats:
        return "expert ids repeat an expert within a token: a token's top_k experts are distinct"
    return None


def check_ids(ids: torch.Tensor, experts: int) -> None:
    """Raise ConfigError unless `ids` is [tokens, top_k] of integers in [0, experts), distinct in a row."""
    check_id_tensor(ids)
    if ids.numel():
        _, _, flags = sorted_pairs(ids, experts)
        problem = id_problem(*flags.tolist(), experts)
        if problem:
            raise ConfigError(problem)


def pair_stats(ids: torch.Tensor, experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(`order`, stats [E + 3] = the pairs per expert, then the smallest id, the largest and 1
    where a token names an expert twice), int64 on ids' device, without waiting for it: one stable
    sort gives all of them (the counts are the sorted ids' run lengths; a token's repeat is two
    equal ids of one token side by side), so the values can be checked with the counts' one
    transfer to the host. Ids outside [0, E) are not counted. On CUDA the stats are one Triton
    kernel (`syncopate.moe.kernels.launch_pair_stats`): this runs on every call of a routing,
    where each launch is host time on the layer's path."""
    tokens, top_k = ids.shape
    flat = ids.reshape(-1).to(torch.int64)
    keys, order = torch.sort(flat, stable=True)
    if not flat.numel():
        return order, torch.zeros(experts + 3, dtype=torch.int64, device=ids.device)
    if ids.is_cuda:
        from syncopate.moe.kernels import launch_pair_stats

        return order, launch_pair_stats(keys, order, top_k, experts)
    bounds = torch.arange(experts + 1, dtype=torch.int64, device=ids.device)
    counts = torch.searchsorted(keys, bounds).diff()
    token = order // top_k
    repeats = ((keys[1:] == keys[:-1]) & (token[1:] == token[:-1])).any()
    return order, torch.cat([counts, torch.stack([keys[0], keys[-1], repeats.to(torch.int64)])])


def sorted_pairs(ids: torch.Tensor, experts: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(`order`, the pairs per expert [E], flags [3] = (smallest id, largest id, 1 where a token
    names an expert twice)): `pair_stats`, its stats split."""
    order, stats = pair_stats(ids, experts)
    return order, stats[:experts], stats[experts:]


def draw_routing(*, world_size: int, tokens: int, experts: int, top_k: int, spec: RoutingSpec) -> Routing:
    """Draw every rank's routing from `spec` on the CPU, deterministically from its seed.

    `uniform`: each token's experts are the top_k of i.i.d. uniform scores, i.e. drawn uniformly
    without replacement. `skewed`: expert e has weight p_e ∝ 1 / (1 + π(e))^s (s = `spec.skew`, π a
    seeded permutation of the experts), and each token's experts are drawn without replacement in
    proportion to p (the top_k of log p_e plus Gumbel noise, which is that draw exactly); with s
    around 2 and tokens · top_k not much above E, the tail experts often get no token. Gate
    weights: a softmax of normal logits over the token's chosen experts.
    """
    if experts % world_size:
        raise ConfigError(f"experts={experts} is not divisible by world size {world_size}")
    if not 1 <= top_k <= experts:
        raise ConfigError(f"top_k={top_k} must be between 1 and experts={experts}")
    gen = torch.Generator().manual_seed(spec.seed)
    if spec.distribution == "skewed":
        position = torch.randperm(experts, generator=gen).double()
        log_p = -spec.skew * torch.log1p(position)
    else:
        log_p = torch.zeros(experts, dtype=torch.float64)
    ids, weights = [], []
    for _ in range(world_size):
        u = torch.rand(tokens, experts, generator=gen, dtype=torch.float64)  # in [0, 1)
        gumbel = -torch.log(-torch.log(u))  # -inf where u is 0: that expert is drawn last
        chosen = (log_p + gumbel).topk(top_k, dim=1).indices
        logits = torch.randn(tokens, top_k, generator=gen)
        ids.append(chosen.to(torch.int64))
        weights.append(torch.softmax(logits, dim=1))
    return Routing(experts=experts, expert_ids=tuple(ids), gate_weights=tuple(weights))


def expert_counts(ids: torch.Tensor, experts: int) -> torch.Tensor:
    """[experts] int64: how many of the pairs in `ids` go to each expert."""
    return torch.bincount(ids.reshape(-1).to(torch.int64), minlength=experts)


def inverse(perm: torch.Tensor) -> torch.Tensor:
    """The inverse of the permutation `perm`: `inverse(perm)[perm[i]] == i`."""
    arange = torch.arange(perm.numel(), dtype=perm.dtype, device=perm.device)
    return torch.empty_like(perm).scatter_(0, perm, arange)


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class ExpertLayout:
    """One rank's dispatch and combine tables (module docstring); index tensors on the ids' device,
    split sizes as Python lists (what `all_to_all_single` takes)."""

    experts: int
    world_size: int
    tokens: int
    top_k: int
    order: torch.Tensor
    order_inverse: torch.Tensor
    send_splits: list[int]
    recv_splits: list[int]
    recv_counts: torch.Tensor
    expert_order: torch.Tensor
    expert_order_inverse: torch.Tensor
    group_sizes: torch.Tensor
    counts: torch.Tensor | None = None
    cache: dict = field(default_factory=dict, repr=False)
    """What the ops derive from these tables once and use in every call with them: the grouped
    GEMM's offsets on the device, the pipelined plans' piece tables (`syncopate.moe.pipelined`)."""

    @property
    def local_experts(self) -> int:
        return self.experts // self.world_size

    @property
    def rows_received(self) -> int:
        return sum(self.recv_splits)

    def rows_received_by(self, rank: int) -> int:
        """Rows rank `rank`'s experts receive (from `counts`: every rank's layout agrees on it)."""
        el = self.local_experts
        return sum(sum(row[rank * el : (rank + 1) * el]) for row in self.host_counts())

    def host_recv_counts(self) -> list[list[int]]:
        """`recv_counts` as Python lists [ws][El], read once (the plans' tables are made from them
        on every call of a routing, on the host's path)."""
        return self._listed("recv_counts")

    def host_counts(self) -> list[list[int]] | None:
        """`counts` as Python lists [ws][E] (None where the layout has none), read once."""
        return None if self.counts is None else self._listed("counts")

    def _listed(self, name: str) -> list:
        """Table `name`'s `tolist()`, made once and kept in the cache."""
        found = self.cache.get((name, "list"))
        if found is None:
            found = self.cache[name, "list"] = getattr(self, name).tolist()
        return found

    def offsets(self, device: torch.device) -> torch.Tensor:
        """int32 [El] on `device`: the end of each local expert's rows (the grouped GEMM's `offs`),
        copied there once."""
        key = ("offsets", str(device))
        offs = self.cache.get(key)
        if offs is None:
            offs = self.cache[key] = to_device(torch.cumsum(self.group_sizes, 0).to(torch.int32), device)
        return offs


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A small CPU table on `device` without waiting for the device: from pinned memory,
    non-blocking (a copy from pageable memory would wait for the work queued before it)."""
    return to_device_all([t], device)[0]


_STAGING_SLOTS = 4
_STAGING: dict = {}
"""Pinned host buffers `to_device_all` stages its tables in, by (device, dtype): a ring of
`_STAGING_SLOTS` [buffer, event] (None until used), and the next slot's index."""


def _staging(n: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.cuda.Event]:
    """A pinned buffer of at least n elements and the event its last copy recorded, once that copy
    is done (a slot is reused `_STAGING_SLOTS` calls later: long done)."""
    ring = _STAGING.setdefault((str(device), dtype), [[None] * _STAGING_SLOTS, 0])
    slots, i = ring
    ring[1] = (i + 1) % _STAGING_SLOTS
    slot = slots[i]
    if slot is not None:
        slot[1].synchronize()
    if slot is None or slot[0].numel() < n:
        size = max(n, 4096, 2 * slot[0].numel() if slot is not None else 0)
        slot = slots[i] = [torch.empty(size, dtype=dtype, pin_memory=True), torch.cuda.Event()]
    return slot[0], slot[1]


def to_device_all(tables: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """Small CPU tables of one dtype on `device` with one copy, without waiting for the device
    (from pinned memory, non-blocking: a copy from pageable memory would wait for the work queued
    before it): views of one buffer, each of its table's shape. On CUDA the tables are gathered
    straight into a pinned buffer of a small ring (no pinned allocation a call: the host's time
    here is on a layer's path)."""
    if not tables:
        return []
    if device.type == "cuda":
        n = sum(t.numel() for t in tables)
        staged, done = _staging(n, tables[0].dtype, device)
        torch.cat([t.reshape(-1) for t in tables], out=staged[:n])
        moved = staged[:n].to(device, non_blocking=True)
        done.record(torch.cuda.current_stream(device))
    else:
        moved = torch.cat([t.reshape(-1) for t in tables]).to(device)
    out, at = [], 0
    for t in tables:
        out.append(moved[at : at + t.numel()].view(t.shape))
        at += t.numel()
    return out


def expert_layout(
    ids: torch.Tensor, experts: int, recv_counts: torch.Tensor, *, counts: torch.Tensor | None = None
) -> ExpertLayout:
    """The tables of the rank that routes `ids` [tokens, top_k] and receives `recv_counts` [ws, El]
    (the rows each source rank sends to each of this rank's experts); `counts` [ws, E], every
    rank's pairs per expert where known (the copy-engine plans need it)."""
    check_id_tensor(ids)
    order, own, flags = sorted_pairs(ids, experts)
    if ids.numel():
        problem = id_problem(*flags.tolist(), experts)
        if problem:
            raise ConfigError(problem)
    return layout_tables(ids, experts, order, own.cpu(), recv_counts, counts=counts)


def layout_tables(
    ids: torch.Tensor,
    experts: int,
    order: torch.Tensor,
    own: torch.Tensor,
    recv_counts: torch.Tensor,
    *,
    counts: torch.Tensor | None = None,
) -> ExpertLayout:
    """The layout from `sorted_pairs`'s `order` (on ids' device) and the host's counts: `own` [E]
    (this rank's pairs per expert), `recv_counts` [ws, El], `counts` [ws, E] or None. Reads nothing
    back from the device: the expert-side permutations are made there from a few block tables."""
    ws, el = recv_counts.shape
    if ws * el != experts:
        raise ConfigError(
            f"receive counts of shape {tuple(recv_counts.shape)} for {experts} experts: expected [ws, E/ws]"
        )
    if counts is not None:
        counts = counts.to(torch.int64).cpu()
        if tuple(counts.shape) != (ws, experts):
            raise ConfigError(f"counts of shape {tuple(counts.shape)}: expected [{ws}, {experts}]")
    tokens, top_k = ids.shape
    recv_counts = recv_counts.to(torch.int64).cpu()
    expert_order, expert_order_inverse = _expert_orders(recv_counts, ids.device)
    return ExpertLayout(
        experts=experts,
        world_size=ws,
        tokens=tokens,
        top_k=top_k,
        order=order,
        order_inverse=inverse(order),
        send_splits=own.view(ws, el).sum(1).tolist(),
        recv_splits=recv_counts.sum(1).tolist(),
        recv_counts=recv_counts,
        expert_order=expert_order,
        expert_order_inverse=expert_order_inverse,
        group_sizes=recv_counts.sum(0),
        counts=counts,
    )


def _block_starts(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each (source, local expert) block of received rows starts, [ws, El] int64 each: on the
    expert side (by source, then expert) and in h (by expert, then source), from `counts` [ws, El]."""
    ws, el = counts.shape
    sizes = counts.reshape(-1)  # by source, then expert
    by_expert = counts.T.reshape(-1)  # the blocks by expert, then source
    side = (np.cumsum(sizes) - sizes).reshape(ws, el)
    return side, (np.cumsum(by_expert) - by_expert).reshape(el, ws).T


def _order_blocks(recv_counts: torch.Tensor) -> tuple[int, np.ndarray]:
    """(the rows received, [6, ws·El] int64: the expert order's shift, start and size of each block,
    by expert then source, then its inverse's, by source then expert). numpy: a few small steps on
    the host's path, each cheaper than torch's."""
    counts = recv_counts.numpy()
    source_start, expert_start = _block_starts(counts)
    shift = expert_start - source_start
    table = [
        -shift.T.reshape(-1),
        expert_start.T.reshape(-1),
        counts.T.reshape(-1),
        shift.reshape(-1),
        source_start.reshape(-1),
        counts.reshape(-1),
    ]
    return int(counts.sum()), np.stack(table)


def _expert_orders(recv_counts: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(`expert_order`, its inverse) on `device`. The received rows come in ws·El blocks (source
    rank, then local expert), moved whole: a row's place is its block's new start plus its offset in
    the block. Only the blocks' shifts cross to the device (one small copy); each permutation is
    one repeat_interleave of told output size and an arange there (on CUDA both are one Triton
    kernel over the blocks' starts: this runs on every call of a routing, on the host's path)."""
    rows, blocks = _order_blocks(recv_counts)
    if device.type == "cuda":
        from syncopate.moe.kernels import launch_expert_orders

        return launch_expert_orders(to_device(torch.from_numpy(blocks[[0, 1, 3, 4]]), device), rows)
    table = to_device(torch.from_numpy(blocks[[0, 2, 3, 5]]), device)
    arange = torch.arange(rows, dtype=torch.int64, device=device)
    forward = torch.repeat_interleave(table[0], table[1], output_size=rows) + arange
    backward = torch.repeat_interleave(table[2], table[3], output_size=rows) + arange
    return forward, backward
