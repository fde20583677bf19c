"""The public fused ops: all-gather + GEMM, GEMM + reduce-scatter, GEMM + all-reduce.

| op                       | a (per rank)   | b (per rank)    | returns            |
|--------------------------|----------------|-----------------|--------------------|
| `all_gather_matmul`      | A[M/ws, K]     | B[K, N/ws]      | out[M, N/ws]       |
| `matmul_reduce_scatter`  | A[M, K/ws]     | B[K/ws, N]      | out[M/ws, N]       |
| `matmul_all_reduce`      | A[M, K/ws]     | B[K/ws, N]      | out[M, N]          |

`b` may be row-major or the transpose of a row-major [N, K] matrix (`weight.t()` of an nn.Linear).
FP8 operands (torch.float8_e4m3fn, both) come with `a_scale=` and `b_scale=` (float32, tensor-wise
or row-wise: `syncopate.kernels.scaled`) and give a bf16 output; the fused templates (FP8 tiles in
Triton) and `unfused` and `decomposed` (`torch._scaled_mm`) run them, eagerly (not under
torch.compile, and without `return_gathered`). With `config=None` an op asks `syncopate.lookup` once
per (workload, group) and keeps the answer. A call's first use of its shapes, dtype, group and
config checks every argument and prepares its call program (`syncopate.kernels.templates`: the
template the config names, its context of symmetric buffers, signals and streams); every later such
call finds the program and only binds its tensors. A later plain call (no out= or bounded waits,
not captured) finds it bound to (a, b) in one lookup keyed by what the checks depend on
(`_call_key`; for FP8 operands, and their scales' shapes, dtypes and layout, `_scale_key`), and
for template `unfused` runs torch's collective and matmul straight away. Programs
and contexts are kept until `close_contexts()`.

Under `torch.compile` a call is traced as one node, `torch.ops.syncopate.*` (`fullgraph=True`
works; `out=` and `spin_limit` are refused there). A call can be captured in a CUDA graph once one
like it (same shapes, dtype, group and config) has run outside the capture: that call makes the
context (a collective) and compiles the kernel. A captured call starts by clearing the signal pads
with the group met before and after (`OverlapContext.begin_call`), as its replays repeat its
epoch; every rank must replay its graphs in the same order, as it would make the calls. A first
call keeps what it allocates out of torch.compile's CUDA graph pool (`kept_allocations`).
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from syncopate.environment import SPIN_LIMIT_VAR, job_spin_limit
from syncopate.errors import CandidateTimeoutError, ConfigError, describe
from syncopate.kernels import streamops
from syncopate.kernels.context import OverlapContext, kept_allocations
from syncopate.kernels.library import OP_NAMES, config_text, register
from syncopate.kernels.replay import LAUNCHES, LaunchChoice, ReplayedCalls, note_prepared, replayable
from syncopate.kernels.scaled import FP8, OUT_DTYPE, Scales, check_scales, fast_accumulation
from syncopate.kernels.templates import (
    CONTEXTS,
    CallProgram,
    CallSpec,
    fused_buffers,
    fused_context_key,
    template_for,
)
from syncopate.platform import detect_topology
from syncopate.search_space import (
    NCCL_CAPTURE_SETTING,
    UNFUSED,
    Candidate,
    Topology,
    Workload,
    canonical_dtype,
    check_candidate,
    nccl_chunks_replay,
)

__all__ = [
    "LAUNCHES",
    "MODES",
    "all_gather_matmul",
    "get_launch",
    "get_mode",
    "launch_choices",
    "launch_report",
    "mode",
    "set_launch",
    "set_mode",
    "gather_buffer",
    "matmul_reduce_scatter",
    "matmul_all_reduce",
    "ContextRegistry",
    "close_contexts",
    "get_context",
    "call_context",
]

log = logging.getLogger(__name__)

register()  # torch.ops.syncopate: what torch.compile traces the ops as

_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_OPERAND_DTYPES = (*_DTYPES, FP8)


MODES = ("eager", "graph")
"""How a job runs the ops, which decides the looked-up configuration: `eager` (calls back to back,
the host on the path) or `graph` (calls replayed from CUDA graphs, the host off the path)."""


class ContextRegistry:
    """Call programs and looked-up configurations, per group and shape. One per process by default."""

    def __init__(self) -> None:
        self.mode = "eager"
        """The mode of calls made outside a CUDA graph capture (`set_mode`); captured calls are `graph`."""
        self.launch = "auto"
        """How fused calls outside a capture are launched (`set_launch`)."""
        self._warned_fallback: set[tuple] = set()
        self._configs: dict[tuple, Candidate] = {}
        self._topologies: dict[str, Topology] = {}
        self.programs: dict[tuple, CallProgram] = {}
        """Prepared calls: their key (`_call_key`) → their program."""
        self.calls: dict[tuple, Callable] = {}
        """The fast path: the key of a plain call (`_call_key`, its kind `GATHERED` for an all-gather
        that returns the gathered A; an FP8 call's with its `_scale_key`) → its program bound as a
        function of (a, b), or of (a, b, scales) (`CallProgram.bind`)."""
        self._lock = threading.Lock()

    def topology(self, group) -> Topology:
        topo = self._topologies.get(group.group_name)
        if topo is None:
            topo = detect_topology(group)
            self._topologies[group.group_name] = topo
        return topo

    def config(self, workload: Workload, group, mode: str) -> Candidate:
        """The looked-up configuration of `workload` on `group` for calls in `mode` (kept)."""
        key = (group.group_name, workload.key(), mode)
        cand = self._configs.get(key)
        if cand is None:
            from syncopate.results_db.lookups import lookup

            result = lookup(
                workload.shape, self.topology(group), kind=workload.kind, dtype=workload.dtype, mode=mode
            )
            cand = result.candidate
            self._configs[key] = cand
            log.info("using %s for %s in %s mode (%s)", cand.short(), workload, mode, result.match)
        return cand

    def close(self, group=None) -> None:
        with self._lock:
            CONTEXTS.close(group)
            self.programs.clear()
            self.calls.clear()


_REGISTRY = ContextRegistry()


def set_mode(name: str) -> None:
    """Look configurations up for `name` mode in calls made outside a CUDA graph capture: `eager`
    (the default) or `graph`, for a process that warms its calls up before capturing them in CUDA
    graphs (torch.cuda.graph, torch.compile's reduce-overhead), so that the warm-up prepares the
    configurations the captured calls replay. Calls being captured always look up `graph`."""
    if name not in MODES:
        raise ConfigError(f"mode {name!r}: accepted are {', '.join(MODES)}")
    _REGISTRY.mode = name


def get_mode() -> str:
    """The mode set by `set_mode` (`eager` unless set)."""
    return _REGISTRY.mode


def set_launch(name: str) -> None:
    """How fused calls made outside a CUDA graph capture are launched (`syncopate.kernels.replay`):
    `graph`, each replayed from a CUDA graph of its own kept per set of tensor addresses (the host
    pays one graph launch a call, the device a meeting of the group at its start); `direct`,
    enqueued operation by operation (the host pays every stream operation, the device no meeting);
    `auto` (the default), direct through a warm-up, then timed in the job both ways in turn and
    launched the faster way from then on. Every rank must set the same, at the same point of the job: what the
    previous setting kept (each program's graphs, `auto`'s choices) is dropped, so `auto` samples
    afresh. Calls being captured by the caller are captured as they are either way."""
    if name not in LAUNCHES:
        raise ConfigError(f"launch {name!r}: accepted are {', '.join(LAUNCHES)}")
    dropped = [
        p.__dict__.pop(kept)
        for p in _REGISTRY.programs.values()
        for kept in _KEPT_LAUNCH.values()
        if kept in p.__dict__
    ]
    if dropped and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()  # no graph of theirs still runs when its memory goes back to the pool
    _REGISTRY.launch = name


def launch_choices() -> dict[str, int]:
    """How this process's fused programs are launched outside a capture so far: `replayed` (from
    graphs of their own), `direct`, and `sampling` (`auto` still deciding; also programs not yet
    called since `set_launch`)."""
    counts = {"replayed": 0, "direct": 0, "sampling": 0}
    for program in _REGISTRY.programs.values():
        if replayable(program, 0):
            counts[_launch_of(program)] += 1
    return counts


def _launch_of(program) -> str:
    """How a replayable program's calls outside a capture are launched now: `replayed`, `direct`,
    or `sampling` (`auto` still deciding, or not called since `set_launch`)."""
    if _REGISTRY.launch != "auto":
        return "replayed" if _REGISTRY.launch == "graph" else "direct"
    choice = program.__dict__.get(_KEPT_LAUNCH["auto"])
    if choice is None or not choice.decided:
        return "sampling"
    return "replayed" if choice.replayed is not None else "direct"


def launch_report() -> list[dict[str, Any]]:
    """Each replayable fused program of this process and how it is launched: under `auto`, those
    called outside a capture since `set_launch`, each with its op, operand shapes and configuration,
    `launch` (`replayed`, `direct` or `sampling`) and, once decided, what `auto` measured
    (`replay.FIGURES`: each way's medians, the group's slowest rank's); under `graph` or `direct`,
    every program with that launch and no figures."""
    report = []
    for program in _REGISTRY.programs.values():
        if not replayable(program, 0):
            continue
        choice = program.__dict__.get(_KEPT_LAUNCH["auto"])
        if _REGISTRY.launch == "auto" and choice is None:  # no eager call since set_launch (captured only)
            continue
        spec = program.spec
        row: dict[str, Any] = {
            "op": spec.op,
            "a": list(spec.a_shape),
            "b": list(spec.b_shape),
            "config": spec.candidate.short(),
            "launch": _launch_of(program),
        }
        if _REGISTRY.launch == "auto" and choice.decided:
            row.update(choice.figures)
        report.append(row)
    return report


def get_launch() -> str:
    """The launch set by `set_launch` (`auto` unless set)."""
    return _REGISTRY.launch


_KEPT_LAUNCH = {"graph": "launch_graph", "auto": "launch_auto"}
"""The attribute a program keeps each launch's state under (`_run`; a call's hot path)."""


def _run(program: CallProgram, a, b, out, capturing: bool, spin_limit: int, scales, gathered=None) -> None:
    """Enqueue one call of `program`: as `set_launch` says where it can be replayed, else
    operation by operation."""
    launch = _REGISTRY.launch
    if not capturing and launch != "direct" and replayable(program, spin_limit):
        name = _KEPT_LAUNCH[launch]
        kept = program.__dict__.get(name)
        if kept is None:
            kept = ReplayedCalls(program) if launch == "graph" else LaunchChoice(program)
            setattr(program, name, kept)
        kept(a, b, out, gathered, scales)
        return
    program(a, b, out, capturing=capturing, spin_limit=spin_limit, gathered=gathered, scales=scales)


class mode:
    """`with syncopate.mode("graph"): ...`: `set_mode` for the block, the previous mode after it."""

    def __init__(self, name: str) -> None:
        if name not in MODES:
            raise ConfigError(f"mode {name!r}: accepted are {', '.join(MODES)}")
        self.name = name
        self._saved: list[str] = []

    def __enter__(self) -> mode:
        self._saved.append(_REGISTRY.mode)
        _REGISTRY.mode = self.name
        return self

    def __exit__(self, *exc) -> None:
        _REGISTRY.mode = self._saved.pop()


def close_contexts(group=None) -> None:
    """Free the symmetric buffers of every context (of `group` only, if given). Collective. CUDA
    graphs holding calls of those contexts must not be replayed afterwards."""
    _REGISTRY.close(group)


def get_context(kind: str, group, shape: tuple[int, ...], dtype: torch.dtype) -> OverlapContext:
    """The context the fused (Triton) templates use for `kind` on `group`: `shape` is (M, K) for
    `ag_gemm` and (M, N) for the others (created on first use)."""
    m, cols = shape
    buffers = fused_buffers(kind, m, cols, dtype, dist.get_world_size(group))
    return CONTEXTS.get(group, fused_context_key(kind, m, cols, dtype), buffers)


def call_context(
    kind: str, a, b, group=None, config: Candidate | dict | None = None
) -> OverlapContext | None:
    """The context that calls of `kind` with operands like `a` and `b` and this config use, once one
    such call has been made (None before, and for template `unfused`, which needs none)."""
    key = _program_key(kind, a, b, group, config, _REGISTRY.mode)
    program = _REGISTRY.programs.get(key) if key is not None else None
    return None if program is None else program.context


def _check_tensor(name: str, t: Any) -> None:
    if not isinstance(t, torch.Tensor):
        raise ConfigError(f"{name} must be a torch.Tensor, got {describe(t)}")
    if t.dim() != 2:
        raise ConfigError(f"{name} must be 2-D, got shape {tuple(t.shape)}")
    if t.dtype not in _OPERAND_DTYPES:
        raise ConfigError(
            f"{name} has dtype {t.dtype}: accepted are bfloat16, float16, float32, float8_e4m3fn (with scales)"
        )


def _group(group) -> Any:
    """The process group a call runs on (None: the default one), checked."""
    if not dist.is_initialized():
        raise ConfigError("torch.distributed is not initialised: call init_process_group first")
    if group is None:
        return dist.group.WORLD
    if not isinstance(group, dist.ProcessGroup):
        raise ConfigError(
            f"group must be a torch.distributed ProcessGroup (or None: the default group), got "
            f"{type(group).__name__} {group!r}"
        )
    return group


def _parse_config(config: Candidate | dict | None) -> Candidate | None:
    """The candidate a call's `config` names (None: look it up), checked on its own."""
    if config is None or isinstance(config, Candidate):
        return config
    if isinstance(config, dict):
        return Candidate.from_dict(config)
    raise ConfigError(f"config must be a Candidate, a dict or None, got {describe(config)}")


def _check_inputs(a: torch.Tensor, b: torch.Tensor, group, config=None) -> tuple[Any, int, int]:
    """Shapes, dtypes, layouts, devices, group and config of a call, checked before anything is
    launched."""
    _check_tensor("a", a)
    _check_tensor("b", b)
    if a.dtype != b.dtype:
        fp8 = " (fp8 takes both in torch.float8_e4m3fn)" if FP8 in (a.dtype, b.dtype) else ""
        raise ConfigError(f"a has dtype {a.dtype} but b has {b.dtype}: they must match{fp8}")
    if not a.is_contiguous():
        raise ConfigError(
            f"a must be contiguous (row-major); got strides {a.stride()} for shape {tuple(a.shape)}"
        )
    if a.shape[1] != b.shape[0]:
        raise ConfigError(f"a is {tuple(a.shape)} and b is {tuple(b.shape)}: a's columns must equal b's rows")
    if not (b.is_contiguous() or (b.stride(0) == 1 and b.stride(1) == b.shape[0])):
        raise ConfigError(
            f"b must be row-major or the transpose of a row-major matrix; got strides {b.stride()} for {tuple(b.shape)}"
        )
    group = _group(group)
    _parse_config(config)
    _check_devices(a, b)
    return group, dist.get_rank(group), dist.get_world_size(group)


def _check_devices(a: torch.Tensor, b: torch.Tensor) -> None:
    """Both operands on this rank's CUDA device (the current one)."""
    for name, t in (("a", a), ("b", b)):
        if not t.is_cuda:
            raise ConfigError(f"{name} is on {t.device}: the fused ops need CUDA tensors")
    device = torch.device("cuda", torch.cuda.current_device())
    for name, t in (("a", a), ("b", b)):
        if t.device != device:
            raise ConfigError(
                f"{name} is on {t.device} but this rank's device is {device}: call torch.cuda.set_device"
            )


def _candidate(config: Candidate | dict | None, workload: Workload, group, mode: str = "eager") -> Candidate:
    cand = _parse_config(config)
    if cand is None:
        cand = _REGISTRY.config(workload, group, mode)
    check_candidate(cand, workload, _REGISTRY.topology(group))
    check_backend_group(cand, group)
    return cand


def check_backend_group(cand: Candidate, group) -> None:
    """The `nccl` backend's chunks go through the group's own collectives: it needs NCCL there. The
    `nvshmem` backend needs this process's symmetric memory to be NVSHMEM's (`syncopate.use_nvshmem()`)."""
    if cand.backend == "nvshmem":
        from syncopate.kernels.symmetric_memory import process_refusal

        why = process_refusal()
        if why is not None:
            raise ConfigError(why)
    backend = str(dist.get_backend(group))
    if cand.backend == "nccl" and cand.template != UNFUSED and "nccl" not in backend:
        raise ConfigError(
            f"backend 'nccl' moves chunks with the group's NCCL collectives, but group {group.group_name!r} "
            f"uses {backend!r}: choose backend copy_engine or sm_copy, or make the group with backend='nccl'"
        )


def _scales(a, b, a_scale, b_scale, out_dtype, fast_accum=False) -> Scales | None:
    """A call's `Scales`, checked (`scaled.check_scales`) where `a` and `b` are 2-D tensors
    (otherwise the operands' own check names what is wrong with them); None for unscaled operands.
    `fast_accum` (FP8 operands only): every GEMM of the call accumulates fast."""
    if fast_accum is not False and fast_accum is not True:
        raise ConfigError(f"fast_accum={fast_accum!r}: give True or False")
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dim() == b.dim() == 2):
        if a_scale is not None or b_scale is not None:
            return Scales(a_scale, b_scale, fast_accum)
        return None
    check_scales(a, b, a_scale, b_scale, out_dtype)
    if a.dtype != FP8:
        if fast_accum:
            raise ConfigError(
                f"fast_accum=True applies to float8_e4m3fn operands (the scaled GEMM's accumulation), got "
                f"{a.dtype}: leave it False"
            )
        return None
    return Scales(a_scale, b_scale, fast_accum)


