"""The MoE ops' cost model: a candidate's device and host time from a calibration and the
workload's expected routing, without a GPU.

```python
from syncopate.cost_model import default_calibration
from syncopate.cost_model.moe import MoeCostModel
model = MoeCostModel(default_calibration(topology))
p = model.predict(workload, candidate, world_size)   # MoePrediction: device_us, host_us, eager_us, …
ranked = model.rank(workload, candidates, world_size, mode="eager")
```

What a rank moves and computes is taken from the routing's expectation (`routing_stats`): each
expert's share of a token's top_k choices (uniform, or the `skewed` law of
:class:`~syncopate.search_space.moe_workload.RoutingSpec` over a seeded permutation drawn here with
numpy: the same law, not the same draw), the busiest rank's rows (every rank waits for it in the
all-to-all), the rows one rank sends another (a row a pair), and the rows a token sends a rank at
most once (`dedup`: a token that picks any expert there).

The parts, each from the calibration (:mod:`syncopate.cost_model.calibration`):

- a grouped GEMM: its tiles (each expert's rows cut in `block_m`, the columns in `block_n`) in
  waves over the SMs, each at the calibrated rate of its tile configuration plus `GROUPED_TILE_US`
  (a lead from the H200 measurements of torch._grouped_mm in docs/moe.md); a fused kernel's GEMM
  slowed by `FUSED_SLOWDOWN` while its rows move;
- an all-to-all: the bytes out of the busiest rank through its backend's transfer curve, plus the
  backend's fixed cost per call;
- row passes (gathers, permutations, the top-k and segment sums): bytes read and written at the
  calibrated HBM rate;
- overlap: a pipelined or fused plan's GEMMs run slower by the backend's `overlap_slowdown` while
  its transfers move (`fused_dedup`'s dispatch in proportion to its fewer bytes; its combine is
  `dedup`'s), pieces wait for their rows (dispatch) or leave when their GEMM is done
  (combine), the own rows need no transfer;
- the host: a fixed cost per template and one per exchange it enqueues (`MOE_HOST_US`, leads from
  the same measurements); eager time is the slower of device and host time
  (:func:`~syncopate.cost_model.host_time.eager_us`).

Every figure is a lead until measured: the MoE harness stores each trial's real device, host and
eager times, and :func:`~syncopate.results_db.moe_lookups.lookup_moe` serves a prediction only
where nothing measured answers (match `predicted`), which `MoELayer` then checks against
`unfused` on its first calls.

Pure Python and numpy: no torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from syncopate.cost_model.calibration import Calibration
from syncopate.cost_model.host_time import eager_us
from syncopate.errors import ConfigError
from syncopate.records import check_mode
from syncopate.search_space import TileConfig
from syncopate.search_space.moe_workload import MoeCandidate, MoeWorkload, check_moe_candidate

__all__ = [
    "FUSED_SLOWDOWN",
    "MeasuredCase",
    "against_measurements",
    "GROUPED_TILE_US",
    "MOE_HOST_US",
    "MoeCostModel",
    "MoePrediction",
    "RoutingStats",
    "routing_stats",
]

GROUPED_TILE_US = 6.0
"""What a grouped GEMM's tile costs beyond its calibrated arithmetic (finding its expert and rows,
a shorter pipeline over uneven groups), µs: torch._grouped_mm over 16 to 64 experts on H200s took
0.98 (K = 7168) to 1.6 (K = 768) times the calibrated rate's time on the same tiles (docs/moe.md's
measurements), about this much a tile; the fused kernels' tiles are of the same shapes."""

FUSED_SLOWDOWN: dict[str, float] = {"a2a_gemm": 0.2, "gemm_a2a": 0.45}
"""How much slower a fused kernel's GEMM runs than the grouped GEMM alone while its plan moves rows:
the dispatch's tiles load rows the copy engine is writing beside them, the combine's epilogues
store every row into a peer's memory (H200 measurements of docs/moe.md: 1.2–1.4 and 1.5–2.2 times
the GEMM alone)."""

PIECE_US: dict[str, float] = {"a2a_gemm": 60.0, "gemm_a2a": 20.0}
"""What each further piece of a pipelined plan costs beyond its GEMM's share, µs: a grouped GEMM
launch, its last partial wave, the piece's wait and its rows' gather or scatter (H200 measurements
of docs/moe.md: two chunks a source against one took 60–110 µs more per dispatch, 20 more per
combine)."""

