"""Thin launchers of the Triton kernels: pick the TMA or pointer path, size the persistent grid,
pass the tables. Callers have validated shapes and candidates already."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import os

import torch
import triton
import triton.compiler.errors
import triton.language as tl

from syncopate import search_space
from syncopate.environment import GLUON_VAR
from syncopate.errors import RuntimeUnavailableError
from syncopate.kernels import gluon_kernels
from syncopate.kernels.context import kept_allocations
from syncopate.kernels.tables import ENTERED_BASE, MEET_BASE, READY_BASE
from syncopate.kernels.triton_kernels import (
    chunk_copy_kernel,
    consumer_kernel,
    graph_entry_kernel,
    producer_kernel,
    pull_kernel,
)
from syncopate.search_space import Candidate
from syncopate.search_space.candidate import gluon_refusal_of

__all__ = [
    "interpreting",
    "use_tma",
    "own_shard_readable",
    "launch_consumer",
    "launch_producer",
    "launch_chunk_copy",
    "copy_job_tables",
    "stage_chunk_copy",
    "launch_graph_entry",
    "warm_graph_entry",
    "pull_aligned",
    "pull_fits",
    "launch_pull",
    "stage_pull",
    "gluon_producer",
    "gluon_consumer",
    "TL_DTYPES",
]

TL_DTYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}

COPY_BLOCK = 4096
COPY_COUNTER_BASE = 2048


_ENVIRON = (
    os.environ._data if os.name == "posix" and isinstance(getattr(os.environ, "_data", None), dict) else None
)
"""os.environ's own table (encoded names to encoded values), where it has one: the launchers read
their settings (the interpreter flag, the Gluon kernels) several times on every call, and a
look-up there skips `os.environ.get`'s encoding and mapping layers, a small part of a call's host
time that every call pays (`benchmarks/op_host.py` measures a call's host time)."""


@functools.cache
def _encoded(name: str) -> bytes:
    return os.fsencode(name)


def getenv(name: str, default: str | None = None) -> str | None:
    """`os.environ.get(name, default)`, read through os.environ's table where it has one."""
    if _ENVIRON is None:
        return os.environ.get(name, default)
    value = _ENVIRON.get(_encoded(name))
    return default if value is None else os.fsdecode(value)


def interpreting() -> bool:
    return getenv("TRITON_INTERPRET", "0") == "1"


def compiled_for_gpu(t: torch.Tensor) -> bool:
    """True when the kernels are compiled for a GPU (not interpreted): the acquire waits use PTX."""
    return t.is_cuda and not interpreting()


def _tma_aligned(t: torch.Tensor) -> bool:
    if t.stride(-1) != 1 or t.data_ptr() % 16:
        return False
    return all((s * t.element_size()) % 16 == 0 for s in t.stride()[:-1])


@functools.cache
def _major(device_index: int) -> int:
    """The compute capability's major version of a GPU (asked of the driver once: it is on every call's path)."""
    return torch.cuda.get_device_capability(device_index)[0]


def use_tma(*tensors: torch.Tensor) -> bool:
    """TMA descriptors on Hopper and newer, unless interpreting, for aligned tensors (the pointer
    path elsewhere)."""
    if interpreting():
        return False
    if not tensors[0].is_cuda or _major(tensors[0].device.index) < 9:
        return False
    return all(_tma_aligned(t) for t in tensors)


def b_is_kmajor(b: torch.Tensor) -> bool:
    """True when B[K, N] is a transposed view of a row-major [N, K] matrix (an nn.Linear weight)."""
    return b.stride(0) == 1 and b.stride(1) == b.shape[0] and b.shape[0] > 1


def _descriptor(t: torch.Tensor, block: list[int]):
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor.from_tensor(t, block)


def _grid(entries: int, programs: int) -> tuple[int]:
    return (max(1, min(programs, entries)),)


def _spin(spin_limit: int) -> int:
    """Poll bound as the kernels take it, an int32: -1 (all ones as an unsigned count) for no bound,
    a bound past int32's range held at its largest (the kernels take the bound's sign bit as "none")."""
    return min(spin_limit, 2**31 - 1) if spin_limit > 0 else -1


RELAUNCH_TRITON = ("3.6.",)
"""Triton releases whose compiled-kernel launcher `_Relaunch` calls directly (the one it was checked
on: the fused ops' results and host times on the GPU). Elsewhere every launch takes Triton's
dispatch."""


def _settings() -> tuple[str | None, str | None]:
    """The environment settings the launchers' choices read (the interpreter flag, the Gluon
    kernels): part of every relaunch key."""
    return getenv("TRITON_INTERPRET"), getenv(GLUON_VAR)


def _relaunch_on(t: torch.Tensor) -> bool:
    return t.is_cuda and triton.__version__.startswith(RELAUNCH_TRITON) and not interpreting()


def _shape_key(t: torch.Tensor | None) -> tuple | None:
    """What a kernel compiled for `t` depends on, its address aside: shape, strides, dtype, device and
    whether the address is 16-byte aligned (which Triton specializes on)."""
    if t is None:
        return None
    return (tuple(t.shape), t.stride(), t.dtype, t.device.index, t.data_ptr() % 16 == 0)


class _Relaunch:
    """A compiled fused kernel and its arguments, launched again with only what changes from call to
    call replaced (the epoch, the caller's tensors, the descriptors over them), without Triton's
    dispatch (binding and specializing some forty arguments, finding the compiled kernel) or the
    launcher's own choices (TMA or pointers, epilogue), which the cache key fixes.

    The first launch under a key takes Triton's dispatch; the key holds every input of those
    choices and of Triton's specialization but the addresses of the replaced tensors, and those
    addresses' alignment. A relaunch costs the host about half of what a launch through Triton's
    dispatch does (`benchmarks/gpu_single.py host` times a launch, `benchmarks/op_host.py` a whole
    call).

    A call passes the replaced descriptors' tensors (None where the launch holds no descriptor
    there). Where it can (`_direct_launch`), a relaunch calls the compiled launcher itself with its
    arguments already laid out, and keeps each descriptor it encodes per address: a weight's, and
    the few addresses the caching allocator hands out again for outputs, are encoded once."""

    LIMIT = 32
    """Most relaunches one cache (a context's) keeps; the oldest goes first."""

    ENCODED = 8
    """Encoded descriptors kept per replaced descriptor (per address); all dropped when full."""

    def __init__(
        self, jit_fn, compiled, grid: tuple[int], args: tuple, kwargs: dict, varying, describe=None
    ) -> None:
        binder = jit_fn.device_caches[torch.cuda.current_device()][4]
        bound = binder(*args, **kwargs)[0]
        names = list(bound)
        self.values = list(bound.values())
        self.slots = {name: names.index(name) for name in varying}
        self.tma = {
            name: self.values[i] is not None for name, i in self.slots.items() if name.endswith("_desc")
        }
        self.boxes = {
            name: self.values[i].block_shape
            for name, i in self.slots.items()
            if name.endswith("_desc") and self.values[i] is not None
        }
        self.passed = [name for name in self.slots if self.tma.get(name, True)]
        """The replaced arguments a call passes: descriptors only where this launch holds one."""
        self.describe = describe or _descriptor
        if not 1 <= len(grid) <= 3:
            raise ValueError(f"grid {grid}: a launch takes one to three dimensions")
        self.compiled, self.grid = compiled, tuple(grid) + (1,) * (3 - len(grid))
        from triton.runtime import driver

        self.device = torch.cuda.current_device()
        self.stream = (
            driver.active.get_current_stream
        )  # the caller's current stream, as Triton's dispatch finds it
        self.direct = _direct_launch(compiled, self.values, self.slots)
        self.direct_launches = 0
        """Launches made through `direct` (the others went through the compiled kernel's run)."""
        for i in self.slots.values():  # hold no caller's tensor beyond its call
            self.values[i] = None

    def __call__(self, **given) -> None:
        """Launch again with the replaced arguments taken from `given` (tensors for descriptors;
        names this launch does not replace are ignored)."""
        hooks = triton.knobs.runtime
        direct = self.direct
        if direct is not None and _unhooked(hooks.launch_enter_hook) and _unhooked(hooks.launch_exit_hook):
            self.direct_launches += 1
            args = direct.args.copy()
            for name in self.passed:
                at, width, meta = direct.places[name]
                if width:
                    args[at : at + width] = self._encoded(name, given[name], meta)
                else:
                    args[at] = given[name]
            direct.launch(
                *self.grid,
                self.stream(self.device),
                direct.function,
                direct.cooperative,
                direct.pdl,
                None,
                None,
                direct.metadata,
                None,
                None,
                None,
                *args,
            )
            return
        values = self.values.copy()
        for name in self.passed:
            value = given[name]
            values[self.slots[name]] = self.describe(value, self.boxes[name]) if name in self.boxes else value
        k = self.compiled
        stream = self.stream(self.device)
        k.run(
            *self.grid,
            stream,
            k.function,
            k.packed_metadata,
            k.launch_metadata(self.grid, stream, *values),
            hooks.launch_enter_hook,
            hooks.launch_exit_hook,
            *values,
        )

    def _encoded(self, name: str, t: torch.Tensor, meta) -> list:
        """The launcher's arguments for a descriptor of `name`'s box over `t` (the key fixes `t`'s
        shape, strides and dtype), encoded once per address. A descriptor the kernel does not take
        as a TMA one (no metadata) is passed as its tensor and sizes: made each call, so that no
        caller's tensor is held."""
        if meta is None:
            return self.direct.encode(self.describe(t, self.boxes[name]), None)
        kept = self.direct.encoded[name]
        ptr = t.data_ptr()
        args = kept.get(ptr)
        if args is None:
            if len(kept) >= self.ENCODED:
                kept.clear()
            args = kept[ptr] = self.direct.encode(self.describe(t, self.boxes[name]), meta)
        return args


def _unhooked(hook) -> bool:
    """Whether a Triton launch hook slot holds nothing to call: None, or a chain of no hooks (a
    profiler's hooks take the compiled kernel's run, which builds their launch metadata)."""
    return hook is None or (hasattr(hook, "calls") and not hook.calls)


@dataclasses.dataclass
class _Direct:
    """What calling a compiled kernel's launcher directly takes (`_direct_launch`)."""

    launch: object
    function: int
    metadata: object
    cooperative: bool
    pdl: bool
    encode: object
    args: list
    """The launcher's arguments after its fixed leading ones; replaced ones hold None or placeholders."""
    places: dict
    """Replaced argument → (first position in `args`, positions it takes where it is a descriptor
    (else 0), the compiled descriptor's metadata)."""
    encoded: dict


def _direct_launch(compiled, values: list, slots: dict[str, int]) -> _Direct | None:
    """How to call `compiled`'s launcher itself with `values` (its arguments in signature order),
    where this Triton's launcher is the one it was written against (`RELAUNCH_TRITON`): the C
    launcher, behind a wrapper that encodes each host descriptor on every launch
    (`wrap_handle_tensordesc`). None elsewhere, or where the kernel takes scratch memory: the
    relaunch then goes through the compiled kernel's `run`."""
    try:
        from triton.backends.nvidia.driver import make_tensordesc_arg
    except ImportError:
        return None
    run = compiled.run
    if getattr(run, "global_scratch_size", 1) or getattr(run, "profile_scratch_size", 1):
        return None
    signature = list(getattr(compiled.src, "signature", {}).values())
    if len(signature) != len(values):
        return None
    desc = [i for i, ty in enumerate(signature) if isinstance(ty, str) and ty.startswith("tensordesc")]
    launch = run.launch
    if desc:
        launch = inspect.getclosurevars(run.launch).nonlocals.get("launcher")
        if launch is None or not callable(launch):
            return None
    metas = list(getattr(compiled.metadata, "tensordesc_meta", None) or [None] * len(desc))
    if len(metas) != len(desc):
        return None
    by_slot = {i: name for name, i in slots.items()}
    args, places = [], {}
    for i, value in enumerate(values):
        name = by_slot.get(i)
        if i in desc:
            meta = metas[desc.index(i)]
            encoded = make_tensordesc_arg(value, meta)
            if name is not None:
                places[name] = (len(args), len(encoded), meta)
            args.extend(encoded)
        else:
            if name is not None:
                places[name] = (len(args), 0, None)
            args.append(value)
    for _name, (at, width, _) in places.items():
        args[at : at + max(width, 1)] = [None] * max(width, 1)
    return _Direct(
        launch=launch,
        function=compiled.function,
        metadata=compiled.packed_metadata,
        cooperative=run.launch_cooperative_grid,
        pdl=run.launch_pdl,
        encode=make_tensordesc_arg,
        args=args,
        places=places,
        encoded={name: {} for name, (_, width, _) in places.items() if width},
    )


def _scale_args(scales, placeholder: torch.Tensor) -> tuple:
    """The kernels' (sa_ptr, sb_ptr, stride_sa, stride_sb) of FP8 `scales` (A's by output row, B's
    by column; each row-wise or one element, read with stride 0), or placeholders without them."""
    if scales is None:
        return placeholder, placeholder, 0, 0
    sa, sb = scales
    return sa, sb, int(sa.numel() > 1), int(sb.numel() > 1)


def _scales_memo(scales) -> tuple:
    """What a memoized launch depends on of `scales`: which are row-wise, their alignment."""
    if scales is None:
        return ()
    return tuple((s.numel() > 1, s.data_ptr() % 16) for s in scales)


def _tables_key(tables) -> tuple:
    """The device tables' addresses (unique while a cached relaunch holds them) and their scalars."""
    return tuple(v.data_ptr() if isinstance(v, torch.Tensor) else v for v in vars(tables).values())


def _remember(
    cache: dict | None, key: tuple | None, jit_fn, compiled, grid, args, kwargs, varying
) -> _Relaunch | None:
    """Keep the launch just made (`compiled`, from `jit_fn[grid](*args, **kwargs)`) in `cache` under
    `key`, to be relaunched with the arguments named in `varying` replaced; returns it."""
    if cache is None or key is None or compiled is None or not hasattr(compiled, "run"):
        return None
    again = _Relaunch(jit_fn, compiled, grid, args, kwargs, varying)
    _keep(cache, key, again, _Relaunch.LIMIT)
    return again


def run_kept(
    cache: dict,
    kernel,
    name: str,
    grid: tuple[int, ...],
    names: tuple[str, ...],
    args: tuple,
    kwargs: dict,
    per_call: tuple[str, ...],
) -> None:
    """`kernel[grid](*args, **kwargs)` (`names`: the names of `args`, the first a CUDA tensor), or the
    compiled kernel of an earlier launch that fixed the same choices, launched again from `cache`
    with its tensors and the integers named in `per_call` replaced (`_Relaunch`). `kernel` is a
    JITFunction or a wrapper over one (`jit_func`, as torch's NVSHMEM kernels are).

    The key holds every other argument's value, and of the replaced ones what Triton specializes
    on: a tensor's dtype and 16-byte alignment, an integer's being 1, a multiple of 16, or beyond
    32 bits."""
    first = args[0]
    if not _relaunch_on(first):
        kernel[grid](*args, **kwargs)
        return
    varying, key = [], [name, grid, first.device.index, _settings(), tuple(sorted(kwargs.items()))]
    for arg_name, value in zip(names, args, strict=True):
        if isinstance(value, torch.Tensor):
            varying.append(arg_name)
            key.append((value.dtype, value.data_ptr() % 16 == 0))
        elif arg_name in per_call:
            varying.append(arg_name)
            key.append((value == 1, value % 16 == 0, -(2**31) <= value < 2**31))
        else:
            key.append(value)
    key = tuple(key)
    again = cache.get(key)
    if again is not None:
        again(**dict(zip(names, args, strict=True)))
        return
    compiled = kernel[grid](*args, **kwargs)
    _remember(cache, key, getattr(kernel, "jit_func", kernel), compiled, grid, args, kwargs, tuple(varying))


def _keep(cache: dict, key: tuple, value, limit: int) -> None:
    """`cache[key] = value`, dropping the oldest entries whose keys start like `key` (same first
    item) beyond `limit` of them."""
    kin = [k for k in cache if isinstance(k, tuple) and k[:1] == key[:1]]
    for k in kin[: max(0, len(kin) - limit + 1)]:
        del cache[k]
    cache[key] = value


def own_shard_readable(a_full: torch.Tensor, b: torch.Tensor, out: torch.Tensor, a_own: torch.Tensor) -> bool:
    """Whether the consumer can read this rank's rows of A from the caller's shard `a_own`: always on
    the pointer path; on the TMA path only where a descriptor fits the shard too (16-byte aligned),
    so that an unaligned shard does not take the TMA path from the rest of the call."""
    b_mat = b.t() if b_is_kmajor(b) else b
    return a_own.dim() == 2 and (not use_tma(a_full, b_mat, out) or use_tma(a_own))


def _tail_buffers(cache: dict | None, device: torch.device, slots: int, c: Candidate) -> tuple | None:
    """Float32 part buffers and their words for `slots` tail parts of c's tiles (a slot and a word
    for each part of each tile of the last wave; the last part of a tile uses no word): kept in a context's
    `cache` (each call's last parts clear the words), else made for this call; None under a CUDA
    graph capture that finds none kept (what it made would be the graph's to reuse)."""
    key = ("tail", device, slots, c.block_m, c.block_n)
    if cache is not None and key in cache:
        return cache[key]
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return None
    made = _kept_empty(
        ((slots * c.block_m * c.block_n,), torch.float32), ((slots,), torch.int32), device=device
    )
    made[1].zero_()  # in stream order, before the kernel that uses the words
    if cache is not None:
        cache[key] = made
    return made


def _kept_empty(
    *specs: tuple[tuple[int, ...], torch.dtype], device: torch.device
) -> tuple[torch.Tensor, ...]:
    """Empty tensors of these (shape, dtype) that a call keeps for the calls after it, allocated
    outside torch.compile's CUDA graph pool (`kept_allocations`: what a compiled model's first call
    keeps must not come from the pool its graphs own). Nothing is enqueued (no synchronization)."""
    return kept_allocations(
        lambda: tuple(torch.empty(s, dtype=d, device=device) for s, d in specs), device, False
    )


_NO_PARTS: dict[torch.device, torch.Tensor] = {}
"""A one-element float32 tensor a device, passed as the part buffer where no tile is cut (never read)."""


def launch_consumer(
    a_full: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor,
    tables,
    c: Candidate,
    epoch: int,
    signals: torch.Tensor,
    error: torch.Tensor,
    num_programs: int,
    spin_limit: int = 0,
    cache: dict | None = None,
    a_own: torch.Tensor | None = None,
    own_row0: int = 0,
    memo: dict | None = None,
    scales: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> None:
    """out[M, N] = A[M, K] @ B[K, N] with A from the gathered buffer, tiles in `tables.order`.

    `scales` (float8 A and B): A's scales by row of the gathered A ([M, 1]) and B's ([1, N], or one
    element each); the output is scaled as `torch._scaled_mm` scales it.

    With `a_own` (this rank's shard, rows [own_row0, own_row0 + len) of A), the leading
    `tables.own_tiles` positions read it instead of the gathered buffer, with no wait.
    With `cache` (a context's), a launch like an earlier one relaunches its compiled kernel (`_Relaunch`).
    With `memo` (a call program's: every call has the shapes, strides, tables and buffers of the
    first), the relaunch is found by what still varies: the wait bound, whether the own rows are
    read from the shard, and the caller's tensors' 16-byte alignment."""
    own_tiles = tables.own_tiles if a_own is not None else 0
    if a_own is None:
        a_own = a_full
    memo_key = None
    kept = None
    if memo is not None:
        memo_key = (
            spin_limit,
            own_tiles,
            b.data_ptr() % 16,
            out.data_ptr() % 16,
            a_own.data_ptr() % 16,
            _scales_memo(scales),
        )
        kept = memo.get(memo_key)
    key = None
    if kept is None and cache is not None and _relaunch_on(out):
        key = (
            "relaunch",
            "consumer",
            _tables_key(tables),
            c,
            num_programs,
            spin_limit,
            a_full.data_ptr(),
            signals.data_ptr(),
            error.data_ptr(),
            _shape_key(a_full),
            _shape_key(b),
            _shape_key(out),
            _shape_key(a_own),
            own_row0,
            own_tiles,
            *(_shape_key(s) for s in scales or ()),
            _settings(),
        )
        again = cache.get(key)
        if again is not None:
            kept = (again, b_is_kmajor(b))
            if memo_key is not None:
                memo[memo_key] = kept
    sa, sb, stride_sa, stride_sb = _scale_args(scales, error)
    if kept is not None:
        again, kmajor = kept
        again(
            b_ptr=b,
            c_ptr=out,
            own_ptr=a_own,
            sa_ptr=sa,
            sb_ptr=sb,
            epoch=epoch,
            b_desc=b.t() if kmajor else b,
            c_desc=out,
            own_desc=a_own,
        )
        return
    M, K = a_full.shape
    N = out.shape[1]
    kmajor = b_is_kmajor(b)
    b_mat = b.t() if kmajor else b
    grid = _grid(tables.order.numel(), num_programs)
    if scales is None and gluon_consumer(c, K, a_full, b_mat, out, a_own):
        again = _launch_gluon_consumer(
            a_full,
            b_mat,
            kmajor,
            out,
            a_own,
            own_row0,
            own_tiles,
            tables,
            c,
            epoch,
            signals,
            error,
            grid,
            spin_limit,
            cache,
            key,
        )
        if again is not None and memo_key is not None:
            memo[memo_key] = (again, kmajor)
        return
    tma = use_tma(a_full, b_mat, out, a_own)
    tiles = tables.order.numel()
    split = search_space.tail_split(tiles, grid[0], triton.cdiv(K, c.block_k), own_tiles)
    buffers = _tail_buffers(cache, out.device, tiles % grid[0] * split, c) if split else None
    if buffers is None:
        split = 0
        if out.device not in _NO_PARTS:
            (_NO_PARTS[out.device],) = _kept_empty(((1,), torch.float32), device=out.device)
        buffers = (_NO_PARTS[out.device], signals)
    tail_start = tiles - tiles % grid[0] if split else tiles
    parts, flags = buffers
    args = (
        a_full,
        b,
        out,
        _descriptor(a_full, [c.block_m, c.block_k]) if tma else None,
        (_descriptor(b_mat, [c.block_n, c.block_k] if kmajor else [c.block_k, c.block_n])) if tma else None,
        _descriptor(out, [c.block_m, c.block_n]) if tma else None,
        M,
        N,
        K,
        a_full.stride(0),
        a_full.stride(1),
        b.stride(0),
        b.stride(1),
        out.stride(0),
        out.stride(1),
        tables.order,
        tables.mtile_lo,
        tables.mtile_hi,
        tables.chunk_slot,
        signals,
        epoch,
        error,
        _spin(spin_limit),
        grid[0],
        a_own,
        _descriptor(a_own, [c.block_m, c.block_k]) if tma else None,
        a_own.shape[0],
        own_row0,
        a_own.stride(0),
        a_own.stride(1),
        own_tiles,
        tail_start,
        split,
        parts,
        flags,
        sa,
        sb,
        stride_sa,
        stride_sb,
    )
    kwargs = dict(
        BLOCK_M=c.block_m,
        BLOCK_N=c.block_n,
        BLOCK_K=c.block_k,
        USE_TMA=tma,
        B_KMAJOR=kmajor,
        ASM_WAIT=compiled_for_gpu(out),
        OUT_DTYPE=TL_DTYPES[out.dtype],
        SCALED=scales is not None,
        num_warps=c.num_warps,
        num_stages=c.num_stages,
    )
    compiled = consumer_kernel[grid](*args, **kwargs)
    varying = ["b_ptr", "c_ptr", "own_ptr", "epoch", "b_desc", "c_desc", "own_desc"]
    if scales is not None:
        varying += ["sa_ptr", "sb_ptr"]
    again = _remember(cache, key, consumer_kernel, compiled, grid, args, kwargs, varying)
    if again is not None and memo_key is not None:
        memo[memo_key] = (again, kmajor)


def launch_producer(
    a: torch.Tensor,
    b: torch.Tensor,
    send: torch.Tensor,
    out: torch.Tensor,
    reduced: torch.Tensor | None,
    recv: torch.Tensor,
    out_row0: int,
    tables,
    c: Candidate,
    epoch: int,
    signals: torch.Tensor,
    counters: torch.Tensor,
    peer_signal_ptrs: torch.Tensor,
    world: int,
    rank: int,
    error: torch.Tensor,
    num_programs: int,
    spin_limit: int = 0,
    cache: dict | None = None,
    memo: dict | None = None,
    scales: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> None:
    """Partial products of A[M, K] @ B[K, N] in send order; received partials added in the epilogue.

    `scales` (float8 A and B): A's ([M, 1]) and B's ([1, N]), each row-wise or one element; every
    tile's sum is scaled as `torch._scaled_mm` scales it before its partials are added.

    With `cache` (a context's), a launch like an earlier one relaunches its compiled kernel (`_Relaunch`).
    With `memo` (a call program's), the relaunch is found by what still varies between its calls
    (as `launch_consumer`'s)."""
    memo_key = None
    kept = None
    if memo is not None:
        memo_key = (
            spin_limit,
            a.data_ptr() % 16,
            b.data_ptr() % 16,
            out.data_ptr() % 16,
            _scales_memo(scales),
        )
        kept = memo.get(memo_key)
    key = None
    if kept is None and cache is not None and _relaunch_on(a):
        key = (
            "relaunch",
            "producer",
            _tables_key(tables),
            c,
            world,
            rank,
            out_row0,
            num_programs,
            spin_limit,
            send.data_ptr(),
            recv.data_ptr(),
            None if reduced is None else reduced.data_ptr(),
            signals.data_ptr(),
            counters.data_ptr(),
            peer_signal_ptrs.data_ptr(),
            error.data_ptr(),
            _shape_key(a),
            _shape_key(b),
            _shape_key(send),
            _shape_key(out),
            _shape_key(reduced),
            _shape_key(recv),
            *(_shape_key(s) for s in scales or ()),
            _settings(),
        )
        again = cache.get(key)
        if again is not None:
            kept = (again, b_is_kmajor(b))
            if memo_key is not None:
                memo[memo_key] = kept
    sa, sb, stride_sa, stride_sb = _scale_args(scales, error)
    if kept is not None:
        again, kmajor = kept
        reduced_or_out = reduced if reduced is not None else out
        again(
            a_ptr=a,
            b_ptr=b,
            sa_ptr=sa,
            sb_ptr=sb,
            out_ptr=out,
            reduced_ptr=reduced_or_out,
            epoch=epoch,
            a_desc=a,
            b_desc=b.t() if kmajor else b,
            out_desc=out,
            reduced_desc=reduced_or_out,
        )
        return
    M, K = a.shape
    N = b.shape[1]
    kmajor = b_is_kmajor(b)
    b_mat = b.t() if kmajor else b
    entries = tables.order.numel()
    grid = _grid(entries, num_programs)
    recv_rows = recv.view(-1, N) if recv.is_contiguous() and recv.numel() % N == 0 else recv
    if (scales is None or kmajor) and gluon_producer(
        c, tables, K, a, b_mat, send, out, reduced if reduced is not None else out, recv_rows
    ):
        again = _launch_gluon_producer(
            a,
            b_mat,
            kmajor,
            send,
            out,
            reduced,
            recv_rows,
            out_row0,
            tables,
            c,
            epoch,
            signals,
            counters,
            peer_signal_ptrs,
            world,
            rank,
            error,
            grid,
            spin_limit,
            cache,
            key,
            (sa, sb, stride_sa, stride_sb) if scales is not None else None,
        )
        if again is not None and memo_key is not None:
            memo[memo_key] = (again, kmajor)
        return
    tma = use_tma(a, b_mat)
    reduced_or_out = reduced if reduced is not None else out
    split = epilogue_split(c)
    tma_epi = tma_epilogue(c, tables, split, send, out, reduced_or_out, recv_rows)
    box = [c.block_m, c.block_n // split]
    args = (
        a,
        b,
        _descriptor(a, [c.block_m, c.block_k]) if tma else None,
        (_descriptor(b_mat, [c.block_n, c.block_k] if kmajor else [c.block_k, c.block_n])) if tma else None,
        send,
        out,
        reduced_or_out,
        recv,
        *((_descriptor(t, box) for t in (send, out, reduced_or_out, recv_rows)) if tma_epi else (None,) * 4),
        M,
        N,
        K,
        out_row0,
        a.stride(0),
        a.stride(1),
        b.stride(0),
        b.stride(1),
        tables.order,
        tables.entry_chunk,
        entries,
        tables.chunk_row,
        tables.inc_start,
        tables.inc_slot,
        tables.inc_offset,
        tables.chunk_ready,
        tables.chunk_tiles,
        counters,
        signals[READY_BASE:],
        tables.keep,
        peer_signal_ptrs,
        tables.gather_slot,
        signals[ENTERED_BASE:],
        rank,
        signals,
        epoch,
        error,
        _spin(spin_limit),
        grid[0],
        sa,
        sb,
        stride_sa,
        stride_sb,
    )
    kwargs = dict(
        WORLD=world,
        INC_MAX=max(1, tables.inc_max),
        BLOCK_M=c.block_m,
        BLOCK_N=c.block_n,
        BLOCK_K=c.block_k,
        USE_TMA=tma,
        B_KMAJOR=kmajor,
        ALL_REDUCE=reduced is not None,
        ASM_WAIT=compiled_for_gpu(a),
        EPI_SPLIT=split,
        TMA_EPI=tma_epi,
        OUT_DTYPE=TL_DTYPES[send.dtype],
        SCALED=scales is not None,
        num_warps=c.num_warps,
        num_stages=c.num_stages,
    )
    compiled = producer_kernel[grid](*args, **kwargs)
    varying = ["a_ptr", "b_ptr", "out_ptr", "epoch", "a_desc", "b_desc", "out_desc"]
    if scales is not None:
        varying += ["sa_ptr", "sb_ptr"]
    if reduced is None:
        varying += ["reduced_ptr", "reduced_desc"]
    again = _remember(cache, key, producer_kernel, compiled, grid, args, kwargs, varying)
    if again is not None and memo_key is not None:
        memo[memo_key] = (again, kmajor)


def tma_epilogue(c: Candidate, tables, split: int, *buffers: torch.Tensor) -> bool:
    """Whether the producer's epilogue reads partials and writes rows through TMA (`TMA_EPI` of
    `producer_kernel`): where the TMA path is on for `buffers` (2-D, row-major, 16-byte aligned
    rows), no tile holds rows of two chunks, and a box of `split`'s columns is 16 bytes or more
    (the masked pointer epilogue elsewhere)."""
    if not tables.whole_tiles:
        return False
    if (c.block_n // split) * buffers[0].element_size() < 16:
        return False
    return all(t.dim() == 2 for t in buffers) and use_tma(*buffers)


GLUON_SMEM = 227 * 1024
"""Shared memory a Hopper program may take (the Gluon producer's buffers are sized from its tiles)."""

GLUON_PARTIAL_LEAD = 4
"""K steps before a tile's end at which the Gluon producer polls for the tile's partial and loads it."""


def gluon_asked(c: Candidate) -> bool:
    """Whether a launch of candidate `c` asks for the Gluon kernels: its `kernel` is `gluon`, or
    SYNCOPATE_GLUON=1 (a user setting recorded in the environment fingerprint,
    `syncopate.environment`) asks for them wherever they fit."""
    return c.kernel == "gluon" or getenv(GLUON_VAR, "0") == "1"


def gluon_runs_here(a: torch.Tensor) -> bool:
    """Whether this process can run the Gluon kernels on `a`'s device: compiled for a GPU (not the
    interpreter), by a Triton with Gluon's Hopper API."""
    return gluon_kernels.AVAILABLE and compiled_for_gpu(a)


_GLUON_DTYPES = (torch.bfloat16, torch.float16, torch.float8_e4m3fn)
"""Operand dtypes the Gluon kernels take (float8 in the producer only: the consumer's launch takes
no scales)."""


def _gluon_fits(c: Candidate, K: int, a: torch.Tensor) -> bool:
    """What both Gluon kernels need: asked for (`gluon_asked`), a process that runs them
    (`gluon_runs_here`), 16-bit or FP8 operands, a tile the kernels' wgmma layout takes (block_m of 64–256
    rows, at least 16 a warp), num_stages operand buffers plus the staging tile in shared memory,
    and K of at least num_stages - 1 steps. Elsewhere a candidate of kernel `gluon` runs the Triton
    kernels, which compute the same tiles (the search space offers `gluon` only where it fits)."""
    if not gluon_asked(c) or not gluon_runs_here(a) or a.dtype not in _GLUON_DTYPES:
        return False
    elem = a.element_size()
    if gluon_refusal_of(c.block_m, c.block_k, c.num_warps, c.num_stages, K, elem):
        return False
    staged = 2  # the output tile's elements: bf16 or fp16 (FP8 operands: bf16)
    return (
        c.num_stages * (c.block_m + c.block_n) * c.block_k * elem + c.block_m * c.block_n * staged
        <= GLUON_SMEM
    )


def gluon_producer(
    c: Candidate, tables, K: int, a: torch.Tensor, b_mat: torch.Tensor, *buffers: torch.Tensor
) -> bool:
    """Whether a producer launch takes `gluon_kernels.gluon_producer_kernel` instead of
    `producer_kernel`: `_gluon_fits`, and the TMA-epilogue path (`tma_epilogue` for `buffers`,
    whole tiles)."""
    return _gluon_fits(c, K, a) and use_tma(a, b_mat) and tma_epilogue(c, tables, 1, *buffers)


def gluon_consumer(
    c: Candidate, K: int, a_full: torch.Tensor, b_mat: torch.Tensor, out: torch.Tensor, a_own: torch.Tensor
) -> bool:
    """Whether a consumer launch takes `gluon_kernels.gluon_consumer_kernel` instead of
    `consumer_kernel`: `_gluon_fits`, and the TMA path for every operand (tiles over the shape's
    edges are the descriptors' business: loads past them read zeros, stores past them are dropped)."""
    return _gluon_fits(c, K, a_full) and use_tma(a_full, b_mat, out, a_own)


@functools.lru_cache(maxsize=64)
def _gl_layout(block: tuple[int, ...], dtype: torch.dtype):
    from triton.experimental.gluon import language as gl

    element = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16, torch.float8_e4m3fn: gl.float8e4nv}[
        dtype
    ]
    return gl.NVMMASharedLayout.get_default_for(list(block), element)


def _gl_descriptor(t: torch.Tensor, block: list[int]):
    """A Gluon TMA descriptor over `t` (its shared layout is part of it)."""
    return gluon_kernels.TensorDescriptor.from_tensor(t, list(block), _gl_layout(tuple(block), t.dtype))


class _GluonRelaunch(_Relaunch):
    """A cached Gluon launch: its descriptors are Gluon's (with their shared layouts)."""

    def __init__(self, *args) -> None:
        super().__init__(*args, describe=_gl_descriptor)


def _launch_gluon_producer(
    a,
    b_mat,
    kmajor,
    send,
    out,
    reduced,
    recv_rows,
    out_row0,
    tables,
    c,
    epoch,
    signals,
    counters,
    peer_signal_ptrs,
    world,
    rank,
    error,
    grid,
    spin_limit,
    cache,
    key,
    scaled=None,
):
    """`gluon_kernels.gluon_producer_kernel`'s launch; `scaled`: an FP8 launch's (sa, sb, stride_sa,
    stride_sb), as `_scale_args` gives them."""
    N = send.shape[1]
    box = [c.block_m, c.block_n]
    out_desc = _gl_descriptor(out, box)
    args = (
        _gl_descriptor(a, [c.block_m, c.block_k]),
        _gl_descriptor(b_mat, [c.block_n, c.block_k] if kmajor else [c.block_k, c.block_n]),
        _gl_descriptor(send, box),
        out_desc,
        _gl_descriptor(reduced, box) if reduced is not None else out_desc,
        _gl_descriptor(recv_rows, box),
        N,
        a.shape[1],
        out_row0,
        tables.order,
        tables.entry_chunk,
        tables.order.numel(),
        tables.inc_start,
        tables.inc_slot,
        tables.inc_offset,
        tables.chunk_ready,
        tables.chunk_tiles,
        counters,
        signals[READY_BASE:],
        tables.keep,
        peer_signal_ptrs,
        tables.gather_slot,
        signals[ENTERED_BASE:],
        rank,
        signals,
        epoch,
        error,
        _spin(spin_limit),
        *(scaled or (error, error, 0, 0)),
    )
    kwargs = dict(
        WORLD=world,
        ALL_REDUCE=reduced is not None,
        B_KMAJOR=kmajor,
        NUM_BUF=c.num_stages,
        PARTIAL_LEAD=GLUON_PARTIAL_LEAD,
        SCALED=scaled is not None,
        num_warps=c.num_warps,
    )
    varying = ["a_desc", "b_desc", "out_desc", "epoch"] + (["reduced_desc"] if reduced is None else [])
    if scaled is not None:
        varying += ["sa_ptr", "sb_ptr"]
    return _run_gluon(
        gluon_kernels.gluon_producer_kernel, "producer", grid, args, kwargs, cache, key, varying
    )


def _launch_gluon_consumer(
    a_full,
    b_mat,
    kmajor,
    out,
    a_own,
    own_row0,
    own_tiles,
    tables,
    c,
    epoch,
    signals,
    error,
    grid,
    spin_limit,
    cache,
    key,
):
    M, K = a_full.shape
    a_desc = _gl_descriptor(a_full, [c.block_m, c.block_k])
    args = (
        a_desc,
        _gl_descriptor(a_own, [c.block_m, c.block_k]) if own_tiles else a_desc,
        _gl_descriptor(b_mat, [c.block_n, c.block_k] if kmajor else [c.block_k, c.block_n]),
        _gl_descriptor(out, [c.block_m, c.block_n]),
        out.shape[1],
        K,
        own_row0,
        tables.order.numel(),
        own_tiles,
        tables.order,
        tables.mtile_lo,
        tables.mtile_hi,
        tables.chunk_slot,
        signals,
        epoch,
        error,
        _spin(spin_limit),
    )
    kwargs = dict(B_KMAJOR=kmajor, NUM_BUF=c.num_stages, num_warps=c.num_warps)
    return _run_gluon(
        gluon_kernels.gluon_consumer_kernel,
        "consumer",
        grid,
        args,
        kwargs,
        cache,
        key,
        ["b_desc", "c_desc", "epoch"] + (["own_desc"] if own_tiles else []),
    )


def _run_gluon(kernel, role: str, grid, args, kwargs, cache, key, varying) -> _Relaunch | None:
    """Launch a Gluon kernel (compiling it first if needed) and keep it in `cache` for relaunches
    (returned); a Triton whose Gluon it does not compile with gets one error saying how to go on."""
    try:
        compiled = kernel[grid](*args, **kwargs)
    except triton.compiler.errors.CompilationError as e:
        raise RuntimeUnavailableError(
            f"the Gluon {role} does not compile with triton {triton.__version__} (checked with 3.6 "
            f"and 3.9): unset {GLUON_VAR} and serve configurations of kernel 'triton' to use the "
            f"Triton kernels"
        ) from e
    if cache is not None and key is not None and compiled is not None and hasattr(compiled, "run"):
        again = _GluonRelaunch(kernel, compiled, grid, args, kwargs, varying)
        _keep(cache, key, again, _Relaunch.LIMIT)
        return again
    return None


def epilogue_split(c: Candidate) -> int:
    """Column halves the producer's epilogue works on: 2 wherever a tile has 32 columns or more,
    else the whole tile. A whole 128x256 tile's epilogue spills or overflows shared memory, and a
    whole 128x128 one reads the accumulator where ptxas then serializes the main loop's wgmma (its
    warning C7514)."""
    return 2 if c.block_n >= 32 else 1


COPY_TABLE_ALIGN = 4
"""Job-table rows are padded to a multiple of this many jobs, so that every row starts 16-byte
aligned whatever the number of jobs. Triton specializes a kernel on its pointers' 16-byte
alignment: with unpadded rows, a plan whose job count changed that alignment would get a copier
variant of its own, compiled and loaded at its launch, after the fused kernel's (the staged first
load loaded the other variant); a module load waits for the device, so the copier would wait for
the kernel that waits for its copies, until a bounded wait runs out."""

COPY_TABLES_CACHED = 32
"""Job tables kept on the device per context (an all-reduce's tables name the caller's output)."""


def copy_job_tables(
    ctx, jobs, stream: torch.cuda.Stream | None, wide: int = 3
) -> tuple[torch.Tensor, torch.Tensor]:
    """The device tables of `jobs` for `chunk_copy_kernel` (or another copier's: the first `wide`
    fields of a job are int64 addresses and sizes, the rest int32), cached per context.

    Making them allocates (pinned host memory, device memory): an implicit synchronization point
    that must not fall between a fused kernel's launch and its communication (the communication
    would then wait for the kernel, which waits for it). Callers make them before the launch.
    """
    cache = getattr(ctx, "cache", None)
    key = ("copy_jobs", wide, tuple(jobs))
    kept = cache.get(key) if cache is not None else None
    if kept is None:
        cols = list(zip(*jobs))
        pad = [0] * (-len(jobs) % COPY_TABLE_ALIGN)
        device = ctx.device
        table = torch.tensor([list(c) + pad for c in cols[:wide]], dtype=torch.int64)
        small = torch.tensor([list(c) + pad for c in cols[wide:]], dtype=torch.int32)

        def made():
            nonlocal table, small
            if device.type == "cuda":
                table, small = table.pin_memory(), small.pin_memory()
            with torch.cuda.stream(stream) if device.type == "cuda" else contextlib.nullcontext():
                return (table.to(device, non_blocking=True), small.to(device, non_blocking=True))

        tables = kept_allocations(made, device, sync=False)  # copies ordered on `stream`, before the copier
        # A copy captured in a CUDA graph reads its pinned source at every replay: kept with the tables.
        kept = (tables, (table, small))
        if cache is not None:
            _keep(cache, key, kept, COPY_TABLES_CACHED)
    if cache is not None:
        _hold_if_captured(cache, ctx.device, *kept)
    return kept[0]


CAPTURED_TABLES = ("captured copy jobs",)
"""The context cache's list of the job tables (device and pinned host) that CUDA graphs captured."""


def _hold_if_captured(cache: dict, device: torch.device, tables, host) -> None:
    """Under a CUDA graph capture, keep `tables` and their pinned `host` source for as long as the
    context lives: the graph's copier reads them at every replay, long after later calls with other
    addresses have pushed them out of the cache's last COPY_TABLES_CACHED (a graph would then read
    freed memory). Captures are few (one a captured call), so the list stays short."""
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        cache.setdefault(CAPTURED_TABLES, []).append((tables, host))


_COPIERS_LOADED: set[tuple] = set()


def stage_chunk_copy(
    ctx, jobs, stream: torch.cuda.Stream | None, programs: int, dtype: torch.dtype, spin_limit: int = 0
) -> None:
    """Everything `launch_chunk_copy` needs that may synchronize, done before a fused kernel runs:
    the job tables, and the copier's first launch in this process (with no jobs), in which Triton
    compiles it and loads it onto the device. A module load is an implicit synchronization point
    too: a first reduce-scatter over SM copies that loaded the copier after the producer started
    would wait for the producer, which waits for the copies, and run out of its waits, while every
    later call, finding the copier loaded, is correct."""
    if not jobs:
        return
    tables = copy_job_tables(ctx, jobs, stream)
    variant = (str(ctx.device), programs, dtype, spin_limit)
    if variant in _COPIERS_LOADED or ctx.device.type != "cuda":
        return
    _run_copier(ctx, stream, tables, 0, programs, 0, dtype, spin_limit)  # no jobs: compile and load only
    _COPIERS_LOADED.add(variant)


def launch_chunk_copy(
    ctx, stream: torch.cuda.Stream, jobs, programs: int, epoch: int, dtype: torch.dtype, spin_limit: int = 0
) -> None:
    """Run SM-driven chunk copies on `stream` with `programs` programs (see `chunk_copy_kernel`)."""
    if not jobs:
        return
    _run_copier(
        ctx, stream, copy_job_tables(ctx, jobs, stream), len(jobs), programs, epoch, dtype, spin_limit
    )


def _run_copier(
    ctx, stream, tables, num_jobs: int, programs: int, epoch: int, dtype: torch.dtype, spin_limit: int
) -> None:
    table, small = tables
    with torch.cuda.stream(stream) if ctx.device.type == "cuda" else contextlib.nullcontext():
        chunk_copy_kernel[(programs,)](
            table[0],
            table[1],
            table[2],
            small[0],
            small[1],
            small[2],
            num_jobs,
            ctx.signals.local,
            ctx.peer_signal_ptrs,
            ctx.signals.local[ENTERED_BASE:],
            ctx.counters[COPY_COUNTER_BASE:],
            epoch,
            ctx.error,
            NUM_PROGRAMS=programs,
            BLOCK=COPY_BLOCK,
            ELEM=TL_DTYPES[dtype],
            MAX_SPIN=spin_limit,
            num_warps=4,
        )


PULL_BLOCK = 4096
"""32-bit words each program of `pull_kernel` copies (16 KiB: a 4 MiB chunk is 256 programs)."""


def pull_aligned(src: int, dst: int, nbytes: int) -> bool:
    """Whether `launch_pull` can copy `nbytes` from address `src` to `dst`: whole 16-byte words at
    16-byte aligned addresses (the one variant of the kernel made ahead, `stage_pull`, copies those)."""
    return nbytes % 16 == 0 and src % 16 == 0 and dst % 16 == 0


def pull_fits(src: torch.Tensor, dst: torch.Tensor) -> bool:
    """Whether `launch_pull` takes these tensors: contiguous, of one size, `pull_aligned`."""
    nbytes = src.numel() * src.element_size()
    return (
        src.is_contiguous()
        and dst.is_contiguous()
        and nbytes == dst.numel() * dst.element_size()
        and pull_aligned(src.data_ptr(), dst.data_ptr(), nbytes)
    )


def _words(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.int32)


def launch_pull(
    ctx,
    stream: torch.cuda.Stream | None,
    src: torch.Tensor,
    dst: torch.Tensor,
    word: int,
    epoch: int,
    spin_limit: int = 0,
) -> None:
    """Enqueue on `stream` the SM copy of `src` (a peer's memory) into `dst` that starts once word
    `word` of this rank's pad reaches `epoch` (`pull_kernel`). `pull_fits(src, dst)` must hold. A launch like
    an earlier one on
    this context relaunches its compiled kernel with the new `dst` and epoch (`_Relaunch`)."""
    n = src.numel() * src.element_size() // 4
    cache = getattr(ctx, "cache", None)
    with (
        torch.cuda.stream(stream)
        if stream is not None and ctx.device.type == "cuda"
        else contextlib.nullcontext()
    ):
        key = None
        if cache is not None and _relaunch_on(dst):
            key = ("relaunch", "pull", src.data_ptr(), n, word, spin_limit, ctx.signals.local.data_ptr())
            again = cache.get(key)
            if again is not None:
                again(dst_ptr=dst, epoch=epoch)
                return
        grid = (max(1, triton.cdiv(n, PULL_BLOCK)),)
        args = (_words(src), _words(dst), n, ctx.signals.local, word, epoch, ctx.error, _spin(spin_limit))
        kwargs = dict(BLOCK=PULL_BLOCK, num_warps=4)
        compiled = pull_kernel[grid](*args, **kwargs)
        _remember(cache, key, pull_kernel, compiled, grid, args, kwargs, ["dst_ptr", "epoch"])


def stage_pull(ctx) -> None:
    """Compile and load `pull_kernel` for this context ahead of its calls (the variant
    `launch_pull` takes, 16-byte aligned, copying nothing): a module load waits for the whole
    device, and in the middle of a call it would hold this rank while a peer's bounded wait for it
    runs out."""
    if ctx.device.type == "cuda":
        pull_kernel[(1,)](
            ctx.scratch, ctx.scratch, 0, ctx.signals.local, 0, 0, ctx.error, -1, BLOCK=PULL_BLOCK, num_warps=4
        )


def launch_graph_entry(ctx, stream: torch.cuda.Stream | None) -> None:
    """Enqueue on `stream` the start of a call captured in a CUDA graph (`graph_entry_kernel`):
    the group meets, each rank clears its pad's words below MEET_BASE, and meets again."""
    with (
        torch.cuda.stream(stream)
        if stream is not None and ctx.device.type == "cuda"
        else contextlib.nullcontext()
    ):
        args, kwargs = _graph_entry_args(ctx)
        graph_entry_kernel[(1,)](*args, **kwargs)


def warm_graph_entry(ctx) -> None:
    """Compile `launch_graph_entry`'s kernel for `ctx` without launching it (once a context): a
    graph captured on one rank alone must not compile it mid-capture, and launching it outside a
    call would make that rank meet a group that is not there."""
    if getattr(ctx, "_graph_entry_warm", False):
        return
    args, kwargs = _graph_entry_args(ctx)
    graph_entry_kernel.warmup(*args, **kwargs, grid=(1,))
    ctx._graph_entry_warm = True


def _graph_entry_args(ctx) -> tuple[tuple, dict]:
    """`graph_entry_kernel`'s arguments for `ctx`: what a launch and its warm-up both pass."""
    args = (ctx.signals.local, ctx.peer_signal_ptrs, ctx.rank, MEET_BASE)
    lanes = triton.next_power_of_2(ctx.world_size)
    return args, {"WORLD": ctx.world_size, "CLEAR": MEET_BASE, "BLOCK": 1024, "LANES": lanes, "num_warps": 1}