def _refuse_scaled(op: str, scales: Scales | None, what: str) -> None:
    if scales is not None:
        raise ConfigError(
            f"syncopate.{op}: {what} is not supported with float8_e4m3fn operands; call it without"
        )


def all_gather_matmul(
    a_shard: torch.Tensor,
    b: torch.Tensor,
    group=None,
    config: Candidate | dict | None = None,
    *,
    return_gathered: bool = False,
    out: torch.Tensor | None = None,
    spin_limit: int = 0,
    a_scale: torch.Tensor | None = None,
    b_scale: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    fast_accum: bool = False,
):
    """out = all_gather(a_shard, dim 0) @ b, with the GEMM consuming rows of A as their chunks arrive.

    Returns the local output [M, N/ws] (and the gathered A [M, K] too with `return_gathered`).
    The GEMM reads this rank's own rows from `a_shard` itself, from the start of the call; the
    shard is copied into the gathered buffer only where a tile across the shard's edge reads it
    there (never when it already lives there: `gather_buffer`). The gathered A returned is a new
    tensor, filled on a side stream while the GEMM runs.
    `spin_limit` > 0 bounds every wait (a tuning run's guard against hangs; the context then raises
    a timeout on `check_error()`).
    FP8 operands: `a_scale` is this shard's ([M/ws, 1] row-wise), `b_scale` B's ([1, N/ws] row-wise);
    the all-gather moves the FP8 rows and their scales; the output is bf16. `fast_accum=True` runs
    its GEMMs with the scaled GEMM's fast accumulation (`torch._scaled_mm`'s `use_fast_accum`:
    faster, each sum rounded more coarsely; torchao's float8 recipes use it for a layer's output).
    The config's template decides what moves (`syncopate.kernels.templates`): `a_stationary` moves
    B and the products instead of A (with `return_gathered` the call takes the direct plan, which
    gathers A); `decomposed` pushes each shard while the own rows' cuBLAS GEMM runs, then cuBLAS
    GEMMs over the peers' rows as they land; `unfused` runs the group's all-gather, then the matmul.
    """
    checked = _checked_spin(a_shard, spin_limit)
    spin_limit = spin_limit or checked
    plain_args = a_scale is None and b_scale is None and out_dtype is None and fast_accum is False
    if out is None and not spin_limit and not torch.compiler.is_compiling():
        if plain_args:
            call = _fast_call(GATHERED if return_gathered else "ag_gemm", a_shard, b, group, config)
            if call is not None:
                return call(a_shard, b)
        elif out_dtype in _SCALED_OUT and not return_gathered:
            call = _fast_call("ag_gemm", a_shard, b, group, config, _scale_key(a_scale, b_scale, fast_accum))
            if call is not None:
                return call(a_shard, b, Scales(a_scale, b_scale, fast_accum))
    scales = _scales(a_shard, b, a_scale, b_scale, out_dtype, fast_accum)
    if torch.compiler.is_compiling():
        _refuse_scaled("all_gather_matmul", scales, "torch.compile")
        return _traced("ag_gemm", a_shard, b, group, config, out, spin_limit, return_gathered)
    if return_gathered:
        _refuse_scaled("all_gather_matmul", scales, "return_gathered")
    capturing = _capturing(a_shard, "all_gather_matmul", spin_limit)
    program = _program("ag_gemm", a_shard, b, group, config, capturing)
    if return_gathered and not program.returns_gathered:  # nothing gathers A there: the direct plan does
        direct = dataclasses.replace(program.spec.candidate, template="direct")
        program = _program("ag_gemm", a_shard, b, group, direct, capturing)
    spec = program.spec
    plain = out is None and not (capturing or spin_limit)
    if out is None:
        out = torch.empty(spec.out_shape, dtype=spec.out_dtype, device=a_shard.device)
    else:
        _check_out(out, spec.out_shape, spec.out_dtype)
    gathered = None
    if return_gathered:
        gathered = torch.empty((spec.m, spec.a_shape[1]), dtype=a_shard.dtype, device=a_shard.device)
    if checked:
        _run_checked(program, "all_gather_matmul", checked, a_shard, b, out, scales, gathered)
    else:
        _run(program, a_shard, b, out, capturing, spin_limit, scales, gathered)
    if plain:
        _keep_call(GATHERED if return_gathered else "ag_gemm", a_shard, b, group, config, program, scales)
    return out if gathered is None else (out, gathered)