PIPELINED_DISPATCH_SLOWDOWN = 0.3
"""How much slower a pipelined dispatch's grouped GEMMs run than their share of the whole while the
peers' rows land in the same memory (docs/moe.md: the own rows' GEMM beside the copy engine's
traffic)."""

MOE_HOST_US: dict[str, tuple[float, float]] = {
    "unfused": (250.0, 0.0),
    "dedup": (260.0, 0.0),
    "dedup/copy_engine": (280.0, 60.0),
    "pipelined/nccl": (260.0, 70.0),
    "pipelined/copy_engine": (250.0, 70.0),
    "pipelined/nvshmem": (250.0, 50.0),
    "fused": (220.0, 20.0),
}
"""(fixed µs, µs per exchange) of one call's host time, by template (and backend): leads from the
H200 measurements of docs/moe.md (unfused about 240–380 µs a call, a pipelined copy-engine plan
about 320 µs at one exchange and 435 at two on two ranks, the fused plans 200–330)."""

_TILE = "128x256x64w8s4"
"""The tile configuration whose calibrated rate stands for torch's grouped GEMM."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RoutingStats:
    """What the expected routing of one workload puts on the busiest rank (rows, bytes per row of
    the reduction dimension aside)."""

    world_size: int
    expert_rows: tuple[float, ...]
    """Rows each of the busiest rank's experts receives (from every source)."""
    pair_rows_out: float
    """Rows (one a pair) the busiest source sends all peers together (its own rows stay)."""
    pair_rows_in: float
    """Rows (one a pair) the busiest rank receives from its peers."""
    dedup_rows_out: float
    """Rows (one a token and rank) a source sends all peers together."""
    dedup_rows_in: float
    """Rows (one a token and rank) the busiest rank receives from its peers."""

    @property
    def rows(self) -> float:
        return float(sum(self.expert_rows))


def _choice_shares(workload: MoeWorkload) -> np.ndarray:
    """Each expert's expected share of a token's top_k choices (sums to top_k)."""
    e, k = workload.experts, workload.top_k
    spec = workload.routing
    if spec.distribution == "uniform" or spec.skew == 0:
        return np.full(e, k / e)
    position = np.random.default_rng(spec.seed).permutation(e)
    weight = (1.0 + position) ** -spec.skew
    p = weight / weight.sum()
    # inclusion of a draw of k without replacement: about min(1, c·p), c so that they sum to k
    lo, hi = float(k), float(k) / max(float(p.min()), 1e-30)
    for _ in range(60):
        c = 0.5 * (lo + hi)
        if np.minimum(1.0, c * p).sum() < k:
            lo = c
        else:
            hi = c
    return np.minimum(1.0, hi * p)


