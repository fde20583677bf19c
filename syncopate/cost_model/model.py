"""The cost model: a candidate's time predicted from calibrations, by simulation.

```python
from syncopate.cost_model.model import CostModel
model = CostModel(calibration)                       # resolve_calibration(...) or default_calibration(...)
p = model.predict(workload, topology, candidate)     # Prediction: time_us, kernel_us, comm_us, waves, …
ranked = model.rank(workload, topology, candidates)  # fastest first; infeasible ones last
kept = model.prune(workload, topology, candidates, keep=0.25)
```

For each kind (see :mod:`syncopate.cost_model.simulate` for how each piece runs):

- `ag_gemm`: the all-gather's chunks arrive per the plan and the backend; every rank's consumer
  walks its tile order wave by wave, each tile waiting for the chunk(s) its rows lie in.
- `gemm_rs`: every rank's producer walks its tiles in send order; a chunk leaves when its last
  tile is stored; the owner's epilogue waits for the incoming partials (and, on a ring, a rank's
  tiles of a forwarded chunk wait for the partial they extend). Solved to a fixed point: arrivals
  depend on tiles that depend on arrivals, over at most world-size rounds.
- `gemm_ar`: the reduce-scatter, then every rank takes each reduced block from its owner once the
  owner's tiles of it are done.

A prediction is the slowest rank's end (kernel, sends, arrivals) plus the backend's fixed cost
per call and the launch. Candidates that cannot run (the copy engine across nodes) come back with
`feasible=False` and a reason.

Pure Python and numpy: no torch.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from syncopate.cost_model.calibration import Calibration
from syncopate.cost_model.calibration_defaults import FP8_GEMM_SPEEDUP
from syncopate.cost_model.simulate import (
    CommContext,
    Infeasible,
    TransferTable,
    own_chunks_ready,
    padded,
    run_programs,
    wave_memory_us,
)
from syncopate.errors import ConfigError
from syncopate.search_space import (
    A_STATIONARY,
    C_STATIONARY,
    COPY_ENGINE_KINDS,
    UNFUSED,
    Candidate,
    ChunkPlan,
    TileConfig,
    TileSchedule,
    Topology,
    Workload,
    build_plan,
    check_candidate,
    consumer_schedule,
    gather_gemms,
    gather_parts,
    halves,
    own_gemm_rows,
    producer_schedule,
    row_chunks,
    tail_copied_together,
    tail_split,
)

__all__ = ["CostModel", "Prediction"]

_COLLECTIVE = {"ag_gemm": "all_gather", "gemm_rs": "reduce_scatter", "gemm_ar": "all_reduce"}
_MEMO_LIMIT = 200_000
"""Predictions a model keeps (a repeated prediction costs a dictionary lookup)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Prediction:
    """What the cost model expects of one candidate."""

    candidate: Candidate
    time_us: float
    """Predicted time of one call, µs (inf when infeasible)."""
    kernel_us: float = 0.0
    """When the slowest rank's kernel ends."""
    comm_us: float = 0.0
    """When the last transfer ends."""
    stall_us: float = 0.0
    """Mean time a program of the slowest rank spent waiting for chunks or partials."""
    programs: int = 0
    """Programs of the fused kernel (an a_stationary call's cuBLAS GEMMs: the GPU's SMs, one wave)."""
    waves: int = 0
    feasible: bool = True
    reason: str = ""

    def to_dict(self) -> dict:
        return {
            "time_us": self.time_us,
            "kernel_us": self.kernel_us,
            "comm_us": self.comm_us,
            "stall_us": self.stall_us,
            "programs": self.programs,
            "waves": self.waves,
            "feasible": self.feasible,
            "reason": self.reason,
        }


@functools.lru_cache(maxsize=512)
def _plan(template: str, collective: str, ws: int, rows: int, splits: int, align: int) -> ChunkPlan:
    return build_plan(template, collective, ws, rows, splits, align=align)


