"""Checking and timing the MoE ops (kinds `a2a_gemm`, `gemm_a2a`) on one rank of an EP group: what
`syncopate tune` (:class:`MoeHarness`, through the GPU and CPU runners) and
benchmarks/moe_bench.py measure with.

- :class:`MoeCase`: one workload's routing on this rank (drawn by its spec), its all-to-all layout,
  two fresh routings for the checks, seeded inputs;
- :func:`check_config`: a candidate's largest relative error against the float32 reference the
  group computes (`moe_*_group_reference`), over the fresh routings, two calls back to back into
  outputs poisoned with NaN, max over ranks;
- :func:`plain_ops`: torch written plainly (all_to_all_single, then torch._grouped_mm; the combine
  the other way round), the all-to-all alone and the grouped GEMM alone: the baselines;
- :func:`time_device` / :func:`time_calls`: device time by the project's method on CUDA
  (:func:`~syncopate.measure.timing.time_collective`, :func:`~syncopate.measure.timing.time_eager`);
  on the CPU (gloo ranks), wall-clock time a call, max over ranks, a stand-in that checks the flow,
  not a figure to compare with a GPU's.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist

from syncopate.kernels.ranks import slowest
from syncopate.measure import harness as tuning
from syncopate.measure.harness import BaselineResult, CandidateResult
from syncopate.moe.ops import _bounded, _token_rows, waits_on_words
from syncopate.search_space.moe_workload import MoeCandidate, MoeWorkload, check_moe_candidate

__all__ = [
    "TOLERANCE",
    "MoeCase",
    "MoeHarness",
    "check_config",
    "copy_engine_a2a",
    "dedup_a2a",
    "fresh_checks",
    "layer_call",
    "moe_op",
    "moe_reference",
    "nvshmem_ops",
    "nvshmem_refusal",
    "out_shape",
    "plain_ops",
    "time_calls",
    "time_device",
    "wall_times",
    "worst_over_ranks",
]

log = logging.getLogger(__name__)

TOLERANCE = 1e-2
"""Largest relative error accepted against the float32 reference (bf16 operands)."""

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def wall_times(fn, group, repetitions: int, calls: int = 1) -> list[float]:
    """Wall-clock µs a call (the CPU's stand-in for device times), max over ranks."""
    fn()
    samples = []
    for _ in range(repetitions):
        dist.barrier(group=group)
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - t0) * 1e6 / calls)
    return slowest(samples, group)


def time_device(fn, group, device: torch.device, *, warmup: int = 5, repetitions: int = 20, flush_l2=True):
    """(samples µs, host µs or None): device times by `time_collective` on CUDA, wall-clock times
    on the CPU (no host figure there)."""
    if device.type != "cuda":
        return tuple(wall_times(fn, group, repetitions)), None
    from syncopate.measure.timing import time_collective

    t = time_collective(fn, group, warmup=warmup, repetitions=repetitions, flush_l2=flush_l2)
    return tuple(t.samples_us), t.host_us


def time_calls(
    fn, group, device: torch.device, *, calls: int | None = None, flush_l2: bool = True
) -> list[float]:
    """Per-call times of calls back to back with the host on the path: `time_eager` on CUDA,
    wall-clock on the CPU."""
    if device.type != "cuda":
        return wall_times(fn, group, 3, calls=calls or 2)
    from syncopate.measure.timing import time_eager

    if calls is None:
        return time_eager(fn, group, flush_l2=flush_l2)
    return time_eager(fn, group, calls=calls, flush_l2=flush_l2)


def _dtype(name: str):
    return _DTYPES[name]


