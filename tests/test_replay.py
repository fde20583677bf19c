"""Unit: eager calls replayed from per-address CUDA graphs (`syncopate.kernels.replay`) — which call
runs directly, which captures, which replays, and what a program keeps; with a recording stand-in
for the CUDA graph (the GPU test, tests/test_gpu_replay.py, runs real ones)."""

from __future__ import annotations

import contextlib
import types

import pytest
import torch

from syncopate.errors import ConfigError
from syncopate.kernels import replay


class _Graph:
    def __init__(self, log, clock=None):
        self.log = log
        self.replays = 0
        self.clock = clock

    def capture_begin(self, capture_error_mode):
        assert capture_error_mode == "thread_local"
        self.log.append("begin")

    def capture_end(self):
        self.log.append("end")

    def replay(self):
        self.replays += 1
        self.log.append("replay")
        if self.clock is not None:
            self.clock.now += self.clock.replayed_us
            self.clock.host += self.clock.replayed_host_us


class _Program:
    def __init__(self, log, fail=False, clock=None):
        self.log = log
        self.fail = fail
        self.clock = clock
        self.context = types.SimpleNamespace(device=types.SimpleNamespace(type="cuda"))
        self.spec = types.SimpleNamespace(
            op="all_gather_matmul",
            a_shape=(2048, 4096),
            b_shape=(4096, 1536),
            candidate=types.SimpleNamespace(short=lambda: "copy_engine/ring/s1"),
        )

    def __call__(self, a, b, out, *, capturing=False, spin_limit=0, gathered=None, scales=None):
        entry = ("capture" if capturing else "direct", a.data_ptr(), out.data_ptr())
        self.log.append(entry if scales is None else (*entry, *(t.data_ptr() for t in scales[:2])))
        if self.fail and capturing:
            raise RuntimeError("the kernel failed")
        if self.clock is not None and not capturing:
            self.clock.now += self.clock.direct_us
            self.clock.host += self.clock.direct_host_us


class _Clock:
    """Stand-in for the CUDA events `auto` times calls with: a direct call moves it by `direct_us`,
    a replay by `replayed_us`, a capture not at all; and for the host's clock, which a direct call
    moves by `direct_host_us`, a replay by `replayed_host_us`."""

    def __init__(self, monkeypatch, log, direct_us, replayed_us, direct_host_us=300.0, replayed_host_us=20.0):
        self.direct_us, self.replayed_us, self.now = direct_us, replayed_us, 0.0
        self.direct_host_us, self.replayed_host_us, self.host = direct_host_us, replayed_host_us, 0.0
        monkeypatch.setattr(replay, "_stamp", lambda device: self.now)
        monkeypatch.setattr(replay, "_elapsed_us", lambda start, end: end - start)
        monkeypatch.setattr(replay, "_now_us", lambda: self.host)
        monkeypatch.setattr(replay, "_new_graph", lambda: _Graph(log, self))


@pytest.fixture
def log(monkeypatch):
    log = []
    monkeypatch.setattr(replay, "_new_graph", lambda: _Graph(log))
    monkeypatch.setattr(replay, "_side_stream", lambda device: None)
    monkeypatch.setattr(replay, "_warm", lambda ctx: log.append("warm"))
    monkeypatch.setattr(replay.torch.cuda, "stream", lambda s: contextlib.nullcontext())
    return log


def _tensors(n):
    return [torch.empty(4) for _ in range(n)]


def test_the_first_call_is_direct_then_each_new_address_set_is_captured_once(log):
    program = _Program(log)
    calls = replay.ReplayedCalls(program)
    a, b, out, other = _tensors(4)
    calls(a, b, out)
    assert log == [("direct", a.data_ptr(), out.data_ptr())]
    log.clear()
    calls(a, b, out)
    assert log == ["warm", "begin", ("capture", a.data_ptr(), out.data_ptr()), "end", "replay"]
    log.clear()
    calls(a, b, out)
    assert log == ["replay"]
    log.clear()
    calls(a, b, other)  # another output address: another graph
    assert log[2] == ("capture", a.data_ptr(), other.data_ptr()) and log[-1] == "replay"
    assert calls.captures == 2 and len(calls.graphs) == 2


