"""The ops that move operands instead of chunks of one tensor: the all-gather matmul that moves B
and the products instead of A (template `a_stationary`) and the matmul reduce-scatter that moves
A's rows and B instead of partial products (`c_stationary`).

Their calls are enqueued by `syncopate/kernels/a_stationary.py` and `c_stationary.py` on the
caller's stream and side streams; here every rank's enqueued work runs in one process on the CPU,
the streams played in random orders by a small executor (stream waits on pad words and events,
copies between the ranks' buffers by address, the GEMMs as the closures they are), several calls
back to back with fresh inputs, and each call's output compared with the reference; half the runs
with every rank's streams on one hardware queue (a rank runs its operations in the order they were
enqueued: a stream wait enqueued before work a peer needs would deadlock the group). The executor
plays `decomposed.py`'s and `decomposed_gather.py`'s calls too (tests/test_decomposed.py).
"""

from __future__ import annotations

import ctypes
import itertools
import math
import random
from types import SimpleNamespace

import pytest
import torch

from syncopate.errors import ConfigError
from syncopate.kernels import a_stationary, c_stationary, decomposed, decomposed_gather
from syncopate.kernels.tables import PAD_WORDS
from syncopate.search_space import (
    A_STATIONARY,
    C_STATIONARY,
    Candidate,
    SpaceOptions,
    Topology,
    Workload,
    a_stationary_candidate,
    build_plan,
    c_stationary_candidate,
    check_candidate,
    check_liveness,
    space,
)

TWO = Topology.from_key("H200x2-nvlink")


class _Ops(list):
    """A stream's operations; each also numbered in the order the host enqueued it, over all streams."""

    submitted = itertools.count()

    def __init__(self) -> None:
        super().__init__()
        self.order: list[int] = []

    def append(self, op) -> None:
        super().append(op)
        self.order.append(next(_Ops.submitted))


class _Stream:
    def __init__(self, name: str, rank: int) -> None:
        self.name, self.rank, self.ops, self.pos = name, rank, _Ops(), 0
        self.cuda_stream = self

    def wait_event(self, event) -> None:
        self.ops.append(("event", event))


class _Event:
    def __init__(self) -> None:
        self.done = False

    def record(self, stream=None) -> None:
        (stream or _World.current).ops.append(("record", self))


