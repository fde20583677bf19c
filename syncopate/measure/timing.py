"""The one benchmark method: warm-up, L2 flush, barrier, per-repetition CUDA events, max over ranks.

Before each repetition every rank flushes L2 (writes a buffer larger than it), meets the others at
a barrier, and queues a device sleep so that the op's launches are all enqueued before the start
event fires (host overhead is measured apart): at least twice the host time of the last warm-up
call, since the slowest calls take most of a millisecond to enqueue and a sleep counted in clock
cycles can end sooner than asked. After the sleep the GPUs meet once more, in a one-element
all-reduce that the host does not wait for, and the start event follows it: the ranks then start
together, where the host barrier alone leaves the hosts' own skew between them, and a rank that
started early counts the wait for a late peer as its op's time. A repetition's time is the largest
over the ranks; callers take the median and p20/p80 of the repetitions (docs/benchmarking.md).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from syncopate.kernels.ranks import slowest

__all__ = ["Timing", "time_collective", "time_eager", "summarize", "barrier", "start_together"]

_FLUSH_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class Timing:
    samples_us: tuple[float, ...]
    host_us: float
    """Median host time to enqueue one call."""

    @property
    def median_us(self) -> float:
        return statistics.median(self.samples_us)

    @property
    def p20_us(self) -> float:
        return _quantile(self.samples_us, 0.2)

    @property
    def p80_us(self) -> float:
        return _quantile(self.samples_us, 0.8)


def _quantile(xs, q: float) -> float:
    s = sorted(xs)
    if len(s) == 1:
        return s[0]
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def summarize(samples) -> dict[str, float]:
    return {
        "median_us": statistics.median(samples),
        "p20_us": _quantile(samples, 0.2),
        "p80_us": _quantile(samples, 0.8),
    }


class _Flusher:
    def __init__(self, device: torch.device) -> None:
        self.buf = torch.empty(_FLUSH_BYTES // 4, dtype=torch.int32, device=device)

    def __call__(self) -> None:
        self.buf.zero_()


_flushers: dict[torch.device, _Flusher] = {}


def _flush(device: torch.device, flush_l2: bool) -> Callable[[], None]:
    """What empties L2 before a repetition on `device` (one buffer a device, made on first use), or
    nothing without `flush_l2`."""
    if not flush_l2:
        return lambda: None
    flusher = _flushers.get(device)
    if flusher is None:
        flusher = _flushers[device] = _Flusher(device)
    return flusher


def barrier(group, device: torch.device) -> None:
    """Every rank of `group` gets here before any leaves (an all-reduce on this rank's device, synced)."""
    token = torch.zeros(1, device=device)
    dist.all_reduce(token, group=group)
    torch.cuda.synchronize(device)


_tokens: dict[torch.device, torch.Tensor] = {}


def start_together(group, device: torch.device, sleep_us: float = 1500.0) -> None:
    """What comes before a repetition's start event: the hosts meet (`barrier`), a device sleep of
    at least `sleep_us` is queued (the caller's launches are enqueued before the GPU reaches them),
    and a one-element all-reduce after it, which the GPUs leave together."""
    barrier(group, device)
    torch.cuda._sleep(int(sleep_us * 2.0e3))  # at least `sleep_us` at clocks up to 2 GHz
    token = _tokens.get(device)
    if token is None:
        token = _tokens[device] = torch.zeros(1, device=device)
    dist.all_reduce(token, group=group)


def time_collective(
    fn: Callable[[], object],
    group,
    *,
    warmup: int = 5,
    repetitions: int = 20,
    flush_l2: bool = True,
    sleep_us: float = 1500.0,
) -> Timing:
    """Time `fn` (a collective every rank calls) by DESIGN's method; samples are max over ranks."""
    device = torch.device("cuda", torch.cuda.current_device())
    flush = _flush(device, flush_l2)
    enqueue_us = 0.0
    for _ in range(warmup):
        t0 = time.perf_counter()
        fn()
        enqueue_us = (time.perf_counter() - t0) * 1e6
    torch.cuda.synchronize()
    sleep_us = max(
        sleep_us, 2.0 * enqueue_us
    )  # the last warm-up's enqueue, twice: the GPU never waits for the host
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(repetitions)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(repetitions)]
    host = []
    for i in range(repetitions):
        flush()
        start_together(group, device, sleep_us)
        starts[i].record()
        t0 = time.perf_counter()
        fn()
        host.append((time.perf_counter() - t0) * 1e6)
        ends[i].record()
    torch.cuda.synchronize()
    local = [s.elapsed_time(e) * 1000.0 for s, e in zip(starts, ends)]
    return Timing(samples_us=tuple(slowest(local, group, device)), host_us=statistics.median(host))


HOST_CALLS = 10
"""Calls a batch of `time_host` enqueues back to back."""


def time_host(
    fn: Callable[[], object], *, calls: int = HOST_CALLS, batches: int = 5, warmup: int = 2
) -> float:
    """This rank's host time to enqueue one call of `fn` (µs): `calls` calls enqueued back to back
    under a device sleep that outlasts them (so that no launch waits for the GPU), the median of
    `batches` batches. Every rank of a collective's group calls `fn` alike. Batches, not one
    call's host time a repetition (`time_collective`'s), which a rank's scheduling skews."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    per_call_us = (time.perf_counter() - t0) * 1e6
    torch.cuda.synchronize()
    per_batch = []
    for _ in range(batches):
        # at least twice the batch's enqueue at clocks up to 2 GHz, and never below a millisecond
        torch.cuda._sleep(int(max(1000.0, 2.0 * per_call_us * calls) * 2.0e3))
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        per_batch.append((time.perf_counter() - t0) * 1e6 / calls)
        per_call_us = max(per_call_us, per_batch[-1])
        torch.cuda.synchronize()
    return statistics.median(per_batch)


EAGER_CALLS = 10
"""Calls a repetition of `time_eager` makes back to back."""


def time_eager(
    fn: Callable[[], object],
    group,
    *,
    calls: int = EAGER_CALLS,
    warmup: int = 3,
    repetitions: int = 7,
    flush_l2: bool = True,
) -> tuple[float, ...]:
    """Per-call time of `fn` called `calls` times back to back with the host on the path: the time
    an eager job sees (device time alone hides the host's enqueueing, `time_collective`).

    Each repetition starts with the GPUs idle and the hosts lined up (`barrier`), records the start
    event, enqueues the calls one after another while the GPU runs them, and records the end: a
    call whose host time exceeds its device time makes the GPU wait for it. A repetition's time
    is (end - start) / calls, the largest over the ranks."""
    device = torch.device("cuda", torch.cuda.current_device())
    flush = _flush(device, flush_l2)
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(repetitions)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(repetitions)]
    for i in range(repetitions):
        flush()
        barrier(group, device)
        starts[i].record()
        for _ in range(calls):
            fn()
        ends[i].record()
        torch.cuda.synchronize()
    return tuple(slowest([s.elapsed_time(e) * 1000.0 / calls for s, e in zip(starts, ends)], group, device))