def test_fp8_calls_pass_their_scales_and_a_graph_binds_the_scales_addresses_too(log):
    """A scaled call is made and captured with its scales; other scales at other addresses are
    another graph (a replay would read the old ones), the same addresses replay."""
    calls = replay.ReplayedCalls(_Program(log))
    a, b, out = _tensors(3)
    scales, others = tuple(_tensors(2)), tuple(_tensors(2))
    ptrs = tuple(t.data_ptr() for t in scales)
    calls(a, b, out, None, scales)
    assert log == [("direct", a.data_ptr(), out.data_ptr(), *ptrs)]
    log.clear()
    calls(a, b, out, None, scales)
    assert log == ["warm", "begin", ("capture", a.data_ptr(), out.data_ptr(), *ptrs), "end", "replay"]
    log.clear()
    calls(a, b, out, None, scales)
    assert log == ["replay"]
    log.clear()
    calls(a, b, out, None, others)
    assert ("capture", a.data_ptr(), out.data_ptr(), *(t.data_ptr() for t in others)) in log
    assert calls.captures == 2


def test_auto_passes_the_scales_while_sampling_and_once_replaying(log, monkeypatch):
    clock = _Clock(monkeypatch, log, direct_us=50.0, replayed_us=20.0)
    monkeypatch.setattr(replay, "_group_slowest", lambda program, values: values)
    choice = replay.LaunchChoice(_Program(log, clock=clock))
    a, b, out = _tensors(3)
    scales = tuple(_tensors(2))
    ptrs = tuple(t.data_ptr() for t in scales)
    for _ in range(replay.WARM + replay.SAMPLES):
        choice(a, b, out, None, scales)
    assert ("direct", a.data_ptr(), out.data_ptr(), *ptrs) in log
    assert ("capture", a.data_ptr(), out.data_ptr(), *ptrs) in log
    log.clear()
    choice(a, b, out, None, scales)
    assert log == ["replay"]


def test_a_program_whose_addresses_never_repeat_is_told_to_launch_directly(log, monkeypatch, caplog):
    monkeypatch.setattr(replay, "GRAPHS", 3)
    calls = replay.ReplayedCalls(_Program(log))
    b, out = torch.empty(4), torch.empty(4)
    inputs = _tensors(6)
    calls(inputs[0], b, out)  # direct
    with caplog.at_level("WARNING", logger="syncopate.kernels.replay"):
        for a in inputs[:3]:
            calls(a, b, out)
        assert not caplog.records
        calls(inputs[3], b, out)
        calls(inputs[4], b, out)
    assert len(caplog.records) == 1 and "set_launch('direct')" in caplog.records[0].getMessage()
    assert len(calls.graphs) == 3


def test_a_program_keeps_its_most_recently_used_graphs(log, monkeypatch):
    monkeypatch.setattr(replay, "GRAPHS", 8)
    program = _Program(log)
    calls = replay.ReplayedCalls(program)
    b = torch.empty(4)
    inputs = _tensors(replay.GRAPHS + 1)
    out = torch.empty(4)
    calls(inputs[0], b, out)  # direct
    for a in inputs:
        calls(a, b, out)
    assert len(calls.graphs) == replay.GRAPHS and calls.captures == replay.GRAPHS + 1
    kept = {key[0] for key in calls.graphs}
    assert inputs[0].data_ptr() not in kept and inputs[-1].data_ptr() in kept
    calls(inputs[1], b, out)  # still kept: replayed, now the most recent
    assert calls.captures == replay.GRAPHS + 1
    assert next(reversed(calls.graphs))[0] == inputs[1].data_ptr()


def test_a_failed_capture_reports_the_failure_and_keeps_no_graph(log):
    program = _Program(log, fail=True)
    calls = replay.ReplayedCalls(program)
    a, b, out = _tensors(3)
    calls(a, b, out)
    with pytest.raises(RuntimeError, match="the kernel failed"):
        calls(a, b, out)
    assert log[-1] == "end" and not calls.graphs


def _program_on(device: str, backend: str = "copy_engine"):
    return types.SimpleNamespace(
        context=types.SimpleNamespace(device=types.SimpleNamespace(type=device)),
        spec=types.SimpleNamespace(candidate=types.SimpleNamespace(backend=backend)),
    )


