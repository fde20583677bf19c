"""The one benchmark method: warm-up, L2 flush, barrier, per-repetition CUDA events, max over ranks.

Before each repetition every rank flushes L2 (writes a buffer larger than it), meets the others at
a barrier, and queues a short device sleep so that the op's launches are all enqueued before the
start event fires (host overhead is measured apart). A repetition's time is the largest over the
ranks; callers take the median and p20/p80 of the repetitions.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

__all__ = ["Timing", "time_collective", "summarize", "barrier"]

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
    return {"median_us": statistics.median(samples), "p20_us": _quantile(samples, 0.2), "p80_us": _quantile(samples, 0.8)}


class _Flusher:
    def __init__(self, device: torch.device) -> None:
        self.buf = torch.empty(_FLUSH_BYTES // 4, dtype=torch.int32, device=device)

    def __call__(self) -> None:
        self.buf.zero_()


_flushers: dict[torch.device, _Flusher] = {}


def barrier(group, device: torch.device) -> None:
    """Every rank of `group` gets here before any leaves (an all-reduce on this rank's device, synced)."""
    token = torch.zeros(1, device=device)
    dist.all_reduce(token, group=group)
    torch.cuda.synchronize(device)


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
    flush = _flushers.setdefault(device, _Flusher(device)) if flush_l2 else (lambda: None)
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(repetitions)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(repetitions)]
    host = []
    cycles = int(sleep_us * 1.5e3)  # ~1.5 GHz and up: at least `sleep_us`
    for i in range(repetitions):
        flush()
        barrier(group, device)
        torch.cuda._sleep(cycles)
        starts[i].record()
        t0 = time.perf_counter()
        fn()
        host.append((time.perf_counter() - t0) * 1e6)
        ends[i].record()
    torch.cuda.synchronize()
    local = torch.tensor([s.elapsed_time(e) * 1000.0 for s, e in zip(starts, ends)], dtype=torch.float64, device=device)
    dist.all_reduce(local, op=dist.ReduceOp.MAX, group=group)
    return Timing(samples_us=tuple(local.tolist()), host_us=statistics.median(host))