class _World:
    """Every rank's streams, pads and symmetric buffers, and the executor that plays them."""

    current: _Stream | None = None

    def __init__(self, ws: int, buffers: dict, plan, module) -> None:
        """`buffers`: the op's symmetric buffers (name: (shape, dtype)); `plan(rank)`: its plan;
        `module`: the op's module (`run(ctx, plan, a, b, out)`)."""
        self.ws, self.module = ws, module
        self.clock, self.spans = (
            0,
            [],
        )  # the timeline's marks as played: (rank, call, label, chunk, start, end)
        self.pads = [[0] * PAD_WORDS for _ in range(ws)]
        bufs = [
            {name: torch.full(shape, float("nan")) for name, (shape, _) in buffers.items()} for _ in range(ws)
        ]
        self.ctxs, self.mains, self.plans = [], [], []
        for r in range(ws):
            buffers = {
                name: SimpleNamespace(
                    local=bufs[r][name], peer_ptrs=[bufs[q][name].data_ptr() for q in range(ws)]
                )
                for name in bufs[r]
            }
            streams = [_Stream(f"rank {r} side {i}", r) for i in range(3)]
            self.ctxs.append(
                SimpleNamespace(
                    rank=r,
                    world_size=ws,
                    buffers=buffers,
                    epoch=0,
                    streams=streams,
                    remote_writes=True,
                    sm_pulls=True,
                    begin_call=self._begin(r),
                    fork=self._fork(streams),
                    join=self._join,
                    current_stream=lambda: _World.current,
                    signal_address=lambda q, word: (q, word),
                    write_signal=lambda stream, q, word, value: stream.ops.append(
                        ("write", (q, word), value)
                    ),
                    stamp=self._stamp,
                    span=self._span(r),
                    cache={},
                    kept_events=lambda key, count: [
                        _Event() for _ in range(count)
                    ],  # CUDA's reuse, as the executor plays it
                )
            )
            self.mains.append(_Stream(f"rank {r} caller", r))
            self.plans.append(plan(r))

    @staticmethod
    def _stamp(stream) -> dict:
        start = {"at": None}
        stream.ops.append(("stamp", start))
        return start

    def _span(self, r):
        def span(label, chunk, rows, stream, start) -> None:
            stream.ops.append(("span", (r, self.ctxs[r].epoch, label, tuple(chunk)), start))

        return span

    def _begin(self, r):
        def begin(stream=None) -> int:
            self.ctxs[r].epoch += 1
            return self.ctxs[r].epoch

        return begin

    @staticmethod
    def _fork(streams):
        def fork(main, count):
            event = _Event()
            event.record(main)
            for s in streams[:count]:
                s.wait_event(event)
            return streams[:count]

        return fork

    @staticmethod
    def _join(main, streams) -> None:
        for s in streams:
            event = _Event()
            event.record(s)
            main.wait_event(event)

    def enqueue(self, r: int, a, b, out) -> None:
        _World.current = self.mains[r]
        self.module.run(self.ctxs[r], self.plans[r], a, b, out)

    def _ready(self, op) -> bool:
        if op[0] == "wait":
            (q, word), value = op[1], op[2]
            return self.pads[q][word] >= value
        return op[0] != "event" or op[1].done

    def play(self, seed: int, one_queue: bool = False) -> None:
        """Run every enqueued operation, the next one of a random stream whose next can run.
        `one_queue`: each rank's streams share one hardware queue (CUDA_DEVICE_MAX_CONNECTIONS=1,
        the worst case of streams sharing queues): a rank runs its operations in the order they
        were enqueued, whatever their stream, so a wait enqueued early holds back all that follows."""
        rng = random.Random(seed)
        streams = self.mains + [s for ctx in self.ctxs for s in ctx.streams]
        while True:
            live = [s for s in streams if s.pos < len(s.ops)]
            if not live:
                return
            if one_queue:
                heads = {}
                for s in live:
                    if s.rank not in heads or s.ops.order[s.pos] < heads[s.rank].ops.order[heads[s.rank].pos]:
                        heads[s.rank] = s
                live = list(heads.values())
            runnable = [s for s in live if self._ready(s.ops[s.pos])]
            if not runnable:
                stuck = [f"{s.name}: {s.ops[s.pos][0]} {s.ops[s.pos][1:]}" for s in live]
                raise AssertionError("the call deadlocked:\n" + "\n".join(stuck))
            s = rng.choice(runnable)
            op = s.ops[s.pos]
            s.pos += 1
            if op[0] == "record":
                op[1].done = True
            elif op[0] == "write":
                (q, word), value = op[1], op[2]
                self.pads[q][word] = value
            elif op[0] == "copy":
                ctypes.memmove(op[1], op[2], op[3])
            elif op[0] == "run":
                op[1]()
            elif op[0] == "stamp":
                op[1]["at"] = self.clock
            elif op[0] == "span":
                self.spans.append(op[1] + (op[2]["at"], self.clock))
            self.clock += 1


@pytest.fixture
def world(monkeypatch):
    def matmul(a, b, out):
        _World.current.ops.append(("run", lambda: out.copy_(a @ b)))

    def add_product(out, a, b):
        _World.current.ops.append(("run", lambda: out.add_(a @ b)))

    cuda = SimpleNamespace(Event=_Event, current_stream=lambda: _World.current)
    fake = SimpleNamespace(matmul=matmul, cuda=cuda)
    driver = SimpleNamespace(
        wait_value=lambda stream, address, value: stream.ops.append(("wait", address, value)),
        copy_async=lambda stream, dst, src, nbytes: stream.ops.append(("copy", dst, src, nbytes)),
    )

    def add_partial(acc, partial):
        _World.current.ops.append(("run", lambda: acc.add_(partial)))

    for module in (a_stationary, c_stationary, decomposed, decomposed_gather):
        monkeypatch.setattr(module, "torch", fake)
        monkeypatch.setattr(module, "streamops", driver)
    monkeypatch.setattr(c_stationary, "add_product", add_product)
    monkeypatch.setattr(decomposed, "add_partial", add_partial)

    def pull_last(ctx, stream, partials, q, slot, lo, hi, dst, word, epoch, spin_limit):
        """The SM pull as the kernel orders it: the wait, then the copy."""
        stream = stream or _World.current
        stream.ops.append(("wait", (ctx.rank, word), epoch))
        row_bytes = dst.stride(0) * dst.element_size()
        src = partials.peer_ptrs[q] + (slot * partials.local.shape[1] + lo) * row_bytes
        stream.ops.append(("copy", dst.data_ptr(), src, (hi - lo) * row_bytes))

    monkeypatch.setattr(decomposed, "pull_last", pull_last)
    return _World


