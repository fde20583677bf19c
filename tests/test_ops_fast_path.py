"""Layer: CPU, one process, a gloo group of one rank. The fast path of the fused ops' later calls:
a plain call whose key (kind, group, config, mode, shapes, dtypes, devices, B's strides) a checked
call had goes straight to its program bound to (a, b), and gives what the long way gives; a call
that differs in any of them misses it and gets the full checks (a bad one its ConfigError); being
captured or traced, or passing out=, bounded waits or scales, takes the long way; and the mode
(`ops.mode`) and capture detection still pick the configuration's program.

The ops take CUDA tensors only: a first call here is made with the device check lifted and the
configuration lookup answering `unfused` (`first_call`), which runs on the CPU; every later call
runs the ops' own path, checks included."""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
import torch
import torch.distributed as dist

from syncopate.errors import ConfigError
from syncopate.kernels import ops
from syncopate.kernels.library import unfused
from syncopate.search_space import Topology, unfused_candidate

UNFUSED = unfused_candidate()


@pytest.fixture()
def group(tmp_path):
    made = not dist.is_initialized()
    if made:
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdv'}", rank=0, world_size=1)
    saved = dict(ops._REGISTRY.programs), dict(ops._REGISTRY.calls)
    ops._REGISTRY.programs.clear()
    ops._REGISTRY.calls.clear()
    yield dist.group.WORLD
    ops._REGISTRY.programs.clear()
    ops._REGISTRY.calls.clear()
    ops._REGISTRY.programs.update(saved[0])
    ops._REGISTRY.calls.update(saved[1])
    ops.set_mode("eager")
    if made:
        dist.destroy_process_group()


@contextlib.contextmanager
def first_call(monkeypatch, served=UNFUSED):
    """A first call on CPU tensors: the device check lifted, the lookup serving `served`."""
    with monkeypatch.context() as m:
        m.setattr(ops, "_check_devices", lambda a, b: None)
        m.setattr(ops._REGISTRY, "config", lambda workload, group, mode: served)
        m.setattr(ops._REGISTRY, "topology", lambda group: Topology.from_key("H100x1-nvlink"))
        yield


