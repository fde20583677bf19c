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