def test_only_fused_cuda_calls_without_nccl_or_bounded_waits_are_replayed():
    cuda, cpu = _program_on("cuda"), _program_on("cpu")
    unfused = types.SimpleNamespace(context=None)
    assert not replay.replayable(_program_on("cuda", "nccl"), 0)
    assert replay.replayable(_program_on("cuda", "sm_copy"), 0)
    assert replay.replayable(cuda, 0)
    assert not replay.replayable(cuda, 1000)
    assert not replay.replayable(cpu, 0)
    assert not replay.replayable(unfused, 0)


def test_set_launch_takes_auto_graph_or_direct():
    from syncopate.kernels import ops

    assert ops.get_launch() == "auto"
    ops.set_launch("direct")
    try:
        assert ops.get_launch() == "direct"
    finally:
        ops.set_launch("auto")
    with pytest.raises(ConfigError, match="launch 'graphs': accepted are auto, graph, direct"):
        ops.set_launch("graphs")


def test_auto_times_both_ways_in_turn_then_the_group_decides_once(log, monkeypatch, caplog):
    """Direct calls through the warm-up, then direct calls and replays in turn, each timed; a replay
    that captured is not counted; the group's slowest medians decide, once, and say so: replays
    where they are faster there, else direct calls (the graphs dropped)."""
    for direct_us, replayed_us, elsewhere, replays in (
        (50.0, 20.0, None, True),
        (20.0, 50.0, None, False),
        (50.0, 20.0, (40.0, 60.0), False),  # another rank's replays are slower: the group's say
    ):
        log.clear()
        caplog.clear()
        caplog.set_level("INFO", logger="syncopate.kernels.replay")
        clock = _Clock(
            monkeypatch, log, direct_us, replayed_us, direct_host_us=5.0
        )  # the device sets the pace
        asked = []

        def group(program, values, asked=asked, elsewhere=elsewhere):
            asked.append(list(values))
            return (
                values
                if elsewhere is None
                else [max(v, o) for v, o in zip(values, [*elsewhere, *values[2:]])]
            )

        monkeypatch.setattr(replay, "_group_slowest", group)
        choice = replay.LaunchChoice(_Program(log, clock=clock))
        a, b, out = _tensors(3)
        for _ in range(replay.WARM):
            choice(a, b, out)
        assert log == [("direct", a.data_ptr(), out.data_ptr())] * replay.WARM
        log.clear()
        for _ in range(replay.SAMPLES):
            choice(a, b, out)
        # in turn: a direct call, then a replay (the first one captures its graph first)
        assert log[0] == ("direct", a.data_ptr(), out.data_ptr())
        assert log[1:6] == ["warm", "begin", ("capture", a.data_ptr(), out.data_ptr()), "end", "replay"]
        assert log.count("replay") == replay.SAMPLES // 2
        # the capture's call left out of the replays' times
        assert asked == [[direct_us, replayed_us, 5.0, 20.0]]
        log.clear()
        choice(a, b, out)
        choice(a, b, out)
        assert len(asked) == 1 and choice.decided  # decided once
        said = [r.getMessage() for r in caplog.records if r.name == "syncopate.kernels.replay"]
        how = "replayed from graphs of its own" if replays else "launched directly"
        figures = [direct_us, replayed_us] if elsewhere is None else [max(direct_us, 40.0), 60.0]
        assert said == [
            f"syncopate.all_gather_matmul (a 2048x4096, b 4096x1536, copy_engine/ring/s1) {how} from now on: "
            f"{figures[0]:.1f} us a call launched directly (5.0 us of host time), {figures[1]:.1f} us "
            f"replayed (20.0 us of host time; the medians of {replay.SAMPLES} calls timed in turn, the group's "
            "slowest rank; syncopate.set_launch('direct' or 'graph') decides it instead)"
        ]
        assert [choice.figures["direct_us"], choice.figures["replayed_us"]] == figures
        if replays:
            assert log == ["replay", "replay"]
        else:
            assert log == [("direct", a.data_ptr(), out.data_ptr())] * 2 and choice.replayed is None