def _no_long_way(monkeypatch):
    """From here on a call that leaves the fast path fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("the call took the long way")

    monkeypatch.setattr(ops, "_program", refuse)
    monkeypatch.setattr(ops, "_scales", refuse)


CASES = [
    # (name, op, its keyword arguments, torch's path)
    ("ag_gemm", ops.all_gather_matmul, {}, "ag_gemm"),
    ("ag_gemm gathered", ops.all_gather_matmul, {"return_gathered": True}, "gathered"),
    ("gemm_rs", ops.matmul_reduce_scatter, {}, "gemm_rs"),
    ("gemm_ar", ops.matmul_all_reduce, {}, "gemm_ar"),
]


def _torch(kind, a, b, group):
    if kind == "gathered":
        return unfused("ag_gemm", a, b, group, gathered=True)
    return unfused(kind, a, b, group)


def _as_tuple(x):
    return x if isinstance(x, tuple) else (x,)


@pytest.mark.parametrize("config", [None, UNFUSED], ids=["looked-up", "given"])
@pytest.mark.parametrize("name, op, kwargs, kind", CASES, ids=[c[0] for c in CASES])
def test_a_later_call_takes_the_fast_path_and_gives_the_same_result(
    group, monkeypatch, name, op, kwargs, kind, config
):
    def call(a, b, group, config):
        return op(a, b, group, config, **kwargs)

    a_shape, b_shape = (8, 4), (4, 6)
    a = torch.randn(a_shape)
    weight = torch.randn(b_shape[::-1])
    for b in (torch.randn(b_shape), weight.t()):  # row-major B, and an nn.Linear weight's transpose
        with first_call(monkeypatch):
            first = _as_tuple(call(a, b, group, config))
        assert len(ops._REGISTRY.calls) >= 1
        long_way = _as_tuple(call(a, b, group, config))  # the same call, found by its key
        with monkeypatch.context() as m:
            _no_long_way(m)
            later = [_as_tuple(call(a.clone(), b.clone() if b.is_contiguous() else b, group, config))]
            a2 = torch.randn(a_shape)
            later.append(_as_tuple(call(a2, b, group, config)))  # new values, same key
        want = _as_tuple(_torch(kind, a, b, group))
        for got in (first, long_way, later[0]):
            assert len(got) == len(want)
            for g, w in zip(got, want):
                assert g.shape == w.shape and g.dtype == w.dtype and g.is_contiguous()
                torch.testing.assert_close(g, w, rtol=0, atol=0)
        for g, w in zip(later[1], _as_tuple(_torch(kind, a2, b, group))):
            torch.testing.assert_close(g, w, rtol=0, atol=0)
        assert later[0][0].data_ptr() != first[0].data_ptr()  # a new output each call


def test_each_kind_and_the_gathered_all_gather_keep_their_own_fast_call(group, monkeypatch):
    a, b = torch.randn(8, 4), torch.randn(4, 6)
    with first_call(monkeypatch):
        ops.all_gather_matmul(a, b, group)
    with monkeypatch.context() as m:
        _no_long_way(m)
        ops.all_gather_matmul(a, b, group)
        for other in (
            lambda: ops.all_gather_matmul(a, b, group, return_gathered=True),
            lambda: ops.matmul_all_reduce(a, b, group),
        ):
            with pytest.raises(AssertionError, match="long way"):
                other()


def _primed(group, monkeypatch, config=None):
    a, b = torch.randn(8, 4), torch.randn(4, 6)
    with first_call(monkeypatch):
        ops.matmul_all_reduce(a, b, group, config)
    ops.matmul_all_reduce(a, b, group, config)  # the fast path
    return a, b


@pytest.mark.parametrize(
    "change, message",
    [
        # each later call differs from the checked one in one part of the key; the full checks
        # run (the device check among them: a tensor of these shapes reaches it) and refuse it
        (lambda a, b, g: (a, b.to("meta"), g, None), "is on (cpu|meta): the fused ops need CUDA tensors"),
        (lambda a, b, g: (a, b.bfloat16(), g, None), "a has dtype torch.float32 but b has torch.bfloat16"),
        (lambda a, b, g: (torch.randn(4, 8).t(), b, g, None), r"a must be contiguous .* strides \(1, 8\)"),
        (
            lambda a, b, g: (a, torch.randn(4, 12)[:, ::2], g, None),
            "b must be row-major or the transpose of a row-major matrix",
        ),
        (lambda a, b, g: (torch.randn(8, 5), b, g, None), "a's columns must equal b's rows"),
        (lambda a, b, g: (torch.randn(16, 4), b, g, None), "a is on cpu: the fused ops need CUDA tensors"),
        (lambda a, b, g: (a, b, "foo", None), "group must be a torch.distributed ProcessGroup"),
        (lambda a, b, g: (a, b, g, {"backend": ["x"]}), r"unknown backend \['x'\]"),
        (lambda a, b, g: (a, b, g, "unfused"), "config must be a Candidate, a dict or None"),
        (lambda a, b, g: (a, b, g, UNFUSED), "a is on cpu: the fused ops need CUDA tensors"),
    ],
    ids=[
        "b-device",
        "b-dtype",
        "a-strides",
        "b-strides",
        "shape",
        "rows",
        "group",
        "bad-config",
        "config-type",
        "config",
    ],
)
def test_a_call_that_differs_misses_the_fast_path_and_gets_the_full_checks(
    group, monkeypatch, change, message
):
    a, b = _primed(group, monkeypatch)
    with pytest.raises(ConfigError, match=message):
        ops.matmul_all_reduce(*change(a, b, group))
    ops.matmul_all_reduce(a, b, group)  # the checked call's key still takes the fast path


def test_another_group_or_mode_misses_the_fast_path(group, monkeypatch):
    a, b = _primed(group, monkeypatch)
    other = dist.new_group([0])
    with pytest.raises(ConfigError, match="need CUDA tensors"):
        ops.matmul_all_reduce(a, b, other)
    with ops.mode("graph"), pytest.raises(ConfigError, match="need CUDA tensors"):
        ops.matmul_all_reduce(a, b, group)  # the graph-mode configuration is looked up, checked first


def test_a_config_given_is_kept_apart_from_a_looked_up_one(group, monkeypatch):
    a, b = _primed(group, monkeypatch, UNFUSED)
    other = dataclasses.replace(UNFUSED, num_splits=2)
    with pytest.raises(ConfigError, match="need CUDA tensors"):
        ops.matmul_all_reduce(a, b, group, other)
    with pytest.raises(ConfigError, match="need CUDA tensors"):
        ops.matmul_all_reduce(a, b, group)  # no config: the looked-up one, never checked for this key


def test_a_destroyed_default_group_is_named(tmp_path, monkeypatch):
    assert not dist.is_initialized()
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdv'}", rank=0, world_size=1)
    try:
        a, b = torch.randn(8, 4), torch.randn(4, 6)
        with first_call(monkeypatch):
            ops.all_gather_matmul(a, b)
        ops.all_gather_matmul(a, b)
    finally:
        dist.destroy_process_group()
    try:
        with pytest.raises(ConfigError, match="call init_process_group first"):
            ops.all_gather_matmul(a, b)
    finally:
        ops.close_contexts()


@pytest.mark.parametrize(
    "extra",
    [
        {"out": "out"},
        {"spin_limit": 100},
        {"a_scale": torch.ones(1)},
        {"out_dtype": torch.bfloat16},
    ],
    ids=["out", "spin_limit", "a_scale", "out_dtype"],
)
def test_a_call_with_more_than_its_operands_takes_the_long_way(group, monkeypatch, extra):
    a, b = _primed(group, monkeypatch)
    if "out" in extra:
        extra = {"out": torch.empty(8, 6)}
    calls = []
    real = ops._gemm_scatter
    monkeypatch.setattr(ops, "_gemm_scatter", lambda *args: calls.append(args) or real(*args))
    try:
        ops.matmul_all_reduce(a, b, group, **extra)
    except ConfigError:
        pass  # scales or an out_dtype that unscaled operands refuse: checked, as they must be
    assert len(calls) == 1


def _fp8(rows, cols, row_wise, seed):
    """FP8 values and their scale: [rows, 1] row-wise, else one element."""
    g = torch.Generator().manual_seed(seed)
    v = (torch.randn(rows, cols, generator=g) * 4).to(torch.float8_e4m3fn)
    return v, (torch.rand(rows, 1, generator=g) + 0.5) if row_wise else torch.tensor([0.75])


@pytest.mark.parametrize(
    "op, kind", [(c[1], c[3]) for c in CASES if not c[2]], ids=["ag_gemm", "gemm_rs", "gemm_ar"]
)
def test_a_later_fp8_call_with_scales_like_the_checked_ones_takes_the_fast_path(group, monkeypatch, op, kind):
    """An FP8 call's key holds its scales' shapes, dtypes, devices and layout besides the operands':
    a later call with new scales like them goes straight to the program with its own scales; one
    with scales of another kind (tensor-wise for row-wise) or of a shape the op refuses misses it,
    the latter refused by the full checks."""
    a, sa = _fp8(16, 32, True, 1)
    w, sw = _fp8(8, 32, True, 2)  # B = w.t(), column-major, with a [1, N] scale
    b, sb = w.t(), sw.reshape(1, -1).contiguous()
    with first_call(monkeypatch):
        first = op(a, b, group, UNFUSED, a_scale=sa, b_scale=sb)
    with monkeypatch.context() as m:
        _no_long_way(m)
        sa2, sb2 = sa * 2, sb.clone()
        later = op(a, b, group, UNFUSED, a_scale=sa2, b_scale=sb2)
        again = op(a, b, group, UNFUSED, a_scale=sa, b_scale=sb, out_dtype=torch.bfloat16)
    assert later.dtype == torch.bfloat16 and later.data_ptr() != first.data_ptr()
    torch.testing.assert_close(later, unfused(kind, a, b, group, scales=(sa2, sb2)), rtol=0, atol=0)
    torch.testing.assert_close(again, first, rtol=0, atol=0)
    calls = []
    real = ops._scales
    monkeypatch.setattr(ops, "_scales", lambda *args: calls.append(args) or real(*args))
    with first_call(monkeypatch):
        op(a, b, group, UNFUSED, a_scale=torch.tensor([0.5]), b_scale=sb)  # tensor-wise: its own key
    assert len(calls) == 1
    with pytest.raises(ConfigError, match="a_scale has shape"):
        op(a, b, group, UNFUSED, a_scale=torch.ones(16, 2), b_scale=sb)
    with pytest.raises(ConfigError, match="out_dtype=torch.float16 for float8_e4m3fn operands"):
        op(a, b, group, UNFUSED, a_scale=sa, b_scale=sb, out_dtype=torch.float16)
    assert len(calls) == 3


# --- mode and capture, with programs that say which configuration they run ----------------------------


class _Program:
    """A stand-in program of one mode: its fast call and its long-way call say which they are."""

    returns_gathered = True

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.spec = type(
            "Spec", (), {"out_shape": (8, 6), "out_dtype": torch.float32, "dtype": torch.float32}
        )
        self.spec.candidate = UNFUSED
        self.ran: list[str] = []

    def __call__(self, a, b, out, **kwargs):
        self.ran.append("long" + (" captured" if kwargs.get("capturing") else ""))

    def bind(self, gathered=False, scaled=False):
        def call(a, b):
            self.ran.append("fast")
            return self.mode

        return call


class _OnCuda(torch.Tensor):
    """A CPU tensor that says it is on the GPU: what the capture check looks at, without one."""

    @property
    def is_cuda(self):
        return True


@pytest.fixture()
def fake_programs(monkeypatch):
    made: dict[str, _Program] = {}

    def prepare(kind, a, b, group, config, mode="eager"):
        made[mode] = _Program(mode)
        return made[mode]

    monkeypatch.setattr(ops, "_prepare", prepare)
    monkeypatch.setattr(ops, "kept_allocations", lambda fn, device, sync=True: fn())
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(ops, "_cuda_device", lambda: 0)
    return made


def test_the_mode_picks_its_own_fast_call(group, fake_programs):
    a, b = torch.randn(8, 4), torch.randn(4, 6)
    ops.matmul_all_reduce(a, b, group)
    assert ops.matmul_all_reduce(a, b, group) == "eager"
    with ops.mode("graph"):
        assert isinstance(ops.matmul_all_reduce(a, b, group), torch.Tensor)  # prepared for graph mode
        assert ops.matmul_all_reduce(a, b, group) == "graph"
    assert ops.matmul_all_reduce(a, b, group) == "eager"
    assert fake_programs["eager"].ran == ["long", "fast", "fast"]
    assert fake_programs["graph"].ran == ["long", "fast"]


def _capturing(monkeypatch, capturing: bool) -> None:
    """Every capture query of the ops (torch's, and the fast path's own binding of it) answers `capturing`."""
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing)
    monkeypatch.setattr(ops, "_stream_capturing", lambda: capturing)


def test_a_captured_call_never_takes_the_fast_path(group, fake_programs, monkeypatch):
    a, b = torch.randn(8, 4).as_subclass(_OnCuda), torch.randn(4, 6)
    _capturing(monkeypatch, False)
    ops.matmul_reduce_scatter(a, b, group)
    assert ops.matmul_reduce_scatter(a, b, group) == "eager"
    _capturing(monkeypatch, True)
    ops.matmul_reduce_scatter(a, b, group)  # no graph-mode program: the eager one, the long way
    assert fake_programs["eager"].ran == ["long", "fast", "long captured"]
    with ops.mode("graph"):
        _capturing(monkeypatch, False)
        ops.matmul_reduce_scatter(a, b, group)  # a warm-up in graph mode prepares its program
        _capturing(monkeypatch, True)
    ops.matmul_reduce_scatter(a, b, group)  # captured: the graph-mode program, the long way
    assert fake_programs["graph"].ran == ["long", "long captured"]
    _capturing(monkeypatch, False)
    assert ops.matmul_reduce_scatter(a, b, group) == "eager"


def test_this_ranks_device_is_part_of_the_key(group, monkeypatch):
    a, b = torch.randn(8, 4).as_subclass(_OnCuda), torch.randn(4, 6)
    monkeypatch.setattr(ops, "_cuda_device", lambda: 0)
    key = ops._call_key("gemm_ar", a, b, group, None, "eager")
    monkeypatch.setattr(ops, "_cuda_device", lambda: 1)
    assert ops._call_key("gemm_ar", a, b, group, None, "eager") != key


def test_a_call_autograd_would_record_takes_the_long_way(group, monkeypatch):
    """The ops are not differentiable: the unfused program's long way (its matmul into `out`)
    refuses operands that require grad where grad is on, after a first call without them too."""
    a, b = _primed(group, monkeypatch)
    w = b.clone().requires_grad_(True)
    with pytest.raises(RuntimeError, match="out=.* don't support automatic differentiation"):
        ops.matmul_all_reduce(a, w, group)
    with torch.no_grad(), monkeypatch.context() as m:
        _no_long_way(m)
        torch.testing.assert_close(ops.matmul_all_reduce(a, w, group), a @ b)


def test_a_traced_call_takes_the_traced_path(group, monkeypatch):
    a, b = _primed(group, monkeypatch)
    traced = []
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    monkeypatch.setattr(ops, "_traced", lambda *args: traced.append(args[0]) or "traced")
    assert ops.matmul_all_reduce(a, b, group) == "traced" and traced == ["gemm_ar"]


def test_a_program_bound_makes_its_outputs_and_passes_them(group):
    """`CallProgram.bind` as the fused templates have it: a new output (and gathered A) a call, in
    the spec's shapes and the operands' dtype and device, handed to the program's own call."""
    from syncopate.kernels.templates import CallProgram, CallSpec

    class Program(CallProgram):
        def __init__(self, spec):
            self.spec, self.seen = spec, []

        def __call__(self, a, b, out, *, capturing=False, spin_limit=0, gathered=None, scales=None):
            self.seen.append((capturing, spin_limit, scales, gathered is not None))
            if gathered is not None:
                gathered.copy_(a)
            torch.matmul(a, b, out=out)

    spec = CallSpec(
        kind="ag_gemm",
        group=group,
        rank=0,
        world_size=1,
        a_shape=(8, 4),
        b_shape=(4, 6),
        dtype=torch.float64,
        device=torch.device("cpu"),
        candidate=UNFUSED,
    )
    program = Program(spec)
    a, b = torch.randn(8, 4, dtype=torch.float64), torch.randn(4, 6, dtype=torch.float64)
    out = program.bind()(a, b)
    again = program.bind()(a, b)
    out2, full = program.bind(gathered=True)(a, b)
    assert out.shape == (8, 6) and out.dtype == torch.float64 and out.data_ptr() != again.data_ptr()
    torch.testing.assert_close(out, a @ b)
    torch.testing.assert_close(out2, a @ b)
    torch.testing.assert_close(full, a)
    assert program.seen == [(False, 0, None, False)] * 2 + [(False, 0, None, True)]


