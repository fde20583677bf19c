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

That meeting costs the device a few microseconds a call, which a job whose GPU is never short of
work pays for nothing. So by default (`auto`) a program is launched directly until the job has
shown which it is: after `WARM` calls, the next `SAMPLES` calls each ask, before enqueueing,
whether the caller's stream has run dry (its GPU waiting for this host); then the group agrees
(one all-reduce of the largest share over the ranks, once a program) and replays from then on
where the stream ran dry on more than half of the samples on some rank. A program prepared
anywhere in the process (`note_prepared`: a new shape's first call, which compiles and looks up)
restarts the count of every program still deciding: a job's first step prepares its programs one
after another, its host busy with that, and a deep model's early layers would otherwise be sampled
there. Every rank prepares the same programs at the same calls, so the group still decides at the
same call everywhere.
"""

from __future__ import annotations

import collections
import logging

import torch

log = logging.getLogger(__name__)

__all__ = [
    "GRAPHS",
    "LAUNCHES",
    "SAMPLES",
    "WARM",
    "LaunchChoice",
    "ReplayedCalls",
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
replayed from a graph of its own where the job's host is on the path (`auto`), always (`graph`),
or enqueued operation by operation (`direct`)."""

WARM = 8
"""Calls of a program made before `auto` starts sampling (first calls compile, allocate, warm up)."""

SAMPLES = 16
"""Calls of a program `auto` samples before the group decides how it is launched."""


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
        and program.spec.candidate.backend != "nccl"
    )


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
            key += tuple((s.data_ptr(), s.numel()) for s in scales)
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
    """`auto`'s choice for one program: direct calls while it samples whether the caller's stream
    runs dry, then the group's decision (`decide`), kept."""

    __slots__ = ("program", "calls", "dry", "replayed", "decided", "prepared")

    def __init__(self, program) -> None:
        self.program = program
        self.prepared = _PREPARED[0]
        """`_PREPARED` when the count last started."""
        self.calls = 0
        self.dry = 0
        """Sampled calls before which the caller's stream had nothing left to run."""
        self.replayed: ReplayedCalls | None = None
        self.decided = False

    def __call__(self, a, b, out, gathered=None, scales=None) -> None:
        if self.replayed is not None:
            self.replayed(a, b, out, gathered, scales)
            return
        if not self.decided:
            if self.prepared != _PREPARED[0]:  # a program prepared since: the job is still warming up
                self.prepared, self.calls, self.dry = _PREPARED[0], 0, 0
            self.calls += 1
            if self.calls > WARM:
                self.dry += bool(_stream_idle(self.program.context.device))
        self.program(a, b, out, gathered=gathered, scales=scales)
        if not self.decided and self.calls >= WARM + SAMPLES:
            self.decided = True
            share = _group_share(self.program, self.dry / SAMPLES)
            if share > 0.5:
                self.replayed = ReplayedCalls(self.program)
                self.replayed.ran = True
            spec = self.program.spec
            log.info(
                "syncopate.%s (a %s, b %s, %s) %s from now on: the caller's stream ran dry before %.0f%% of %d "
                "sampled calls on the group's driest rank (syncopate.set_launch('direct' or 'graph') decides "
                "it instead)",
                spec.op,
                "x".join(map(str, spec.a_shape)),
                "x".join(map(str, spec.b_shape)),
                spec.candidate.short(),
                "replayed from graphs of its own" if self.replayed is not None else "launched directly",
                100 * share,
                SAMPLES,
            )


def _stream_idle(device) -> bool:
    """Whether the caller's stream has run everything enqueued on it (one driver query)."""
    return torch.cuda.current_stream(device).query()


def _group_share(program, share: float) -> float:
    """The largest `share` over the program's group (a collective every rank makes at the same call
    of the program: the same calls in the same order)."""
    import torch.distributed as dist

    from syncopate.kernels.ranks import slowest

    group = program.spec.group
    nccl = dist.get_backend(group) == "nccl"  # else gloo (ranks sharing a GPU): a CPU tensor
    return slowest([share], group, program.context.device if nccl else "cpu")[0]
