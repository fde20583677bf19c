"""The cost model's simulator: a chunk plan's transfers and persistent kernels' tiles over time.

Times are µs from the start of the call. Every rank is simulated at once (arrays indexed by rank
first): a tile order that ignores arrival differs from rank to rank, and the op takes as long as
its slowest rank.

Communication (:class:`TransferTable`), per backend as the kernels run it:

| backend       | where transfers queue                                   | per chunk                          |
|---------------|---------------------------------------------------------|------------------------------------|
| `copy_engine` | one side stream per plan stream, in the plan's order    | its curve; streams of one rank share its egress where the links do |
| `sm_copy`     | one job list per rank (the chunk-copy kernel), in order | its curve at `comm_sms`            |
| `nvshmem`     | as `sm_copy` (the NVSHMEM copier runs the same job list) | its own curve at `comm_sms`       |
| `nccl`        | batches per (step, split), every rank in lock step      | its curve; a batch ends for all    |

A transfer starts when its queue is free and its chunk is ready: a rank's own rows at once, a
forwarded chunk (ring templates) when it has arrived, a reduce-scatter partial when its last tile
is stored. Transfers between nodes take the `inter` curve (the copy engine cannot reach another
node); on an NVLink mesh of more than two GPUs each peer has its share of the links. A rank's own
shard is copied into the gathered buffer chunk by chunk on a third stream.

Compute (:func:`run_programs`): P = SMs − SMs reserved for communication persistent programs;
program p takes positions p, p+P, … of the tile order (wave i // P). A tile starts when its
program is free and, for a consumer, when the chunks its rows lie in are there (a signal wait);
it takes its tile time, or its wave's memory time where that is larger (the distinct panels of A
and B the wave touches, read once from HBM), slowed while communication runs. A producer's
epilogue waits for the partials it adds and reads them; a chunk is ready to leave when its last
tile is stored.

Pure Python and numpy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from syncopate.cost_model.calibration import Calibration, TransferModel
from syncopate.search_space import Candidate, ChunkPlan, Topology, Transfer

__all__ = [
    "CommContext",
    "Infeasible",
    "ProgramRun",
    "TransferTable",
    "own_chunks_ready",
    "padded",
    "run_programs",
    "wave_memory_us",
]


class Infeasible(Exception):
    """The candidate cannot run on this topology (the reason is the message)."""


@dataclass(frozen=True, slots=True)
class CommContext:
    """What transfers need to know: the calibration, the topology, the candidate, the row size."""

    calibration: Calibration
    topology: Topology
    candidate: Candidate
    row_bytes: int

    @property
    def backend(self) -> str:
        return self.candidate.backend

    def node(self, rank: int) -> int:
        return rank // self.topology.gpus_per_node

    def model(self, src: int, dst: int) -> TransferModel:
        scope = "intra" if self.node(src) == self.node(dst) else "inter"
        if scope == "inter" and self.backend == "copy_engine":
            raise Infeasible("the copy engine cannot reach a GPU of another node")
        return self.calibration.transfer(self.backend, scope)

    def transfer_us(self, t: Transfer, share: float = 1.0) -> float:
        """Time of transfer `t` inside a fused call when its rank's egress is shared `1 / share` ways."""
        model = self.model(t.src, t.dst)
        us = model.time_us(t.rows * self.row_bytes, self.candidate.comm_sms)
        us += self.calibration.costs.chunk_us.get(self.backend, 0.0)
        topo = self.topology
        if model.scope == "intra" and topo.interconnect == "nvlink" and topo.gpus_per_node > 2:
            us *= topo.gpus_per_node - 1
        return us / share

    def call_us(self) -> float:
        """Fixed cost of the backend per call (the slowest scope the plan uses)."""
        if self.topology.world_size == 1:
            return 0.0
        models = [self.calibration.transfer(self.backend, "intra")] if self.topology.gpus_per_node > 1 else []
        if self.topology.nodes > 1:
            if self.backend == "copy_engine":
                raise Infeasible("the copy engine cannot reach a GPU of another node")
            models.append(self.calibration.transfer(self.backend, "inter"))
        return max((m.call_us for m in models), default=0.0)

    def egress_share(self, plan: ChunkPlan) -> float:
        """1 / streams of one rank that run at once over one egress (the copy engine's
        bidirectional ring on two GPUs, on a switch or over PCIe); 1 where each has its own links."""
        streams = plan.num_streams
        if self.backend != "copy_engine" or streams == 1:
            return 1.0
        topo = self.topology
        if topo.interconnect == "nvlink" and topo.gpus_per_node > 2:
            return 1.0
        return 1.0 / streams


