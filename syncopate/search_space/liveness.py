"""Liveness of one call of a fused op: does every tile of every rank finish and every transfer end?

A discrete-event model of one call on every rank at once, written from what the kernels
(`syncopate/kernels/triton_kernels.py`) and the backends (`syncopate/kernels/backends.py`) do:

- **Fused kernel.** P persistent programs per rank (P = min(num_programs, entries of the order));
  program p takes positions p, p+P, … of the order, strictly one after the other. A consumer tile
  waits for the word of each chunk its rows lie in (`chunk_slot[lo]`, then `chunk_slot[hi-1]`; the
  rank's own chunks are raised by the local copy on stream 2). A producer entry finishes the rows
  of one chunk (`TileSchedule.entry_chunk`): it waits for every partial received for the chunk (in
  slot order), for an all-reduce chunk kept here until every peer has entered the call (`ENTERED`
  words), then counts the tile in the chunk; the chunk's last tile raises its ready word and, for
  an all-reduce chunk kept here, every peer's gather word. A schedule without entries (the kernels
  before them) closes every chunk of the tile in one entry, as `epilogue` says.
- **Communication**, per rank, as queues that run their operations strictly in enqueue order:
  `copy_engine`: one queue per side stream (0, 1, 2), each send waiting for the peer's entry (once
  per stream and peer), for its chunk (ready word, or its own arrival when forwarding), then
  signalling; `sm_copy` and `nvshmem` (one copier job list): stream 2 (own chunks), and stream 0:
  the entry announcement, then the copier's jobs one after the other, each waiting for its peer's
  entry and its chunk; `nccl`: stream 2 (own chunks) and stream 0: the announcement, then per
  (step, split) batch the ready words of its sends, the batch, the arrival words of its receives
  (all-reduce: then the gather phase the same way, its sends waiting for the kept chunks' ready
  words).
- **NCCL batches** are a rendezvous: a batch ends only once the batch with the same key is running
  on every peer it sends to or receives from (stricter than NCCL, which lets a small send finish
  into the peer's buffer early).

Where a detail is uncertain the stricter behaviour is modelled, and `shared_queue=True` is stricter
still: every side stream of a rank shares one hardware queue, so their operations run in the order
they were enqueued (CUDA maps streams onto a few hardware queues; two streams on one queue
serialise). Signals only grow and every step depends only on signals having been raised, so the
state the model ends in does not depend on the order in which events are taken.

Left out: the fused kernel is assumed to have all its programs resident at once (the launchers
size the grid to the SMs the backend leaves) and the SM copier and NCCL their reserved SMs; a
consumer raises nothing, so when it starts (before or after its side work) and its software
pipelining (it waits for its next tile's rows while finishing the current one) cannot change
whether a call ends; a producer waits only in its epilogue, after its loads, so its entries are
modelled one at a time. Copies, data, memory ordering, the bounded waits of a tuning run, and what
one call leaves for the next (epochs, counters reset) are not modelled.
Pure Python.
"""

from __future__ import annotations

import functools
from collections import defaultdict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any

from syncopate.errors import ConfigError
from syncopate.search_space.candidate import COPIER_BACKENDS, Candidate
from syncopate.search_space.chunk_plan import PLANLESS_KINDS, ChunkPlan, Transfer, build_plan
from syncopate.search_space.tile_order import TileSchedule, consumer_schedule, producer_schedule

__all__ = ["EPILOGUES", "LivenessReport", "check_liveness", "queue_operations"]

EPILOGUES: tuple[str, ...] = ("leaving_first", "waits_first")
"""How a producer tile with rows of two chunks ends when its schedule has no `entry_chunk` (the
kernels before entries): `leaving_first` finishes and counts the chunk that leaves first before it
waits for the other's partials; `waits_first` waits for every partial of the tile before it counts
either chunk, which can deadlock (two ranks each waiting for the chunk the other holds back): the
model must find that."""

_COLLECTIVE = {"ag_gemm": "all_gather", "gemm_rs": "reduce_scatter", "gemm_ar": "all_reduce"}
_WAIT, _RAISE, _COUNT = 0, 1, 2
# Signals are ints: (index << 11) | (rank << 3) | word kind.
_ARRIVAL, _READY, _LOCAL, _ENTERED, _BATCH = range(5)


