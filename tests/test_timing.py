"""How a repetition's start is lined up across ranks (`syncopate.measure.timing.start_together`)."""

import pytest
import torch

from syncopate.measure import timing


@pytest.fixture
def calls(monkeypatch):
    """What start_together enqueues, in order, with the GPU calls replaced by records."""
    seen = []
    monkeypatch.setattr(timing, "barrier", lambda group, device: seen.append("barrier"))
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: seen.append(("sleep", cycles)))
    monkeypatch.setattr(
        timing.dist, "all_reduce", lambda t, group=None: seen.append(("all_reduce", tuple(t.shape)))
    )
    monkeypatch.setattr(timing, "_tokens", {})
    return seen


def test_the_gpus_meet_after_the_sleep(calls):
    timing.start_together(None, torch.device("cpu"), sleep_us=1000.0)
    assert calls == ["barrier", ("sleep", 2_000_000), ("all_reduce", (1,))]


def test_the_token_is_made_once_per_device(calls):
    for _ in range(3):
        timing.start_together(None, torch.device("cpu"))
    assert list(timing._tokens) == [torch.device("cpu")]
    assert calls.count(("all_reduce", (1,))) == 3


def test_host_time_is_the_median_batch_under_a_sleep_that_outlasts_it(monkeypatch):
    """`time_host`: warm-up calls, one call to size the sleep, then each batch of `calls` calls
    enqueued under a device sleep of at least twice the batch's expected enqueue (cycles at 2 GHz,
    never below a millisecond), growing with the slowest call seen; the median batch's µs a call."""
    seen = []
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: seen.append(("sleep", cycles)))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: seen.append("sync"))
    clock = iter([0.0, 50e-6] + [t for b in (100e-6, 300e-6, 200e-6) for t in (0.0, b * 4)])
    monkeypatch.setattr(timing.time, "perf_counter", lambda: next(clock))
    got = timing.time_host(lambda: seen.append("call"), calls=4, batches=3, warmup=2)
    assert got == pytest.approx(200.0)  # the batches' µs a call: 100, 300, 200
    sleeps = [c for c in seen if isinstance(c, tuple)]
    assert sleeps == [("sleep", 2_000_000), ("sleep", 2_000_000), ("sleep", 4_800_000)]
    assert seen.count("call") == 2 + 1 + 3 * 4


def test_side_by_side_interleaves_the_repetitions_turning_the_order_each_round(monkeypatch):
    """`time_eager_side_by_side`: every function's warm-up first, then round r times one repetition
    of each, the order turned by r places; each repetition's time is its own function's (its
    calls' span over `calls`), the slowest rank's."""
    seen = []
    clock = iter(range(0, 10_000, 1))

    class Event:
        def __init__(self, enable_timing=False):
            self.t = None

        def record(self):
            self.t = next(clock)

        def elapsed_time(self, other):  # ms
            return (other.t - self.t) / 1000.0

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(timing, "barrier", lambda group, device: seen.append("barrier"))
    monkeypatch.setattr(timing, "_flush", lambda device, flush_l2: lambda: None)
    monkeypatch.setattr(timing, "slowest", lambda xs, group, device: [x * 2 for x in xs])

    def fn(name, ticks):
        def call():
            seen.append(name)
            for _ in range(ticks):
                next(clock)

        return call

    got = timing.time_eager_side_by_side(
        {"a": fn("a", 3), "b": fn("b", 5), "c": fn("c", 7)}, None, calls=2, warmup=1, repetitions=4
    )
    calls = [s for s in seen if s != "barrier"]
    assert calls[:3] == ["a", "b", "c"]  # warm-ups
    rounds = [calls[3 + 6 * r : 3 + 6 * (r + 1) : 2] for r in range(4)]
    assert rounds == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]
    assert seen.count("barrier") == 12
    # a repetition spans its two calls' ticks and the end event's: (2 · ticks + 1) µs over 2 calls, doubled
    assert got == {name: (2 * ticks + 1,) * 4 for name, ticks in (("a", 3), ("b", 5), ("c", 7))}


def test_time_eager_is_the_side_by_side_timing_of_one_function(monkeypatch):
    got = {}

    def fake(fns, group, **kw):
        got.update(kw)
        return {name: (1.0,) for name in fns}

    monkeypatch.setattr(timing, "time_eager_side_by_side", fake)
    assert timing.time_eager(lambda: None, None, calls=4, warmup=2, repetitions=3) == (1.0,)
    assert got == {"calls": 4, "warmup": 2, "repetitions": 3, "flush_l2": True}
