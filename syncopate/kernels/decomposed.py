"""The matmul reduce-scatter and all-reduce cut into row chunks of cuBLAS GEMMs (`template:
decomposed`): the partial products move as soon as their GEMM ends, and the reduction is done in
the own rows' GEMMs.

Rank r's output block is the sum over ranks q of A_q[r's rows] @ B_q. A block is cut into
`num_splits` row chunks. Rank r first computes its partials of each peer's block, in two GEMMs (the
first half of its chunks, then the rest: a GEMM of more rows runs nearer cuBLAS's full rate), and
the copy engine pushes each into the owner's symmetric `partials[r]` as soon as its GEMM has ended;
then it computes its own block chunk by chunk, each chunk summed onto the peers' partials of it
(cuBLAS with beta=1, in place: a partial is read once, in the GEMM's epilogue); an all-reduce cuts
its last own chunk in two (`own_chunks`). No fused kernel: the GEMMs run at cuBLAS's rate, only copies and
stream memory operations go on the side streams,
and what is left after the last GEMM is the last chunk's transfer (an all-reduce's pull; a
reduce-scatter's local copy), shorter the more chunks. One call, rank r, its rows [r0, r1):

- caller's stream: for each peer p in turn (r+1 first, whose own rows wait for r's partial the
  least): for each half of p's chunks, compute A_r[p's rows there] @ B_r into a send slot (a
  reduce-scatter: the symmetric `send[p]`; an all-reduce: the output's rows of p, which p's reduced
  chunks overwrite later), then an event; then for each chunk j of its own rows (`own_chunks`:
  the first half's chunks as one; once every peer's partial of its half is here: an event of side
  stream 2), add A_r[own rows, chunk j] @ B_r onto the first peer's partial (`partials[r-1]`, the
  accumulator) and sum the others into it, then an event.
- side stream 0 (pushes): announce r's entry into every pad; wait until the peers that read what
  it overwrites have entered this call (p for a reduce-scatter, every rank for an all-reduce, whose
  accumulators the peers pull); after each partial GEMM's event, copy its rows into p's
  `partials[r]` and raise p's word `PARTIAL + r * 2 + h`.
- side stream 1: after each own chunk's event, raise every peer's word `GATHER + r * (S + 1) + j`
  (an all-reduce; on more than two ranks the last chunk's is raised from the caller's stream right
  after its GEMM) and copy the reduced chunk into the output (on two ranks an all-reduce's chunk
  before the last together with the last, after the last GEMM: `_Layout.merged_tail`).
- side stream 2: for each half h, each peer q: wait for `PARTIAL + q * 2 + h`, then an event;
  then (an all-reduce) for each own chunk j, each peer q: wait for `GATHER + q * (S + 1) + j`,
  pull q's reduced chunk j into the output's rows of q (the last chunk's wait and pull on the
  caller's stream, after its last GEMM).

An all-reduce's last pulls, which the call ends on, are done by the SMs (`pull_last`, one kernel a
peer on the caller's stream, after the last GEMM): each waits for its peer's word and copies with
every SM, so the call's tail starts as soon as the word is written, where a stream wait and a
copy-engine copy follow the write later. The word itself stays a stream write: a kernel raising it
made the call slower again. Not where ranks share a GPU (`OverlapContext.sm_pulls`: a spinning
kernel could hold the SMs the peer's GEMM needs) or where a chunk is not whole 16-byte words at
aligned addresses: the stream path then. `benchmarks/timeline.py gemm_ar ... --template
decomposed` shows the tail left after the last GEMM.

FP8 operands (`scales`): every GEMM is a `torch._scaled_mm` of its rows of A with their scale
rows (this rank's partial dequantized by its own scales), into bf16 partials, which move as in
bf16. `_scaled_mm` cannot add onto its output (no beta), so an own chunk's product is summed with
the peers' partials by one more pass, and its GEMM, which needs none of them, runs first: only the
sum waits for the partials. Where the sum goes is the plan's `scaled_sum` (`SCALED_SUMS`): `out`,
a reduce-scatter's default, writes the product into the output's rows and adds the partials there
(no copy into the output after, so nothing is left after the last sum); `accumulator`, an
all-reduce's only way (the peers pull its reduced chunks from there), writes it into a scratch
tensor added onto the accumulator. `side_add` runs a reduce-scatter's sums on a side stream, so
that the next chunk's GEMM does not queue behind them; `fast_accum` runs every GEMM with Hopper's
fast FP8 accumulation. Which is faster is the GPU's to say (`benchmarks/fp8_rs_variants.py` times
them side by side).

The caller's stream then waits for the side streams. A wait is for an entry, announced first, for a
partial, which waits only for entries, or for a reduced chunk, which waits only for partials: a
call always ends. Only for copy-engine candidates on one node. An all-reduce's M need not divide
by the ranks: the blocks are `block_bounds`'s, the largest sets the slots' size.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from syncopate.errors import ConfigError
from syncopate.kernels import c_stationary, launch, streamops
from syncopate.kernels.backends import announce_entry
from syncopate.kernels.context import OverlapContext, record, wait
from syncopate.kernels.scaled import Scales, chunk_scale, column_major, fast_accumulation, scaled_mm
from syncopate.kernels.tables import ARRIVAL_SLOTS, ENTERED_BASE
from syncopate.search_space import (
    block_bounds,
    halves,
    own_gemm_rows,
    peers_ahead,
    peers_behind,
    row_chunks,
    tail_copied_together,
)

__all__ = [
    "GATHER",
    "PARTIAL",
    "SCALED_SUMS",
    "DecomposedPlan",
    "add_partial",
    "decomposed_buffers",
    "prepare",
    "pull_last",
    "run",
    "scaled_gemm",
]

PARTIAL = 0
"""Pad word `PARTIAL + q * 2 + h`: half h of rank q's partial of this rank's block has landed."""
GATHER = 512
"""Pad word `GATHER + q * (num_splits + 1) + j`: chunk j of rank q's reduced block is ready to pull."""
SCALED_SUMS = ("out", "accumulator")
"""Where an FP8 call sums an own chunk's product with the peers' partials (`DecomposedPlan.scaled_sum`)."""