def _sig(rank: int, kind: int, index: int) -> int:
    return (index << 11) | (rank << 3) | kind


def _batch(phase: str, step: int, split: int) -> int:
    """Index of the NCCL batch (phase, step, split): the same on every rank."""
    return (step << 7) | (split << 1) | (phase == "gather")


@dataclass(frozen=True, slots=True)
class LivenessReport:
    """What one modelled call came to."""

    live: bool
    """Every tile of every rank finished and every transfer ended."""
    case: str
    """The call: kind, candidate fields that matter, world size, rows, columns, programs."""
    entries_done: int
    """Order entries (tiles) finished, over every rank."""
    entries_total: int
    stuck: tuple[str, ...] = ()
    """One line per blocked actor (program or queue), at most a dozen."""
    cycle: tuple[str, ...] = ()
    """The wait-for chain from a blocked actor until it comes back to one it met before: each line
    says who waits for what, and who would raise it."""

    def __bool__(self) -> bool:
        return self.live

    def describe(self) -> str:
        if self.live:
            return f"{self.case}: live ({self.entries_total} entries)"
        lines = [f"{self.case}: DEADLOCK, {self.entries_done} of {self.entries_total} entries done"]
        if self.cycle:
            lines.append("wait-for cycle:")
            lines += [f"  {line}" for line in self.cycle]
        lines.append("blocked:")
        lines += [f"  {line}" for line in self.stuck]
        return "\n".join(lines)


def check_liveness(
    kind: str,
    candidate: Candidate | Mapping[str, Any],
    world_size: int,
    total_rows: int,
    n_cols: int,
    num_programs: int,
    *,
    shared_queue: bool = False,
    epilogue: str = "leaving_first",
    schedule: Callable[[ChunkPlan, int], TileSchedule] | None = None,
) -> LivenessReport:
    """Model one call of `kind` with `candidate` on `world_size` ranks and say whether it ends.

    `total_rows` is M of the communicated tensor, `n_cols` the output columns of each rank's GEMM
    (N/ws for `ag_gemm`, N otherwise), `num_programs` the persistent grid the launcher asks for
    (the SMs left by the backend). `schedule(plan, rank)` replaces each rank's tile schedule (to
    model another order); `epilogue` and `shared_queue` are described in :data:`EPILOGUES` and the
    module docstring. Raises ConfigError where the kernel tables would refuse the plan.
    """
    c = candidate if isinstance(candidate, Candidate) else Candidate.from_dict(dict(candidate))
    if kind not in _COLLECTIVE:
        raise ConfigError(f"unknown kind {kind!r}: accepted are {', '.join(_COLLECTIVE)}")
    if epilogue not in EPILOGUES:
        raise ConfigError(f"unknown epilogue {epilogue!r}: accepted are {', '.join(EPILOGUES)}")
    if not 2 <= world_size <= 255:
        raise ConfigError(f"world size {world_size}: the model takes 2 to 255 ranks")
    if num_programs < 1:
        raise ConfigError(f"num_programs={num_programs} must be at least 1")
    if c.template in PLANLESS_KINDS:
        return _planless_report(kind, c, world_size, total_rows)
    fields = (
        kind,
        c.template,
        c.num_splits,
        c.tile_order,
        c.block_m,
        c.block_n,
        c.group_m,
        world_size,
        total_rows,
        n_cols,
        epilogue,
    )
    call = _call(*fields) if schedule is None else _Call(*fields, schedule=schedule)
    model = _Model(call, c.backend, num_programs, shared_queue)
    model.run()
    case = (
        f"{kind} {c.backend}/{c.template}/s{c.num_splits}/{c.tile_order} bm{c.block_m} bn{c.block_n} "
        f"g{c.group_m} ws={world_size} rows={total_rows} cols={n_cols} P={num_programs}"
        + (" shared-queue" if shared_queue else "")
        + (f" epilogue={epilogue}" if epilogue != "leaving_first" else "")
        + (" custom-schedule" if schedule is not None else "")
    )
    return model.report(case)