def _a_world(world, ws, m_local, n_local, k, splits, kmajor=False):
    return world(
        ws,
        a_stationary.a_stationary_buffers(ws, m_local, n_local, k, torch.float32),
        lambda r: a_stationary.AStationaryPlan.of(
            a_stationary_candidate(splits), r, ws, m_local, n_local, k, kmajor
        ),
        a_stationary,
    )


def _b(k: int, n: int, gen, kmajor: bool) -> torch.Tensor:
    """A random B[k, n]: row-major, or an nn.Linear weight's transpose (`kmajor`)."""
    return torch.randn(n, k, generator=gen).t() if kmajor else torch.randn(k, n, generator=gen)


@pytest.mark.parametrize(
    "ws, splits, m_local, kmajor",
    [
        (2, 1, 64, False),
        (2, 2, 64, False),
        (3, 4, 37, False),
        (4, 2, 48, False),
        (8, 2, 24, False),
        (2, 2, 64, True),
        (3, 1, 37, True),
    ],
)
def test_every_call_computes_all_gather_a_times_its_b(world, ws, splits, m_local, kmajor):
    """Three calls back to back, fresh inputs each, every stream played in random orders: each
    call's output is right, so no call overwrote what an earlier one still read. A K-major B
    (`weight.t()`) moves as it is laid out and is read so by the peers."""
    n_local, k = 24, 40
    for seed in range(4):
        w = _a_world(world, ws, m_local, n_local, k, splits, kmajor)
        calls = []
        for call in range(3):
            gen = torch.Generator().manual_seed(1000 * seed + call)
            a = [torch.randn(m_local, k, generator=gen) for _ in range(ws)]
            b = [_b(k, n_local, gen, kmajor) for _ in range(ws)]
            outs = [torch.full((m_local * ws, n_local), float("nan")) for _ in range(ws)]
            for r in range(ws):
                w.enqueue(r, a[r], b[r], outs[r])
            calls.append((a, b, outs))
        w.play(seed, one_queue=seed % 2 == 1)  # odd seeds: every rank's streams on one hardware queue
        for call, (a, b, outs) in enumerate(calls):
            full = torch.cat(a)
            for r in range(ws):
                assert torch.allclose(outs[r], full @ b[r], atol=1e-4), f"seed {seed}, call {call}, rank {r}"


def test_b_in_another_layout_than_the_plan_is_refused_before_anything_is_enqueued(world):
    """A plan reads the peers' B in its own layout: a call with B laid out otherwise is refused."""
    w = _a_world(world, 2, 32, 16, 24, 2, kmajor=True)
    with pytest.raises(ValueError, match=r"a_stationary: b with strides \(16, 1\) on a plan for a K-major B"):
        w.enqueue(0, torch.randn(32, 24), torch.randn(24, 16), torch.empty(64, 16))
    c = world(
        2,
        c_stationary.c_stationary_buffers(2, 64, 16, 24, torch.float32),
        lambda r: c_stationary.CStationaryPlan.of(r, 2, 64, 16, 24),
        c_stationary,
    )
    with pytest.raises(
        ValueError, match=r"c_stationary: b with strides \(1, 24\) on a plan for a row-major B"
    ):
        c.enqueue(0, torch.randn(64, 24), torch.randn(16, 24).t(), torch.empty(32, 16))
    assert (
        all(not s.ops for ctx in w.ctxs + c.ctxs for s in ctx.streams)
        and not w.mains[0].ops
        and not c.mains[0].ops
    )