class MoeCase:
    """One workload's routing on this rank: routings, layouts and inputs, made once. The kind does
    not change them: the dispatch and the combine of one layer share a case."""

    def __init__(self, workload: MoeWorkload, group, device: torch.device) -> None:
        from syncopate.moe import draw_routing, exchange_layout

        w = workload
        self.w, self.group, self.device = w, group, device
        self.rank, self.ws = dist.get_rank(group), dist.get_world_size(group)
        w.check_world_size(self.ws)
        self.dtype = _dtype(w.dtype)
        self.local = w.experts // self.ws

        def routed(spec):
            r = draw_routing(world_size=self.ws, tokens=w.tokens, experts=w.experts, top_k=w.top_k, spec=spec)
            ids, gates = r.expert_ids[self.rank].to(device), r.gate_weights[self.rank].to(device)
            return ids, gates, exchange_layout(ids, w.experts, group)

        self.ids, self.gates, self.layout = routed(w.routing)
        fresh = [dataclasses.replace(w.routing, seed=w.routing.seed + 1 + i) for i in range(2)]
        self.fresh = [routed(spec) for spec in fresh]
        self.gen = torch.Generator(device=device).manual_seed(1000 + self.rank)
        most = torch.tensor([self.layout.rows_received], device=device)
        dist.all_reduce(most, op=dist.ReduceOp.MAX, group=group)
        self.most_rows = int(most.item())

    def rand(self, *shape, scale: float = 1.0):
        return (torch.randn(*shape, generator=self.gen, device=self.device) * scale).to(self.dtype)

    def operands(self, kind: str, layout):
        """(activation, weight) of `kind` on `layout`'s rows."""
        w = self.w
        if kind == "a2a_gemm":
            return self.rand(w.tokens, w.hidden), self.rand(
                self.local, w.hidden, 2 * w.ffn, scale=w.hidden**-0.5
            )
        return self.rand(layout.rows_received, w.ffn), self.rand(
            self.local, w.ffn, w.hidden, scale=w.ffn**-0.5
        )


def moe_op(kind: str):
    """`kind`'s op as f(a, wt, gates, layout, group, out, config)."""
    from syncopate.moe import dispatch_gemm, gemm_combine

    if kind == "a2a_gemm":
        return lambda a, wt, gates, layout, group, out, config: dispatch_gemm(
            a, wt, layout, group, out=out, config=config
        )
    return lambda a, wt, gates, layout, group, out, config: gemm_combine(
        a, wt, gates, layout, group, out=out, config=config
    )


def out_shape(kind: str, w: MoeWorkload, layout) -> tuple[int, int]:
    return (layout.rows_received, 2 * w.ffn) if kind == "a2a_gemm" else (w.tokens, w.hidden)


def moe_reference(kind: str, case: MoeCase, a, wt, ids, gates):
    """The float32 reference of `kind`'s op, computed by the group together."""
    from syncopate.measure.reference import moe_combine_group_reference, moe_dispatch_group_reference

    if kind == "a2a_gemm":
        return moe_dispatch_group_reference(a, ids, wt, case.w.experts, case.group)
    return moe_combine_group_reference(a, wt, ids, gates, case.w.experts, case.group)


def worst_over_ranks(value: float, case: MoeCase) -> float:
    """The largest of every rank's `value` (NaN counts as infinite)."""
    return slowest([value], case.group, case.device)[0]


def fresh_checks(kind: str, case: MoeCase):
    """Per fresh routing: (ids, gates, layout, [(a, w) of two calls], [their references])."""
    out = []
    for ids, gates, layout in case.fresh:
        calls = [case.operands(kind, layout) for _ in range(2)]
        refs = [moe_reference(kind, case, a, wt, ids, gates) for a, wt in calls]
        out.append((ids, gates, layout, calls, refs))
    return out


AFTER_FAILURE_LIMIT = 64
"""The spin limit of the calls `check_config` still makes after one failed: they need only be made
(the other ranks' calls wait for them), not be right, so each gives up at once where its peers do
not come."""


