"""Unit: what a candidate's timings call (`syncopate.measure.harness.Harness.run_candidate`): the
device time through bounded waits (the tuning run's guard), the host and eager times through the
call a job makes (unbounded waits, the fast path, launched directly); with the op, the timing
methods and the group stood in for (the GPU suite runs the real ones)."""

from __future__ import annotations

import types

import pytest

from syncopate.errors import CandidateTimeoutError
from syncopate.kernels import ops
from syncopate.measure import harness as harness_mod
from syncopate.measure.harness import SPIN_LIMIT, Harness
from syncopate.search_space import Candidate, Shape, Workload


def _harness(monkeypatch, calls: list, fail_check: bool = False, eager_us=None) -> Harness:
    eager_us = eager_us or {"direct": 12.0, "graph": 13.0}
    h = object.__new__(Harness)
    h.workload = Workload(kind="gemm_rs", shape=Shape(m=64, n=32, k=16), dtype="bf16")
    h.scaled = False
    h.a, h.b, h.scales = "a", "b", None

    def fused(a, b, group, config, *, out=None, spin_limit=0):
        calls.append(("call", spin_limit, out, ops.get_launch()))

    monkeypatch.setattr(ops, "matmul_reduce_scatter", fused)
    h.group = None
    h.verify = lambda candidate: 0.0
    h._agree = lambda status: status

    def timing(fn):
        calls.append("timing")
        fn()
        return types.SimpleNamespace(samples_us=(10.0, 11.0), host_us=70.0)

    def host(fn):
        calls.append("host")
        fn()
        return {"direct": 7.0, "graph": 3.0}[ops.get_launch()]

    def eager(fn):
        calls.append("eager")
        fn()
        return eager_us[ops.get_launch()]

    def check_error():
        calls.append("check_error")
        if fail_check:
            raise CandidateTimeoutError("a wait ran out of its spin limit")

    h._timing = timing
    h._host = host
    h._eager = eager
    monkeypatch.setattr(ops, "call_context", lambda *a: types.SimpleNamespace(check_error=check_error))
    monkeypatch.setattr(ops, "close_contexts", lambda group=None: calls.append("close_contexts"))
    return h


def test_device_time_is_guarded_and_host_and_eager_times_are_a_jobs_call(monkeypatch):
    calls: list = []
    h = _harness(monkeypatch, calls)
    cand = Candidate.from_dict({"backend": "copy_engine", "template": "direct", "num_splits": 2})
    result = h.run_candidate(cand)
    assert result.status == "ok" and result.samples_us == (10.0, 11.0) and result.eager_us == 12.0
    assert calls == [
        "timing",
        ("call", SPIN_LIMIT, None, "auto"),  # the device time: bounded waits
        "check_error",  # a wait that ran out is caught before any unbounded call
        "host",
        ("call", 0, None, "direct"),  # the host time: a job's call, launched directly
        "eager",
        ("call", 0, None, "direct"),
        "host",
        ("call", 0, None, "graph"),  # and replayed from a graph of its own
        "eager",
        ("call", 0, None, "graph"),
    ]
    assert result.host_us == 7.0  # the job call's (`time_host`), not the bounded call's; the faster way's
    assert ops.get_launch() == "auto"  # the launch setting is given back


def test_the_eager_time_is_the_faster_ways_and_nccl_candidates_are_only_launched_directly(monkeypatch):
    calls: list = []
    h = _harness(monkeypatch, calls, eager_us={"direct": 12.0, "graph": 9.0})
    result = h.run_candidate(Candidate.from_dict({"backend": "copy_engine", "template": "direct"}))
    assert (result.eager_us, result.host_us) == (9.0, 3.0)  # replayed: its eager and host times
    for cand in (
        Candidate.from_dict({"backend": "nccl", "template": "direct", "comm_sms": 8}),
        Candidate.from_dict({"backend": "nccl", "template": "unfused"}),
    ):
        calls.clear()
        result = h.run_candidate(cand)
        assert (result.eager_us, result.host_us) == (12.0, 7.0)
        assert [c[3] for c in calls if isinstance(c, tuple) and c[1] == 0] == ["direct", "direct"]


def test_a_wait_that_ran_out_is_a_timeout_and_no_unbounded_call_is_made(monkeypatch):
    calls: list = []
    h = _harness(monkeypatch, calls, fail_check=True)
    cand = Candidate.from_dict({"backend": "copy_engine", "template": "direct", "num_splits": 2})
    result = h.run_candidate(cand)
    assert result.status == "timeout" and "spin limit" in result.error
    assert all(c[1] == SPIN_LIMIT for c in calls if isinstance(c, tuple))
    assert calls[-1] == "close_contexts"  # the next candidate starts on fresh contexts
    assert ops.get_launch() == "auto"


@pytest.mark.parametrize("launch", ["graph", "direct"])
def test_the_callers_launch_setting_survives_a_measurement(monkeypatch, launch):
    calls: list = []
    h = _harness(monkeypatch, calls)
    ops.set_launch(launch)
    try:
        h.run_candidate(
            Candidate.from_dict({"backend": "copy_engine", "template": "direct", "num_splits": 2})
        )
        assert ops.get_launch() == launch
    finally:
        ops.set_launch("auto")
    assert harness_mod.SPIN_LIMIT > 0


def test_a_rank_that_timed_out_while_timing_stops_every_rank_before_the_jobs_calls(monkeypatch):
    """This rank's timed calls went well; another's ran out (the agreed status says so): no rank
    goes on to the job's calls (host and eager times, collective), the contexts are closed."""
    calls: list = []
    h = _harness(monkeypatch, calls)
    agreed = iter(["ok", "timeout"])  # after verifying, after the timed calls
    h._agree = lambda status: next(agreed)
    result = h.run_candidate(Candidate.from_dict({"backend": "copy_engine", "template": "direct"}))
    assert result.status == "timeout" and result.error == "failed on another rank"
    assert "host" not in calls and "eager" not in calls and calls[-1] == "close_contexts"