def own_chunks_ready(plan: ChunkPlan, ctx: CommContext, start: float) -> np.ndarray:
    """[rank, chunk]: when each rank's own chunks are in its gathered buffer (one local copy-engine
    copy per chunk, in order); inf for the other chunks."""
    ws = plan.world_size
    out = np.full((ws, plan.num_chunks), np.inf)
    rate = ctx.calibration.costs.local_copy_gbps * 1e3
    for r in range(ws):
        t = start
        for j, (lo, hi) in enumerate(plan.chunk_bounds[r]):
            t += (hi - lo) * ctx.row_bytes / rate + 1.0
            out[r, plan.chunk_index(r, j)] = t
    return out


class TransferTable:
    """The transfers of one phase of a plan, in the order they are issued, with their durations.

    :meth:`run` moves them: a transfer leaves when its queue is free and its chunk is ready at
    its sender. Arrivals are indexed [receiver, chunk] for a gather and [receiver, signal slot]
    for a reduce. `pull`: the receiver moves the chunk on its own queue (an all-reduce's gather
    of reduced blocks).
    """

    def __init__(self, plan: ChunkPlan, phase: str, ctx: CommContext, *, pull: bool = False) -> None:
        self.phase = phase
        self.nccl = ctx.backend == "nccl"
        transfers = sorted(
            (t for t in plan.transfers if t.phase == phase),
            key=lambda t: (t.step, t.src, t.stream, t.split, t.block),
        )
        share = ctx.egress_share(plan)
        self.forwarded_gather = phase == "gather" and not pull
        rows = []
        for t in transfers:
            if pull:
                queue = (t.dst, 2) if ctx.backend == "copy_engine" else (t.dst, 0)
            else:
                queue = (t.src, t.stream) if ctx.backend == "copy_engine" else (t.src, 0)
            chunk = plan.chunk_index(t.block, t.split)
            own = t.block == t.src
            out = chunk if phase == "gather" else t.signal
            rows.append((queue, t.src, chunk, own, t.dst, out, ctx.transfer_us(t, share)))
        self.rows = rows
        self.batches: list[tuple[list[int], float]] = []
        if self.nccl:
            groups: dict[tuple[int, int], list[int]] = {}
            for i, t in enumerate(transfers):
                groups.setdefault((t.step, t.split), []).append(i)
            for key in sorted(groups):
                per_rank: dict[int, float] = {}
                for i in groups[key]:
                    per_rank[rows[i][1]] = per_rank.get(rows[i][1], 0.0) + rows[i][6]
                self.batches.append((groups[key], max(per_rank.values())))

    def run(
        self,
        ready: np.ndarray,
        arrival: np.ndarray,
        start: float,
        queue_free: dict | None = None,
        log: list | None = None,
    ) -> dict:
        """Fill `arrival` (in place); return each queue's free time. `ready[src, chunk]` says when a
        chunk may leave its sender; for a gather, a chunk of another block leaves once it has
        arrived there (`arrival`), a rank's own rows at `start`. `log` (not for NCCL) gets each
        transfer as (src, begin, duration)."""
        free = dict(queue_free or {})
        rows = self.rows
        if self.nccl:
            clock = max([start, *free.values()])
            for members, duration in self.batches:
                go = clock
                for i in members:
                    _, src, chunk, own, _, _, _ = rows[i]
                    at = self._ready_at(ready, arrival, src, chunk, own, start)
                    if at > go:
                        go = at
                clock = go + duration
                for i in members:
                    arrival[rows[i][4], rows[i][5]] = clock
            return {"nccl": clock}
        for queue, src, chunk, own, dst, out, duration in rows:
            begin = free.get(queue, start)
            at = self._ready_at(ready, arrival, src, chunk, own, start)
            if at > begin:
                begin = at
            end = begin + duration
            free[queue] = end
            arrival[dst, out] = end
            if log is not None:
                log.append((src, begin, duration))
        return free

    def _ready_at(self, ready, arrival, src, chunk, own, start) -> float:
        if self.forwarded_gather:
            return start if own else float(arrival[src, chunk])
        return float(ready[src, chunk])


