"""Eager calls replayed from CUDA graphs of their own: a fused call's host time cut to one launch.

A fused call enqueues dozens of driver operations (stream writes and waits, copy-engine copies,
events on its side streams) and a kernel launch: its host time, not its device time, bounds an
eager job whose calls are small (`benchmarks/op_host.py`, `syncopate bench --layer`). The same call
captured in a CUDA graph costs the host one graph launch. A graph binds the addresses it was
captured with, so a program keeps one graph per set of addresses its calls bind (the input, the
weight, the output and the gathered copy): a job's steps allocate their activations in the same
order each step, so the caching allocator hands out the same addresses and each step replays the
graphs of the one before. A miss captures a new graph (`GRAPHS` kept a program, the oldest
dropped); capturing executes nothing.

Every call so replayed runs the captured-call protocol (`OverlapContext.begin_call`: the group
meets, the signal pads are cleared, the group meets again), whether a rank replays a graph or has
just captured it, so ranks that miss at different calls still run the same protocol together. A
program's first call runs directly (it compiles the kernel and may allocate), on every rank alike.

That meeting costs the device a few microseconds a call, and a call launched directly costs the
host every stream operation, which an eager job whose host is on the path pays on the device's
timeline too, on every rank: each fused call meets the group, so every rank's device waits for the
slowest rank's host. Which costs a job more is the job's to show, so by default (`auto`) a program
is launched directly for `WARM` calls, then its next `SAMPLES` calls alternate between a direct
launch and a replay, each timed on the caller's stream (CUDA events: the time the call holds the
stream, its host's enqueueing and the group's waits included where the device waits for them) and
on the host (a replay that had to capture its graph first is not counted); then the group takes
each way's medians on its slowest rank (one all-reduce, once a program) and replays from then on
where replays held the stream less, or where a direct call takes the host at least `HOST_SHARE` of
the call's time on the stream (the host then sets the job's pace, which one rank's stream does not
show), and launches directly otherwise, a program whose replays all captured directly. A program
prepared anywhere in the process (`note_prepared`: a new shape's first call, which compiles and
looks up) restarts the count of every program still deciding: a job's first step prepares its
programs one after another, its host busy with that, and a deep model's early layers would
otherwise be sampled there. Every rank prepares the same programs at the same calls, so the group
still decides at the same call everywhere.
"""

from __future__ import annotations

import collections
import logging
import math
import statistics
import time

import torch

from syncopate.kernels.scaled import fast_accumulation

log = logging.getLogger(__name__)

__all__ = [
    "FIGURES",
    "GRAPHS",
    "HOST_SHARE",
    "LAUNCHES",
    "SAMPLES",
    "WARM",
    "LaunchChoice",
    "ReplayedCalls",
    "candidate_replays",
    "note_prepared",
    "replayable",
]

GRAPHS = 256
"""Graphs a program keeps, one per set of addresses; the least recently used goes first. A program
serves every layer of its shapes (a model's layers share them), each layer's activations at
addresses of their own, so a step needs about one graph a layer; a graph costs little memory (its
calls allocate nothing) and one capture."""

LAUNCHES = ("auto", "graph", "direct")
"""How a fused call made outside a CUDA graph capture is launched (`syncopate.kernels.ops.set_launch`):
replayed from a graph of its own where that is faster in the job (`auto`), always (`graph`), or
enqueued operation by operation (`direct`)."""

WARM = 8
"""Calls of a program made before `auto` starts timing (first calls compile, allocate, warm up)."""

SAMPLES = 16
"""Calls of a program `auto` times, alternately launched directly and replayed, before the group
decides how it is launched."""


HOST_SHARE = 0.5
"""`auto` replays a program whose direct calls take the host at least this share of the call's time
on the stream (the faster way's median), whatever the two ways' times on the stream say: a job
made of such calls and of torch's ops around them (whose host time grows alike as the tokens
shrink) keeps its device waiting for its host, and in a group every rank's device waits for the
slowest host, which a call's time on one rank's stream does not show."""


_PREPARED = [0]
"""Programs prepared in this process so far (`note_prepared`)."""


def note_prepared() -> None:
    """A fused program has just been prepared: `auto`'s programs still deciding start counting again."""
    _PREPARED[0] += 1


def replayable(program, spin_limit: int) -> bool:
    """Whether this call of `program` may be replayed from a graph: a fused program on CUDA whose
    transfers are not NCCL's (`unfused` and the `nccl` backend enqueue NCCL's collectives, whose
    host cost torch's own path pays alike), with unbounded waits (a bounded wait's timeout is read
    after the call, which a replay cannot report). FP8 calls too: their scales are bound like the
    operands (a graph per set of addresses)."""
    ctx = getattr(program, "context", None)
    return (
        ctx is not None
        and ctx.device.type == "cuda"
        and not spin_limit
        and candidate_replays(program.spec.candidate)
    )