def decomposed_buffers(ws: int, m: int, n: int, dtype: torch.dtype, all_reduce: bool = False) -> dict:
    """Symmetric buffers of a decomposed context: `partials[q]`, rank q's partial of this rank's
    block (slot r-1 is where the block is reduced; this rank's own slot is unused), and for a
    reduce-scatter `send[p]`, this rank's partial of p's block."""
    rows = -(-m // ws)
    bufs = {"partials": ((ws, rows, n), dtype)}
    if not all_reduce:
        bufs["send"] = ((ws, rows, n), dtype)
    return bufs


@dataclass(frozen=True)
class DecomposedPlan:
    """What every call of one (shape, group, candidate) needs."""

    rank: int
    world_size: int
    m: int
    n: int
    all_reduce: bool = False
    splits: int = 1
    scaled_sum: str = ""
    """FP8 calls: where an own chunk's product meets the peers' partials (`SCALED_SUMS`): `out` (its
    GEMM into the output's rows, the partials added there; a reduce-scatter only) or `accumulator`
    (into a scratch tensor added onto the accumulator, then copied out). Empty: `out` for a
    reduce-scatter, `accumulator` for an all-reduce."""
    side_add: bool = False
    """FP8 calls with `scaled_sum="out"`: the sums on a side stream instead of the caller's."""
    fast_accum: bool = False
    """FP8 calls: every GEMM with Hopper's fast FP8 accumulation (`torch._scaled_mm`'s
    `use_fast_accum`: faster, its sums rounded more coarsely)."""

    def __post_init__(self) -> None:
        if not self.scaled_sum:
            object.__setattr__(self, "scaled_sum", "accumulator" if self.all_reduce else "out")
        if self.scaled_sum not in SCALED_SUMS:
            raise ConfigError(
                f"decomposed: scaled_sum={self.scaled_sum!r}: accepted are {', '.join(SCALED_SUMS)}"
            )
        if self.all_reduce and self.scaled_sum == "out":
            raise ConfigError(
                "decomposed: scaled_sum='out' is for a reduce-scatter; an all-reduce sums in the accumulator, "
                "from which the peers pull its reduced chunks"
            )
        if self.side_add and self.scaled_sum != "out":
            raise ConfigError(
                f"decomposed: side_add=True moves the sums into the output (scaled_sum='out') to a side stream; "
                f"got scaled_sum={self.scaled_sum!r}"
            )
        for name in ("side_add", "fast_accum"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"decomposed: {name}={getattr(self, name)!r} must be True or False")

    @property
    def peers_sent(self) -> list[int]:
        """Peers whose partials this rank computes and pushes, in that order."""
        return peers_ahead(self.rank, self.world_size)

    @property
    def peers_summed(self) -> list[int]:
        """Peers whose partials of this rank's block it sums, in the order they arrive: the first is
        the accumulator's slot."""
        return peers_behind(self.rank, self.world_size)

    def accumulator(self, q: int) -> int:
        """The slot of rank q's `partials` its block is reduced in (the first peer to push to it)."""
        return (q - 1) % self.world_size

    def chunks(self, q: int) -> list[tuple[int, int]]:
        """Rank q's block as row chunks, relative to its first row."""
        q0, q1 = block_bounds(self.m, self.world_size, q)
        return row_chunks(q1 - q0, self.splits)

    def own_chunks(self, q: int) -> list[tuple[int, int]]:
        """Rank q's block as the chunks its own GEMMs reduce: `chunks`, but on two ranks the first
        half's in one GEMM (they wait for the same partials, and what follows them hides their longer
        transfer), and for an all-reduce the last cut in two, so that the pull left after the call's
        last GEMM is half as long. The cut gains most at few splits and can cost at many:
        `num_splits` is searched, so the tuner weighs it. The first half is one GEMM on two ranks
        only: on more, the cost model has it slower for some all-reduces, whose reduced rows' pulls
        from several peers then start later on one ingress."""
        return own_gemm_rows(self.chunks(q), self.world_size, self.all_reduce)

    @property
    def halves(self) -> list[range]:
        """The chunks each partial GEMM covers: the first half of a block's chunks, then the rest
        (one GEMM where there is one chunk). A GEMM of more rows runs nearer cuBLAS's full rate (a
        chunk of a few hundred rows falls well short of the whole GEMM's), and the second half's
        push has the own rows' first half to hide behind."""
        return halves(self.splits)

    @classmethod
    def of(
        cls, rank: int, ws: int, m: int, n: int, all_reduce: bool = False, splits: int = 1, **scaled
    ) -> DecomposedPlan:
        """The plan of these dims; `scaled`: the FP8 fields (`scaled_sum`, `side_add`, `fast_accum`)."""
        if GATHER + ws * (splits + 1) > ARRIVAL_SLOTS:
            raise ValueError(f"decomposed: {ws} ranks x {splits} chunks do not fit the signal pad")
        if splits > m // ws:
            raise ValueError(f"decomposed: {splits} chunks exceed the {m // ws} rows of a block")
        return cls(rank=rank, world_size=ws, m=m, n=n, all_reduce=all_reduce, splits=splits, **scaled)


def prepare(ctx: OverlapContext, plan: DecomposedPlan) -> None:
    """What a context needs before its first call: an all-reduce's pull kernel compiled and loaded."""
    if plan.all_reduce and plan.world_size > 1 and ctx.sm_pulls:
        launch.stage_pull(ctx)


class _Layout:
    """What every call of a plan enqueues, worked out once per context (`_layout`): rows, addresses,
    pad words, the fixed views of the symmetric buffers, the timeline's labels. Working them out
    again and slicing the buffers anew each call was a large share of a call's host time
    (`benchmarks/op_host.py decomposed` measures it)."""

    def __init__(self, ctx: OverlapContext, plan: DecomposedPlan, row_bytes: int) -> None:
        r, ws = plan.rank, plan.world_size
        partials = ctx.buffers["partials"]
        slot_bytes = partials.local.shape[1] * row_bytes
        entered = {q: ctx.signal_address(r, ENTERED_BASE + q) for q in plan.peers_sent}
        self.entries = list(entered.values()) if plan.all_reduce else []
        """Words the push stream waits on first: every peer's entry (an all-reduce)."""
        self.pushes = []
        """(peer, its entry's word or None, [(rows of A, the send slot or None, the peer's slot's
        address, bytes, the peer's pad word it raises, labels)]) for each peer, in turn."""
        for p in plan.peers_sent:
            p0 = block_bounds(plan.m, ws, p)[0]
            chunks, pieces = plan.chunks(p), []
            for h, half in enumerate(plan.halves):
                lo, hi = chunks[half[0]][0], chunks[half[-1]][1]
                send = None if plan.all_reduce else ctx.buffers["send"].local[p, lo:hi]
                pieces.append(
                    (
                        p0 + lo,
                        p0 + hi,
                        send,
                        partials.peer_ptrs[p] + r * slot_bytes + lo * row_bytes,
                        (hi - lo) * row_bytes,
                        PARTIAL + r * 2 + h,
                        (f"partial for {p}", f"partial to {p}", (p, h), hi - lo),
                    )
                )
            self.pushes.append((p, None if plan.all_reduce else entered[p], pieces))
        self.arrivals = [
            (h, q, ctx.signal_address(r, PARTIAL + q * 2 + h))
            for h in range(len(plan.halves))
            for q in plan.peers_summed
        ]
        self.first, *others = plan.peers_summed
        """The peer whose partial slot is the accumulator; `others` are added into it."""
        r0 = block_bounds(plan.m, ws, r)[0]
        o0 = r0 if plan.all_reduce else 0
        even = plan.chunks(r)
        opening = {even[half[0]][0]: h for h, half in enumerate(plan.halves)}  # first rows of each half
        own = plan.own_chunks(r)
        slots = plan.splits + 1  # a rank's pad words for its reduced chunks (the last chunk cut in two)
        self.own = []
        """(accumulator view, rows of A, the half whose partials it waits for or None, the other peers'
        partial views, the words it raises, labels)."""
        self.copies = []
        """Each own chunk's copy into the output (output offset, accumulator address, bytes), or None
        where the next chunk's copy takes its rows too."""
        self.out_rows = [slice(o0 + lo, o0 + hi) for lo, hi in own]
        """Each own chunk's rows of the output."""
        for j, (lo, hi) in enumerate(own):
            acc = partials.local[self.first, lo:hi]
            words = [(p, GATHER + r * slots + j) for p in plan.peers_sent] if plan.all_reduce else []
            self.own.append(
                (
                    acc,
                    r0 + lo,
                    r0 + hi,
                    opening.get(lo),
                    [(q, partials.local[q, lo:hi]) for q in others],
                    words,
                    ((r, j), hi - lo, [(f"partial of {q} added", (q, j)) for q in others]),
                )
            )
            self.copies.append(((o0 + lo) * row_bytes, acc.data_ptr(), (hi - lo) * row_bytes))
        self.merged_tail = tail_copied_together(even, ws, plan.all_reduce)
        """An all-reduce on two ranks whose last own chunk is cut in two: the first half's copy into the
        output goes with the second's, after the call's last GEMM, so that `ready` is idle when that
        GEMM ends and raises the last word at once (`run`): faster on two ranks at every split, the
        stream path's pulls included; slower on four, so not on more ranks."""
        if self.merged_tail:
            offset, address, nbytes = self.copies[-2]
            self.copies[-2:] = [None, (offset, address, nbytes + self.copies[-1][2])]
        self.pulls = []
        """(on the caller's stream, peer, its accumulator's slot, rows of its block, the block's first
        row, the chunk's pad word here and its address, source address, output offset, bytes, label)
        for each reduced chunk of each peer (an all-reduce)."""
        self.last_aligned = True
        """Whether every peer's last chunk is aligned 16-byte words at its address (given an aligned output)."""
        if plan.all_reduce:
            pulled = {q: plan.own_chunks(q) for q in plan.peers_sent}
            for j in range(slots):
                for q in plan.peers_sent:
                    q0 = block_bounds(plan.m, ws, q)[0]
                    if j >= len(pulled[q]):  # a block of one-row chunks: its last is not cut
                        continue
                    lo, hi = pulled[q][j]
                    src = partials.peer_ptrs[q] + plan.accumulator(q) * slot_bytes + lo * row_bytes
                    last = j == len(pulled[q]) - 1
                    if last:
                        self.last_aligned &= launch.pull_aligned(
                            src, (q0 + lo) * row_bytes, (hi - lo) * row_bytes
                        )
                    self.pulls.append(
                        (
                            last,
                            q,
                            plan.accumulator(q),
                            lo,
                            hi,
                            q0,
                            ctx.signal_address(r, GATHER + q * slots + j),
                            src,
                            (q0 + lo) * row_bytes,
                            (hi - lo) * row_bytes,
                            GATHER + q * slots + j,
                            (f"reduced from {q}", (q, j), hi - lo),
                        )
                    )
        self.events = sum(len(pieces) for _, _, pieces in self.pushes) + len(self.arrivals) + len(self.own)


def _layout(ctx: OverlapContext, plan: DecomposedPlan, row_bytes: int) -> _Layout:
    key = ("decomposed layout", plan, row_bytes)
    layout = ctx.cache.get(key)
    if layout is None:
        layout = ctx.cache[key] = _Layout(ctx, plan, row_bytes)
    return layout


def run(
    ctx: OverlapContext,
    plan: DecomposedPlan,
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor,
    captured: bool = False,
    spin_limit: int = 0,
    scales: Scales | None = None,
) -> None:
    """Enqueue one call: out = this rank's rows [M/ws, N] (all-reduce: all [M, N]) of the sum over
    ranks of a @ b (a: [M, K/ws] contiguous, b: [K/ws, N]).
    `captured`: the call is being captured in a CUDA graph on the caller's stream. `spin_limit`
    bounds the SM pulls' waits (their stream waits are not bounded). `scales`: FP8 operands'
    (a_scale, b_scale); `out` is then bf16."""
    main = ctx.current_stream()
    e = ctx.begin_call(main if captured else None)
    if scales is not None:
        a_scale, b_scale = scales[0], scales[1]
        b = column_major(b)
        fast = plan.fast_accum or fast_accumulation(scales)

        def gemm(lo: int, hi: int, dst: torch.Tensor | None) -> torch.Tensor:
            return scaled_gemm(a[lo:hi], b, chunk_scale(a_scale, lo, hi), b_scale, dst, fast)
    else:

        def gemm(lo: int, hi: int, dst: torch.Tensor) -> None:
            torch.matmul(a[lo:hi], b, out=dst)

        def add_gemm(acc: torch.Tensor, lo: int, hi: int) -> None:
            c_stationary.add_product(acc, a[lo:hi], b)

    if plan.world_size == 1:
        gemm(0, a.shape[0], out)
        return
    layout = _layout(ctx, plan, plan.n * out.element_size())
    events = iter(ctx.kept_events(layout, layout.events))
    streams = ctx.fork(main, 3)
    push, ready, side = streams
    out_ptr = out.data_ptr()
    announce_entry(push, ctx, e)
    for address in (
        layout.entries
    ):  # every peer has pulled the blocks reduced in the previous call (partials among them)
        streamops.wait_value(push.cuda_stream, address, e)
    for p, entered, pieces in layout.pushes:
        if entered is not None:  # p has read what r pushed in the previous call
            streamops.wait_value(push.cuda_stream, entered, e)
        for lo, hi, send, peer_slot, nbytes, word, (computed, pushed, chunk, rows) in pieces:
            dst = out[lo:hi] if send is None else send
            t0 = ctx.stamp(main)
            gemm(lo, hi, dst)
            ctx.span(computed, chunk, rows, main, t0)
            done = next(events)
            record(done, main)
            wait(push, done)
            t0 = ctx.stamp(push)
            streamops.copy_async(push.cuda_stream, peer_slot, dst.data_ptr(), nbytes)
            ctx.span(pushed, chunk, rows, push, t0)
            ctx.write_signal(push, p, word, e)
    # The caller's stream waits for the peers' partials through events the third stream records
    # once they are here: a stream wait on a pad word between two GEMMs holds the caller's stream
    # several microseconds even where the word is long set, and an event wait does not. Enqueued
    # after the partials' GEMMs and pushes: where streams share a hardware queue, a wait enqueued
    # before them would hold back what the peers wait for.
    arrived = {}
    for h, q, address in layout.arrivals:
        streamops.wait_value(side.cuda_stream, address, e)
        arrived[h, q] = next(events)
        record(arrived[h, q], side)
    sm_pull = (
        plan.all_reduce and layout.last_aligned and out_ptr % 16 == 0 and out.is_contiguous() and ctx.sm_pulls
    )
    first, last = layout.first, len(layout.own) - 1
    into_out = scales is not None and plan.scaled_sum == "out"
    for j, (acc, lo, hi, starts, others, words, (chunk, rows, added)) in enumerate(layout.own):
        if scales is not None:
            dst = out[layout.out_rows[j]] if into_out else None
            t0 = ctx.stamp(main)
            product = gemm(lo, hi, dst)
            ctx.span("own rows", chunk, rows, main, t0)
            adder = main
            if plan.side_add:
                done = next(events)
                record(done, main)
                wait(ready, done)
                adder = ready
            with torch.cuda.stream(adder) if plan.side_add else contextlib.nullcontext():
                terms = [(first, acc), *others]
                labels = [(f"partial of {first} added", (first, chunk[1])), *added]
                for (q, partial), (label, of) in zip(terms, labels):
                    if starts is not None:
                        wait(adder, arrived[starts, q])
                    t0 = ctx.stamp(adder)
                    if into_out:
                        add_partial(product, partial)
                    elif q == first:
                        add_partial(acc, product)
                    else:
                        add_partial(acc, partial)
                    ctx.span(label, of, rows, adder, t0)
            if into_out:  # a reduce-scatter: no words to raise, and the sum is in the output already
                continue
        else:
            if starts is not None:
                wait(main, arrived[starts, first])
            t0 = ctx.stamp(main)
            add_gemm(acc, lo, hi)
            ctx.span("own rows", chunk, rows, main, t0)
            for (q, partial), (label, of) in zip(others, added):
                if starts is not None:
                    wait(main, arrived[starts, q])
                t0 = ctx.stamp(main)
                add_partial(acc, partial)
                ctx.span(label, of, rows, main, t0)
        # The words go from `ready` once it has the chunk's event. The last one is what the peers'
        # pulls, which the call ends on, wait for: where the chunk before's copy is merged into the
        # last's (`merged_tail`), `ready` is idle when the last GEMM ends and raises it at once, and
        # the pull after that GEMM on the caller's stream starts right behind it, where a stream
        # write between them would hold it back. Otherwise the last word goes from the caller's
        # stream, right after its GEMM, not behind the chunk before's copy on `ready` (a context
        # whose streams cannot write a peer's memory relays a word through a side stream's own
        # scratch slot, which the caller's stream has none of: the word stays on `ready` there).
        # Earlier chunks' words stay off the caller's stream: a stream write between two GEMMs cost
        # more than it saved.
        done = next(events)
        record(done, main)
        wait(ready, done)
        stream = main if j == last and ctx.remote_writes and not layout.merged_tail else ready
        for p, word in words:
            ctx.write_signal(stream, p, word, e)
        copy = layout.copies[j]
        if copy is not None:
            streamops.copy_async(ready.cuda_stream, out_ptr + copy[0], copy[1], copy[2])
    for on_main, q, slot, lo, hi, q0, address, src, offset, nbytes, word, (
        label,
        chunk,
        rows,
    ) in layout.pulls:
        # a peer's last chunk is pulled on the caller's stream, which the call ends on (enqueued
        # after every word and copy the peers wait for, so its wait holds nothing back that they need)
        stream = main if on_main else side
        if on_main and sm_pull:
            t0 = ctx.stamp(main)
            pull_last(
                ctx,
                None,
                ctx.buffers["partials"],
                q,
                slot,
                lo,
                hi,
                out[q0 + lo : q0 + hi],
                word,
                e,
                spin_limit,
            )
        else:
            streamops.wait_value(stream.cuda_stream, address, e)
            t0 = ctx.stamp(stream)
            streamops.copy_async(stream.cuda_stream, out_ptr + offset, src, nbytes)
        ctx.span(label, chunk, rows, stream, t0)
    ctx.join(main, streams)


def pull_last(
    ctx: OverlapContext,
    stream: torch.cuda.Stream | None,
    partials,
    q: int,
    slot: int,
    lo: int,
    hi: int,
    dst: torch.Tensor,
    word: int,
    epoch: int,
    spin_limit: int,
) -> None:
    """Rows [lo, hi) of rank q's `partials[slot]` into `dst` by the SMs, once this rank's pad word
    `word` reaches `epoch`; on `stream`, None for the current one (no stream switch to enqueue)."""
    key = ("peer view", q)
    view = ctx.cache.get(key)
    if view is None:
        view = ctx.cache[key] = partials.peer_view(q)
    launch.launch_pull(ctx, stream, view[slot, lo:hi], dst, word, epoch, spin_limit)


def scaled_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    a_scale: torch.Tensor,
    b_scale: torch.Tensor,
    out: torch.Tensor | None = None,
    fast_accum: bool = False,
) -> torch.Tensor:
    """(a * a_scale) @ (b * b_scale) in bf16 into `out` (None: a new tensor), returned, on the
    current stream: FP8 operands, b column-major (`scaled.scaled_mm`)."""
    return scaled_mm(a, b, a_scale, b_scale, out=out, fast_accum=fast_accum)


def add_partial(acc: torch.Tensor, partial: torch.Tensor) -> None:
    """acc += partial on the current stream (a third rank's partial onward: one rounding a term)."""
    acc.add_(partial)