def wave_memory_us(
    order: np.ndarray,
    tiles_m: int,
    tiles_n: int,
    programs: int,
    panel_bytes_m: float,
    panel_bytes_n: float,
    hbm_gbps: float,
) -> np.ndarray:
    """[rank, wave]: the time to read, once, the distinct panels of A and B a wave's tiles touch.

    `order` is [rank, position] tile ids."""
    ranks, n = order.shape
    p = max(1, min(programs, n))
    waves = -(-n // p)
    wave = np.arange(n) // p
    rank = np.arange(ranks)[:, None]
    key_m = (rank * waves + wave) * tiles_m + order // tiles_n
    key_n = (rank * waves + wave) * tiles_n + order % tiles_n
    dm = np.bincount(np.unique(key_m) // tiles_m, minlength=ranks * waves).reshape(ranks, waves)
    dn = np.bincount(np.unique(key_n) // tiles_n, minlength=ranks * waves).reshape(ranks, waves)
    return (dm * panel_bytes_m + dn * panel_bytes_n) / (hbm_gbps * 1e3)


def padded(a: np.ndarray, p: int, fill: float) -> np.ndarray:
    """[rank, position] → [rank, wave, program], positions past the end filled with `fill`."""
    ranks, n = a.shape
    waves = -(-n // p)
    out = np.full((ranks, waves * p), fill)
    out[:, :n] = a
    return out.reshape(ranks, waves, p)


@dataclass(frozen=True, slots=True)
class ProgramRun:
    """Every rank's persistent kernel, simulated."""

    end: np.ndarray
    """[rank]: when the last program finished."""
    tile_end: np.ndarray
    """[rank, position]: when that tile was stored."""
    stall: np.ndarray
    """[rank]: program-µs spent waiting for chunks or partials, summed over programs."""
    slowed: np.ndarray | None = None
    """[rank, wave, program]: the tiles that started while communication ran (slowed down)."""


def _scan(t0: float, a: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Clocks after each wave of t[w+1] = max(t[w] + a[w], c[w]), t[0] = t0, along axis 1: the
    closed form t[w+1] = A[w+1] + max(t0, max over j <= w of (c[j] - A[j+1])), A the running sum."""
    acc = np.cumsum(a, axis=1)
    return acc + np.maximum(t0, np.maximum.accumulate(c - acc, axis=1))


def run_programs(
    programs: int,
    start: float,
    need: np.ndarray | None,
    duration: np.ndarray,
    *,
    comm_end: float = 0.0,
    slowdown: float = 0.0,
    partial: np.ndarray | None = None,
    epilogue: np.ndarray | None = None,
    positions: int,
    slowed: np.ndarray | None = None,
) -> ProgramRun:
    """Run every rank's tiles on `programs` persistent programs (see the module docstring).

    All arrays are [rank, wave, program] (see :func:`padded`): need: when a position's inputs are
    there, wait included (-inf or None: no wait); duration: its compute time (0 past the end);
    partial / epilogue (producers): when the partials it adds are there, and the time to read and
    add them. Tiles that start before `comm_end` take `1 + slowdown` times as long: found by a
    first pass without slowdown, or given as `slowed` (a previous run's, when iterating).

    Per program: begin = max(clock, need); done = max(begin + d, partial) + epilogue; the clock
    moves to done: t[w+1] = max(t[w] + a[w], c[w]) with a = d + epilogue and
    c = max(need + a, partial + epilogue), solved for all waves at once.
    """
    ranks, waves, p = duration.shape
    epi = epilogue if epilogue is not None else 0.0
    bound = partial + epi if partial is not None else None

    def clocks(d: np.ndarray) -> np.ndarray:
        a = d + epi
        if need is None:
            c = bound if bound is not None else np.full_like(a, -np.inf)
        else:
            c = need + a
            if bound is not None:
                c = np.maximum(c, bound)
        return _scan(start, a, c)

    def slowed_of(done: np.ndarray) -> np.ndarray:
        before = np.concatenate([np.full((ranks, 1, p), start), done[:, :-1]], axis=1)
        begin = before if need is None else np.maximum(before, need)
        return begin < comm_end

    mask = None
    if slowdown:
        if slowed is None:
            slowed = slowed_of(clocks(duration))
        duration = np.where(slowed, duration * (1.0 + slowdown), duration)
    done = clocks(duration)
    if slowdown:
        mask = slowed_of(done)
    final = done[:, -1]
    busy = duration.sum(axis=(1, 2)) + (epilogue.sum(axis=(1, 2)) if epilogue is not None else 0.0)
    stall = np.maximum(final.sum(axis=1) - p * start - busy, 0.0)
    return ProgramRun(
        end=final.max(axis=1), tile_end=done.reshape(ranks, -1)[:, :positions], stall=stall, slowed=mask
    )