def check_config(kind: str, config, case: MoeCase, prepared, spin_limit: int = 0) -> float:
    """The largest relative error of `config`'s op over the fresh routings, two calls back to back
    into outputs poisoned with NaN (max over ranks). With `spin_limit` (the tuner's: `harness.
    SPIN_LIMIT`), each call of a plan that waits on signal words is bounded as SYNCOPATE_SPIN_LIMIT
    bounds a job's (`moe.ops._bounded`); a call that ran out (or raised anything else) is raised
    once every call is made (those after it bounded by `AFTER_FAILURE_LIMIT`) and the ranks' worst
    error agreed: the other ranks wait for those."""
    from syncopate.measure.reference import relative_error

    op, worst, failed, limit = moe_op(kind), 0.0, None, spin_limit
    for _, gates, layout, calls, refs in prepared:
        outs = [
            torch.full(out_shape(kind, case.w, layout), float("nan"), dtype=case.dtype, device=case.device)
        ]
        outs.append(torch.full_like(outs[0], float("nan")))
        for (a, wt), out in zip(calls, outs, strict=True):
            try:
                _checked_call(
                    config, case, a, limit, lambda: op(a, wt, gates, layout, case.group, out, config)
                )
            except Exception as e:  # noqa: BLE001 — raised below, once every call is made
                failed = failed or e
                limit = min(limit, AFTER_FAILURE_LIMIT)
        for out, ref in zip(outs, refs, strict=True):
            err = relative_error(out, ref) if ref.numel() else float(out.numel())
            worst = max(worst, err)
    worst = worst_over_ranks(worst, case)
    tuning.raise_held(failed)
    return worst


def _checked_call(config, case: MoeCase, a, spin_limit: int, call) -> None:
    """`call()`, bounded by `spin_limit` where its plan waits on signal words (`waits_on_words`)."""
    if not (spin_limit and waits_on_words(a, config)):
        call()
        return
    _bounded(f"candidate {config.short()}", case.group, spin_limit, call, **tuning.tuner_bound(spin_limit))


def plain_ops(kind: str, case: MoeCase, a, wt):
    """torch written plainly on the case's routing: (whole op, all-to-all alone, GEMM alone), each
    f(out=None): the op's result, copied into `out` only where one is given (a check)."""
    lay, w, g = case.layout, case.w, case.group
    offs = _group_ends(case)
    send_rows = _token_rows(lay)
    if kind == "a2a_gemm":
        received = torch.empty(lay.rows_received, w.hidden, dtype=case.dtype, device=case.device)
        send = a[send_rows]
        ordered = received[lay.expert_order]

        def whole(out=None):
            dist.all_to_all_single(received, a[send_rows], lay.recv_splits, lay.send_splits, group=g)
            return _into(out, torch._grouped_mm(received[lay.expert_order], wt, offs=offs))

        def a2a(out=None):
            dist.all_to_all_single(received, send, lay.recv_splits, lay.send_splits, group=g)

        def gemm(out=None):
            return _into(out, torch._grouped_mm(ordered, wt, offs=offs))

        return whole, a2a, gemm
    back = torch.empty(w.tokens * w.top_k, w.hidden, dtype=case.dtype, device=case.device)
    y_rows = torch.empty(lay.rows_received, w.hidden, dtype=case.dtype, device=case.device).normal_()

    def whole(out=None):
        y = torch._grouped_mm(a, wt, offs=offs)[lay.expert_order_inverse]
        dist.all_to_all_single(back, y, lay.send_splits, lay.recv_splits, group=g)
        return _summed_back(case, back, out)

    def a2a(out=None):
        dist.all_to_all_single(back, y_rows, lay.send_splits, lay.recv_splits, group=g)

    def gemm(out=None):
        return torch._grouped_mm(a, wt, offs=offs)

    return whole, a2a, gemm


COPY_ENGINE_ALONE = "copy-engine transfers of the pipelined plan (one piece a peer), no GEMM"
"""What the copy-engine all-to-all alone times (`copy_engine_a2a`)."""


def copy_engine_a2a(kind: str, case: MoeCase, a):
    """The all-to-all alone on the copy engine: the transfers of `kind`'s pipelined copy-engine plan
    with one piece a peer and no GEMM (`pipelined.exchange_alone`), on rows like `plain_ops`'s
    all-to-all's, as f(out=None); None where the copy engine cannot run (not CUDA). Its own rows
    are not moved, as no plan of ours moves them, where NCCL's all-to-all copies them too."""
    if case.device.type != "cuda":
        return None
    from syncopate.moe.pipelined import exchange_alone
    from syncopate.search_space.moe_workload import MoeCandidate

    lay, w = case.layout, case.w
    config = MoeCandidate(template="pipelined", backend="copy_engine", chunks_per_source=1)
    if kind == "a2a_gemm":
        rows = a[_token_rows(lay)]
    else:
        rows = torch.empty(lay.rows_received, w.hidden, dtype=case.dtype, device=case.device).normal_()

    def a2a(out=None):
        return exchange_alone(rows, lay, case.group, config, kind)

    return a2a