def _checked_spin(a, spin_limit: int) -> int:
    """The spin limit SYNCOPATE_SPIN_LIMIT (`job_spin_limit`) sets this call, which then checks its
    waits after it (`check_waits`); 0 where the caller bounds the waits itself (`spin_limit`), the
    variable is unset, or the call is traced or captured (nothing could read its timeout there)."""
    if spin_limit or not (isinstance(a, torch.Tensor) and a.is_cuda):
        return 0
    limit = job_spin_limit()
    if not limit or torch.compiler.is_compiling() or torch.cuda.is_current_stream_capturing():
        return 0
    return limit


def _run_checked(program: CallProgram, op: str, limit: int, a, b, out, scales, gathered=None) -> None:
    """One eager call bounded by SYNCOPATE_SPIN_LIMIT=`limit`, then `check_waits`."""
    with streamops.watching() as waits:
        _run(program, a, b, out, False, limit, scales, gathered)
    check_waits(program.context, f"syncopate.{op}", limit, waits)


def check_waits(
    ctx,
    op: str,
    limit: int,
    waits: list[tuple[int, int]],
    done=None,
    setting: str | None = None,
    advice: str | None = None,
) -> None:
    """After a call bounded by SYNCOPATE_SPIN_LIMIT=`limit`, whose kernels' waits were bounded to
    `limit` polls: bound its stream waits `waits` (`streamops.watching`; on the device they cannot
    time out) to `limit` microseconds of the host's waiting for the call to finish (`done`, an
    event recorded after it by default). A wait that ran out raises CandidateTimeoutError naming
    its word, the stream waits released first, so that the device is not left holding them
    (synchronizes the device). `ctx`: the call's context (its `release_waits` and `check_error`);
    `op`: the call as the error names it; `setting`: what set the limit and `advice`: what to do,
    as the error says them (default: a job's, the variable)."""
    setting = setting or f"{SPIN_LIMIT_VAR}={limit}"
    advice = advice or _LATE_RANK
    held = _held_streams(ctx, waits, limit * 1e-6, done)
    if held:
        raise CandidateTimeoutError(
            f"{op} ({setting}): a stream of the call waited longer than {limit} µs for {held[0]}"
            + (f" (and for {len(held) - 1} more word(s), released with it)" if len(held) > 1 else "")
            + f"; the call's output is not valid. {advice}"
        )
    try:
        ctx.check_error()
    except CandidateTimeoutError as e:
        raise CandidateTimeoutError(
            f"{op} ({setting}): {e}; the call's output is not valid. {advice}"
        ) from None