def candidate_replays(candidate) -> bool:
    """Whether a configuration's eager calls can be replayed from graphs of their own (`replayable`):
    its transfers are not NCCL's (template `unfused` takes backend `nccl` too)."""
    return candidate.backend != "nccl"


class ReplayedCalls:
    """One program's graphs, by the addresses of the tensors their call bound."""

    __slots__ = ("program", "graphs", "ran", "captures", "stream")

    def __init__(self, program) -> None:
        self.program = program
        self.graphs: collections.OrderedDict[tuple, torch.cuda.CUDAGraph] = collections.OrderedDict()
        self.ran = False
        """Whether the program's first (direct) call has been made."""
        self.captures = 0
        """Graphs captured so far (a job whose addresses never repeat captures every call)."""
        self.stream: torch.cuda.Stream | None = None

    def __call__(self, a, b, out, gathered=None, scales=None) -> None:
        """Make the call: directly the first time, else by replaying its graph (captured on a miss)."""
        if not self.ran:
            self.program(a, b, out, gathered=gathered, scales=scales)
            self.ran = True
            return
        key = (a.data_ptr(), b.data_ptr(), out.data_ptr(), 0 if gathered is None else gathered.data_ptr())
        if scales is not None:  # a program takes tensor-wise and row-wise scales alike: their size too
            key += (*((s.data_ptr(), s.numel()) for s in scales[:2]), fast_accumulation(scales))
        graph = self.graphs.pop(key, None)
        if graph is None:
            graph = self._capture(a, b, out, gathered, scales)
            if len(self.graphs) >= GRAPHS:
                if self.captures == GRAPHS + 1:
                    log.warning(
                        "a fused call's program has captured %d graphs: the job's tensors keep landing at new "
                        "addresses, so each call pays a capture; call syncopate.set_launch('direct') on every "
                        "rank for such a job",
                        GRAPHS + 1,
                    )
                while len(self.graphs) >= GRAPHS:
                    self.graphs.popitem(last=False)  # a graph in flight is freed when it ends
        self.graphs[key] = graph
        graph.replay()

    def _capture(self, a, b, out, gathered, scales=None) -> torch.cuda.CUDAGraph:
        """The call captured on a side stream (capturing runs nothing): what a replay enqueues on
        the caller's stream. Thread-local capture mode: the backward pass captures on autograd's
        thread while other threads (NCCL's watchdog) query events."""
        ctx = self.program.context
        _warm(ctx)  # compiled before the capture, never launched outside a call
        if self.stream is None:
            self.stream = _side_stream(ctx.device)
        graph = _new_graph()
        with torch.cuda.stream(self.stream):
            graph.capture_begin(capture_error_mode="thread_local")
            try:
                self.program(a, b, out, capturing=True, gathered=gathered, scales=scales)
            except BaseException:
                try:
                    graph.capture_end()
                except RuntimeError:  # the capture the failure left invalid: the failure is what to report
                    pass
                raise
            graph.capture_end()
        self.captures += 1
        return graph

    def clear(self) -> None:
        self.graphs.clear()


def _warm(ctx) -> None:
    from syncopate.kernels.launch import warm_graph_entry

    warm_graph_entry(ctx)


def _side_stream(device) -> torch.cuda.Stream:
    return torch.cuda.Stream(device)


def _new_graph() -> torch.cuda.CUDAGraph:
    return torch.cuda.CUDAGraph()