def test_auto_replays_where_a_direct_call_takes_the_host_half_the_calls_time_or_more(log, monkeypatch):
    """Direct calls that hold the stream less are kept only while their host time stays under
    `HOST_SHARE` of the faster way's time on the stream: past it the host sets a job's pace (and
    the group's, every rank waiting for the slowest host), which one rank's stream does not show."""
    monkeypatch.setattr(replay, "_group_slowest", lambda program, values: values)
    for direct_host_us, replays in ((40.0, False), (49.5, False), (50.0, True), (300.0, True)):
        log.clear()
        clock = _Clock(monkeypatch, log, direct_us=100.0, replayed_us=110.0, direct_host_us=direct_host_us)
        choice = replay.LaunchChoice(_Program(log, clock=clock))
        a, b, out = _tensors(3)
        for _ in range(replay.WARM + replay.SAMPLES):
            choice(a, b, out)
        assert choice.decided and (choice.replayed is not None) == replays, direct_host_us
        assert choice.figures == {
            "direct_us": 100.0,
            "replayed_us": 110.0,
            "direct_host_us": pytest.approx(direct_host_us),
            "replayed_host_us": 20.0,
        }


def test_a_program_whose_replays_all_capture_stays_direct(log, monkeypatch):
    """New addresses at every replayed call: every replay captures, none is timed, and the program
    stays direct (its replays count as infinitely slow)."""
    clock = _Clock(monkeypatch, log, direct_us=50.0, replayed_us=20.0)
    asked = []
    monkeypatch.setattr(replay, "_group_slowest", lambda program, values: asked.append(values) or values)
    choice = replay.LaunchChoice(_Program(log, clock=clock))
    b = torch.empty(4)
    for _ in range(replay.WARM + replay.SAMPLES):
        choice(torch.empty(4), b, torch.empty(4))
    assert asked[0][:2] == [50.0, float("inf")] and choice.replayed is None


def _share_rank(rank, world, init, q):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        program = types.SimpleNamespace(
            context=types.SimpleNamespace(device=torch.device("cpu")),
            spec=types.SimpleNamespace(group=dist.group.WORLD),
        )
        q.put((rank, replay._group_slowest(program, [[0.25, 3.0], [0.75, 1.0]][rank])))
    finally:
        dist.destroy_process_group()


def test_the_group_agrees_on_the_slowest_ranks_times():
    from support.gloo import run_gloo

    assert dict(run_gloo(_share_rank, 2)) == {0: [0.75, 3.0], 1: [0.75, 3.0]}


def test_set_launch_drops_what_the_last_setting_kept_and_launch_choices_counts_the_choices(monkeypatch):
    """A new setting drops each program's graphs and `auto`'s choice, so `auto` samples afresh;
    `launch_choices` counts the replayable programs by how they are launched now."""
    from syncopate.kernels import ops

    def program(decided=None):
        p = types.SimpleNamespace(
            context=types.SimpleNamespace(device=types.SimpleNamespace(type="cuda")),
            spec=types.SimpleNamespace(candidate=types.SimpleNamespace(backend="copy_engine")),
        )
        if decided is not None:
            choice = replay.LaunchChoice(p)
            choice.decided = decided != "sampling"
            choice.replayed = object() if decided == "replayed" else None
            p.launch_auto = choice
        return p

    kept = {
        "a": program("replayed"),
        "b": program("direct"),
        "c": program("sampling"),
        "d": program(),
        "nccl": types.SimpleNamespace(
            context=types.SimpleNamespace(device=types.SimpleNamespace(type="cuda")),
            spec=types.SimpleNamespace(candidate=types.SimpleNamespace(backend="nccl")),
        ),
    }
    kept["b"].launch_graph = object()
    monkeypatch.setattr(ops._REGISTRY, "programs", kept)
    assert ops.launch_choices() == {"replayed": 1, "direct": 1, "sampling": 2}
    ops.set_launch("direct")
    try:
        assert not any(hasattr(p, "launch_auto") or hasattr(p, "launch_graph") for p in kept.values())
        assert ops.launch_choices() == {"replayed": 0, "direct": 4, "sampling": 0}
        ops.set_launch("graph")
        assert ops.launch_choices() == {"replayed": 4, "direct": 0, "sampling": 0}
    finally:
        ops.set_launch("auto")
    assert ops.launch_choices() == {"replayed": 0, "direct": 0, "sampling": 4}


def test_a_graph_of_tensor_wise_scales_is_not_replayed_for_row_wise_ones_at_the_same_address(log):
    calls = replay.ReplayedCalls(_Program(log))
    a, b, out = _tensors(3)
    storage = torch.empty(8)
    tensor_wise = (storage[:1], storage[4:5])
    row_wise = (storage[:4], storage[4:8])  # at the same addresses, more elements
    calls(a, b, out, None, tensor_wise)  # direct
    calls(a, b, out, None, tensor_wise)  # captured
    log.clear()
    calls(a, b, out, None, row_wise)
    assert "begin" in log and calls.captures == 2