_LATE_RANK = (
    "A word below the epoch is one its writer has not reached: that rank is slower than the limit "
    "allows (raise it), or is making other calls (the ranks of a group must make the same fused "
    "calls in the same order)"
)


def _held_streams(ctx, waits: list[tuple[int, int]], seconds: float, done=None) -> list[str]:
    """Wait for `done` (default: an event recorded now on the caller's stream, after the call);
    each time it has not come after another `seconds`, the stream waits of `waits` still held,
    named and released (`OverlapContext.release_waits`). The words named, in the order released;
    empty where nothing was held (also a call that is slow, not held: it is then waited for as long
    as it takes)."""
    if not waits:
        return []
    if done is None:
        done = torch.cuda.Event()
        done.record()
    deadline = time.monotonic() + seconds
    pause, held = 1e-5, []
    while not done.query():
        if time.monotonic() >= deadline:
            held += ctx.release_waits(waits)
            deadline = time.monotonic() + seconds
        time.sleep(pause)
        pause = min(2 * pause, 1e-3)
    return held


def _check_out(out: torch.Tensor, shape: tuple[int, int], dtype: torch.dtype) -> None:
    if tuple(out.shape) != shape or out.dtype != dtype or not out.is_contiguous():
        raise ConfigError(
            f"out must be a contiguous {dtype} tensor of shape {shape}, got {out.dtype} "
            f"{tuple(out.shape)}{'' if out.is_contiguous() else ' (not contiguous)'}"
        )