def _planless_report(kind: str, c: Candidate, world_size: int, total_rows: int) -> LivenessReport:
    """A call with no chunk plan has no waiting kernel to model. unfused: a matmul, then one
    collective every rank enters. The calls that move operands (`kernels/a_stationary.py`,
    `kernels/c_stationary.py`): a_stationary: the caller's stream waits for each
    peer's B, which the peer pushes first thing; a side stream waits for the peers' products, which
    wait only for those pushes. c_stationary: the caller's stream waits for each peer's inputs,
    which the peer pushes once this rank has entered the call, announced first thing, and for an
    all-reduce for the peers' entries (before its block is written) and, on a side stream, for the
    peers' chunks of their blocks, which wait only for pushes. decomposed
    (`kernels/decomposed.py`): the pushes wait for the peers' entries, announced first thing; the
    caller's stream for the peers' partials, which wait only for entries and the pusher's own GEMMs;
    an all-reduce's pulls for the peers' reduced chunks, which wait only for partials; an
    all-gather's (`kernels/decomposed_gather.py`) caller's stream for the parts of the peers'
    shards, whose pushes wait only for entries. Every wait is on something raised without waiting
    for the waiter, so the call ends."""
    if kind not in PLANLESS_KINDS[c.template]:
        raise ConfigError(
            f"template {c.template} is for {' and '.join(PLANLESS_KINDS[c.template])}, not {kind}"
        )
    case = f"{kind} {c.backend}/{c.template}/s{c.num_splits} ws={world_size} rows={total_rows}"
    return LivenessReport(live=True, case=case, entries_done=0, entries_total=0)


def queue_operations(
    kind: str, candidate: Candidate | Mapping[str, Any], world_size: int, total_rows: int, rank: int
) -> dict[int, list[tuple]]:
    """What the model puts on each side stream of `rank`, in order, to compare with what a backend
    enqueues: `("wait" | "raise", rank, word, index)` for a signal word (`arrival`, `ready`, `local`,
    `entered`: ARRIVAL slot, READY_BASE+i, LOCAL_BASE+j, ENTERED_BASE+p of that rank's pad) and
    `("batch", peers)` for an NCCL batch with those peers. Copies are left out (they never block)."""
    c = candidate if isinstance(candidate, Candidate) else Candidate.from_dict(dict(candidate))
    call = _call(
        kind,
        c.template,
        c.num_splits,
        c.tile_order,
        c.block_m,
        c.block_n,
        c.group_m,
        world_size,
        total_rows,
        c.block_n,
        "leaving_first",
    )
    out: dict[int, list[tuple]] = {}
    for name, _steps, ops in call.queues(c.backend, False):
        if name[1] != rank:
            continue
        items: list[tuple] = []
        for code, arg, note in ops:
            if note[0] == "batch":
                items.append(("batch", []))
            elif note[0] == "peer":
                items[-1][1].append(note[4])
            else:
                kind_, r, idx = arg & 7, (arg >> 3) & 255, arg >> 11
                items.append(("wait" if code == _WAIT else "raise", r, _WORDS[kind_], idx))
        out[name[2]] = [("batch", tuple(x[1])) if x[0] == "batch" else x for x in items]
    return out


_WORDS = {_ARRIVAL: "arrival", _READY: "ready", _LOCAL: "local", _ENTERED: "entered"}