class LaunchChoice:
    """`auto`'s choice for one program (module docstring): direct calls through the warm-up, then
    direct and replayed calls in turn, each timed, then the group's decision (`decide`), kept."""

    __slots__ = ("program", "calls", "samples", "replayed", "decided", "prepared", "figures")

    def __init__(self, program) -> None:
        self.program = program
        self.prepared = _PREPARED[0]
        """`_PREPARED` when the count last started."""
        self.calls = 0
        self.samples: list[_Sample] = []
        """Timed calls."""
        self.replayed: ReplayedCalls | None = None
        """The program's graphs: made when the first replayed sample comes, kept if replays win."""
        self.decided = False
        self.figures: dict[str, float] | None = None
        """What the group decided on (`FIGURES`), once decided."""

    def __call__(self, a, b, out, gathered=None, scales=None) -> None:
        if self.decided:
            if self.replayed is not None:
                self.replayed(a, b, out, gathered, scales)
            else:
                self.program(a, b, out, gathered=gathered, scales=scales)
            return
        if self.prepared != _PREPARED[0]:  # a program prepared since: the job is still warming up
            self.prepared, self.calls, self.samples = _PREPARED[0], 0, []
        self.calls += 1
        if self.calls <= WARM:
            self.program(a, b, out, gathered=gathered, scales=scales)
            return
        replay = self.calls % 2 == 0  # in turn, at the same calls on every rank
        device = self.program.context.device
        if replay and self.replayed is None:
            self.replayed = ReplayedCalls(self.program)
            self.replayed.ran = True  # the program's first call was made (the warm-up's)
        captures = self.replayed.captures if replay else 0
        began, start = _now_us(), _stamp(device)
        if replay:
            self.replayed(a, b, out, gathered, scales)
        else:
            self.program(a, b, out, gathered=gathered, scales=scales)
        end = _stamp(device)
        if not replay or self.replayed.captures == captures:  # a capture's host time is not a replay's
            self.samples.append(_Sample(replay, start, end, _now_us() - began))
        if self.calls >= WARM + SAMPLES:
            self.decide()

    def decide(self) -> None:
        """The group's choice, once, on each way's medians on the slowest rank (a way a rank has no
        sample of counts as infinite there): replays where they hold the stream less or where a direct
        call takes the host `HOST_SHARE` of the call's time or more, else direct calls."""
        self.decided = True
        samples, self.samples = self.samples, []
        ways = [[s for s in samples if s.replayed == replay] for replay in (False, True)]
        local = [_median([_elapsed_us(s.start, s.end) for s in way]) for way in ways]
        local += [_median([s.host_us for s in way]) for way in ways]
        self.figures = dict(zip(FIGURES, _group_slowest(self.program, local)))
        direct_us, replayed_us = self.figures["direct_us"], self.figures["replayed_us"]
        host_bound = self.figures["direct_host_us"] >= HOST_SHARE * min(direct_us, replayed_us)
        if not (math.isfinite(replayed_us) and (replayed_us < direct_us or host_bound)):
            if self.replayed is not None:
                self.replayed.clear()
            self.replayed = None
        spec = self.program.spec
        log.info(
            "syncopate.%s (a %s, b %s, %s) %s from now on: %s a call launched directly (%s of host time), %s "
            "replayed (%s of host time; the medians of %d calls timed in turn, the group's slowest rank; "
            "syncopate.set_launch('direct' or 'graph') decides it instead)",
            spec.op,
            "x".join(map(str, spec.a_shape)),
            "x".join(map(str, spec.b_shape)),
            spec.candidate.short(),
            "replayed from graphs of its own" if self.replayed is not None else "launched directly",
            _us(direct_us),
            _us(self.figures["direct_host_us"]),
            _us(replayed_us),
            _us(self.figures["replayed_host_us"]),
            SAMPLES,
        )


FIGURES = ("direct_us", "replayed_us", "direct_host_us", "replayed_host_us")
"""What `auto` measured of a program, each way's median over its sampled calls, the group's slowest
rank's: the time a call held the caller's stream (`_us`: CUDA events, the host's enqueueing included
where the device waited for it) and the host's time to make the call (`_host_us`)."""


class _Sample(collections.namedtuple("_Sample", "replayed start end host_us")):
    """One timed call: replayed or direct, its start and end stamps on the caller's stream, and the
    host's time to make it (µs)."""

    __slots__ = ()


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else math.inf


def _us(t: float) -> str:
    return f"{t:.1f} us" if math.isfinite(t) else "no time"


def _stamp(device):
    """A timing event recorded on the caller's stream of `device`."""
    event = torch.cuda.Event(enable_timing=True)
    event.record(torch.cuda.current_stream(device))
    return event


def _now_us() -> float:
    """The host's clock, µs."""
    return time.perf_counter() * 1e6


def _elapsed_us(start, end) -> float:
    """µs between two `_stamp`s (waits for the second)."""
    end.synchronize()
    return start.elapsed_time(end) * 1e3


def _group_slowest(program, values: list[float]) -> list[float]:
    """Each of `values` at its largest over the program's group (a collective every rank makes at the
    same call of the program: the same calls in the same order)."""
    import torch.distributed as dist

    from syncopate.kernels.ranks import slowest

    group = program.spec.group
    nccl = dist.get_backend(group) == "nccl"  # else gloo (ranks sharing a GPU): a CPU tensor
    return slowest(values, group, program.context.device if nccl else "cpu")