def test_the_space_offers_it_for_all_gather_matmuls_over_the_copy_engine_only():
    w = Workload(kind="ag_gemm", shape=(8192, 2048, 8192))
    found = [c for c in space(w, TWO) if c.template == A_STATIONARY]
    assert found == [a_stationary_candidate(s) for s in (1, 2, 4, 8)]
    for options in (SpaceOptions(backends=("sm_copy", "nccl")), SpaceOptions(templates=("direct",))):
        assert A_STATIONARY not in {c.template for c in space(w, TWO, options)}
    for kind in ("gemm_rs", "gemm_ar"):
        producer = Workload(kind=kind, shape=(8192, 8192, 2048))
        assert A_STATIONARY not in {c.template for c in space(producer, TWO)}


def test_candidates_it_refuses_say_why():
    w = Workload(kind="ag_gemm", shape=(8192, 2048, 8192))
    check_candidate(a_stationary_candidate(2), w, TWO)
    with pytest.raises(ConfigError, match="ag_gemm"):
        check_candidate(a_stationary_candidate(2), Workload(kind="gemm_rs", shape=(8192, 8192, 2048)), TWO)
    with pytest.raises(ConfigError, match="copy engine"):
        check_candidate(Candidate(backend="nccl", template=A_STATIONARY, comm_sms=64), w, TWO)
    with pytest.raises(ConfigError, match="block_n=256"):
        check_candidate(Candidate(template=A_STATIONARY, block_n=256), w, TWO)
    with pytest.raises(ConfigError, match="no chunk plan"):
        build_plan(A_STATIONARY, "all_gather", 2, 8192, 1)
    assert check_liveness("ag_gemm", a_stationary_candidate(4), 4, 8192, 512, 132).live
    with pytest.raises(ConfigError, match="ag_gemm"):
        check_liveness("gemm_ar", a_stationary_candidate(4), 4, 8192, 512, 132)


def test_the_cost_model_prefers_it_where_n_per_rank_is_small():
    """ag_gemm N=2048 on two H200s moves 24 MiB a peer this way against 64 MiB of A; at N=11008
    the products and B (86 MiB) outweigh A's 32 MiB."""
    from syncopate.cost_model.calibration_defaults import default_calibration
    from syncopate.cost_model.model import CostModel

    model = CostModel(default_calibration(TWO))
    for (n, k), wins in (((2048, 8192), True), ((11008, 4096), False)):
        w = Workload(kind="ag_gemm", shape=(8192, n, k))
        ranked = model.rank(w, TWO, space(w, TWO))
        assert all(p.feasible and math.isfinite(p.time_us) for p in ranked)
        assert (ranked[0].candidate.template == A_STATIONARY) is wins, (n, ranked[0])
        best = [p for p in ranked if p.candidate.template == A_STATIONARY][0]
        assert best.time_us >= model.baselines(w, TWO)["gemm_alone"]


@pytest.mark.parametrize(
    "all_reduce, ws, m, splits, kmajor",
    [
        (False, 2, 64, 1, False),
        (False, 3, 96, 1, False),
        (False, 4, 128, 1, False),
        (True, 2, 64, 1, False),
        (True, 2, 64, 4, False),
        (True, 3, 96, 2, False),
        (True, 4, 128, 2, False),
        (False, 8, 256, 1, False),
        (True, 8, 256, 2, False),
        (True, 2, 65, 2, False),
        (True, 3, 97, 4, False),
        (False, 2, 64, 1, True),
        (False, 3, 96, 1, True),
        (True, 2, 65, 2, True),
    ],
)
def test_every_reduce_call_sums_over_the_ranks(world, all_reduce, ws, m, splits, kmajor):
    """c_stationary: three calls back to back, fresh inputs each, streams in random orders; each
    rank's output is its rows of the sum over ranks of A_q @ B_q (all-reduce: all the rows, M
    divisible by the ranks or not; B row-major or K-major, which moves as it is laid out)."""
    n, k_local = 24, 40
    check_reduce_calls(
        lambda: world(
            ws,
            c_stationary.c_stationary_buffers(ws, m, n, k_local, torch.float32, all_reduce),
            lambda r: c_stationary.CStationaryPlan.of(r, ws, m, n, k_local, all_reduce, splits, kmajor),
            c_stationary,
        ),
        ws,
        m,
        n,
        k_local,
        all_reduce,
        kmajor,
    )


