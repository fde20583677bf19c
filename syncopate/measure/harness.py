"""Verify and time fused-op candidates and the baselines on the GPUs of one process group.

Used by the Ray GPU workers (one `Harness` per rank, the same calls on every rank) and by
`syncopate bench`. Every result is already agreed across ranks: times are the max over ranks per
repetition, a failure on any rank is a failure everywhere.

An `fp8` workload's inputs are float8 e4m3 with row-wise float32 scales (A per row, B per output
column, B given as `weight.t()`); its baselines are torch's scaled paths: the collective on the
FP8 bytes (and A's scales) or on the bf16 partials, and `torch._scaled_mm`, in sequence
(`torch_seq`), and torch's fused scaled async-TP ops where the installed torch has them
(`torch.ops.symm_mem.fused_all_gather_scaled_matmul`, `fused_scaled_matmul_reduce_scatter`;
an all-reduce: `torch._scaled_mm` into symmetric memory, then its all-reduce).
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.distributed as dist
import triton

from syncopate.errors import CandidateTimeoutError, ConfigError
from syncopate.kernels import launch, ops, streamops
from syncopate.kernels.ranks import slowest
from syncopate.kernels.replay import candidate_replays
from syncopate.kernels.scaled import FP8, OUT_DTYPE, quantize, scaled_mm
from syncopate.measure.reference import FP8_TOLERANCE, reference, relative_error
from syncopate.measure.timing import Timing, barrier, time_collective, time_eager, time_host
from syncopate.search_space import Candidate, Workload

__all__ = ["Harness", "BaselineResult", "CandidateResult", "TOLERANCE", "SPIN_LIMIT", "TimingSettings"]

log = logging.getLogger(__name__)

TOLERANCE = {"bf16": 1e-2, "fp16": 5e-3, "fp32": 2e-3, "fp8": FP8_TOLERANCE}
"""Largest accepted ‖out − ref‖/‖ref‖ against the float32 reference (for fp8, of the same FP8
operands and scales)."""

SPIN_LIMIT = 1 << 24
"""Polls a wait may spend while tuning before it reports a timeout (seconds, not forever)."""


_TUNER_ADVICE = (
    "The word's writer did not come in time: a rank of the gang fell that far behind (a slow host, "
    "a faulty GPU), or the candidate's plan never writes that word; the trial is recorded as a "
    "timeout and the sweep goes on"
)


def tuner_bound(limit: int | None = None) -> dict[str, str]:
    """What a timeout of a tuner's check says (`ops.check_waits`' `setting` and `advice`): the
    harness's spin limit (`limit`, default `SPIN_LIMIT`) bounded the call, and the sweep goes on."""
    return {
        "setting": f"the tuner's spin limit, {SPIN_LIMIT if limit is None else limit}",
        "advice": _TUNER_ADVICE,
    }


class TimingSettings(Protocol):
    """What the harness reads of its timing settings: a sweep's `timing:` section (on the GPU
    workers) or `syncopate bench`'s options (:class:`~syncopate.measure.bench.BenchOptions`)."""

    warmup: int
    """Untimed calls first."""
    repetitions: int
    """Timed repetitions, one CUDA-event pair each."""
    flush_l2: bool
    """Whether L2 is flushed before each repetition."""


_STATUS_CODES = {"ok": 0, "wrong_result": 1, "timeout": 2, "compile_error": 3, "oom": 4, "crash": 5}
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "fp8": FP8}


@dataclass(frozen=True)
class BaselineResult:
    name: str
    samples_us: tuple[float, ...]
    """Device time of a call, µs, one sample a repetition (`time_collective`)."""
    detail: str = ""
    eager_us: float | None = None
    """Median per-call time of back-to-back eager calls, host on the path (`time_eager`), where measured."""
    host_us: float | None = None
    """Median host time to enqueue one call (`time_host`), where measured."""


@dataclass(frozen=True)
class CandidateResult:
    status: str
    samples_us: tuple[float, ...] = ()
    """Device time of a call, µs, one sample a repetition (`time_collective`)."""
    max_rel_error: float | None = None
    error: str = ""
    host_us: float | None = None
    """Median host time to enqueue one call (`time_host`), called as a job calls it (`Harness._as_a_job`)."""
    eager_us: float | None = None
    """Median per-call time of back-to-back eager calls with the host on the path (`time_eager`),
    called as a job calls it (`Harness._as_a_job`)."""


