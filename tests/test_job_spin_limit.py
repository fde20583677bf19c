"""Layer: pure CPU. SYNCOPATE_SPIN_LIMIT: read as a poll count, refused with what it takes; a call
it bounds raises the timeout of its context with the op, the setting and what to make of it, and
one whose streams are still held by their waits after the limit (as microseconds) names the words
and releases them before it raises. The tuner's verification bounds its candidates' stream waits
the same way, by its own spin limit, and starts the next candidate on fresh contexts."""

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
        ops.check_waits(program.context, "syncopate.matmul_reduce_scatter", 64, [])
    said = str(e.value)
    assert said.startswith(f"syncopate.matmul_reduce_scatter ({SPIN_LIMIT_VAR}=64): a fused kernel waited")
    assert "output is not valid" in said and "must make the same fused calls in the same order" in said
    ops.check_waits(SimpleNamespace(check_error=lambda: None), "syncopate.x", 64, [])


class Call:
    """A call's end as the host sees it: not done until its held words are released, and then
    only after `slow` more queries (`drained` once it is done). Nothing may block on it."""

    def __init__(self, held: list[str], slow: int = 0) -> None:
        self.held, self.slow = held, slow
        self.released = self.checked = 0
        self.drained = False

    def query(self) -> bool:
        if self.held:
            return False
        self.slow -= 1
        self.drained = self.slow < 0
        return self.drained

    def synchronize(self) -> None:
        raise AssertionError("blocked on the call: a stream still held would hang the job here")

    def release_waits(self, waits):
        self.released += 1
        held, self.held = self.held, []
        return held

    def check_error(self) -> None:
        self.checked += 1


def test_a_call_whose_streams_are_held_past_the_limit_names_the_words_and_releases_them():
    call = Call(["word 3 of rank 1's signal pad (...)", "word 4 of rank 1's signal pad (...)"])
    with pytest.raises(CandidateTimeoutError) as e:
        ops.check_waits(call, "syncopate.all_gather_matmul", 64, [(0x10, 5)], done=call)
    said = str(e.value)
    assert said.startswith(f"syncopate.all_gather_matmul ({SPIN_LIMIT_VAR}=64): a stream of the call waited")
    assert "longer than 64 µs for word 3 of rank 1's signal pad" in said and "1 more word(s)" in said
    assert "output is not valid" in said
    assert call.released == 1 and call.drained  # released, then the device drained


def test_the_calls_waiting_on_one_word_are_released_by_its_latest_value():
    from syncopate.kernels.context import _waited_words

    signals = SimpleNamespace(peer_ptrs=[0x1000, 0x9000])
    waits = [(0x100C, 5), (0x9008, 2), (0x100C, 7), (0x100C, 6), (0x5000, 9)]  # three calls' epochs on word 3
    assert _waited_words(signals, waits) == {0x100C: (7, 0, 3), 0x9008: (2, 1, 2)}  # not in a pad: left
    wrapped = [(0x100C, 0xFFFFFFFF), (0x100C, 0), (0x100C, 1)]  # the epoch wraps: 1 is the latest
    assert _waited_words(signals, wrapped) == {0x100C: (1, 0, 3)}


def test_a_call_that_is_slow_but_not_held_is_waited_for_and_its_kernels_checked():
    call = Call([], slow=50)
    ops.check_waits(call, "syncopate.matmul_reduce_scatter", 1, [(0x10, 5)], done=call)
    assert call.released >= 1 and call.slow < 0 and call.checked == 1
    call = Call(["word 3"])  # no stream waits (a kernel template): nothing to release, the kernels checked
    ops.check_waits(call, "syncopate.matmul_reduce_scatter", 1, [], done=call)
    assert call.released == 0 and call.checked == 1


def test_an_moe_call_is_bounded_where_its_plan_waits_on_signal_words(monkeypatch):
    from syncopate.moe import ops as moe_ops
    from syncopate.search_space.moe_workload import MoeCandidate

    monkeypatch.setenv(SPIN_LIMIT_VAR, "64")
    cpu = torch.zeros(2)
    assert moe_ops._job_spin(cpu, MoeCandidate(template="fused", backend="copy_engine")) == 0  # on the CPU
    gpu = SimpleNamespace(device=torch.device("cuda", 0))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    for config, bounded in [
        (MoeCandidate(template="fused", backend="copy_engine"), True),
        (MoeCandidate(template="pipelined", backend="copy_engine"), True),
        (MoeCandidate(template="pipelined", backend="nccl"), False),  # NCCL's waits: its own watchdog
        (MoeCandidate(), False),  # unfused
    ]:
        assert moe_ops._job_spin(gpu, config) == (64 if bounded else 0), config