def dedup_a2a(kind: str, case: MoeCase):
    """The all-to-all alone of the `dedup` template (`syncopate.moe.dedup`): torch's
    all_to_all_single of one row of the layer's width a (token, rank), the dispatch's way or the
    combine's (back), no GEMM and no sum, as f(out=None). Collective: makes the layout's dedup
    tables on first use."""
    from syncopate.moe.dedup import dedup_tables

    t = dedup_tables(case.layout, case.group)
    sent, received = (t.send_splits, t.recv_splits) if kind == "a2a_gemm" else (t.recv_splits, t.send_splits)
    width = case.w.hidden
    src = torch.empty(sum(sent), width, dtype=case.dtype, device=case.device).normal_()
    dst = torch.empty(sum(received), width, dtype=case.dtype, device=case.device)

    def a2a(out=None):
        dist.all_to_all_single(dst, src, list(received), list(sent), group=case.group)
        return dst

    return a2a


def _group_ends(case: MoeCase) -> torch.Tensor:
    """The ends of the local experts' row groups (int32, on the device), as `torch._grouped_mm`
    takes them."""
    return torch.cumsum(case.layout.group_sizes, 0).to(device=case.device, dtype=torch.int32)


def _into(out: torch.Tensor | None, result: torch.Tensor) -> torch.Tensor:
    """`result`, copied into `out` where one is given (a check's poisoned output); a timed call passes
    none, so that torch's path is not charged a copy it would not make."""
    return result if out is None else out.copy_(result)