def routing_stats(workload: MoeWorkload, world_size: int) -> RoutingStats:
    """The expected rows of `workload`'s routing on its busiest rank (module docstring)."""
    workload.check_world_size(world_size)
    ws, t, k, e = world_size, workload.tokens, workload.top_k, workload.experts
    el = e // ws
    share = _choice_shares(workload).reshape(ws, el)  # [rank, local expert]
    per_rank = share.sum(1)  # a token's expected rows to each rank
    busiest = int(np.argmax(per_rank))
    expert_rows = tuple(float(x) for x in share[busiest] * t * ws)  # every source's tokens alike
    # a token reaches rank d at least once: exactly for uniform, independence otherwise
    if workload.routing.distribution == "uniform" or workload.routing.skew == 0:
        miss = math.comb(e - el, k) / math.comb(e, k) if e - el >= k else 0.0
        reach = np.full(ws, 1.0 - miss)
    else:
        reach = 1.0 - np.prod(1.0 - share, axis=1)
    others = per_rank.sum() - per_rank  # rows a source sends its peers, by the source's own rank
    return RoutingStats(
        world_size=ws,
        expert_rows=expert_rows,
        pair_rows_out=float(t * others.max()),
        pair_rows_in=float(t * per_rank[busiest] * (ws - 1)),
        dedup_rows_out=float(t * (reach.sum() - reach).max()),
        dedup_rows_in=float(t * reach[busiest] * (ws - 1)),
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class MoePrediction:
    """A MoE candidate's predicted times (µs) and their parts."""

    device_us: float
    host_us: float
    eager_us: float
    gemm_us: float
    """The grouped GEMM(s) alone, as the candidate cuts them."""
    comm_us: float
    """Its transfers alone."""

    def time_us(self, mode: str) -> float:
        """The time a job in `mode` sees: `eager` (the host on the path) or `graph` (device time)."""
        return self.eager_us if check_mode(mode) == "eager" else self.device_us

    def to_dict(self) -> dict[str, float]:
        return {
            "device_us": self.device_us,
            "host_us": self.host_us,
            "eager_us": self.eager_us,
            "gemm_us": self.gemm_us,
            "comm_us": self.comm_us,
        }


class MoeCostModel:
    """Predicts and ranks MoE candidates on one calibration (module docstring)."""

    def __init__(self, calibration: Calibration) -> None:
        self.calibration = calibration
        self.costs = calibration.costs
        self.sms = _sm_count(calibration)

    # the parts ---------------------------------------------------------------------------------

    def gemm_us(self, expert_rows: Iterable[float], k: int, n: int, tile: str = _TILE) -> float:
        """A grouped GEMM over `expert_rows` rows per expert, [rows, k] @ [k, n] each, on tiles of
        configuration `tile` (module docstring)."""
        rate = self._rate(tile)
        block_m, block_n = (int(x) for x in tile.split("w")[0].split("x")[:2])
        tiles = sum(math.ceil(r / block_m) for r in expert_rows if r > 0) * math.ceil(n / block_n)
        if tiles == 0:
            return 0.0
        # the persistent programs share the tiles wave by wave; a last wave's part costs a whole tile
        return math.ceil(tiles / self.sms) * (
            rate.tile_us(2.0 * block_m * block_n * k, self.sms) + GROUPED_TILE_US
        )

    def _rate(self, tile: str):
        """The calibrated rate of `tile` (else of the nearest calibrated tile: `Calibration.gemm_rate`)."""
        try:
            config = TileConfig.from_key(tile)
        except ConfigError:
            config = TileConfig.from_key(_TILE)
        return self.calibration.gemm_rate(config)

    def pass_us(self, nbytes: float) -> float:
        """Reading and writing `nbytes` through device memory once."""
        return nbytes / (self.costs.hbm_gbps * 1e3)

    def a2a_us(self, backend: str, nbytes_out: float) -> float:
        """The busiest rank's `nbytes_out` leaving by `backend` (its transfer curve), with the call's fixed cost."""
        if nbytes_out <= 0:
            return 0.0
        model = self.calibration.transfer(backend)
        sms = max(model.curves) if len(model.curves) > 1 else 0
        return model.time_us(nbytes_out, sms) + model.call_us

    # a candidate -------------------------------------------------------------------------------

    def predict(self, workload: MoeWorkload, candidate: MoeCandidate, world_size: int) -> MoePrediction:
        """`candidate`'s predicted times on `workload` over `world_size` ranks of this calibration's
        topology; ConfigError where it cannot run there."""
        check_moe_candidate(candidate, world_size)
        s = routing_stats(workload, world_size)
        dispatch = workload.kind == "a2a_gemm"
        h, f = workload.hidden, workload.ffn
        k_dim, n_dim = (h, 2 * f) if dispatch else (f, h)
        elem = workload.element_bytes
        row_in, row_out = k_dim * elem, n_dim * elem  # a row the GEMM reads, one it writes
        moved = h * elem  # what crosses: x's rows (dispatch) or the output's (combine)
        tokens = workload.tokens
        template, backend = candidate.template, candidate.backend
        rows = s.rows
        gemm = self.gemm_us(s.expert_rows, k_dim, n_dim)
        launch = self.costs.launch_us
        if template == "unfused" or (template == "dedup" and backend == "nccl"):
            dedup = template == "dedup"
            out = (s.dedup_rows_out if dedup else s.pair_rows_out) * moved
            comm = self.a2a_us("nccl", out)
            if dispatch:  # gather to send order, all-to-all, rows to h's order, the GEMM
                sent = (s.dedup_rows_out + tokens if dedup else tokens * workload.top_k) * moved
                passes = self.pass_us(2 * sent + 2 * rows * row_in)
            else:  # the GEMM, rows to send order, all-to-all, the top-k (or segment) sums
                back = (s.dedup_rows_out + tokens) if dedup else tokens * workload.top_k
                passes = self.pass_us(2 * rows * row_out + back * moved + tokens * moved)
            device = gemm + comm + passes + 2 * launch
        elif template in ("pipelined", "dedup") or (template == "fused_dedup" and not dispatch):
            device, comm, gemm = self._pieces(workload, candidate, s, dispatch, k_dim, n_dim, moved)
        elif template in ("fused", "fused_dedup"):
            device, comm = self._fused(workload, candidate, s, dispatch, gemm, moved)
        else:
            raise ConfigError(f"the MoE cost model has no template {template!r}")
        host = self._host_us(candidate, world_size, dispatch)
        return MoePrediction(
            device_us=device, host_us=host, eager_us=eager_us(device, host), gemm_us=gemm, comm_us=comm
        )

    def rank(
        self, workload: MoeWorkload, candidates: Iterable[MoeCandidate], world_size: int, mode: str = "eager"
    ) -> list[tuple[MoeCandidate, MoePrediction]]:
        """`candidates` that can run on `world_size` ranks with their predictions, fastest in `mode` first."""
        out = []
        for c in candidates:
            try:
                out.append((c, self.predict(workload, c, world_size)))
            except ConfigError:
                continue
        return sorted(out, key=lambda cp: cp[1].time_us(mode))

    # the plans ---------------------------------------------------------------------------------

    def _pieces(self, w, c, s: RoutingStats, dispatch: bool, k_dim: int, n_dim: int, moved: float):
        """A pipelined plan (or `dedup`'s on the copy engine: one piece a source, deduplicated rows):
        the own rows' GEMM and the peers' pieces in exchange order, each waiting for its rows
        (dispatch) or sending them once its GEMM is done (combine)."""
        ws = s.world_size
        dedup = c.template in ("dedup", "fused_dedup")
        chunks = 1 if dedup else c.chunks_per_source
        pieces = (ws - 1) * chunks
        elem = w.element_bytes
        own_share = 1.0 / ws
        if pieces == 0:  # one rank: its own rows' GEMM, nothing moves
            g = self.gemm_us(s.expert_rows, k_dim, n_dim)
            return g + 2 * self.costs.launch_us, 0.0, g
        own_rows = [r * own_share for r in s.expert_rows]
        piece_rows = [r * (1 - own_share) / pieces for r in s.expert_rows]
        g_own = self.gemm_us(own_rows, k_dim, n_dim)
        g_piece = self.gemm_us(piece_rows, k_dim, n_dim)
        slow = 1.0 + (
            PIPELINED_DISPATCH_SLOWDOWN if dispatch else self.costs.overlap_slowdown.get(c.backend, 0.0)
        )
        out_rows = s.dedup_rows_out if dedup else s.pair_rows_out
        comm = self.a2a_us(c.backend, out_rows * moved)
        per_piece = comm / pieces
        rows_piece = s.rows * (1 - own_share) / pieces
        extra_chunk = self.costs.chunk_us.get(c.backend, 0.0)
        if dispatch:
            # each piece's output rows scattered into h (and, deduplicated, its rows gathered first)
            side = self.pass_us(
                2 * rows_piece * n_dim * elem + (2 * rows_piece * k_dim * elem if dedup else 0.0)
            )
            side += PIECE_US[w.kind]
            t = g_own * slow
            for i in range(pieces):
                arrival = (i + 1) * (per_piece + extra_chunk)
                t = max(t, arrival) + (g_piece * (slow if arrival > t else 1.0)) + side
            device = t
        else:
            # each piece's rows gathered from h (and, deduplicated, summed by token before they leave)
            side = self.pass_us(2 * rows_piece * k_dim * elem + (rows_piece * n_dim * elem if dedup else 0.0))
            side += PIECE_US[w.kind]
            t, sent = 0.0, 0.0
            for _ in range(pieces):
                t += g_piece * slow + side
                sent = max(sent, t) + per_piece + extra_chunk
            t += g_own * (slow if sent > t else 1.0) + side
            back = (s.dedup_rows_out / (ws - 1) + w.tokens) if dedup else w.tokens * w.top_k
            device = max(t, sent) + self.pass_us(back * moved + w.tokens * moved)
        gemm = g_own + pieces * g_piece
        return device + 2 * self.costs.launch_us, comm, gemm

    def _fused(self, w, c, s: RoutingStats, dispatch: bool, gemm: float, moved: float):
        """A fused plan: one grouped GEMM whose tiles wait for their rows (dispatch: the last piece's
        rows hold back the tiles that need them) or store into the destination's buffer (combine:
        the last piece leaves with its tiles, then the top-k sum)."""
        ws = s.world_size
        pieces = (ws - 1) * c.chunks_per_source
        rows_out = s.pair_rows_out
        slow = 1.0 + FUSED_SLOWDOWN[w.kind]
        if c.template == "fused_dedup":  # a row a token and rank: less traffic beside the tiles
            rows_out = s.dedup_rows_out
            slow = 1.0 + FUSED_SLOWDOWN[w.kind] * rows_out / max(s.pair_rows_out, 1.0)
        tile = f"{c.block_m}x{c.block_n}x{c.block_k}w{c.num_warps}s{c.num_stages}"
        g = self.gemm_us(
            s.expert_rows, w.hidden if dispatch else w.ffn, 2 * w.ffn if dispatch else w.hidden, tile
        )
        comm = self.a2a_us(c.backend, rows_out * moved)
        last = g * (1 - 1.0 / ws) / max(pieces, 1)  # the GEMM share of the last piece's rows
        if dispatch:
            device = max(g * slow, comm + last)
        else:
            device = max(g * slow, comm) + self.pass_us(w.tokens * w.top_k * moved + w.tokens * moved)
        return device + 2 * self.costs.launch_us, comm

    def _host_us(self, c: MoeCandidate, world_size: int, dispatch: bool) -> float:
        if c.template == "unfused" or (c.template == "dedup" and c.backend == "nccl"):
            return MOE_HOST_US[c.template][0]
        if c.template == "fused" or (c.template == "fused_dedup" and dispatch):
            key = "fused"
        elif c.template in ("dedup", "fused_dedup"):
            key = "dedup/copy_engine"
        else:
            key = f"pipelined/{c.backend}"
        fixed, per = MOE_HOST_US[key]
        chunks = 1 if c.template in ("dedup", "fused_dedup") else c.chunks_per_source
        return fixed + per * chunks * (world_size - 1)


def _sm_count(calibration: Calibration) -> int:
    """The SMs the calibration's GEMM rates were measured on (their largest program count)."""
    return max(calibration.gemm_rate(TileConfig.from_key(_TILE)).tflops_by_sms)


@dataclass(frozen=True, kw_only=True, slots=True)
class MeasuredCase:
    """One measured MoE op case beside the model: what the model ranks first on the device and
    what was measured of it and of the fastest."""

    workload: MoeWorkload
    world_size: int
    pick: MoeCandidate
    pick_us: float
    """The measured device time of the model's pick."""
    best: MoeCandidate
    best_us: float
    spearman: float
    """Rank correlation of predicted and measured device times over the case's candidates."""
    ratios: tuple[float, ...]
    """Predicted over measured device time, a candidate each."""


def against_measurements(model: MoeCostModel, op: dict) -> MeasuredCase:
    """`model` on one op row of a `benchmarks/moe_bench.py` run (its `workload` key, `ep` and each
    verified candidate's measured device time)."""
    w = MoeWorkload.from_key(op["workload"])
    measured = {
        MoeCandidate.from_dict(c["config"]): c["times"]["median_us"]
        for c in op["candidates"]
        if c.get("status") == "ok" and c.get("times")
    }
    ranked = model.rank(w, measured, op["ep"], "graph")
    pick = ranked[0][0]
    best = min(measured, key=measured.__getitem__)
    return MeasuredCase(
        workload=w,
        world_size=op["ep"],
        pick=pick,
        pick_us=measured[pick],
        best=best,
        best_us=measured[best],
        spearman=_spearman([p.device_us for _, p in ranked], [measured[c] for c, _ in ranked]),
        ratios=tuple(p.device_us / measured[c] for c, p in ranked),
    )


def _spearman(a: list[float], b: list[float]) -> float:
    """Spearman's rank correlation (average ranks for ties)."""

    def ranks(x: list[float]) -> np.ndarray:
        order = np.argsort(x, kind="stable")
        r = np.empty(len(x))
        r[order] = np.arange(len(x), dtype=float)
        values = np.asarray(x)
        for v in np.unique(values):
            tied = values == v
            r[tied] = r[tied].mean()
        return r

    if len(a) < 2:
        return 1.0
    ra, rb = ranks(a), ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return 1.0
    return float(np.corrcoef(ra, rb)[0, 1])