def check_reduce_calls(
    make_world, ws: int, m: int, n: int, k_local: int, all_reduce: bool, kmajor: bool = False
) -> None:
    """Three calls back to back on a world `make_world()` makes, fresh inputs each, played in random
    orders (four seeds; the odd ones with every rank's streams on one hardware queue): each rank's
    output is its rows of the sum over ranks of A_q @ B_q (all-reduce: all the rows; `kmajor`: each
    B an nn.Linear weight's transpose)."""
    for seed in range(4):
        w = make_world()
        calls = []
        for call in range(3):
            gen = torch.Generator().manual_seed(1000 * seed + call)
            a = [torch.randn(m, k_local, generator=gen) for _ in range(ws)]
            b = [_b(k_local, n, gen, kmajor) for _ in range(ws)]
            outs = [torch.full((m if all_reduce else m // ws, n), float("nan")) for _ in range(ws)]
            for r in range(ws):
                w.enqueue(r, a[r], b[r], outs[r])
            calls.append((a, b, outs))
        w.play(seed, one_queue=seed % 2 == 1)
        for call, (a, b, outs) in enumerate(calls):
            total = sum(x @ y for x, y in zip(a, b, strict=True))
            for r in range(ws):
                rows = slice(None) if all_reduce else slice(r * m // ws, (r + 1) * m // ws)
                assert torch.allclose(outs[r], total[rows], atol=1e-4), f"seed {seed}, call {call}, rank {r}"


def test_the_space_offers_c_stationary_for_reductions_over_the_copy_engine_only():
    w = Workload(kind="gemm_rs", shape=(8192, 8192, 2048))
    assert [c for c in space(w, TWO) if c.template == C_STATIONARY] == [c_stationary_candidate()]
    check_candidate(c_stationary_candidate(), w, TWO)
    with pytest.raises(ConfigError, match="num_splits=2"):
        check_candidate(Candidate(template=C_STATIONARY, num_splits=2), w, TWO)
    ar = Workload(kind="gemm_ar", shape=(8192, 8192, 2048))
    assert [c for c in space(ar, TWO) if c.template == C_STATIONARY] == [
        c_stationary_candidate(s) for s in (1, 2, 4, 8)
    ]
    ag = Workload(kind="ag_gemm", shape=(8192, 8192, 2048))
    assert C_STATIONARY not in {c.template for c in space(ag, TWO)}
    with pytest.raises(ConfigError, match="is for gemm_rs and gemm_ar"):
        check_candidate(c_stationary_candidate(), ag, TWO)
    assert check_liveness("gemm_rs", c_stationary_candidate(), 4, 8192, 8192, 132).live
    assert check_liveness("gemm_ar", c_stationary_candidate(4), 4, 8192, 8192, 132).live


def test_the_cost_model_prefers_c_stationary_where_k_per_rank_is_small():
    """gemm_rs K=2048 on two H200s moves 24 MiB a peer this way against 64 MiB of partials; at
    8192x4096x11008 (K/ws=5504, N=4096) A's rows and B (86 MiB) outweigh the partials' 32 MiB."""
    from syncopate.cost_model.calibration_defaults import default_calibration
    from syncopate.cost_model.model import CostModel

    model = CostModel(default_calibration(TWO))
    for (n, k), wins in (((8192, 2048), True), ((4096, 11008), False)):
        w = Workload(kind="gemm_rs", shape=(8192, n, k))
        ranked = model.rank(w, TWO, space(w, TWO))
        assert (ranked[0].candidate.template == C_STATIONARY) is wins, (n, ranked[0])


def test_the_stationary_sweep_config_measures_both_templates_on_the_link_bound_shapes():
    from syncopate.autotuner.sweep import load_sweep

    sweep = load_sweep("configs/llama_tp2_stationary.yaml")
    topo = sweep.topology()
    found = {w.kind: {c.template for c in space(w, topo, sweep.space)} for w in sweep.workloads}
    assert found == {"ag_gemm": {A_STATIONARY}, "gemm_rs": {C_STATIONARY}, "gemm_ar": {C_STATIONARY}}
    assert sum(len(space(w, topo, sweep.space)) for w in sweep.workloads) == 18


@pytest.mark.parametrize("all_reduce", [False, True])
def test_the_timeline_marks_each_term_from_when_its_inputs_are_there(world, all_reduce):
    """With the timeline on (benchmarks/timeline.py), c_stationary marks its pushes and its GEMMs:
    a peer's term starts after that peer's push to this rank has ended, in the same call, and the
    own term needs nothing."""
    ws, m, n, k_local = 3, 96, 24, 40
    w = world(
        ws,
        c_stationary.c_stationary_buffers(ws, m, n, k_local, torch.float32, all_reduce),
        lambda r: c_stationary.CStationaryPlan.of(r, ws, m, n, k_local, all_reduce, 2),
        c_stationary,
    )
    kept = []  # the enqueued copies read and write these by address when played: they must outlive play()
    for _ in range(2):
        for r in range(ws):
            kept.append(
                (
                    torch.randn(m, k_local),
                    torch.randn(k_local, n),
                    torch.empty(m if all_reduce else m // ws, n),
                )
            )
            w.enqueue(r, *kept[-1])
    w.play(7)
    spans = {(r, call, label, chunk): (start, end) for r, call, label, chunk, start, end in w.spans}
    pushes = {
        (r, call, label): end for (r, call, label, _), (_, end) in spans.items() if label.startswith("A rows")
    }
    terms = [
        (r, call, label, start)
        for (r, call, label, _), (start, _) in spans.items()
        if label.startswith("term of")
    ]
    assert len(pushes) == 2 * ws * (ws - 1) and len(terms) == 2 * ws * (ws - 1 + (2 - 1 if all_reduce else 0))
    for r, call, label, start in terms:
        q = int(label.rsplit(" ", 1)[1])
        assert start > pushes[(q, call, f"A rows, B to {r}")], (r, call, label)
    assert {
        label for (_, _, label, _) in spans if not label.startswith(("A rows", "term of", "reduced from"))
    } == {"own term"}
    if all_reduce:
        assert sum(label.startswith("reduced from") for (_, _, label, _) in spans) == 2 * ws * (ws - 1) * 2


@pytest.mark.parametrize(
    "ws, all_reduce, on_caller", [(2, True, False), (3, True, True), (4, True, True), (4, False, False)]
)
def test_an_all_reduce_on_more_than_two_ranks_waits_for_its_inputs_on_the_callers_stream(
    world, ws, all_reduce, on_caller
):
    """c_stationary's waits for the peers' A rows and B: on the caller's stream before each term for
    an all-reduce on three or more ranks (whose side stream 2, which would hold them, also makes the
    pulls), else on a side stream that records an event per peer for the caller's stream."""
    m, n, k_local = 24 * ws, 16, 8
    w = world(
        ws,
        c_stationary.c_stationary_buffers(ws, m, n, k_local, torch.float32, all_reduce),
        lambda r: c_stationary.CStationaryPlan.of(r, ws, m, n, k_local, all_reduce, 2),
        c_stationary,
    )
    w.enqueue(
        0, torch.randn(m, k_local), torch.randn(k_local, n), torch.empty(m if all_reduce else m // ws, n)
    )

    def arrival_waits(stream) -> list[int]:
        return [
            op[1][1]
            for op in stream.ops
            if op[0] == "wait"
            and op[1][0] == 0
            and c_stationary.ARRIVED <= op[1][1] < c_stationary.ARRIVED + ws
        ]

    peers = c_stationary.CStationaryPlan.of(0, ws, m, n, k_local, all_reduce).peers_added
    on_main = arrival_waits(w.mains[0])
    on_sides = [q for s in w.ctxs[0].streams for q in arrival_waits(s)]
    assert (on_main, on_sides) == ((peers, []) if on_caller else ([], peers))