def _summed_back(case: MoeCase, back: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """The combine's end on torch's path: the rows back on their tokens' rank (`back`, send order)
    summed over each token's top_k, weighted by its gates, in float32, in the rows' type (into
    `out` where given)."""
    w = case.w
    pairs = back[case.layout.order_inverse].view(w.tokens, w.top_k, w.hidden)
    summed = (pairs.float() * case.gates.float().unsqueeze(-1)).sum(1)
    return summed.to(back.dtype) if out is None else out.copy_(summed)


def nvshmem_refusal(case: MoeCase) -> str | None:
    """Why torch's NVSHMEM all-to-all (`torch.ops.symm_mem.all_to_all_vdev`) cannot be a baseline
    here, None where it can: it needs CUDA ranks whose symmetric memory is NVSHMEM's
    (`syncopate.use_nvshmem()`, SYNCOPATE_SYMMETRIC_MEMORY=nvshmem, which moe_bench's `--backends
    ...,nvshmem` sets) and a torch that has it."""
    from syncopate.kernels.symmetric_memory import apply_requested, process_memory

    if case.device.type != "cuda":
        return "torch's NVSHMEM all-to-all runs on CUDA ranks only"
    if not hasattr(torch.ops.symm_mem, "all_to_all_vdev"):
        return f"torch {torch.__version__} has no torch.ops.symm_mem.all_to_all_vdev"
    apply_requested()  # SYNCOPATE_SYMMETRIC_MEMORY=nvshmem, before anything allocates
    if process_memory() != "nvshmem":
        return (
            "this process's symmetric memory is not NVSHMEM's (syncopate.use_nvshmem() on every rank first)"
        )
    return None


def nvshmem_ops(kind: str, case: MoeCase, a, wt):
    """torch's path with its NVSHMEM all-to-all in place of NCCL's (`all_to_all_vdev`, device-side
    splits, rows landing by source rank as all_to_all_single lands them) on the case's routing:
    (whole op, all-to-all alone), each f(out=None) as `plain_ops`'s. The rows go
    through symmetric buffers (one size on every rank) of the most any routing of the workload can
    put there (a rank's tokens · top_k pairs; on an expert rank, every rank's), flattened, so that
    the splits count elements whichever unit a torch's op counts them in along dim 0."""
    import torch.distributed._symmetric_memory as symm_mem

    from syncopate.kernels.context import enable_symm_mem

    lay, w, g = case.layout, case.w, case.group
    name = g.group_name
    enable_symm_mem(name)
    sent = w.tokens * w.top_k * w.hidden  # a rank's pairs; an expert rank can hold every rank's
    most = (sent, sent * case.ws) if kind == "a2a_gemm" else (sent * case.ws, sent)
    send_buf = symm_mem.empty(most[0], dtype=case.dtype, device=case.device)
    recv_buf = symm_mem.empty(most[1], dtype=case.dtype, device=case.device)
    # torch's op takes (input, out, in_out_splits [3, W], group) or, later, (input, out, in_splits [W],
    # out_splits_offsets [2, W], group): 3·W words either way, the first W the sent splits
    four = len(torch.ops.symm_mem.all_to_all_vdev.default._schema.arguments) == 4
    meta = symm_mem.empty(3 * case.ws, dtype=torch.int64, device=case.device)
    for t in (send_buf, recv_buf, meta):
        symm_mem.rendezvous(t, name)
    sent_splits = lay.send_splits if kind == "a2a_gemm" else lay.recv_splits
    meta[: case.ws].copy_(torch.tensor([n * w.hidden for n in sent_splits], dtype=torch.int64))

    def exchange(recv_rows: int):
        if four:
            torch.ops.symm_mem.all_to_all_vdev(send_buf, recv_buf, meta.view(3, case.ws), name)
        else:
            splits, landed = meta[: case.ws], meta[case.ws :].view(2, case.ws)
            torch.ops.symm_mem.all_to_all_vdev(send_buf, recv_buf, splits, landed, name)
        return recv_buf[: recv_rows * w.hidden].view(recv_rows, w.hidden)

    offs = _group_ends(case)
    if kind == "a2a_gemm":
        send_rows = _token_rows(lay)
        rows_out = send_buf[: lay.order.numel() * w.hidden].view(-1, w.hidden)

        def whole(out=None):
            torch.index_select(a, 0, send_rows, out=rows_out)
            received = exchange(lay.rows_received)
            return _into(out, torch._grouped_mm(received[lay.expert_order], wt, offs=offs))

        def a2a(out=None):
            exchange(lay.rows_received)

        return whole, a2a
    rows_out = send_buf[: lay.rows_received * w.hidden].view(-1, w.hidden)
    back_rows = w.tokens * w.top_k
    back_order = lay.expert_order_inverse.to(case.device)

    def whole(out=None):
        y = torch._grouped_mm(a, wt, offs=offs)
        torch.index_select(y, 0, back_order, out=rows_out)
        return _summed_back(case, exchange(back_rows), out)

    def a2a(out=None):
        exchange(back_rows)

    return whole, a2a


def layer_call(fn, case: MoeCase, dedup: bool = False):
    """`fn(layout)` as `MoELayer` calls its ops: after the routing's layout is made for this call
    (`exchange_layout`: the counts' all-gather and the host's wait for them, then the tables; a
    plan's own tables start empty), which torch's path pays as well (its split sizes read back to
    the host). So an eager time counts what a plan spends on the host after that wait."""
    from syncopate.moe import exchange_layout

    def call():
        fn(exchange_layout(case.ids, case.w.experts, case.group, dedup=dedup))

    return call


# The tuning harness ------------------------------------------------------------------------------


class MoeHarness:
    """One MoE workload on this rank, as the runners of `syncopate tune` measure it: the baselines
    (`torch_seq`: torch's all_to_all_single and grouped GEMM; `comm_alone`: the all-to-all alone;
    on CUDA `comm_alone_copy_engine`: the copy engine's transfers alone (`copy_engine_a2a`);
    `gemm_alone`: the grouped GEMM alone; the sweep's bound is the larger of the GEMM alone and the
    faster all-to-all alone), and
    each candidate checked against the float32 group reference on fresh routings into outputs
    poisoned with NaN (:func:`check_config`), then timed: device time and back-to-back eager time
    on CUDA, wall-clock on the CPU. Every failure becomes the trial's status, the worst over the
    ranks (a candidate the ranks cannot run, such as `copy_engine` on the CPU, is a ConfigError:
    `compile_error`); none is raised."""

    def __init__(self, workload: MoeWorkload, group, timing: Any, device: torch.device | None = None) -> None:
        self.workload, self.group, self.timing = workload, group, timing
        if device is None:
            device = (
                torch.device("cuda", torch.cuda.current_device())
                if torch.cuda.is_available()
                else torch.device("cpu")
            )
        self.device = device
        self.case = MoeCase(workload, group, device)
        self.kind = workload.kind
        self.a, self.wt = self.case.operands(self.kind, self.case.layout)
        self._prepared = None

    def _time(self, fn, dedup: bool = False) -> tuple[tuple[float, ...], float | None, float]:
        """(device samples, host µs, eager µs) of `fn(layout)`: the device time on the case's layout,
        made once; the eager time as a layer calls the op, each call on a layout made for it
        (`layer_call`; `dedup`: as a layer running a `dedup` plan makes it)."""
        t = self.timing
        samples, host = time_device(
            lambda: fn(self.case.layout),
            self.group,
            self.device,
            warmup=getattr(t, "warmup", 5),
            repetitions=getattr(t, "repetitions", 20),
            flush_l2=getattr(t, "flush_l2", True),
        )
        eager = statistics.median(
            time_calls(
                layer_call(fn, self.case, dedup),
                self.group,
                self.device,
                flush_l2=getattr(t, "flush_l2", True),
            )
        )
        return samples, host, eager

    def measure_baselines(self) -> list[BaselineResult]:
        whole, a2a, gemm = plain_ops(self.kind, self.case, self.a, self.wt)
        timed = [
            ("torch_seq", whole, "torch: all_to_all_single and torch._grouped_mm, written plainly"),
            ("comm_alone", a2a, "the all-to-all alone (all_to_all_single)"),
            ("gemm_alone", gemm, "the grouped GEMM alone (torch._grouped_mm)"),
        ]
        ce = copy_engine_a2a(self.kind, self.case, self.a)
        if ce is not None:
            timed.append(("comm_alone_copy_engine", ce, COPY_ENGINE_ALONE))
        found = []
        for name, fn, detail in timed:
            try:
                samples, host, eager = self._time(lambda layout, f=fn: f())
            except Exception as e:  # noqa: BLE001 — a baseline that cannot run is left out, the sweep goes on
                if name != "comm_alone_copy_engine":
                    raise
                log.warning("MoE baseline %s left out: %s: %s", name, type(e).__name__, e)
                continue
            found.append(BaselineResult(name, samples, detail, eager_us=eager, host_us=host))
        return found

    def _agree(self, status: str) -> str:
        return tuning.agreed_status(status, self.group, self.device)

    def run_candidate(self, candidate: MoeCandidate, deadline_s: float | None = None) -> CandidateResult:
        """Check, then time one candidate; after each stage the ranks agree on the worst status
        (`harness.agreed_failure`: the contexts closed after a timeout) before the next stage's
        collectives."""
        status, error, rel = "ok", "", None
        try:
            check_moe_candidate(candidate, self.case.ws)
            if self._prepared is None:
                self._prepared = fresh_checks(self.kind, self.case)
            rel = check_config(self.kind, candidate, self.case, self._prepared, tuning.SPIN_LIMIT)
            if not rel <= TOLERANCE:
                status, error = "wrong_result", f"relative error {rel:.3g} exceeds {TOLERANCE}"
        except Exception as e:
            status, error = tuning.classify(e), f"{type(e).__name__}: {e}"
            log.info("MoE candidate %s: %s", candidate.short(), error)
        failed = tuning.agreed_failure(self._agree, self.close, status, rel, error)
        if failed is not None:
            return failed
        op, case = moe_op(self.kind), self.case
        out = torch.empty(
            out_shape(self.kind, self.workload, case.layout), dtype=case.dtype, device=self.device
        )
        try:
            samples, host, eager = self._time(
                lambda layout: op(self.a, self.wt, case.gates, layout, case.group, out, candidate),
                dedup=candidate.template in ("dedup", "fused_dedup"),
            )
        except Exception as e:
            status, error = tuning.classify(e), f"{type(e).__name__}: {e}"
        failed = tuning.agreed_failure(self._agree, self.close, status, rel, error)
        if failed is not None:
            return failed
        return CandidateResult(
            status="ok", samples_us=samples, max_rel_error=rel, host_us=host, eager_us=eager
        )

    def close(self) -> None:
        from syncopate.moe import close_moe_contexts

        close_moe_contexts(self.group)
