"""Layer: pure CPU. SYNCOPATE_SPIN_LIMIT: read as a poll count, refused with what it takes; a call
it bounds raises the timeout of its context with the op, the setting and what to make of it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from syncopate.environment import SPIN_LIMIT_VAR, job_spin_limit
from syncopate.errors import CandidateTimeoutError, ConfigError
from syncopate.kernels import ops


@pytest.mark.parametrize("raw, polls", [(None, 0), ("", 0), ("0", 0), (" 64 ", 64), ("16777216", 1 << 24)])
def test_the_setting_reads_as_a_poll_count(raw, polls):
    env = {} if raw is None else {SPIN_LIMIT_VAR: raw}
    assert job_spin_limit(env) == polls


@pytest.mark.parametrize("raw", ["-1", "1e6", "a lot", str(1 << 31)])
def test_anything_else_is_refused_naming_it_and_what_it_takes(raw):
    with pytest.raises(ConfigError) as e:
        job_spin_limit({SPIN_LIMIT_VAR: raw})
    assert f"{SPIN_LIMIT_VAR}={raw!r}" in str(e.value) and "number of polls" in str(e.value)


def test_a_call_on_cpu_tensors_or_with_its_own_limit_is_not_bounded_by_the_setting(monkeypatch):
    monkeypatch.setenv(SPIN_LIMIT_VAR, "64")
    assert ops._checked_spin(torch.zeros(2), 0) == 0  # the ops refuse CPU tensors anyway
    assert ops._checked_spin(torch.zeros(2), 5) == 0


def test_a_bounded_call_raises_its_contexts_timeout_with_the_op_and_the_setting():
    def timed_out():
        raise CandidateTimeoutError("a fused kernel waited longer than its spin limit for word 1025 of ...")

    program = SimpleNamespace(context=SimpleNamespace(check_error=timed_out))
    with pytest.raises(CandidateTimeoutError) as e:
        ops._check_waits(program, "matmul_reduce_scatter", 64)
    said = str(e.value)
    assert said.startswith(f"syncopate.matmul_reduce_scatter ({SPIN_LIMIT_VAR}=64): a fused kernel waited")
    assert "output is not valid" in said and "must make the same fused calls in the same order" in said
    ops._check_waits(SimpleNamespace(context=SimpleNamespace(check_error=lambda: None)), "x", 64)