def test_an_moe_call_bounds_its_kernels_and_checks_its_groups_contexts(monkeypatch):
    from syncopate.kernels import ops as dense_ops
    from syncopate.kernels import streamops
    from syncopate.moe import exchange
    from syncopate.moe import ops as moe_ops

    class Context:
        def __init__(self, error: str = "") -> None:
            self.error, self.read = error, 0

        def release_waits(self, waits):
            return []

        def check_error(self) -> None:
            self.read += 1
            if self.error:
                raise CandidateTimeoutError(self.error)

    contexts = [Context(), Context("a fused kernel waited ... word 3"), Context("... word 4")]
    monkeypatch.setattr(exchange.CONTEXTS, "of", lambda group: contexts)
    monkeypatch.setattr(streamops, "_driver", lambda: SimpleNamespace(wait=lambda *a: 0))
    seen = {}

    def checked(ctx, op, limit, waits, done=None):
        seen.update(ctx=ctx, op=op, limit=limit, waits=list(waits))

    monkeypatch.setattr(dense_ops, "check_waits", checked)

    def call():
        seen["bound"] = exchange.job_bound.limit  # what the fused kernels are launched with
        streamops.wait_value(0, 0x40, 6)
        return "rows"

    assert moe_ops._bounded("syncopate.moe.gemm_combine", object(), 64, call) == "rows"
    assert seen["bound"] == 64 and exchange.job_bound.limit == 0  # set for the call only
    assert seen["op"] == "syncopate.moe.gemm_combine" and seen["limit"] == 64 and seen["waits"] == [(0x40, 6)]
    with pytest.raises(CandidateTimeoutError, match="word 3"):
        seen["ctx"].check_error()
    assert [c.read for c in contexts] == [1, 1, 1] and not seen["ctx"].release_waits([])  # every one read


def _verifying_harness(monkeypatch, held: list[str]):
    """A dense-op Harness on the CPU whose candidate's calls each enqueue a stream wait (the
    driver faked) and whose context (`ops.call_context`) is a `Call` holding `held` words; the
    references are the outputs themselves, and the ranks agree with this one."""
    from syncopate.kernels import streamops
    from syncopate.measure import harness as hm
    from syncopate.search_space import Workload

    call = Call(held)
    call.record = lambda: None
    monkeypatch.setattr(streamops, "_driver", lambda: SimpleNamespace(wait=lambda *a: 0))
    monkeypatch.setattr(torch.cuda, "Event", lambda: call)  # the calls' end as the host waits for it
    looked_up = []
    monkeypatch.setattr(ops, "call_context", lambda *a: looked_up.append(a) or call)
    closed = []
    monkeypatch.setattr(ops, "close_contexts", lambda group=None: closed.append(group))
    references = []

    def reference(kind, a, b, group, *scales):
        references.append(kind)  # collective: every rank makes them, timed out or not
        return a.float() @ b.float()

    monkeypatch.setattr(hm, "reference", reference)

    h = object.__new__(hm.Harness)
    h.workload, h.group, h.scaled = Workload(kind="gemm_ar", shape=(8, 4, 4), dtype="bf16"), "g", False
    h.device, h.out_dtype = torch.device("cpu"), torch.bfloat16
    h.shapes = {"out": (8, 4)}
    h.a, h.b, h.scales = torch.ones(8, 4, dtype=torch.bfloat16), torch.ones(4, 4, dtype=torch.bfloat16), None
    h.fresh_inputs = lambda: (h.a, h.b, None)
    h._poison = lambda: None
    h._agree = lambda status: status

    epochs = iter(range(7, 100))

    def op(candidate, spin_limit=0):
        def fused(a, b, out=None, scales=None):
            streamops.wait_value(0, 0x40, next(epochs))  # a copy-engine stream waits for a peer's word
            return (a @ b) if out is None else out.copy_(a @ b)

        return fused

    def timing(fn):
        fn()
        return SimpleNamespace(samples_us=(10.0,))

    h.op, h._timing = op, timing
    h._as_a_job = lambda *a: (1.0, 11.0)
    call.references, call.looked_up = references, looked_up
    return h, call, closed


