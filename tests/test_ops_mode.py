"""Which configuration mode a fused op's call looks up (CPU, a gloo group of one rank): `eager`
outside a CUDA graph capture unless `set_mode` says otherwise, `graph` while capturing, and a
capture whose graph-mode program was never prepared takes the eager one rather than refusing.
Preparing a program needs a GPU, so `_prepare` is replaced here by one that records its mode."""

from __future__ import annotations

import sys
import types

import pytest
import torch
import torch.distributed as dist

from syncopate.errors import ConfigError
from syncopate.kernels import ops


@pytest.fixture()
def group():
    made = not dist.is_initialized()
    if made:
        from syncopate.measure.local_ranks import free_port

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield dist.group.WORLD
    if made:
        dist.destroy_process_group()


@pytest.fixture()
def prepared(monkeypatch):
    calls = []

    def fake_prepare(kind, a, b, group, config, mode="eager"):
        calls.append(mode)
        return types.SimpleNamespace(mode=mode, spec=types.SimpleNamespace(candidate=ops.Candidate()))

    monkeypatch.setattr(ops, "_prepare", fake_prepare)
    monkeypatch.setattr(ops, "kept_allocations", lambda fn, device, sync=True: fn())
    saved = dict(ops._REGISTRY.programs)
    ops._REGISTRY.programs.clear()
    yield calls
    ops._REGISTRY.programs.clear()
    ops._REGISTRY.programs.update(saved)
    ops.set_mode("eager")


def _operands():
    return torch.zeros(8, 4), torch.zeros(4, 6)


def test_calls_look_up_eager_unless_set(group, prepared):
    a, b = _operands()
    assert ops.get_mode() == "eager"
    assert ops._program("ag_gemm", a, b, group, None, capturing=False).mode == "eager"
    ops.set_mode("graph")
    assert ops._program("ag_gemm", a, b, group, None, capturing=False).mode == "graph"
    assert prepared == ["eager", "graph"]
    # each mode's program is kept: no new preparation
    assert ops._program("ag_gemm", a, b, group, None, capturing=False).mode == "graph"
    assert prepared == ["eager", "graph"]


def test_a_capture_takes_the_graph_program_or_else_the_eager_one(group, prepared):
    a, b = _operands()
    with pytest.raises(ConfigError, match="cannot be captured in a CUDA graph"):
        ops._program("gemm_rs", a, b, group, None, capturing=True)
    eager = ops._program("gemm_rs", a, b, group, None, capturing=False)
    assert ops._program("gemm_rs", a, b, group, None, capturing=True) is eager
    with ops.mode("graph"):
        graph = ops._program("gemm_rs", a, b, group, None, capturing=False)
    assert ops.get_mode() == "eager"
    assert graph.mode == "graph"
    assert ops._program("gemm_rs", a, b, group, None, capturing=True) is graph


def test_a_given_config_is_the_same_in_every_mode(group, prepared):
    a, b = _operands()
    cand = ops.Candidate()
    first = ops._program("gemm_ar", a, b, group, cand, capturing=False)
    with ops.mode("graph"):
        assert ops._program("gemm_ar", a, b, group, cand, capturing=False) is first
    assert ops._program("gemm_ar", a, b, group, cand, capturing=True) is first


def test_unknown_mode_is_refused():
    with pytest.raises(ConfigError, match="mode 'fast': accepted are eager, graph"):
        ops.set_mode("fast")
    with pytest.raises(ConfigError, match="mode 'fast'"):
        ops.mode("fast")


class _OnCuda(torch.Tensor):
    """A CPU tensor that says it lives on cuda:0, for the mode choice alone (nothing runs on it)."""

    @property
    def is_cuda(self):
        return True

    @property
    def device(self):
        return torch.device("cuda", 0)