def test_a_program_prepared_while_auto_samples_restarts_the_count(log, monkeypatch):
    """A job's first step prepares its programs one after another: a preparation anywhere restarts
    the count of a program still deciding, so its timed calls come after the warm-up; once decided,
    a preparation changes nothing."""
    clock = _Clock(monkeypatch, log, direct_us=50.0, replayed_us=20.0)
    asked = []
    monkeypatch.setattr(replay, "_group_slowest", lambda program, values: asked.append(values) or values)
    choice = replay.LaunchChoice(_Program(log, clock=clock))
    a, b, out = _tensors(3)
    for _ in range(replay.WARM + replay.SAMPLES - 1):
        choice(a, b, out)
    replay.note_prepared()  # another shape's first call, one call short of the decision
    for _ in range(replay.WARM + replay.SAMPLES - 1):
        choice(a, b, out)
    assert not choice.decided and not asked
    choice(a, b, out)
    assert choice.decided and [v[:2] for v in asked] == [[50.0, 20.0]]
    replay.note_prepared()
    log.clear()
    choice(a, b, out)
    assert log == ["replay"] and len(asked) == 1


def test_launch_report_says_how_each_program_is_launched_and_on_what_figures(monkeypatch):
    """One row a replayable program: its op, shapes and configuration, how `auto` launches it, and
    the medians it decided on; `graph` and `direct` name their launch for every program."""
    from syncopate.kernels import ops

    def program(op, decided=None, figures=None, backend="copy_engine"):
        p = types.SimpleNamespace(
            context=types.SimpleNamespace(device=types.SimpleNamespace(type="cuda")),
            spec=types.SimpleNamespace(
                op=op,
                a_shape=(512, 4096),
                b_shape=(4096, 7168),
                candidate=types.SimpleNamespace(backend=backend, short=lambda: f"{backend}/direct/s1"),
            ),
        )
        if decided is not None:
            choice = replay.LaunchChoice(p)
            choice.decided = decided != "sampling"
            choice.replayed = object() if decided == "replayed" else None
            choice.figures = figures
            p.launch_auto = choice
        return p

    kept = {
        "a": program("all_gather_matmul", "replayed", dict(zip(replay.FIGURES, (180.0, 120.5, 300.0, 20.0)))),
        "b": program("matmul_reduce_scatter", "direct", dict(zip(replay.FIGURES, (90.0, 95.0, 30.0, 20.0)))),
        "c": program("matmul_all_reduce", "sampling"),
        "captured": program("all_gather_matmul"),  # never called outside a capture: no row under auto
        "nccl": program("all_gather_matmul", backend="nccl"),
    }
    monkeypatch.setattr(ops._REGISTRY, "programs", kept)
    report = ops.launch_report()
    assert [r["launch"] for r in report] == ["replayed", "direct", "sampling"]
    assert report[0] == {
        "op": "all_gather_matmul",
        "a": [512, 4096],
        "b": [4096, 7168],
        "config": "copy_engine/direct/s1",
        "launch": "replayed",
        "direct_us": 180.0,
        "replayed_us": 120.5,
        "direct_host_us": 300.0,
        "replayed_host_us": 20.0,
    }
    assert "direct_us" not in report[2]
    ops.set_launch("graph")
    try:
        assert [r["launch"] for r in ops.launch_report()] == ["replayed"] * 4
    finally:
        ops.set_launch("auto")


def test_a_graph_without_fast_accumulation_is_not_replayed_for_a_call_asking_for_it(log):
    from syncopate.kernels.scaled import Scales

    calls = replay.ReplayedCalls(_Program(log))
    a, b, out = _tensors(3)
    a_scale, b_scale = _tensors(2)
    calls(a, b, out, None, (a_scale, b_scale))  # direct
    calls(a, b, out, None, (a_scale, b_scale))  # captured
    calls(a, b, out, None, Scales(a_scale, b_scale))  # the same call: replayed
    assert calls.captures == 1
    calls(a, b, out, None, Scales(a_scale, b_scale, True))  # the same addresses, fast accumulation
    assert calls.captures == 2