def test_the_tuners_verification_bounds_its_stream_waits_and_the_next_candidate_starts_fresh(monkeypatch):
    from syncopate.measure.harness import SPIN_LIMIT
    from syncopate.search_space import decomposed_candidate

    word = "word 1025 of rank 0's signal pad (rank 1's entry into the call), which reads 5 now"
    h, call, closed = _verifying_harness(monkeypatch, [word])
    cand = decomposed_candidate(2)
    result = h.run_candidate(cand)
    assert result.status == "timeout" and not result.samples_us
    assert result.error.startswith(
        f"CandidateTimeoutError: during verification, candidate {cand.short()} (the tuner's spin limit, "
        f"{SPIN_LIMIT}): a stream of the call waited longer than {SPIN_LIMIT} µs for {word}"
    ), result.error
    assert "the sweep goes on" in result.error and SPIN_LIMIT_VAR not in result.error
    assert call.released == 1 and call.drained  # released before anything waited on the device
    assert len(call.references) == 3  # and the references made as on a rank that did not time out
    assert closed == ["g"]  # the next candidate gets fresh contexts: late copies cannot reach it


def test_the_tuners_verification_and_timing_check_the_candidates_own_context(monkeypatch):
    from syncopate.search_space import decomposed_candidate

    h, call, closed = _verifying_harness(monkeypatch, [])
    cand = decomposed_candidate(2)
    result = h.run_candidate(cand)
    assert result.status == "ok" and result.max_rel_error == 0 and result.samples_us == (10.0,)
    assert call.checked == 2 and closed == []  # after the verification, and after the timed calls
    assert call.looked_up == [("gemm_ar", h.a, h.b, "g", cand)] * 2  # the candidate's own calls' context


@pytest.mark.parametrize("second", ["timeout", "oom"])
def test_the_tuners_moe_verification_bounds_each_call_and_makes_every_call_before_it_raises(
    monkeypatch, second
):
    from syncopate.measure import moe as measure_moe
    from syncopate.search_space.moe_workload import MoeCandidate

    made, seen, agreed = [], [], []

    def op(a, wt, gates, layout, group, out, config):
        made.append(config)
        out.fill_(1.0)

    def bounded(op, group, limit, call, **said):
        seen.append((op, limit, said["setting"]))
        call()
        if len(seen) == 2:  # the first routing's second call ran out, or raised
            if second == "oom":
                raise torch.cuda.OutOfMemoryError("CUDA out of memory")
            raise CandidateTimeoutError(
                "candidate …: a stream of the call waited longer than 1000 µs for word 3"
            )

    monkeypatch.setattr(measure_moe, "moe_op", lambda kind: op)
    monkeypatch.setattr(measure_moe, "waits_on_words", lambda a, config: True)  # as a GPU call's plan
    monkeypatch.setattr(measure_moe, "_bounded", bounded)
    monkeypatch.setattr(measure_moe, "out_shape", lambda kind, w, layout: (2, 2))
    monkeypatch.setattr(measure_moe, "worst_over_ranks", lambda value, case: agreed.append(value) or value)
    case = SimpleNamespace(w=None, dtype=torch.float32, device=torch.device("cpu"), group="g")
    routing = (None, None, None, [(torch.zeros(1), None)] * 2, [torch.ones(2, 2)] * 2)
    config = MoeCandidate(template="fused", backend="copy_engine")
    with pytest.raises((CandidateTimeoutError, torch.cuda.OutOfMemoryError)) as e:
        measure_moe.check_config("a2a_gemm", config, case, [routing, routing], 1000)
    if second == "timeout":
        assert str(e.value).startswith("during verification, candidate …: a stream of the call waited")
    else:
        assert isinstance(e.value, torch.cuda.OutOfMemoryError)
    # every call made (the other ranks wait for them), those after the failure given up at once,
    # and the worst error agreed first
    assert len(made) == 4 and [s[1] for s in seen] == [1000, 1000, 64, 64] and agreed == [0.0]
    assert seen[0][0] == f"candidate {config.short()}" and seen[0][2] == "the tuner's spin limit, 1000"


def test_an_moe_candidate_that_timed_out_leaves_fresh_contexts_for_the_next(monkeypatch):
    from syncopate.measure import moe as measure_moe
    from syncopate.search_space.moe_workload import MoeCandidate

    def timed_out(*a):
        raise CandidateTimeoutError("during verification, candidate …: … word 3")

    monkeypatch.setattr(measure_moe, "check_config", timed_out)
    monkeypatch.setattr(measure_moe, "check_moe_candidate", lambda c, ws: None)
    h = object.__new__(measure_moe.MoeHarness)
    closed = []
    h.kind, h._prepared, h.case = "a2a_gemm", [], SimpleNamespace(ws=2)
    h._agree, h.close = (lambda status: status), (lambda: closed.append(True))
    result = h.run_candidate(MoeCandidate(template="fused", backend="copy_engine"))
    assert result.status == "timeout" and "word 3" in result.error and closed == [True]