def classify(e: BaseException) -> str:
    """Trial status of an exception raised while building, checking or timing a candidate."""
    name = type(e).__name__
    if isinstance(e, CandidateTimeoutError):
        return "timeout"
    if isinstance(e, torch.cuda.OutOfMemoryError):
        return "oom"
    if isinstance(e, ConfigError) or name in (
        "CompilationError",
        "OutOfResources",
        "CompileTimeAssertionFailure",
    ):
        return "compile_error"
    if "out of resource" in str(e).lower() or "compil" in name.lower():
        return "compile_error"
    return "crash"


class Harness:
    """Inputs, baselines, verification and timing of one workload on this rank's GPU."""

    def __init__(self, workload: Workload, group, timing: TimingSettings) -> None:
        self.workload = workload
        self.group = group
        self.timing = timing
        self.rank = dist.get_rank(group)
        self.ws = dist.get_world_size(group)
        self.device = torch.device("cuda", torch.cuda.current_device())
        self.dtype = _DTYPES[workload.dtype]
        self.scaled = workload.scaled
        self.out_dtype = OUT_DTYPE if self.scaled else self.dtype
        workload.check_world_size(self.ws)
        self.shapes = workload.local_shapes(self.ws)
        self._gen = torch.Generator(device=self.device)
        self._gen.manual_seed(1234 + self.rank)
        self.a, self.b, self.scales = self.fresh_inputs()

    def fresh_inputs(self) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
        """New random inputs (scaled so that outputs are O(1)); never zeros. For fp8, the operands
        quantized row-wise (B as `weight.t()`) and their (a_scale, b_scale); else None for those."""
        (ma, ka), (kb, nb) = self.shapes["a"], self.shapes["b"]
        a = torch.randn((ma, ka), generator=self._gen, device=self.device, dtype=torch.float32)
        b = torch.randn((kb, nb), generator=self._gen, device=self.device, dtype=torch.float32)
        b = b / (self.workload.shape.k**0.5)
        if not self.scaled:
            return a.to(self.dtype), b.to(self.dtype), None
        a8, a_scale = quantize(a, 1)
        w8, w_scale = quantize(b.t().contiguous(), 1)  # [N, K] as a weight holds it
        return a8, w8.t(), (a_scale, w_scale.reshape(1, -1).contiguous())

    def op(self, candidate: Candidate, spin_limit: int = 0) -> Callable[..., torch.Tensor]:
        kind = self.workload.kind
        fused = {
            "ag_gemm": ops.all_gather_matmul,
            "gemm_rs": ops.matmul_reduce_scatter,
            "gemm_ar": ops.matmul_all_reduce,
        }[kind]

        def call(a, b, out=None, scales=None):
            extra = {} if scales is None else {"a_scale": scales[0], "b_scale": scales[1]}
            return fused(a, b, self.group, candidate, out=out, spin_limit=spin_limit, **extra)

        return call

    def _gemm(self, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None, a_scale=None):
        """torch's GEMM of this workload's operands: torch.matmul, or for fp8 torch._scaled_mm with
        the inputs' scales (`a_scale`: the gathered A's where given)."""
        if not self.scaled:
            return torch.matmul(a, b, out=out) if out is not None else a @ b
        return scaled_mm(a, b, self.scales[0] if a_scale is None else a_scale, self.scales[1], out=out)

    # Baselines ---------------------------------------------------------------------------------

    def _timing(self, fn) -> Timing:
        """`fn`'s device time by the one method (`time_collective`), with this harness's settings."""
        return time_collective(
            fn,
            self.group,
            warmup=self.timing.warmup,
            repetitions=self.timing.repetitions,
            flush_l2=self.timing.flush_l2,
        )

    def _time(self, fn) -> tuple[float, ...]:
        return self._timing(fn).samples_us

    def _eager(self, fn) -> float:
        """`fn`'s median time a call back to back, the host on the path (`time_eager`)."""
        return statistics.median(time_eager(fn, self.group, flush_l2=self.timing.flush_l2))

    def _host(self, fn) -> float:
        """`fn`'s host time to enqueue one call (`time_host`), the slowest rank's (a collective waits
        for it): a baseline's and a candidate's by the one method."""
        return slowest([time_host(fn)], self.group, self.device)[0]

    def _baseline(self, name: str, fn, detail: str) -> BaselineResult:
        """A baseline's device time, back-to-back eager time and host time."""
        t = self._timing(fn)
        return BaselineResult(name, t.samples_us, detail, eager_us=self._eager(fn), host_us=self._host(fn))

    def measure_baselines(self) -> list[BaselineResult]:
        """torch_seq, torch_async_tp, gemm_alone, comm_alone (NCCL) and comm_alone_copy_engine."""
        kind, a, b, g = self.workload.kind, self.a, self.b, self.group
        results = []
        m_full = self.workload.shape.m
        gemm_scale = None
        if kind == "ag_gemm":
            gathered = torch.empty((m_full, a.shape[1]), dtype=self.dtype, device=self.device)
            if self.scaled:  # NCCL takes no float8 tensors: A's bytes as uint8, and A's scales
                gathered_scale = torch.empty((m_full, 1), dtype=torch.float32, device=self.device)
                a_bytes, gathered_bytes = a.view(torch.uint8), gathered.view(torch.uint8)

                def comm():
                    dist.all_gather_into_tensor(gathered_bytes, a_bytes, group=g)
                    dist.all_gather_into_tensor(gathered_scale, self.scales[0], group=g)

                gemm_scale = gathered_scale
            else:

                def comm():
                    dist.all_gather_into_tensor(gathered, a, group=g)

            def seq():
                comm()
                return self._gemm(gathered, b, a_scale=gemm_scale)

            gemm_a = gathered
        else:
            out_rs = torch.empty((m_full // self.ws, b.shape[1]), dtype=self.out_dtype, device=self.device)
            partial = torch.empty((m_full, b.shape[1]), dtype=self.out_dtype, device=self.device)

            def comm():
                if kind == "gemm_rs":
                    dist.reduce_scatter_tensor(out_rs, partial, group=g)
                else:
                    dist.all_reduce(partial, group=g)

            def seq():
                self._gemm(a, b, out=partial)
                comm()

            gemm_a = a
        gemm_name = "torch._scaled_mm" if self.scaled else "torch.matmul"
        results.append(self._baseline("torch_seq", seq, f"NCCL collective and {gemm_name} in sequence"))
        results.append(
            BaselineResult(
                "gemm_alone",
                self._time(lambda: self._gemm(gemm_a, b, a_scale=gemm_scale)),
                f"{gemm_name} (cuBLAS)",
            )
        )
        results.append(BaselineResult("comm_alone", self._time(comm), "NCCL collective alone"))
        async_tp = self._async_tp()
        if async_tp is not None:
            results.append(async_tp)
        ce = self._copy_engine_alone()
        if ce is not None:
            results.append(ce)
        return results

    def _async_tp(self) -> BaselineResult | None:
        kind, a, b, g = self.workload.kind, self.a, self.b, self.group
        from syncopate.kernels.symmetric_memory import process_memory

        if process_memory() == "nvshmem":
            log.warning(
                "torch async-TP baseline left out for %s: it does not run on NVSHMEM symmetric memory, "
                "which this process opted into (backend nvshmem)",
                self.workload,
            )
            return None
        try:
            import torch.distributed._symmetric_memory as symm_mem

            from syncopate.kernels.context import enable_symm_mem

            enable_symm_mem(g.group_name)
            if self.scaled and kind != "gemm_ar":
                return self._scaled_async_tp()
            if kind == "ag_gemm":

                def fn():
                    return torch.ops.symm_mem.fused_all_gather_matmul(
                        a, [b], gather_dim=0, group_name=g.group_name
                    )

                detail = "torch.ops.symm_mem.fused_all_gather_matmul"
            elif kind == "gemm_rs":

                def fn():
                    return torch.ops.symm_mem.fused_matmul_reduce_scatter(
                        a, b, "sum", scatter_dim=0, group_name=g.group_name
                    )

                detail = "torch.ops.symm_mem.fused_matmul_reduce_scatter"
            else:
                return self._symm_all_reduce(symm_mem)
            return self._baseline("torch_async_tp", fn, detail)
        except Exception as e:  # an older torch, or an op this build lacks
            log.warning("torch async-TP baseline unavailable for %s: %s", self.workload, e)
            return None

    def _scaled_async_tp(self) -> BaselineResult | None:
        """torch's fused scaled async-TP op of an fp8 all-gather or reduce-scatter, None (said in
        the log) where the installed torch has none."""
        kind, a, b, g = self.workload.kind, self.a, self.b, self.group
        a_scale, b_scale = self.scales
        name = "fused_all_gather_scaled_matmul" if kind == "ag_gemm" else "fused_scaled_matmul_reduce_scatter"
        if not hasattr(torch.ops.symm_mem, name):
            log.warning(
                "torch async-TP baseline unavailable for %s: torch.ops.symm_mem.%s is missing",
                self.workload,
                name,
            )
            return None
        if kind == "ag_gemm":

            def fn():
                return torch.ops.symm_mem.fused_all_gather_scaled_matmul(
                    a, [b], a_scale, [b_scale], 0, g.group_name, [None], [None], [OUT_DTYPE], [False]
                )
        else:
            shape = [a.shape[0], b.shape[1]]

            def fn():
                return torch.ops.symm_mem.fused_scaled_matmul_reduce_scatter(
                    a, b, a_scale, b_scale, "sum", 0, 0, g.group_name, shape, out_dtype=OUT_DTYPE
                )

        return self._baseline("torch_async_tp", fn, f"torch.ops.symm_mem.{name}")

    def _symm_all_reduce(self, symm_mem) -> BaselineResult:
        """The faster of torch's symmetric-memory all-reduces after torch's GEMM (`_gemm`) into a
        symmetric buffer: one-shot (every rank reads every peer's whole buffer) and two-shot (a
        reduce-scatter then an all-gather, in place); the one-shot alone loses on large outputs."""
        a, b, g = self.a, self.b, self.group
        buf = symm_mem.empty((a.shape[0], b.shape[1]), dtype=self.out_dtype, device=self.device)
        symm_mem.rendezvous(buf, group=g.group_name)

        def one_shot():
            self._gemm(a, b, out=buf)
            return torch.ops.symm_mem.one_shot_all_reduce(buf, "sum", g.group_name)

        def two_shot():
            self._gemm(a, b, out=buf)
            torch.ops.symm_mem.two_shot_all_reduce_(buf, "sum", g.group_name)
            return buf

        tried = [
            self._baseline(
                "torch_async_tp",
                one_shot,
                "torch.matmul into symmetric memory, then torch.ops.symm_mem.one_shot_all_reduce",
            )
        ]
        if hasattr(torch.ops.symm_mem, "two_shot_all_reduce_"):
            tried.append(
                self._baseline(
                    "torch_async_tp",
                    two_shot,
                    "torch.matmul into symmetric memory, then torch.ops.symm_mem.two_shot_all_reduce_",
                )
            )
        return min(tried, key=lambda r: statistics.median(r.samples_us))

    def _copy_engine_alone(self) -> BaselineResult | None:
        """The copy engine moving this kind's chunks with no GEMM (one chunk per block, direct plan)."""
        from syncopate.kernels import streamops
        from syncopate.kernels.backends import GatherCall, ScatterCall, backend_for
        from syncopate.kernels.tables import READY_BASE, plan_for

        if not streamops.available() or self.workload.kind == "gemm_ar":
            return None
        cand = Candidate(backend="copy_engine", template="direct", num_splits=1)
        kind, a, b = self.workload.kind, self.a, self.b
        m = self.workload.shape.m
        plan = plan_for(kind, "direct", self.ws, m, 1, 1)
        backend = backend_for(cand)
        if kind == "ag_gemm":
            if self.scaled:  # A's FP8 bytes (its scales, 4 bytes a row, are left out)
                a = a.view(torch.uint8)
            ctx = ops.get_context(kind, self.group, (m, a.shape[1]), a.dtype)

            def fn():
                e = ctx.begin_call()
                main = torch.cuda.current_stream()
                streams = ctx.fork(main, 3)
                backend.start_gather(
                    GatherCall(
                        ctx=ctx,
                        plan=plan,
                        candidate=cand,
                        epoch=e,
                        main=main,
                        a_local=a,
                        a_full=ctx.buffers["a_full"],
                        r0=self.rank * a.shape[0],
                        row_bytes=a.shape[1] * a.element_size(),
                    ),
                    streams,
                )
                ctx.join(main, streams)
        else:
            n = b.shape[1]
            ctx = ops.get_context(kind, self.group, (m, n), self.out_dtype)
            send = torch.randn((m, n), device=self.device).to(self.out_dtype)

            def fn():
                e = ctx.begin_call()
                main = torch.cuda.current_stream()
                for i in range(len(plan.sends(self.rank, "reduce"))):
                    streamops.write_value(main.cuda_stream, ctx.signal_address(self.rank, READY_BASE + i), e)
                streams = ctx.fork(main, 3)
                backend.start_scatter(
                    ScatterCall(
                        ctx=ctx,
                        plan=plan,
                        candidate=cand,
                        epoch=e,
                        main=main,
                        send=send,
                        recv=ctx.buffers["recv"],
                        n_cols=n,
                        elem=send.element_size(),
                    ),
                    streams,
                )
                ctx.join(main, streams)

        return BaselineResult(
            "comm_alone_copy_engine", self._time(fn), "copy-engine transfers of the direct plan, no GEMM"
        )

    # Candidates --------------------------------------------------------------------------------

    def _poison(self) -> None:
        """Fill this workload's symmetric buffers with NaN so that a stale read shows (the fused
        templates' context: none for fp8, which they do not run)."""
        if self.scaled:
            return
        kind, m = self.workload.kind, self.workload.shape.m
        shape = (m, self.a.shape[1]) if kind == "ag_gemm" else (m, self.b.shape[1])
        ctx = ops.get_context(kind, self.group, shape, self.dtype)
        for buf in ctx.buffers.values():
            buf.local.fill_(float("nan"))
        send = ctx.cache.get(("send",))
        if send is not None:
            send.fill_(float("nan"))
        barrier(self.group, self.device)

    def verify(self, candidate: Candidate, calls: int = 3) -> float:
        """Worst relative error over `calls` back-to-back calls on fresh inputs, outputs poisoned.
        Every wait of the calls is bounded: a kernel's to `SPIN_LIMIT` polls, a stream's (the copy
        engine's, the cuBLAS templates') to `SPIN_LIMIT` µs of this host's waiting for the calls
        (`ops.check_waits`, which releases it), so that a candidate whose ranks stop meeting ends
        in a timeout naming the word it waited for, not in its gang's deadline. Whatever fails
        here, the references (collective) are made for every call before it is raised."""
        fused = self.op(candidate, SPIN_LIMIT)
        self._poison()
        inputs = [self.fresh_inputs() for _ in range(calls)]
        outs, failed = [], None
        with streamops.watching() as waits:
            for a, b, scales in inputs:
                outs.append(
                    torch.full(self.shapes["out"], float("nan"), dtype=self.out_dtype, device=self.device)
                )
                if failed is None:
                    try:
                        fused(a, b, outs[-1], scales)
                    except Exception as e:  # noqa: BLE001 — raised below, once the references are made
                        failed = e
        try:
            self._check_waits(candidate, waits)
        except Exception as e:  # noqa: BLE001 — as above
            failed = failed or e
        worst = 0.0
        for out, (a, b, scales) in zip(outs, inputs, strict=True):
            worst = max(
                worst, relative_error(out, reference(self.workload.kind, a, b, self.group, *(scales or ())))
            )
        raise_held(failed)
        return worst

    def _check_waits(self, candidate: Candidate, waits: list[tuple[int, int]] | None = None) -> None:
        """The candidate's calls so far checked (`ops.check_waits`): its stream waits `waits`
        bounded, then its context's kernel timeouts (none where its template needs no context)."""
        ctx = ops.call_context(self.workload.kind, self.a, self.b, self.group, candidate)
        if ctx is not None:
            ops.check_waits(ctx, f"candidate {candidate.short()}", SPIN_LIMIT, waits or [], **tuner_bound())

    def _agree(self, status: str) -> str:
        return agreed_status(status, self.group, self.device)

    def run_candidate(self, candidate: Candidate, deadline_s: float | None = None) -> CandidateResult:
        """Build, verify against the float32 reference, then time one candidate. Every rank makes
        the same collective calls whatever fails where: after each stage the ranks agree on the
        worst status (`_agreed_failure`) before the next stage's collectives."""
        status, error, rel = "ok", "", None
        try:
            self._check_kernel(candidate)
            rel = self.verify(candidate)
            if not rel <= TOLERANCE[self.workload.dtype]:
                status, error = (
                    "wrong_result",
                    f"relative error {rel:.3g} exceeds {TOLERANCE[self.workload.dtype]}",
                )
        except Exception as e:
            status, error = classify(e), f"{type(e).__name__}: {e}"
            log.info("candidate %s: %s", candidate.short(), error)
        failed = self._agreed_failure(status, rel, error)
        if failed is not None:
            return failed
        fused = self.op(candidate, SPIN_LIMIT)
        a, b, scales = self.a, self.b, self.scales
        try:
            timing = self._timing(lambda: fused(a, b, None, scales))
            self._check_waits(candidate)
        except CandidateTimeoutError as e:
            status, error = "timeout", f"CandidateTimeoutError: while timing, {e}"
        except Exception as e:
            status, error = classify(e), f"{type(e).__name__}: {e}"
        failed = self._agreed_failure(status, rel, error)
        if failed is not None:
            return failed
        try:
            host_us, eager_us = self._as_a_job(self.op(candidate), a, b, scales, candidate_replays(candidate))
        except Exception as e:
            status, error = classify(e), f"{type(e).__name__}: {e}"
        failed = self._agreed_failure(status, rel, error)
        if failed is not None:
            return failed
        return CandidateResult(
            status="ok",
            samples_us=timing.samples_us,
            max_rel_error=rel,
            host_us=host_us,
            eager_us=eager_us,
        )

    def _agreed_failure(self, status: str, rel: float | None, error: str) -> CandidateResult | None:
        return agreed_failure(self._agree, self.close, status, rel, error)

    def _check_kernel(self, candidate: Candidate) -> None:
        """A `gluon` candidate is measured only where its Gluon kernels run (on the interpreter the
        Triton kernels stand in: the same tiles, no timing that counts): elsewhere the Triton
        kernels would be timed under its name."""
        if candidate.kernel == "gluon" and not launch.interpreting() and not launch.gluon_runs_here(self.a):
            raise ConfigError(
                f"kernel 'gluon' needs triton's Gluon Hopper API, which triton {triton.__version__} "
                f"lacks here: measure kernel 'triton' candidates (space kernels: [triton])"
            )

    def _as_a_job(self, call, a, b, scales, replays: bool = False) -> tuple[float, float]:
        """(host µs, eager µs) a call as a job makes it: unbounded waits, no `out=`, so after the first
        call the op's fast path (a bounded-wait call takes the checked path every time, and is never
        replayed), launched directly and, where the candidate can be (`replays`), replayed from a
        graph of its own (`syncopate.kernels.replay`): the way with the lower eager time, as `auto`
        launches a job's calls back to back. The device time is the bounded calls' (`_timing`): the
        same kernels, and a kernel's wait that runs out is caught there (the timed calls' stream
        waits are not bounded: a call held for ever meets the sweep's deadline)."""
        launch = ops.get_launch()
        ways = []
        try:
            for way in ("direct", "graph") if replays else ("direct",):
                ops.set_launch(way)
                host_us = self._host(lambda: call(a, b, None, scales))
                ways.append((self._eager(lambda: call(a, b, None, scales)), host_us))
        finally:
            ops.set_launch(launch)
        eager_us, host_us = min(ways)
        return host_us, eager_us

    def close(self) -> None:
        ops.close_contexts(self.group)


def raise_held(failed: Exception | None) -> None:
    """Raise what a verification held back until every rank's collective calls were made (None:
    nothing failed); a timeout says it was one during verification."""
    if isinstance(failed, CandidateTimeoutError):
        raise CandidateTimeoutError(f"during verification, {failed}") from None
    if failed is not None:
        raise failed


CLOSED_AFTER = ("timeout", "oom")
"""Agreed statuses after which the harness closes its contexts: a rank's calls may have been given
up (or left off) there, and their copies, landing late, must not reach the next candidate's
buffers; the next call makes fresh ones."""


def agreed_status(status: str, group, device: torch.device) -> str:
    """The worst of every rank's `status` (collective)."""
    code = torch.tensor([_STATUS_CODES[status]], device=device)
    dist.all_reduce(code, op=dist.ReduceOp.MAX, group=group)
    return {v: k for k, v in _STATUS_CODES.items()}[int(code.item())]


def agreed_failure(agree, close, status: str, rel: float | None, error: str) -> CandidateResult | None:
    """After a stage of a candidate that ended in `status` on this rank: the ranks' worst status
    (`agree(status)`, collective), None where it is `ok`, else the candidate's result, the contexts
    closed first (`close()`, collective) after a status of `CLOSED_AFTER`. Every rank calls it
    after every stage, so that no rank goes on to the next stage's collectives alone."""
    status = agree(status)
    if status == "ok":
        return None
    if status in CLOSED_AFTER:
        close()
    return CandidateResult(status=status, max_rel_error=rel, error=error or "failed on another rank")