class _Call:
    """What every rank does in one call, whatever the grid: per rank, one tuple of kernel operations
    per order entry; per (rank, chunk), the tiles that complete it and the signals it then raises;
    per backend, every rank's communication queues."""

    def __init__(
        self,
        kind,
        template,
        splits,
        order,
        block_m,
        block_n,
        group_m,
        ws,
        rows,
        n_cols,
        epilogue,
        schedule=None,
    ):
        self.kind, self.ws, self.epilogue = kind, ws, epilogue
        self.all_reduce = kind == "gemm_ar"
        plan = self.plan = build_plan(template, _COLLECTIVE[kind], ws, rows, splits, align=block_m)
        if schedule is None:
            make = consumer_schedule if kind == "ag_gemm" else producer_schedule
            self.scheds = [make(plan, r, n_cols, block_m, block_n, group_m, order) for r in range(ws)]
        else:
            self.scheds = [schedule(plan, r) for r in range(ws)]
        for s in self.scheds:
            if max(hi - lo for lo, hi in zip(s.mtile_chunk_lo, s.mtile_chunk_hi)) > 2:
                raise ConfigError(
                    f"a tile overlaps more than two chunks ({rows} rows, world size {ws}, num_splits={splits}, "
                    f"block_m={block_m}): the kernel tables refuse this plan"
                )
        self.targets = [0] * (ws * plan.num_chunks)
        self.on_done: list[list[int]] = [[] for _ in range(ws * plan.num_chunks)]
        self.entries = [self._consumer(r) if kind == "ag_gemm" else self._producer(r) for r in range(ws)]
        self._queues: dict[tuple[str, bool], list] = {}

    def _consumer(self, r: int) -> list[tuple]:
        plan, s = self.plan, self.scheds[r]
        slot = [
            _sig(r, _LOCAL, ci % plan.num_splits)
            if ci // plan.num_splits == r
            else _sig(r, _ARRIVAL, waits[0])
            for ci, waits in enumerate(s.chunk_wait)
        ]
        out = []
        for pos, tile in enumerate(s.order):
            tm = tile // s.tiles_n
            lo, hi = s.mtile_chunk_lo[tm], s.mtile_chunk_hi[tm]
            ops = ((_WAIT, slot[lo], ("rows", r, pos, lo)),)
            if hi - 1 != lo:
                ops += ((_WAIT, slot[hi - 1], ("rows", r, pos, hi - 1)),)
            out.append(ops)
        return out

    def _producer(self, r: int) -> list[tuple]:
        plan, s, ws, nc = self.plan, self.scheds[r], self.ws, self.plan.num_chunks
        ready = list(s.chunk_ready)
        keep = [x < 0 for x in ready]
        if self.all_reduce:  # as kernels.tables.producer_tables: kept chunks get ready words after the sends'
            for ci, word in plan.kept_ready_words(r).items():
                ready[ci] = word
        for ci in range(nc):
            self.targets[r * nc + ci] = s.chunk_tiles[ci]
            done = self.on_done[r * nc + ci]
            if ready[ci] >= 0:
                done.append(_sig(r, _READY, ready[ci]))
            if self.all_reduce and keep[ci]:
                done += [
                    _sig(p, _ARRIVAL, t.signal)
                    for p in range(ws)
                    for t in plan.recvs(p, "gather")
                    if t.src == r and plan.chunk_index(*t.chunk) == ci
                ]
        src = {t.signal: t.src for t in plan.recvs(r, "reduce")}
        waits = []
        for ci in range(nc):
            ops = tuple(
                (_WAIT, _sig(r, _ARRIVAL, slot), ("partial", r, ci, src[slot])) for slot in s.chunk_wait[ci]
            )
            if self.all_reduce and keep[ci]:
                ops += tuple((_WAIT, _sig(r, _ENTERED, p), ("free", r, ci, p)) for p in range(ws) if p != r)
            waits.append(ops)
        out = []
        for pos, tile in enumerate(s.order):
            tm = tile // s.tiles_n
            c0, c1 = s.mtile_chunk_lo[tm], s.mtile_chunk_hi[tm] - 1
            if s.entry_chunk:
                chunks = (s.entry_chunk[pos],)
            elif c1 == c0:
                chunks = (c0,)
            elif self.epilogue == "waits_first":  # every wait of the tile, then both counts, in row order
                counts = tuple((_COUNT, r * nc + c, ("count", r, c)) for c in (c0, c1))
                out.append(waits[c0] + waits[c1] + counts)
                continue
            else:
                swap = ready[c1] >= 0 and (ready[c0] < 0 or ready[c1] < ready[c0])
                chunks = (c1, c0) if swap else (c0, c1)
            ops = ()
            for ci in chunks:
                ops += waits[ci] + ((_COUNT, r * nc + ci, ("count", r, ci)),)
            out.append(ops)
        return out

    # ---- communication -------------------------------------------------------------------------

    def queues(self, backend: str, shared_queue: bool) -> list[tuple[tuple, list[tuple], list[tuple]]]:
        """Every rank's communication queues: (name, operations of each transfer, all operations)."""
        key = (backend, shared_queue)
        if key not in self._queues:
            self._queues[key] = [
                (name, steps, list(chain.from_iterable(steps)))
                for r in range(self.ws)
                for name, steps in self._communication(r, backend, shared_queue)
            ]
        return self._queues[key]

    def _communication(self, r: int, backend: str, shared_queue: bool) -> list[tuple[tuple, list[tuple]]]:
        """Rank r's side-stream work in enqueue order, as (stream, operations of one transfer)."""
        copier = backend in COPIER_BACKENDS
        work: list[tuple[int, tuple]] = []
        if self.kind == "ag_gemm":
            work += [(2, ((_RAISE, _sig(r, _LOCAL, j), ("own", j)),)) for j in range(self.plan.num_splits)]
        work.append((0, tuple((_RAISE, _sig(p, _ENTERED, r), ("announce", p)) for p in range(self.ws))))
        if backend == "nccl":
            if self.kind == "ag_gemm":
                work += [(0, ops) for ops in self._nccl(r, "gather")]
            else:
                work += [(0, ops) for ops in self._nccl(r, "reduce")]
                if self.all_reduce:
                    work += [(0, ops) for ops in self._nccl(r, "gather")]
        elif self.kind == "ag_gemm":
            work += self._sends(r, "gather", copier)
        else:
            work += self._sends(r, "reduce", copier)
            if self.all_reduce:
                for t in self.plan.recvs(r, "gather"):  # take each reduced chunk once its owner says so
                    ops = ((_WAIT, _sig(r, _ARRIVAL, t.signal), ("gathered", t)),)
                    if copier:  # the copier's job first waits for `free[job_peer]`, here its own entry
                        ops = ((_WAIT, _sig(r, _ENTERED, r), ("entered", t)),) + ops
                    work.append((0 if copier else 2, ops))
        if shared_queue:
            return [(("queue", r, -1, backend), [ops for _, ops in work])]
        return [
            (("queue", r, stream, backend), [ops for s, ops in work if s == stream])
            for stream in sorted({s for s, _ in work})
        ]

    def _sends(self, r: int, phase: str, copier: bool) -> list[tuple[int, tuple]]:
        """copy_engine (per stream) and the copiers (one job list): wait for the peer's entry, for the
        chunk (ready word, or its own arrival when forwarding a gathered chunk), copy, signal."""
        arrived = {t.chunk: t.signal for t in self.plan.recvs(r, "gather")}
        out, waited = [], set()
        for i, t in enumerate(self.plan.sends(r, phase)):
            ops = ()
            if copier or (t.stream, t.dst) not in waited:  # the copier waits for the peer before every job
                ops += ((_WAIT, _sig(r, _ENTERED, t.dst), ("entered", t)),)
                waited.add((t.stream, t.dst))
            if phase == "reduce":
                ops += ((_WAIT, _sig(r, _READY, i), ("ready", t)),)
            elif t.block != r:
                ops += ((_WAIT, _sig(r, _ARRIVAL, arrived[t.chunk]), ("forward", t)),)
            ops += ((_RAISE, _sig(t.dst, _ARRIVAL, t.signal), ("signal", t)),)
            out.append((0 if copier else t.stream, ops))
        return out

    def _nccl(self, r: int, phase: str) -> list[tuple]:
        """`nccl_exchange`: per (step, split) batch, the ready waits of its sends, the batch (a
        rendezvous with every peer in it), then the arrival words of its receives."""
        plan = self.plan
        send_index = {(t.chunk, t.step): i for i, t in enumerate(plan.sends(r, "reduce"))}
        kept = [ci for ci in range(plan.num_chunks) if ci // plan.num_splits == r]
        kept_ready = {ci: len(send_index) + i for i, ci in enumerate(kept)}
        batches: dict[tuple[int, int], tuple[list[Transfer], list[Transfer]]] = {}
        for t in plan.sends(r, phase):
            batches.setdefault((t.step, t.split), ([], []))[0].append(t)
        for t in plan.recvs(r, phase):
            batches.setdefault((t.step, t.split), ([], []))[1].append(t)
        out = []
        for step, split in sorted(batches):
            sends, recvs = batches[(step, split)]
            ops = ()
            if self.kind != "ag_gemm":
                for t in sends:
                    if phase == "reduce":
                        word = send_index[(t.chunk, t.step)]
                    else:
                        word = kept_ready[plan.chunk_index(*t.chunk)]
                    ops += ((_WAIT, _sig(r, _READY, word), ("ready", t)),)
            b = _batch(phase, step, split)
            ops += ((_RAISE, _sig(r, _BATCH, b), ("batch", phase, step, split)),)
            ops += tuple(
                (_WAIT, _sig(q, _BATCH, b), ("peer", phase, step, split, q))
                for q in sorted({t.dst for t in sends} | {t.src for t in recvs})
            )
            if phase == "reduce" or self.kind == "ag_gemm":
                ops += tuple((_RAISE, _sig(r, _ARRIVAL, t.signal), ("signal", t)) for t in recvs)
            out.append(ops)
        return out


@functools.lru_cache(maxsize=256)
def _call(*fields) -> _Call:
    """A call's kernels are the same for every backend, grid and queue model: built once a sweep."""
    return _Call(*fields)


class _Model:
    """Every actor of one call (a kernel program or a communication queue: a list of operations
    run in order), their signals and counters, run to a fixpoint."""

    def __init__(self, call: _Call, backend: str, num_programs: int, shared_queue: bool) -> None:
        self.k = call
        self.plan = call.plan
        self.names: list[tuple] = []
        self.steps: list[list[tuple]] = []
        """Per actor, its order entries (programs) or transfers (queues), each a tuple of operations."""
        self.ops: list[Sequence[tuple]] = []
        for r in range(call.ws):
            entries = call.entries[r]
            grid = max(1, min(num_programs, len(entries)))
            for p in range(grid):
                self.names.append(("program", r, p, grid))
                steps = entries[p::grid]
                self.steps.append(steps)
                self.ops.append(steps[0] if len(steps) == 1 else list(chain.from_iterable(steps)))
        for name, steps, ops in call.queues(backend, shared_queue):
            self.names.append(name)
            self.steps.append(steps)
            self.ops.append(ops)
        self.pos = [0] * len(self.ops)
        self.counts = [0] * len(call.targets)
        self.raised: set[int] = set()

    def run(self) -> None:
        raised, counts, pos, all_ops = self.raised, self.counts, self.pos, self.ops
        targets, on_done = self.k.targets, self.k.on_done
        waiters: dict[int, list[int]] = defaultdict(list)
        queue = deque(range(len(all_ops)))
        while queue:
            a = queue.popleft()
            ops, i, n = all_ops[a], pos[a], len(all_ops[a])
            while i < n:
                code, arg, _ = ops[i]
                if code == _WAIT:
                    if arg not in raised:
                        waiters[arg].append(a)
                        break
                elif code == _RAISE:
                    if arg not in raised:
                        raised.add(arg)
                        queue.extend(waiters.pop(arg, ()))
                else:
                    counts[arg] += 1
                    if counts[arg] == targets[arg]:
                        for sig in on_done[arg]:
                            if sig not in raised:
                                raised.add(sig)
                                queue.extend(waiters.pop(sig, ()))
                i += 1
            pos[a] = i

    # ---- reporting -----------------------------------------------------------------------------

    def report(self, case: str) -> LivenessReport:
        total = sum(len(e) for e in self.k.entries)
        blocked = [a for a in range(len(self.ops)) if self.pos[a] < len(self.ops[a])]
        if not blocked:
            return LivenessReport(live=True, case=case, entries_done=total, entries_total=total)
        left = sum(
            len(self.steps[a]) - self._entry_of(a, self.pos[a])
            for a in blocked
            if self.names[a][0] == "program"
        )
        stuck = tuple(self._waits(a) for a in blocked[:12])
        if len(blocked) > 12:
            stuck += (f"... and {len(blocked) - 12} more",)
        return LivenessReport(
            live=False,
            case=case,
            entries_done=total - left,
            entries_total=total,
            stuck=stuck,
            cycle=self._cycle(blocked[0]),
        )

    def _cycle(self, start: int) -> tuple[str, ...]:
        raisers: dict[int, int] = {}
        counters: dict[int, list[tuple[int, int]]] = defaultdict(list)
        for a, ops in enumerate(self.ops):
            for i in range(self.pos[a], len(ops)):
                code, arg, _ = ops[i]
                if code == _RAISE:
                    raisers.setdefault(arg, a)
                elif code == _COUNT:
                    counters[arg].append((a, i))
        nc = self.plan.num_chunks
        done_by = {sig: key for key, sigs in enumerate(self.k.on_done) for sig in sigs}
        seen: dict[int, int] = {}
        hops: list[str] = []
        a = start
        while a not in seen:
            seen[a] = len(hops)
            sig = self.ops[a][self.pos[a]][1]
            line = self._waits(a)
            if sig in raisers:
                a = raisers[sig]
                line += f"; {self._who(a)} raises it, after what it waits for"
            elif sig in done_by:
                key = done_by[sig]
                r, ci = divmod(key, nc)
                line += (
                    f"; raised once {self._chunk(ci)} of rank {r} is complete "
                    f"({self.counts[key]} of {self.k.targets[key]} tiles counted)"
                )
                if not counters[key]:
                    return tuple(hops + [line + ", which never happens"])
                a, i = counters[key][0]
                _, r, p, grid = self.names[a]
                tile = self.k.scheds[r].order[p + self._entry_of(a, i) * grid]
                line += f"; the count of {self._tile(r, tile)} is left to {self._who(a)}"
            else:
                return tuple(hops + [line + "; nothing in this call raises it"])
            hops.append(line)
        return tuple(hops[seen[a] :])

    def _entry_of(self, a: int, op: int) -> int:
        """Index of the entry (program) or transfer (queue) of actor a that holds its operation `op`."""
        for i, step in enumerate(self.steps[a]):
            if op < len(step):
                return i
            op -= len(step)
        return len(self.steps[a])

    def _waits(self, a: int) -> str:
        _, sig, note = self.ops[a][self.pos[a]]
        return f"{self._who(a)} waits for {self._signal(sig)}{self._why(note)}"

    def _who(self, a: int) -> str:
        at = self._entry_of(a, self.pos[a])
        if self.names[a][0] == "program":
            _, r, p, grid = self.names[a]
            pos = p + at * grid
            return (
                f"rank {r} program {p} of {grid} (its entry {at + 1}, order position {pos}, "
                f"{self._tile(r, self.k.scheds[r].order[pos])})"
            )
        _, r, stream, backend = self.names[a]
        if stream < 0:
            what = "side streams sharing one hardware queue"
        elif backend in COPIER_BACKENDS and stream == 0:
            what = "stream 0 (entry, then the SM copier's jobs)"
        else:
            what = f"stream {stream}"
        return f"rank {r} {what} (item {at + 1} of its queue)"

    def _tile(self, r: int, tile: int) -> str:
        n = self.k.scheds[r].tiles_n
        return f"tile ({tile // n}, {tile % n})"

    def _chunk(self, ci: int) -> str:
        lo, hi = self.plan.chunk_rows()[ci]
        return f"chunk {ci // self.plan.num_splits}.{ci % self.plan.num_splits} [rows {lo}, {hi})"

    def _transfer(self, t: Transfer) -> str:
        return f"{t.phase} {self._chunk(self.plan.chunk_index(*t.chunk))} {t.src}->{t.dst} (step {t.step})"

    def _why(self, note: tuple) -> str:
        what = note[0]
        if what == "partial":
            return f": partial of {self._chunk(note[2])} from rank {note[3]}"
        if what == "free":
            return f": kept {self._chunk(note[2])} is stored once rank {note[3]} entered the call"
        if what == "rows":
            return f": rows of {self._chunk(note[3])}"
        if what == "peer":
            return f": its own batch ({note[1]}, step {note[2]}, split {note[3]}) pairs with rank {note[4]}"
        verb = {
            "ready": "before sending",
            "entered": "before sending",
            "forward": "before forwarding",
            "gathered": "before copying in",
        }.get(what)
        return f": {verb} {self._transfer(note[1])}" if verb else ""

    def _signal(self, sig: int) -> str:
        kind, r, idx = sig & 7, (sig >> 3) & 255, sig >> 11
        if kind == _ARRIVAL:
            return f"arrival word {idx} on rank {r}"
        if kind == _READY:
            return f"ready word READY_BASE+{idx} on rank {r}"
        if kind == _LOCAL:
            return f"LOCAL_BASE+{idx} on rank {r} (own chunk copied)"
        if kind == _ENTERED:
            return f"ENTERED_BASE+{idx} on rank {r} (rank {idx} entered the call)"
        phase = "gather" if idx & 1 else "reduce"
        return f"the start of NCCL batch ({phase}, step {idx >> 7}, split {(idx >> 1) & 63}) on rank {r}"
