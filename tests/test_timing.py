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