# --- on a GPU -------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("template", ["unfused", "direct"])
def test_on_a_gpu_the_fast_path_gives_the_long_ways_result(tmp_path, monkeypatch, template):
    """The real first call (every check, the context, the kernel's compile), then later calls on the
    fast path with fresh inputs: the same as the long way (out=) gives, in an NCCL group of one rank."""
    from syncopate.search_space import Candidate

    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"file://{tmp_path / 'rdv'}", rank=0, world_size=1)
    config = UNFUSED if template == "unfused" else Candidate()
    try:
        for _, op, kwargs, _ in CASES:
            gen = torch.Generator(device="cuda").manual_seed(0)

            def operands():
                return (
                    torch.randn(512, 256, device="cuda", generator=gen).bfloat16(),
                    (torch.randn(512, 256, device="cuda", generator=gen) / 16).bfloat16().t(),
                )

            a, b = operands()
            op(a, b, None, config, **kwargs)
            with monkeypatch.context() as m:
                _no_long_way(m)
                a, b = operands()
                fast = _as_tuple(op(a, b, None, config, **kwargs))
            long_way = _as_tuple(op(a, b, None, config, out=torch.empty_like(fast[0]), **kwargs))
            torch.cuda.synchronize()
            for f, w in zip(fast, long_way):
                torch.testing.assert_close(f, w, rtol=0, atol=0)
    finally:
        ops.close_contexts()
        dist.destroy_process_group()