class CostModel:
    """Predicts candidates' times on workloads from one :class:`Calibration`."""

    def __init__(self, calibration: Calibration) -> None:
        self.calibration = calibration
        self._groups: dict[tuple, _Group] = {}
        self._tables: dict[tuple, TransferTable] = {}
        self._memo: dict[tuple[str, str, str], Prediction] = {}

    # -- public ---------------------------------------------------------------------------------

    def predict(self, workload: Workload, topology: Topology, candidate: Candidate) -> Prediction:
        """The predicted time of `candidate` on `workload` and `topology`; ConfigError when the
        candidate is not valid for them. The model knows no difference between a candidate's
        kernels: a `gluon` candidate is predicted as its `triton` twin."""
        key = (workload.key(), topology.key(), candidate.key())
        found = self._memo.get(key)
        if found is not None:
            return found
        check_candidate(candidate, workload, topology)
        if candidate.kernel != "triton":
            twin = self.predict(workload, topology, dataclasses.replace(candidate, kernel="triton"))
            p = dataclasses.replace(twin, candidate=candidate)
            self._memo[key] = p
            return p
        try:
            p = self._simulate(workload, topology, candidate)
        except Infeasible as e:
            p = Prediction(candidate=candidate, time_us=math.inf, feasible=False, reason=str(e))
        if len(self._memo) >= _MEMO_LIMIT:
            self._memo.clear()
        self._memo[key] = p
        return p

    def rank(
        self, workload: Workload, topology: Topology, candidates: Iterable[Candidate]
    ) -> list[Prediction]:
        """Predictions of `candidates`, fastest first (ties in the given order); infeasible last."""
        preds = [self.predict(workload, topology, c) for c in candidates]
        order = sorted(range(len(preds)), key=lambda i: (preds[i].time_us, i))
        return [preds[i] for i in order]

    def prune(
        self,
        workload: Workload,
        topology: Topology,
        candidates: Iterable[Candidate],
        *,
        keep: float = 0.25,
        within: float = 1.5,
    ) -> list[Candidate]:
        """The candidates worth measuring, in their given order: feasible, and either among the
        fastest `keep` fraction or predicted within `within` × the fastest prediction."""
        cands = list(candidates)
        if not 0 < keep <= 1:
            raise ConfigError(f"keep={keep} must be a fraction in (0, 1]")
        ranked = self.rank(workload, topology, cands)
        feasible = [p for p in ranked if p.feasible]
        if not feasible:
            return []
        cut = max(1, math.ceil(keep * len(feasible)))
        chosen = {p.candidate.key() for p in feasible[:cut]}
        best = feasible[0].time_us
        chosen |= {p.candidate.key() for p in feasible if p.time_us <= within * best}
        return [c for c in cands if c.key() in chosen]

    def baselines(self, workload: Workload, topology: Topology) -> dict[str, float]:
        """Predicted times (µs) of the reference ops, by the names of :data:`syncopate.records.BASELINES`:
        the GEMM alone (the best calibrated tile configuration on every SM), the collective alone
        with NCCL (a ring of whole blocks) and with the copy engine (`direct`, one chunk per block;
        not for `gemm_ar`, as the harness), and both in sequence."""
        gemm, nccl = self._gemm_and_collective_us(workload, topology)
        out = {"gemm_alone": gemm}
        if topology.world_size > 1:
            out["comm_alone"] = nccl
            out["torch_seq"] = gemm + nccl
            if workload.kind != "gemm_ar" and topology.nodes == 1:
                out["comm_alone_copy_engine"] = self._collective_ce_us(workload, topology)
        return out

    # -- pieces ---------------------------------------------------------------------------------

    def _gemm_and_collective_us(self, workload: Workload, topology: Topology) -> tuple[float, float]:
        """The local GEMM alone, and NCCL's whole collective alone (0 on one rank)."""
        m, n, k = workload.local_gemm(topology.world_size)
        gemm = self._best_gemm_us(m, n, k, topology, workload.dtype)
        return gemm, self._collective_nccl_us(workload, topology) if topology.world_size > 1 else 0.0

    def _tile_configs(self) -> list[TileConfig]:
        return [TileConfig.from_key(k) for k in sorted(self.calibration.gemm)]

    def _tile_us(self, tc: TileConfig, k: int, programs: int, dtype: str) -> float:
        """A tile's time at the calibrated (16-bit) rate: half that rate in fp32, FP8_GEMM_SPEEDUP
        times it in fp8 (a lead)."""
        rate = self.calibration.gemm_rate(tc)
        scale = {"fp32": 0.5, "fp8": FP8_GEMM_SPEEDUP}.get(dtype, 1.0)
        return rate.tile_us(2.0 * tc.block_m * tc.block_n * k / scale, programs)

    def _plain_gemm_us(self, m: int, n: int, k: int, tc: TileConfig, topology: Topology, dtype: str) -> float:
        tiles = math.ceil(m / tc.block_m) * math.ceil(n / tc.block_n)
        p = min(topology.sm_count, tiles)
        return self.calibration.costs.launch_us + math.ceil(tiles / p) * self._tile_us(tc, k, p, dtype)

    def _best_gemm_us(self, m: int, n: int, k: int, topology: Topology, dtype: str) -> float:
        """A plain GEMM at the best calibrated tile configuration (what cuBLAS reaches, about)."""
        return min(self._plain_gemm_us(m, n, k, tc, topology, dtype) for tc in self._tile_configs())

    def _collective_nccl_us(self, workload: Workload, topology: Topology) -> float:
        ws = topology.world_size
        block = workload.shape.m // ws * workload.comm_row_bytes()
        scope = "inter" if topology.nodes > 1 else "intra"
        model = self.calibration.transfer("nccl", scope)
        steps = (ws - 1) * (2 if workload.kind == "gemm_ar" else 1)
        return model.call_us + steps * model.time_us(block, 16)

    def _collective_ce_us(self, workload: Workload, topology: Topology) -> float:
        c = Candidate(backend="copy_engine", template="direct", num_splits=1)
        ctx = CommContext(self.calibration, topology, c, workload.comm_row_bytes())
        plan = _plan("direct", _COLLECTIVE[workload.kind], topology.world_size, workload.shape.m, 1, 1)
        if workload.kind == "ag_gemm":
            arrival = own_chunks_ready(plan, ctx, 0.0)
            TransferTable(plan, "gather", ctx).run(None, arrival, 0.0)
        else:
            arrival = np.zeros((topology.world_size, _slots(plan)))
            TransferTable(plan, "reduce", ctx).run(
                np.zeros((topology.world_size, plan.num_chunks)), arrival, 0.0
            )
        return ctx.call_us() + float(np.max(arrival))

    def _group(self, role: str, plan: ChunkPlan, n_cols: int, c: Candidate) -> _Group:
        key = (
            role,
            plan.template,
            plan.collective,
            plan.world_size,
            plan.total_rows,
            plan.num_splits,
            n_cols,
            c.block_m,
            c.block_n,
            c.group_m,
            c.tile_order,
        )
        group = self._groups.get(key)
        if group is None:
            build = consumer_schedule if role == "consumer" else producer_schedule
            scheds = [
                build(plan, r, n_cols, c.block_m, c.block_n, c.group_m, c.tile_order)
                for r in range(plan.world_size)
            ]
            if len(self._groups) > 2048:
                self._groups.clear()
            group = self._groups[key] = _Group.of(scheds, _slots(plan))
        return group

    def _table(self, plan: ChunkPlan, phase: str, ctx: CommContext, pull: bool = False) -> TransferTable:
        c = ctx.candidate
        key = (
            plan.template,
            plan.collective,
            plan.world_size,
            plan.total_rows,
            plan.num_splits,
            c.block_m,
            phase,
            pull,
            c.backend,
            c.comm_sms,
            ctx.row_bytes,
            ctx.topology.key(),
        )
        table = self._tables.get(key)
        if table is None:
            if len(self._tables) > 4096:
                self._tables.clear()
            table = self._tables[key] = TransferTable(plan, phase, ctx, pull=pull)
        return table

    def _durations(
        self, group: _Group, programs: int, tile_us: float, k: int, c: Candidate, elem: int
    ) -> np.ndarray:
        """[rank, wave, program] compute time of each position (0 past the end)."""
        memory = group.wave_memory(
            programs, c.block_m * k * elem, c.block_n * k * elem, self.calibration.costs.hbm_gbps
        )
        per_wave = np.maximum(tile_us, memory)
        return np.where(group.valid(programs), per_wave[:, :, None], 0.0)

    # -- simulation -----------------------------------------------------------------------------

    def _stationary(self, w: Workload, topo: Topology, c: Candidate) -> Prediction:
        # Infeasible across nodes, as for every copy-engine candidate
        call_us = CommContext(self.calibration, topo, c, w.comm_row_bytes()).call_us()
        timeline = {A_STATIONARY: _a_stationary_us, C_STATIONARY: _c_stationary_us}.get(
            c.template, _decomposed_gather_us if w.kind == "ag_gemm" else _decomposed_us
        )
        end, kernel_end, comm_end = timeline(self, w, topo, c)
        return Prediction(
            candidate=c,
            time_us=call_us + end,
            kernel_us=kernel_end,
            comm_us=comm_end,
            programs=topo.sm_count,
            waves=1,
        )

    def _unfused(self, w: Workload, topo: Topology, c: Candidate) -> Prediction:
        """The matmul, then the whole collective: `torch_seq` of :meth:`baselines`."""
        gemm, comm = self._gemm_and_collective_us(w, topo)
        return Prediction(
            candidate=c,
            time_us=gemm + comm,
            kernel_us=gemm,
            comm_us=gemm + comm,
            programs=topo.sm_count,
            waves=1,
        )

    def _simulate(self, w: Workload, topo: Topology, c: Candidate) -> Prediction:
        if c.template == UNFUSED:
            return self._unfused(w, topo, c)
        if c.template in COPY_ENGINE_KINDS:
            return self._stationary(w, topo, c)
        ws = topo.world_size
        _, n_local, k_local = w.local_gemm(ws)
        reserved = c.comm_sms if c.backend != "copy_engine" else 0
        ctx = CommContext(self.calibration, topo, c, w.comm_row_bytes())
        call_us = ctx.call_us()
        plan = _plan(c.template, _COLLECTIVE[w.kind], ws, w.shape.m, c.num_splits, c.block_m)
        role = "consumer" if w.kind == "ag_gemm" else "producer"
        group = self._group(role, plan, n_local, c)
        programs = max(1, min(topo.sm_count - reserved, group.positions))
        tile_us = self._tile_us(TileConfig.of(c), k_local, programs, w.dtype)
        durations = self._durations(group, programs, tile_us, k_local, c, w.element_bytes)
        if role == "consumer":
            split = tail_split(group.positions, programs, -(-k_local // c.block_k))
            end, kernel_end, comm_end, stall = _consumer(
                self, w, plan, ctx, group, programs, durations, split
            )
        else:
            end, kernel_end, comm_end, stall = _producer(self, w, plan, ctx, group, programs, durations)
        slowest = int(np.argmax(end))
        return Prediction(
            candidate=c,
            time_us=call_us + float(end[slowest]),
            kernel_us=float(np.max(kernel_end)),
            comm_us=comm_end,
            stall_us=float(stall[slowest]) / programs,
            programs=programs,
            waves=-(-group.positions // programs),
        )


def _cublas_timeline_inputs(model: CostModel, w: Workload, topo: Topology):
    """What the cuBLAS templates' timelines share: (ranks, rows of a rank's block, the per-rank
    GEMM's N and K, element bytes, the copy engine's link, its per-copy cost, the time of a GEMM of
    that N and K over `m` rows at the best calibrated rate)."""
    ws = topo.world_size
    _, n, k = w.local_gemm(ws)

    def gemm(m: int) -> float:
        return model._best_gemm_us(m, n, k, topo, w.dtype)

    return (
        ws,
        -(-w.shape.m // ws),
        n,
        k,
        w.element_bytes,
        model.calibration.transfer("copy_engine", "intra"),
        model.calibration.costs.chunk_us.get("copy_engine", 0.0),
        gemm,
    )


def _c_stationary_us(
    model: CostModel, w: Workload, topo: Topology, c: Candidate
) -> tuple[float, float, float]:
    """(call end, GEMMs' end, last transfer's end) of a c_stationary call: each peer's rows of A and
    B pushed to it in turn over one egress while the own term's GEMM runs; each peer's term added
    once its inputs are here, in the order they arrive. An all-reduce adds the last term in
    `num_splits` row chunks and pulls each peer's chunk once made (all ranks alike), over one
    ingress."""
    ws, rows, n, k_local, elem, link, extra, gemm = _cublas_timeline_inputs(model, w, topo)
    clock, sent = gemm(rows), 0.0
    arrivals = []
    for _ in range(ws - 1):
        sent += link.time_us(rows * k_local * elem) + link.time_us(k_local * n * elem) + extra
        arrivals.append(sent)
    if w.kind != "gemm_ar":
        for arrive in arrivals:
            clock = max(clock, arrive) + gemm(rows)
        return clock, clock, sent
    for arrive in arrivals[:-1]:
        clock = max(clock, arrive) + gemm(rows)
    if arrivals:
        clock = max(clock, arrivals[-1])
    pulled = 0.0
    for lo, hi in row_chunks(rows, c.num_splits):
        if arrivals:
            clock += gemm(hi - lo)
        for _ in range(ws - 1):
            pulled = max(pulled, clock) + link.time_us((hi - lo) * n * elem) + extra
    return max(clock, pulled), clock, max(sent, pulled)


def _decomposed_us(model: CostModel, w: Workload, topo: Topology, c: Candidate) -> tuple[float, float, float]:
    """(call end, GEMMs' end, last transfer's end) of a decomposed call (all ranks alike): the
    partials of each peer's block in two GEMMs (the halves of its `num_splits` row chunks), each
    pushed over one egress once computed; then the own block's chunks (on two ranks the first
    half's in one GEMM), each once every peer's partial of it is here (what this rank pushes to the
    peer `d` ahead arrives from the peer `d` behind at the same time), a third rank's partial
    onward added at the HBM's rate; each reduced chunk copied into the output (on two ranks an
    all-reduce's last two together), and an all-reduce's pulled by every peer over one ingress (its
    last own chunk in two)."""
    ws, rows, n, _, _, link, extra, gemm = _cublas_timeline_inputs(model, w, topo)
    out_bytes = w.output_bytes  # the partials move in the output's dtype (bf16 for fp8)
    costs = model.calibration.costs
    even = row_chunks(rows, c.num_splits)
    chunks = [hi - lo for lo, hi in even]
    clock, sent = 0.0, 0.0
    arrive = [0.0] * len(chunks)
    for _ in range(ws - 1):
        for half in halves(len(chunks)):
            m = sum(chunks[j] for j in half)
            clock += gemm(m)
            sent = max(sent, clock) + link.time_us(m * n * out_bytes) + extra
            for j in half:
                arrive[j] = max(arrive[j], sent)
    copied = pulled = 0.0
    all_reduce = w.kind == "gemm_ar"
    own = own_gemm_rows(even, ws, all_reduce)
    starts = [lo for lo, _ in even]
    held = 0  # the chunk before the last copied into the output with the last (`tail_copied_together`)
    for i, (lo, hi) in enumerate(own):
        j = bisect.bisect_right(starts, lo) - 1  # the even chunk it starts in: its partials' arrival
        nbytes = (hi - lo) * n * out_bytes
        clock = max(clock, arrive[j]) + gemm(hi - lo) + (ws - 2) * 3 * nbytes / (costs.hbm_gbps * 1e3)
        if i == len(own) - 2 and tail_copied_together(even, ws, all_reduce):
            held = nbytes
        else:
            copied = max(copied, clock) + (held + nbytes) / (costs.local_copy_gbps * 1e3)
        if all_reduce:
            for _ in range(ws - 1):
                pulled = max(pulled, clock) + link.time_us(nbytes) + extra
    return max(clock, copied, pulled), clock, max(sent, pulled)


def _decomposed_gather_us(
    model: CostModel, w: Workload, topo: Topology, c: Candidate
) -> tuple[float, float, float]:
    """(call end, GEMMs' end, last transfer's end) of a decomposed all-gather matmul, on the rank that
    finishes last: every rank pushes its shard's parts to each peer in turn over one egress (what
    lands from the peer `d` behind lands when this rank's `d`-th push ends) while its own rows' GEMM
    runs; then each GEMM of `gather_gemms` once the parts it reads are here."""
    ws, m_local, _, _, _, link, extra, gemm = _cublas_timeline_inputs(model, w, topo)
    row_bytes = w.comm_row_bytes()  # A's row (an fp8 row with its scale)
    parts = row_chunks(m_local, gather_parts(ws, c.num_splits))
    landed, t = {}, 0.0
    for d in range(1, ws):
        for j, (lo, hi) in enumerate(parts):
            t += link.time_us((hi - lo) * row_bytes) + extra
            landed[d, j] = t
    end = 0.0
    for r in range(ws):
        clock = gemm(m_local)
        for lo, hi, read in gather_gemms(ws, r, m_local, c.num_splits):
            clock = max([clock] + [landed[(r - q) % ws, j] for q, j in read]) + gemm(hi - lo)
        end = max(end, clock)
    return max(end, t), end, t


def _a_stationary_us(
    model: CostModel, w: Workload, topo: Topology, c: Candidate
) -> tuple[float, float, float]:
    """(call end, GEMMs' end, last transfer's end) of an a_stationary call, µs after its start, on
    the rank that finishes last (all alike): B pushed to each peer in turn over one egress while the
    first half of the own rows' GEMM runs; each peer's product computed in `num_splits` row chunks
    once its B is here, in the order the peers' B arrive, each chunk pulled by its owner once
    computed, over one ingress; then the second half of the own rows. GEMMs run at the best
    calibrated tile configuration's rate (cuBLAS's, about)."""
    ws, m_local, n_local, k, elem, link, extra, gemm = _cublas_timeline_inputs(model, w, topo)
    b_arrives, t = [], 0.0
    for _ in range(ws - 1):
        t += link.time_us(k * n_local * elem) + extra
        b_arrives.append(t)
    chunks = [hi - lo for lo, hi in row_chunks(m_local, c.num_splits)]
    half = m_local // 2
    clock = gemm(half)
    link_free = 0.0
    for arrive in b_arrives:
        clock = max(clock, arrive)
        for rows in chunks:
            clock += gemm(rows)
            link_free = max(link_free, clock) + link.time_us(rows * n_local * elem) + extra
    clock += gemm(m_local - half)
    return max(clock, link_free), clock, link_free


def _cut_tail(need: np.ndarray, durations: np.ndarray, split: int, positions: int, extra_us: float):
    """The consumer's last wave with each of its tiles cut into `split` K parts
    (`search_space.tail_split`): program u takes part u % split of the wave's tile u // split, when
    that tile's rows are there, for 1/split of its time plus `extra_us` (its sum stored in float32
    and the last part's reading of the others')."""
    programs = need.shape[2]
    whole, rest = divmod(positions, programs)
    owner = np.arange(rest * split) // split
    need, durations = need.copy(), durations.copy()
    last_need, last = need[:, whole, :rest].copy(), durations[:, whole, :rest].copy()
    need[:, whole, :], durations[:, whole, :] = -np.inf, 0.0
    need[:, whole, : rest * split] = last_need[:, owner]
    durations[:, whole, : rest * split] = last[:, owner] / split + extra_us
    return need, durations


def _consumer(model: CostModel, w, plan, ctx, group, programs, durations, split: int = 0):
    costs = model.calibration.costs
    start = costs.launch_us
    # The kernel reads each rank's own rows from its shard (and the backends send them from there):
    # they are there when the call starts, not when the copy into the gathered buffer ends.
    own = own_chunks_ready(plan, ctx, start)
    arrival = np.where(np.isfinite(own), start, own)
    if plan.world_size > 1:
        model._table(plan, "gather", ctx).run(None, arrival, start)
    comm_end = float(np.max(arrival))
    need = padded(group.per_position(arrival) + costs.wait_us, programs, -np.inf)
    if split:  # the last wave's parts: each a share of its tile, its float32 sum stored and read back
        c = ctx.candidate
        extra_us = split * c.block_m * c.block_n * 4 / (costs.hbm_gbps * 1e3 / programs)
        need, durations = _cut_tail(need, durations, split, group.positions, extra_us)
    slowdown = costs.overlap_slowdown.get(ctx.backend, 0.0) if plan.world_size > 1 else 0.0
    run = run_programs(
        programs, start, need, durations, comm_end=comm_end, slowdown=slowdown, positions=group.positions
    )
    end = np.maximum(run.end, arrival.max(axis=1))
    return end, run.end, comm_end, run.stall


def _producer(model: CostModel, w, plan, ctx, group, programs, durations):
    costs = model.calibration.costs
    start = costs.launch_us
    ws = plan.world_size
    slowdown = costs.overlap_slowdown.get(ctx.backend, 0.0) if ws > 1 else 0.0
    tile_bytes = ctx.candidate.block_m * ctx.candidate.block_n * w.output_bytes
    epilogue = padded(
        group.incoming_per_position * tile_bytes / (costs.hbm_gbps * 1e3 / programs), programs, 0.0
    )
    partials = np.zeros((ws, group.slots))
    table = model._table(plan, "reduce", ctx) if ws > 1 else None
    free: dict = {}
    comm_end = start
    slowed = None
    all_reduce = w.kind == "gemm_ar" and ws > 1
    # the transfers of the last reduce phase simulated and of the gather, when they share one queue
    log: list | None = (
        [] if all_reduce and ctx.backend == "copy_engine" and _unshared_egress(plan, ctx) else None
    )
    for _ in range(ws + 4):
        partial = padded(
            group.per_position(group.chunk_wait_time(partials)) + costs.wait_us, programs, -np.inf
        )
        run = run_programs(
            programs,
            start,
            None,
            durations,
            comm_end=comm_end,
            slowdown=slowdown,
            partial=partial,
            epilogue=epilogue,
            positions=group.positions,
            slowed=slowed,
        )
        settled = slowed is None or run.slowed is None or np.array_equal(slowed, run.slowed)
        slowed = run.slowed
        ready = group.chunk_max(run.tile_end, plan.num_chunks, start)
        if table is None:
            break
        new = np.zeros_like(partials)
        if log is not None:
            log.clear()
        free = table.run(ready, new, start, log=log)
        comm_end = max([start, *free.values()])
        converged = float(np.max(np.abs(new - partials))) < 1e-6 and settled
        partials = new
        if converged:
            break
    end = np.maximum(run.end, comm_end)
    if all_reduce:
        gathered = np.full((ws, plan.num_chunks), start)
        queues = {} if ctx.backend == "copy_engine" else free
        model._table(plan, "gather", ctx, pull=True).run(ready, gathered, start, queues, log)
        end = np.maximum(end, gathered.max(axis=1))
        comm_end = max(comm_end, float(np.max(gathered)))
        if log is not None:
            egress = _one_egress(log, ws)
            end = np.maximum(end, egress)
            comm_end = max(comm_end, float(np.max(egress)))
    return end, run.end, comm_end, run.stall


def _unshared_egress(plan: ChunkPlan, ctx: CommContext) -> bool:
    """Whether the model gives each of a rank's transfers its whole egress (their times not
    already spread over concurrent streams or a switch's peers), so that they can be replayed
    one after another on one queue."""
    topo = ctx.topology
    return ctx.egress_share(plan) == 1.0 and not (topo.interconnect == "nvlink" and topo.gpus_per_node > 2)


def _one_egress(log: list, ws: int) -> np.ndarray:
    """[rank]: when each rank's egress has moved all it sends, its transfers (src, begin, duration)
    replayed in the order they began on one queue.

    An all-reduce over the copy engine sends a rank's partials on its side streams and has its
    peers pull its reduced rows on theirs: separate queues, but one link direction, so the two
    phases share its bandwidth: the partials and the reduced chunks run back to back on it, and the
    call takes as long as both."""
    free = np.full(ws, -np.inf)
    for src, begin, duration in sorted(log, key=lambda e: e[1]):
        free[src] = max(free[src], begin) + duration
    return np.full(ws, float(np.max(free)))


def _slots(plan: ChunkPlan) -> int:
    return max((plan.num_signals(r) for r in range(plan.world_size)), default=0) + 1


class _Group:
    """Every rank's tile schedule of one (plan, tile shape, order), as arrays [rank, position]."""

    def __init__(self, scheds: list[TileSchedule], slots: int) -> None:
        first = scheds[0]
        self.tiles_m, self.tiles_n = first.tiles_m, first.tiles_n
        self.order = np.array([s.order for s in scheds], dtype=np.int64)
        ranks, self.positions = self.order.shape
        tm = self.order // self.tiles_n
        if first.entry_chunk:  # a producer entry finishes the rows of one chunk
            self.pos_lo = np.array([s.entry_chunk for s in scheds], dtype=np.int64)
            self.pos_hi = self.pos_lo
        else:
            self.pos_lo = np.take_along_axis(
                np.array([s.mtile_chunk_lo for s in scheds], dtype=np.int64), tm, axis=1
            )
            self.pos_hi = (
                np.take_along_axis(np.array([s.mtile_chunk_hi for s in scheds], dtype=np.int64), tm, axis=1)
                - 1
            )
        self.rank_index = np.arange(ranks)[:, None]
        chunks = len(first.chunk_wait)
        self._flat_lo = (self.rank_index * chunks + self.pos_lo).reshape(-1)
        self._flat_hi = (
            None
            if np.array_equal(self.pos_lo, self.pos_hi)
            else (self.rank_index * chunks + self.pos_hi).reshape(-1)
        )
        self.num_chunks = chunks
        self.slots = slots
        width = max((len(w) for s in scheds for w in s.chunk_wait), default=0) or 1
        self.wait_slots = np.full((ranks, chunks, width), slots, dtype=np.int64)
        for r, s in enumerate(scheds):
            for c, slots_ in enumerate(s.chunk_wait):
                self.wait_slots[r, c, : len(slots_)] = slots_
        incoming = np.array([[len(x) for x in s.chunk_wait] for s in scheds], dtype=float)
        self.incoming_per_position = np.take_along_axis(incoming, self.pos_lo, axis=1)
        keys = np.concatenate(
            [self.rank_index * chunks + self.pos_lo, self.rank_index * chunks + self.pos_hi], axis=1
        )
        flat = keys.reshape(-1)
        self._perm = np.argsort(flat, kind="stable")
        ordered = flat[self._perm]
        self._starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
        self._ids = ordered[self._starts]
        self._memory: dict[tuple, np.ndarray] = {}
        self._valid: dict[int, np.ndarray] = {}

    @classmethod
    def of(cls, scheds: list[TileSchedule], slots: int) -> _Group:
        return cls(scheds, slots)

    def per_position(self, per_chunk: np.ndarray) -> np.ndarray:
        """[rank, position]: the latest of `per_chunk[rank, chunk]` over the chunk(s) the position's rows lie in."""
        flat = per_chunk.reshape(-1)
        out = flat.take(self._flat_lo)
        if self._flat_hi is not None:
            out = np.maximum(out, flat.take(self._flat_hi))
        return out.reshape(self.pos_lo.shape)

    def chunk_wait_time(self, slot_arrival: np.ndarray) -> np.ndarray:
        """[rank, chunk]: when the last partial it waits for arrives (-inf: none)."""
        ext = np.concatenate([slot_arrival, np.full((slot_arrival.shape[0], 1), -np.inf)], axis=1)
        return ext[self.rank_index[:, :, None], self.wait_slots].max(axis=2)

    def chunk_max(self, per_position: np.ndarray, num_chunks: int, floor: float) -> np.ndarray:
        """[rank, chunk]: the latest of `per_position` over the positions whose rows overlap the chunk."""
        both = np.concatenate([per_position, per_position], axis=1).reshape(-1)
        out = np.full(per_position.shape[0] * num_chunks, floor)
        out[self._ids] = np.maximum(np.maximum.reduceat(both[self._perm], self._starts), floor)
        return out.reshape(per_position.shape[0], num_chunks)

    def wave_memory(self, programs: int, panel_m: float, panel_n: float, hbm_gbps: float) -> np.ndarray:
        key = (programs, panel_m, panel_n, hbm_gbps)
        mem = self._memory.get(key)
        if mem is None:
            mem = self._memory[key] = wave_memory_us(
                self.order, self.tiles_m, self.tiles_n, programs, panel_m, panel_n, hbm_gbps
            )
        return mem

    def valid(self, programs: int) -> np.ndarray:
        """[1, wave, program]: True where a position exists."""
        v = self._valid.get(programs)
        if v is None:
            p = max(1, min(programs, self.positions))
            v = self._valid[programs] = (np.arange(-(-self.positions // p) * p) < self.positions).reshape(
                1, -1, p
            )
        return v