def _traced(kind: str, a, b, group, config, out, spin_limit: int, gathered: bool = False):
    """The call as torch.compile traces it: one node of its graph, `torch.ops.syncopate.*`
    (`syncopate.kernels.library`), run with the compiled graph (`out=` and bounded waits have no
    place there)."""
    op = OP_NAMES[kind]
    if out is not None or spin_limit:
        raise ConfigError(
            f"syncopate.{op} under torch.compile: out= and spin_limit are not supported there; "
            f"call it without them (the compiled graph allocates the output)"
        )
    name = (group or dist.group.WORLD).group_name
    traced = torch.ops.syncopate
    if gathered:
        return traced.all_gather_matmul_gathered(a, b, name, config_text(config))
    return getattr(traced, op)(a, b, name, config_text(config))


def _capturing(a, op: str, spin_limit: int) -> bool:
    """Whether this call is being captured in a CUDA graph; bounded waits are refused there: a
    replay's timeout could not be reported (nothing reads the error flag), only its wrong output."""
    if not (isinstance(a, torch.Tensor) and a.is_cuda and torch.cuda.is_current_stream_capturing()):
        return False
    if spin_limit:
        raise ConfigError(
            f"syncopate.{op}: spin_limit={spin_limit} bounds waits for a tuning run, which reports a timeout "
            f"after the call; a call captured in a CUDA graph cannot: capture it with spin_limit=0"
        )
    return True


def _device_of(a) -> torch.device | None:
    return a.device if isinstance(a, torch.Tensor) else None


def _refuse_first_capture(op: str, capturing: bool) -> None:
    """The first call of a shape makes its context (symmetric memory, a collective that synchronizes)
    and compiles its kernel: neither can happen under a capture. Refused before anything is enqueued."""
    if capturing:
        raise ConfigError(
            f"syncopate.{op}: the first call with these shapes, dtype, group and config cannot be captured in a "
            f"CUDA graph (it makes the group's symmetric buffers and compiles the kernel); make one such call "
            f"before capturing, as torch.cuda.graph's warm-up does"
        )