def test_the_warm_up_of_compiled_cuda_graphs_prepares_the_graph_program(group, prepared, monkeypatch):
    """torch.compile's reduce-overhead mode runs a model's first calls eagerly (its cudagraph tree
    warming up) and captures the next: those warm-up calls prepare the graph-mode program, which the
    capture then finds, with no set_mode; they keep no eager fast path. Without a tree warming up
    (none made, done warming up, or torch's internals answering otherwise) the process's mode holds."""
    manager = types.SimpleNamespace(in_warmup=True)
    answers = {"get": lambda index, create_if_none_exists=True: manager}
    trees = types.SimpleNamespace(get_manager=lambda *a, **k: answers["get"](*a, **k))
    monkeypatch.setitem(sys.modules, "torch._inductor.cudagraph_trees", trees)
    monkeypatch.setattr(ops, "_cuda_device", lambda: 0)
    monkeypatch.setattr(ops, "_stream_capturing", lambda: False)
    a, b = (t.as_subclass(_OnCuda) for t in _operands())

    warm = ops._program("ag_gemm", a, b, group, None, capturing=False)
    assert warm.mode == "graph" and prepared == ["graph"]
    assert ops._program("ag_gemm", a, b, group, None, capturing=True) is warm
    before = dict(ops._REGISTRY.calls)
    warm.spec.dtype = torch.bfloat16
    ops._keep_call("ag_gemm", a, b, group, None, warm)
    assert ops._REGISTRY.calls == before
    # an eager call of the shape kept before: not taken during the warm-up, taken after it
    key = ops._call_key("ag_gemm", a, b, group, None, "eager")
    ops._REGISTRY.calls[key] = kept = object()
    try:
        assert ops._fast_call("ag_gemm", a, b, group, None) is None
        manager.in_warmup = False
        assert ops._fast_call("ag_gemm", a, b, group, None) is kept
        manager.in_warmup = True
    finally:
        del ops._REGISTRY.calls[key]
    # a given config is that config in every mode
    cand = ops.Candidate()
    assert ops._program("gemm_rs", a, b, group, cand, capturing=False).mode == "eager"

    manager.in_warmup = False
    assert ops._program("ag_gemm", a, b, group, None, capturing=False).mode == "eager"
    answers["get"] = lambda index, create_if_none_exists=True: None
    assert ops._program("gemm_ar", a, b, group, None, capturing=False).mode == "eager"

    def broken(index, create_if_none_exists=True):
        raise AttributeError("another torch")

    answers["get"] = broken
    assert ops._program("gemm_rs", a, b, group, None, capturing=False).mode == "eager"
    monkeypatch.delitem(sys.modules, "torch._inductor.cudagraph_trees")
    assert ops._compiled_graph_warmup(a) is False
    assert ops._compiled_graph_warmup(torch.zeros(2)) is False


def test_a_configuration_whose_replay_stalls_is_refused_under_capture(group, prepared, monkeypatch):
    """The nccl backend's chunk plans do not replay from a CUDA graph while NCCL registers captured
    buffers: a capture of such a call is refused before anything is enqueued, given or looked up
    (here in eager mode, the warm-up's), and the message names the setting that lets it replay; a
    captured call never takes the fast path of a call kept outside the capture, so none escapes."""
    nccl = ops.Candidate(backend="nccl", template="direct", comm_sms=64)

    def fake_prepare(kind, a, b, group, config, mode="eager"):
        prepared.append(mode)
        return types.SimpleNamespace(
            mode=mode, spec=types.SimpleNamespace(candidate=config or nccl, kind=kind)
        )

    monkeypatch.setattr(ops, "_prepare", fake_prepare)
    a, b = _operands()
    assert ops._program("ag_gemm", a, b, group, nccl, capturing=False).spec.candidate == nccl
    monkeypatch.delenv("NCCL_GRAPH_REGISTER", raising=False)
    with pytest.raises(
        ConfigError,
        match=r"nccl/direct.*cannot be captured in a CUDA graph.*copy_engine or sm_copy.*"
        r"NCCL_GRAPH_REGISTER=0 in its environment",
    ):
        ops._program("ag_gemm", a, b, group, nccl, capturing=True)
    monkeypatch.setenv("NCCL_GRAPH_REGISTER", "0")  # NCCL registers no captured buffer: it replays
    assert ops._program("ag_gemm", a, b, group, nccl, capturing=True).spec.candidate == nccl
    assert not nccl.replays_in_graph  # a given config only: lookup's graph mode still passes it over
    monkeypatch.setenv("NCCL_GRAPH_REGISTER", "1")
    ops._program("gemm_rs", a, b, group, None, capturing=False)  # looked up in eager mode
    with pytest.raises(ConfigError, match=r"set_mode\('graph'\) before the warm-up"):
        ops._program("gemm_rs", a, b, group, None, capturing=True)
    unfused = ops.Candidate(backend="nccl", template="unfused")
    assert ops._program("gemm_ar", a, b, group, unfused, capturing=False) is ops._program(
        "gemm_ar", a, b, group, unfused, capturing=True
    )

    # a call being captured never takes the fast path (`_fast_call`), so `_program` refuses it too
    monkeypatch.setattr(ops, "_cuda_device", lambda: 0)
    cuda_a, cuda_b = a.as_subclass(_OnCuda), b.as_subclass(_OnCuda)
    key = ops._call_key("ag_gemm", cuda_a, cuda_b, group, nccl, "eager")
    ops._REGISTRY.calls[key] = kept = object()
    try:
        monkeypatch.setattr(ops, "_stream_capturing", lambda: False)
        assert ops._fast_call("ag_gemm", cuda_a, cuda_b, group, nccl) is kept
        monkeypatch.setattr(ops, "_stream_capturing", lambda: True)
        assert ops._fast_call("ag_gemm", cuda_a, cuda_b, group, nccl) is None
    finally:
        del ops._REGISTRY.calls[key]