_cuda_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device
"""The current CUDA device's index: torch's own query without `torch.cuda.current_device`'s lazy-init
check, for a call's key (its operands are on a GPU already, so CUDA is initialized)."""

_stream_capturing = (
    getattr(torch._C, "_cuda_isCurrentStreamCapturing", None) or torch.cuda.is_current_stream_capturing
)
"""`torch.cuda.is_current_stream_capturing` without its Python frame (a plain call's fast path asks it)."""


def _call_key(kind: str, a, b, group, config, mode: str) -> tuple | None:
    """What makes two calls the same once validated: the kind, the group, the config (None: look it
    up, then also the `mode` it is looked up for), the operands' shapes, dtypes, devices and B's
    strides, and this rank's CUDA device (A is contiguous: no key otherwise). Every check of
    `_check_inputs` and of the config (`_candidate`) depends on these alone, so a call whose key a
    checked call had passes them too. None where the inputs need checking anyway. A dict config
    counts as its items (`_program_key`); here it makes the key unhashable, which `_fast_call` takes
    as a miss."""
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or not a.is_contiguous():
        return None
    world = dist.group.WORLD  # None before init_process_group (and after the default group is destroyed)
    if world is None:
        return None
    return (
        kind,
        world if group is None else group,
        config,
        mode if config is None else None,
        a.shape,
        a.dtype,
        a.device,
        b.shape,
        b.stride(),
        b.dtype,
        b.device,
        _cuda_device() if a.is_cuda else None,
    )


def _program_key(kind: str, a, b, group, config, mode: str) -> tuple | None:
    """`_call_key` of a call that looks its program up, a dict config as its sorted items; None
    where the key cannot be made (a config dict holding a list: checked, and refused, the long way)."""
    if isinstance(config, dict):
        config = tuple(sorted(config.items()))
    elif not (config is None or isinstance(config, Candidate)):
        return None
    if not (group is None or isinstance(group, dist.ProcessGroup)):
        return None
    key = _call_key(kind, a, b, group, config, mode)
    try:
        hash(key)
    except TypeError:  # a config dict with a list in it: checked (and refused) the long way
        return None
    return key


_SCALED_OUT = (None, OUT_DTYPE)
"""The `out_dtype` an FP8 call's fast path takes (the only accepted one, or none given)."""

GATHERED = "ag_gemm+gathered"
"""The kind under which `_REGISTRY.calls` keeps all-gathers that also return the gathered A."""


def _fast_call(kind: str, a, b, group, config, scaled: tuple | None = ()) -> Callable | None:
    """The fast path of a plain call (no out=, no bounded waits, not traced, not being captured,
    not recorded by autograd): the function a checked call with the same key (`_call_key`, and for
    FP8 operands `scaled`, their scales' `_scale_key`; None: no fast path) kept (`_keep_call`), or
    None. Its tensors bound, it enqueues the call (for `unfused`, torch's collective and matmul).
    The ops are not differentiable: a call whose operands autograd would record takes the long way,
    which writes into `out` as it always has."""
    key = _call_key(kind, a, b, group, config, _REGISTRY.mode)
    if (
        key is None
        or scaled is None
        or (key[-1] is not None and _stream_capturing())
        or ((a.requires_grad or b.requires_grad) and torch.is_grad_enabled())
    ):
        return None
    key += scaled
    try:
        call = _REGISTRY.calls.get(key)
    except TypeError:  # a dict config, or an unhashable group: the long way checks them
        return None
    if call is not None and config is None and _REGISTRY.mode != "graph" and _compiled_graph_warmup(a):
        return None  # an eager call's program kept; the warm-up prepares the graph-mode one (`_program`)
    return call


def _scale_key(a_scale, b_scale, fast_accum) -> tuple | None:
    """What an FP8 call's scale checks (`scaled.check_scales`, with its operands' `_call_key`)
    depend on: each scale's shape, dtype, device and contiguity, and `fast_accum`; None where the
    scales are not both tensors (the long way says what is wrong)."""
    if (
        not (isinstance(a_scale, torch.Tensor) and isinstance(b_scale, torch.Tensor))
        or type(fast_accum) is not bool
    ):
        return None
    return (
        "scaled",
        a_scale.shape,
        a_scale.dtype,
        a_scale.device,
        a_scale.is_contiguous(),
        b_scale.shape,
        b_scale.dtype,
        b_scale.device,
        b_scale.is_contiguous(),
        fast_accum,
    )


def _keep_call(kind: str, a, b, group, config, program: CallProgram, scales: Scales | None = None) -> None:
    """After a plain call has found its program the long way (its inputs checked, once per key):
    keep the program bound (`CallProgram.bind`) for the later calls' fast path, an FP8 call's under
    its scales' `_scale_key` too. Not for dict configs (their key is their items, which a later call
    would have to sort again)."""
    if not (config is None or isinstance(config, Candidate)):
        return
    if config is None and _REGISTRY.mode != "graph" and _compiled_graph_warmup(a):
        return  # its program is the graph-mode one (`_program`): not for later eager calls
    key = _call_key(kind, a, b, group, config, _REGISTRY.mode)
    if key is None:
        return
    if scales is not None:
        scaled = _scale_key(scales[0], scales[1], fast_accumulation(scales))
        if scaled is None:
            return
        key += scaled
    _REGISTRY.calls[key] = _bound(program, kind == GATHERED, scales is not None)


def _bound(program: CallProgram, gathered: bool, scaled: bool = False) -> Callable:
    """`program.bind`, where its calls may be replayed (`_run`) enqueueing them as `set_launch` says."""
    if not replayable(program, 0):
        return program.bind(gathered=gathered, scaled=scaled)

    def enqueue(a, b, out, gathered=None, scales=None):
        _run(program, a, b, out, False, 0, scales, gathered)

    return program.bind(gathered=gathered, enqueue=enqueue, scaled=scaled)


def gather_buffer(a_shard_shape: tuple[int, int], dtype: torch.dtype, group=None) -> torch.Tensor:
    """This rank's rows of the gathered buffer `all_gather_matmul` uses for shards of this shape.

    Write the next shard there (e.g. as the `out=` of the op producing it) and the op never copies
    it; otherwise it copies a shard only where a tile across the shard's edge reads it from the
    buffer (the kernel reads the rest of its own rows from the shard itself). The view stays valid
    until `close_contexts()`.
    """
    group = _group(group)
    shape = tuple(a_shard_shape) if isinstance(a_shard_shape, (tuple, list, torch.Size)) else None
    if (
        shape is None
        or len(shape) != 2
        or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape)
    ):
        raise ConfigError(
            f"a_shard_shape {a_shard_shape!r} must be (rows, columns) of the shard, two positive integers"
        )
    if dtype not in _DTYPES:
        raise ConfigError(f"dtype {dtype!r}: accepted are torch.bfloat16, torch.float16, torch.float32")
    ws, rank = dist.get_world_size(group), dist.get_rank(group)
    m_local, k = shape
    ctx = get_context("ag_gemm", group, (m_local * ws, k), dtype)
    return ctx.buffers["a_full"].local[rank * m_local : (rank + 1) * m_local]


def _compiled_graph_warmup(a) -> bool:
    """Whether this call runs in the warm-up of torch.compile's CUDA graphs (mode="reduce-overhead"):
    the cudagraph tree of A's device is warming up, and its next run of the same code is captured.
    False where torch.compile has made no such tree (its module not even imported) or where asking
    fails (the tree is torch's internal API)."""
    trees = sys.modules.get("torch._inductor.cudagraph_trees")
    if trees is None or not (isinstance(a, torch.Tensor) and a.is_cuda):
        return False
    try:
        manager = trees.get_manager(a.device.index, create_if_none_exists=False)
        return bool(manager is not None and manager.in_warmup)
    except Exception:  # noqa: BLE001 — another torch's internals: the process's mode then
        return False


def _program(kind: str, a, b, group, config, capturing: bool) -> CallProgram:
    """The call program of this call: found by the call's key, else prepared (collective: every
    rank makes its first call of a shape together), the inputs checked once. Without a config the
    key holds the mode the configuration is looked up for: `graph` while capturing or in the
    warm-up of torch.compile's CUDA graphs (whose next run captures the call), else the `set_mode`
    one. A capture whose `graph` program was never prepared (its warm-up ran in `eager` mode, e.g.
    torch.cuda.graph's side-stream iterations without `set_mode("graph")`) takes the `eager` one,
    said once: a first call cannot be captured."""
    graph = capturing or (config is None and _REGISTRY.mode != "graph" and _compiled_graph_warmup(a))
    mode = "graph" if graph else _REGISTRY.mode
    key = _program_key(kind, a, b, group, config, mode)
    program = _REGISTRY.programs.get(key) if key is not None else None
    if program is None and capturing and config is None:
        eager = _program_key(kind, a, b, group, config, "eager")
        program = _REGISTRY.programs.get(eager) if eager is not None else None
        if program is not None and key not in _REGISTRY._warned_fallback:
            _REGISTRY._warned_fallback.add(key)
            log.info(
                "syncopate.%s captured with its eager-mode configuration %s: its warm-up ran in eager mode; "
                "call syncopate.set_mode('graph') before the warm-up to capture the graph-mode one",
                OP_NAMES[kind],
                program.spec.candidate.short(),
            )
    if program is None:
        _refuse_first_capture(OP_NAMES[kind], capturing)
        program = kept_allocations(lambda: _prepare(kind, a, b, group, config, mode), _device_of(a))
        note_prepared()
        if key is not None:
            _REGISTRY.programs[key] = program
    if capturing:
        _refuse_in_graph(OP_NAMES[kind], program.spec.candidate, config is None)
    return program


def _refuse_in_graph(op: str, cand: Candidate, looked_up: bool) -> None:
    """A call whose configuration does not replay from a CUDA graph (`Candidate.replays_in_graph`),
    refused under a capture before anything is enqueued: its replay would stall, not fail. In a
    process whose NCCL registers no captured buffer (`nccl_chunks_replay`) the nccl chunk plans
    replay, and are captured."""
    if cand.replays_in_graph or nccl_chunks_replay():
        return
    how = (
        "lookup served it in eager mode: call syncopate.set_mode('graph') before the warm-up, so that "
        "lookup serves a configuration that replays"
        if looked_up
        else "capture a configuration on backend copy_engine or sm_copy, or template unfused (the "
        "group's collective, then the matmul)"
    )
    name, value = NCCL_CAPTURE_SETTING
    raise ConfigError(
        f"syncopate.{op}: configuration {cand.short()} cannot be captured in a CUDA graph (a replay of the "
        f"nccl backend's chunk sends and receives stalls while NCCL registers captured buffers); {how}, "
        f"or start the job with {name}={value} in its environment, or make this call outside the graph"
    )


def _prepare(kind: str, a, b, group, config, mode: str = "eager") -> CallProgram:
    """Validate a call once per (shapes, dtype, group, config) and prepare its program."""
    group, rank, ws = _check_inputs(a, b, group, config)
    if kind == "ag_gemm":
        m_local, k = a.shape
        shape = (m_local * ws, b.shape[1] * ws, k)
    else:
        shape = (a.shape[0], b.shape[1], a.shape[1] * ws)
    workload = Workload(kind=kind, shape=shape, dtype=canonical_dtype(a.dtype))
    workload.check_world_size(ws)
    cand = _candidate(config, workload, group, mode)
    spec = CallSpec(
        kind=kind,
        group=group,
        rank=rank,
        world_size=ws,
        a_shape=tuple(a.shape),
        b_shape=tuple(b.shape),
        dtype=a.dtype,
        device=a.device,
        candidate=cand,
    )
    return template_for(cand, kind).prepare(spec, b)


def _gemm_scatter(
    kind: str,
    a,
    b,
    group,
    config,
    out,
    spin_limit: int,
    checked: int,
    a_scale,
    b_scale,
    out_dtype,
    fast_accum,
):
    """`matmul_reduce_scatter` or `matmul_all_reduce` past the fast path (`checked`: the spin limit
    SYNCOPATE_SPIN_LIMIT set, `_checked_spin`)."""
    scales = _scales(a, b, a_scale, b_scale, out_dtype, fast_accum)
    if torch.compiler.is_compiling():
        _refuse_scaled(OP_NAMES[kind], scales, "torch.compile")
        return _traced(kind, a, b, group, config, out, spin_limit)
    capturing = _capturing(a, OP_NAMES[kind], spin_limit)
    program = _program(kind, a, b, group, config, capturing)
    plain = out is None and not (capturing or spin_limit)
    if out is None:
        out = torch.empty(program.spec.out_shape, dtype=program.spec.out_dtype, device=a.device)
    else:
        _check_out(out, program.spec.out_shape, program.spec.out_dtype)
    if checked:
        _run_checked(program, OP_NAMES[kind], checked, a, b, out, scales)
    else:
        _run(program, a, b, out, capturing, spin_limit, scales)
    if plain:
        _keep_call(kind, a, b, group, config, program, scales)
    return out


def matmul_reduce_scatter(
    a,
    b,
    group=None,
    config: Candidate | dict | None = None,
    *,
    out=None,
    spin_limit: int = 0,
    a_scale: torch.Tensor | None = None,
    b_scale: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    fast_accum: bool = False,
):
    """out = reduce_scatter(a @ b, dim 0): partial tiles leave for their owner as soon as they are done.

    a: A[M, K/ws], b: B[K/ws, N]; returns this rank's rows [M/ws, N] of the sum over ranks.
    A config with template `c_stationary` moves A's rows and B instead of partial products, and
    each rank computes its own rows (cuBLAS; its stream waits are not bounded by `spin_limit`).
    Template `decomposed`: cuBLAS GEMMs in row chunks, each chunk's partial pushed by the copy
    engine once computed, the own rows summed onto the peers' partials.
    Template `unfused`: the matmul, then the group's reduce-scatter.
    FP8 operands: `a_scale` [M, 1] row-wise (this rank's K slice), `b_scale` [1, N] row-wise; each
    rank's partial is dequantized by its own scales and the bf16 partials are reduced;
    `fast_accum` as for `all_gather_matmul`.
    """
    checked = _checked_spin(a, spin_limit)
    spin_limit = spin_limit or checked
    plain_args = a_scale is None and b_scale is None and out_dtype is None and fast_accum is False
    if out is None and not spin_limit and not torch.compiler.is_compiling():
        if plain_args:
            call = _fast_call("gemm_rs", a, b, group, config)
            if call is not None:
                return call(a, b)
        elif out_dtype in _SCALED_OUT:
            call = _fast_call("gemm_rs", a, b, group, config, _scale_key(a_scale, b_scale, fast_accum))
            if call is not None:
                return call(a, b, Scales(a_scale, b_scale, fast_accum))
    return _gemm_scatter(
        "gemm_rs", a, b, group, config, out, spin_limit, checked, a_scale, b_scale, out_dtype, fast_accum
    )


def matmul_all_reduce(
    a,
    b,
    group=None,
    config: Candidate | dict | None = None,
    *,
    out=None,
    spin_limit: int = 0,
    a_scale: torch.Tensor | None = None,
    b_scale: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    fast_accum: bool = False,
):
    """out = all_reduce(a @ b): reduce-scatter of partial tiles, then every rank takes each reduced block.

    a: A[M, K/ws], b: B[K/ws, N]; returns [M, N], the sum over ranks.
    With a config of template `c_stationary` each rank computes its own block from the peers' A rows
    and B (as `matmul_reduce_scatter` does), then every rank takes each block in `num_splits` chunks.
    Template `decomposed`: as for `matmul_reduce_scatter`, then every rank pulls each reduced chunk
    once made (the last ones by the SMs, whose waits `spin_limit` bounds; the stream waits it does not).
    Template `unfused`: the matmul, then the group's all-reduce.
    FP8 operands: as `matmul_reduce_scatter`'s.
    """
    checked = _checked_spin(a, spin_limit)
    spin_limit = spin_limit or checked
    plain_args = a_scale is None and b_scale is None and out_dtype is None and fast_accum is False
    if out is None and not spin_limit and not torch.compiler.is_compiling():
        if plain_args:
            call = _fast_call("gemm_ar", a, b, group, config)
            if call is not None:
                return call(a, b)
        elif out_dtype in _SCALED_OUT:
            call = _fast_call("gemm_ar", a, b, group, config, _scale_key(a_scale, b_scale, fast_accum))
            if call is not None:
                return call(a, b, Scales(a_scale, b_scale, fast_accum))
    return _gemm_scatter(
        "gemm_ar", a, b, group, config, out, spin_limit, checked, a_scale, b_scale, out_dtype, fast_accum
    )
