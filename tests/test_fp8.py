"""Layer: pure CPU, and gloo process groups. FP8 operands (float8 e4m3 with float32 scales, bf16 out):
the workload dtype and what the search offers for it, the scale checks, the cost model's figures,
the decomposed templates' scale rows, and the unfused path (`library.unfused` and the `unfused`
template's call program) against the float32 reference of the same FP8 operands and scales."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from support.gloo import run_gloo

from syncopate.cost_model.calibration_defaults import FP8_GEMM_SPEEDUP, default_calibration
from syncopate.cost_model.model import CostModel
from syncopate.errors import ConfigError
from syncopate.kernels.scaled import FP8, check_scales, chunk_scale, column_major, row_scales, scaled_mm
from syncopate.measure.reference import FP8_TOLERANCE, reference, relative_error
from syncopate.search_space import (
    FP8_TEMPLATES,
    FP8_TILE_CONFIGS,
    KINDS,
    Candidate,
    SpaceOptions,
    TileConfig,
    Topology,
    Workload,
    a_stationary_candidate,
    bench_grid,
    c_stationary_candidate,
    canonical_dtype,
    check_candidate,
    default_candidate,
    guard_candidates,
    space,
    unfused_candidate,
)

TOPO = Topology.from_key("H200x2-nvlink")


# The workload and the search -------------------------------------------------------------------


@pytest.mark.parametrize("spelling", ["fp8", "float8_e4m3fn", "torch.float8_e4m3fn", FP8, " FP8 "])
def test_every_spelling_is_fp8(spelling):
    assert canonical_dtype(spelling) == "fp8"
    assert Workload(kind="ag_gemm", shape=(64, 64, 64), dtype=spelling).key() == "ag_gemm/64x64x64/fp8"


def test_fp8_moves_one_byte_rows_with_their_scale_and_bf16_partials():
    ag = Workload(kind="ag_gemm", shape=(8192, 4096, 2048), dtype="fp8")
    rs = Workload(kind="gemm_rs", shape=(8192, 4096, 2048), dtype="fp8")
    assert (ag.element_bytes, ag.output_bytes, ag.scaled) == (1, 2, True)
    assert ag.comm_row_bytes() == 2048 + 4, "an all-gathered row: K FP8 bytes and a float32 scale"
    assert rs.comm_row_bytes() == 4096 * 2, "a reduced row: N bf16 partials"
    bf16 = Workload(kind="ag_gemm", shape=(8192, 4096, 2048))
    assert (bf16.comm_row_bytes(), bf16.output_bytes, bf16.scaled) == (2048 * 2, 2, False)
    assert Workload.from_key(ag.key()) == ag and Workload.from_dict(ag.to_dict()) == ag


@pytest.mark.parametrize("kind", KINDS)
def test_the_fused_and_scaled_gemm_templates_run_fp8_and_the_stationary_ones_are_refused(kind):
    w = Workload(kind=kind, shape=(8192, 4096, 4096), dtype="fp8")
    fused = Candidate(backend="copy_engine", template="direct", num_splits=2, block_k=128)
    for template in ("direct", "ring", "bidirectional_ring"):
        check_candidate(fused.replace(template=template), w, TOPO)
    stationary = a_stationary_candidate(1) if kind == "ag_gemm" else c_stationary_candidate()
    check_candidate(stationary, w.__class__(kind=kind, shape=w.shape), TOPO)  # fine in bf16
    with pytest.raises(
        ConfigError,
        match=rf"template '{stationary.template}' does not run fp8 operands .*; fp8 runs on templates "
        rf"direct, ring, bidirectional_ring, decomposed, unfused",
    ):
        check_candidate(stationary, w, TOPO)
    check_candidate(unfused_candidate(), w, TOPO)
    offered = space(w, TOPO)
    assert {c.template for c in offered} == set(FP8_TEMPLATES) - ({"ring"} if TOPO.world_size <= 2 else set())
    fused_tiles = {TileConfig.of(c) for c in offered if c.template == "direct"}
    assert fused_tiles and fused_tiles <= set(FP8_TILE_CONFIGS), "FP8 tiles step 2x deeper in K"
    grid = bench_grid(w, TOPO, "tiny", ("copy_engine", "sm_copy", "nccl"))
    assert {c.template for c in grid} <= set(FP8_TEMPLATES) and len(grid) == len(set(grid))
    assert {c.block_k for c in grid if c.template == "direct"} == {128}
    backends = {c.backend for c in grid if c.template == "direct"}
    assert backends == ({"copy_engine"} if kind == "ag_gemm" else {"copy_engine", "sm_copy", "nccl"})
    assert default_candidate(w, TOPO) == unfused_candidate()
    assert set(guard_candidates(w, TOPO).values()) == {unfused_candidate()}


def test_an_fp8_all_gather_moves_its_scales_on_the_copy_engine_only():
    w = Workload(kind="ag_gemm", shape=(8192, 4096, 4096), dtype="fp8")
    c = Candidate(backend="sm_copy", template="direct", num_splits=2, comm_sms=32, block_k=128)
    check_candidate(c, w.__class__(kind="ag_gemm", shape=w.shape), TOPO)
    with pytest.raises(
        ConfigError,
        match=r"backend 'sm_copy' does not move an fp8 all-gather's row scales in template 'direct': "
        r"accepted are copy_engine \(or template decomposed or unfused\)",
    ):
        check_candidate(c, w, TOPO)
    check_candidate(c, Workload(kind="gemm_rs", shape=(8192, 4096, 4096), dtype="fp8"), TOPO)


def test_fp8_tiles_given_in_the_space_section_are_taken_as_given():
    w = Workload(kind="gemm_rs", shape=(8192, 4096, 4096), dtype="fp8")
    mine = SpaceOptions(tile_configs=(TileConfig(128, 128, 64, 4, 4),), templates=("direct",))
    assert {TileConfig.of(c) for c in space(w, TOPO, mine)} == {TileConfig(128, 128, 64, 4, 4)}


def test_the_cost_model_runs_fp8_gemms_at_twice_the_rate_and_moves_its_bytes():
    model = CostModel(default_calibration(TOPO))
    for kind in KINDS:
        bf16 = Workload(kind=kind, shape=(8192, 8192, 8192))
        fp8 = Workload(kind=kind, shape=(8192, 8192, 8192), dtype="fp8")
        b16, b8 = model.baselines(bf16, TOPO), model.baselines(fp8, TOPO)
        launch = model.calibration.costs.launch_us
        ratio = (b16["gemm_alone"] - launch) / (
            b8["gemm_alone"] - launch
        )  # a tile's fixed cost is not halved
        assert 0.95 * FP8_GEMM_SPEEDUP < ratio <= FP8_GEMM_SPEEDUP
        if kind == "ag_gemm":
            assert b8["comm_alone"] < 0.6 * b16["comm_alone"], "the all-gather moves FP8 rows"
        else:
            assert b8["comm_alone"] == pytest.approx(b16["comm_alone"]), "the reduction moves bf16 partials"
        for c in space(fp8, TOPO):
            assert model.predict(fp8, TOPO, c).feasible


def test_lookup_of_fp8_on_an_empty_database_serves_unfused(tmp_path):
    from syncopate.results_db.lookups import lookup

    for kind in KINDS:
        r = lookup((8192, 4096, 4096), TOPO, kind=kind, dtype="fp8")  # the default database: none
        assert r.candidate == unfused_candidate() and r.match == "cost_model", r.reason
        assert r.workload.dtype == "fp8"


# Scales -----------------------------------------------------------------------------------------


def _fp8(rows, cols, gen):
    return torch.randn(rows, cols, generator=gen).to(FP8)


@pytest.mark.parametrize(
    "a, b, a_scale, b_scale, out_dtype, message",
    [
        (FP8, FP8, None, "t", None, r"a_scale is missing: float8_e4m3fn operands need a_scale and b_scale"),
        (FP8, FP8, "t", None, None, r"b_scale is missing: .* row-wise \(here a_scale \(8, 1\), b_scale \(1, 6\)\)"),
        (FP8, torch.bfloat16, "t", "t", None, r"a has dtype torch.float8_e4m3fn but b has torch.bfloat16"),
        (FP8, FP8, torch.ones(8, 1, dtype=torch.float64), "t", None, r"a_scale has dtype torch.float64: accepted"),
        (FP8, FP8, torch.ones(1, 8), "t", None, r"a_scale has shape \(1, 8\): accepted are one element .* or \(8, 1\)"),
        (FP8, FP8, "t", torch.ones(6, 1), None, r"b_scale has shape \(6, 1\): accepted are one element .* or \(1, 6\)"),
        (FP8, FP8, torch.ones(1, 16)[:, ::2].t(), "t", None, r"a_scale must be contiguous"),
        (FP8, FP8, "t", "t", torch.float16, r"out_dtype=torch.float16 for float8_e4m3fn operands: accepted"),
        (FP8, FP8, 0.5, "t", None, r"a_scale must be a torch.Tensor, got the number 0.5"),
        (torch.bfloat16, torch.bfloat16, "t", None, None, r"a_scale is given but a and b are torch.bfloat16"),
        (torch.bfloat16, torch.bfloat16, None, None, torch.float32, r"out_dtype=torch.float32 for torch.bfloat16"),
    ],
)  # fmt: skip
def test_bad_scales_are_named(a, b, a_scale, b_scale, out_dtype, message):
    t = torch.tensor(0.5)
    a_scale, b_scale = (t if s == "t" else s for s in (a_scale, b_scale))
    with pytest.raises(ConfigError, match=message):
        check_scales(torch.zeros(8, 4).to(a), torch.zeros(4, 6).to(b), a_scale, b_scale, out_dtype)


def test_good_scales_pass_and_the_ops_name_them_before_anything_else():
    a, b = torch.zeros(8, 4).to(FP8), torch.zeros(6, 4).to(FP8).t()
    for a_scale, b_scale in ((torch.tensor(1.0), torch.ones(1)), (torch.ones(8, 1), torch.ones(1, 6))):
        check_scales(a, b, a_scale, b_scale, torch.bfloat16)
    check_scales(a.float(), b.float(), None, None, torch.float32)
    from syncopate.kernels.ops import all_gather_matmul, matmul_all_reduce, matmul_reduce_scatter

    for op in (all_gather_matmul, matmul_reduce_scatter, matmul_all_reduce):
        with pytest.raises(ConfigError, match="a_scale is missing"):
            op(a, b)  # before the process group is asked for
        with pytest.raises(
            ConfigError, match="but b has torch.float32: fp8 takes both operands in torch.float8"
        ):
            op(a, b.float(), a_scale=torch.ones(1), b_scale=torch.ones(1))
        with pytest.raises(
            ConfigError, match=r"fast_accum=True applies to float8_e4m3fn operands .* got torch.float32"
        ):
            op(a.float(), b.float(), fast_accum=True)  # before the process group is asked for
        with pytest.raises(ConfigError, match=r"fast_accum='yes': give True or False"):
            op(a, b, a_scale=torch.ones(1), b_scale=torch.ones(1), fast_accum="yes")


def test_a_pair_of_scales_or_scales_asking_for_fast_accumulation():
    from syncopate.kernels.scaled import Scales, fast_accumulation

    t = torch.ones(1)
    assert not fast_accumulation((t, t)) and not fast_accumulation(Scales(t, t))
    assert fast_accumulation(Scales(t, t, True))
    a_scale, b_scale, fast = Scales(t, t, True)
    assert a_scale is t and fast is True


def test_scale_rows_of_a_chunk_and_the_scaled_gemm():
    gen = torch.Generator().manual_seed(3)
    a, w = _fp8(12, 32, gen), _fp8(16, 32, gen)
    sa, sb = torch.rand(12, 1, generator=gen) + 0.5, torch.rand(1, 16, generator=gen) + 0.5
    assert torch.equal(chunk_scale(sa, 4, 8), sa[4:8])
    one = torch.tensor(0.25)
    assert chunk_scale(one, 4, 8) is one
    assert torch.equal(row_scales(one, 3), torch.full((3, 1), 0.25)) and row_scales(sa, 12) is sa
    b_t = w.t()
    assert column_major(b_t) is b_t
    b_rows = w.t().contiguous()
    copied = column_major(b_rows)
    assert copied.stride() == (1, 32) and torch.equal(copied.float(), b_rows.float())
    want = (a.float() * sa) @ (w.float().t() * sb)
    for sa_, sb_, ref in (
        (sa, sb, want),
        (sa, one, (a.float() * sa) @ (w.float().t() * 0.25)),  # row-wise A beside a tensor-wise B
        (one, sb, (a.float() * 0.25) @ (w.float().t() * sb)),
        (one, torch.ones(1), (a.float() * 0.25) @ w.float().t()),
    ):
        got = scaled_mm(a, b_t, sa_, sb_)
        assert got.dtype == torch.bfloat16 and relative_error(got, ref) < FP8_TOLERANCE
    # a chunk's GEMM with its scale rows is that chunk of the whole product
    part = torch.empty(4, 16, dtype=torch.bfloat16)
    scaled_mm(a[4:8], b_t, chunk_scale(sa, 4, 8), sb, out=part)
    assert relative_error(part, want[4:8]) < FP8_TOLERANCE


def test_the_decomposed_gather_keeps_fp8_bytes_and_scales_in_its_buffers():
    from syncopate.kernels.decomposed import decomposed_buffers
    from syncopate.kernels.decomposed_gather import gather_buffers

    assert gather_buffers(4, 256, 1024, FP8) == {
        "a_full": ((1024, 1024), torch.uint8),
        "a_scale": ((1024, 1), torch.float32),
    }
    assert gather_buffers(4, 256, 1024, torch.bfloat16) == {"a_full": ((1024, 1024), torch.bfloat16)}
    from syncopate.kernels.templates import TEMPLATES, CallSpec

    for kind in ("gemm_rs", "gemm_ar"):
        spec = CallSpec(
            kind=kind,
            group=None,
            rank=0,
            world_size=2,
            a_shape=(512, 256),
            b_shape=(256, 1024),
            dtype=FP8,
            device=torch.device("cpu"),
            candidate=Candidate(backend="copy_engine", template="decomposed", num_splits=2),
        )
        assert spec.out_dtype == torch.bfloat16
        bufs = TEMPLATES["decomposed"].buffers(spec)
        assert bufs == decomposed_buffers(2, 512, 1024, torch.bfloat16, all_reduce=kind == "gemm_ar")


# The unfused path on gloo ranks --------------------------------------------------------------------


def _quantized(x: torch.Tensor, row_wise: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """x as FP8 and its float32 scale (per row, or one), from its largest magnitudes."""
    amax = x.abs().amax(dim=1, keepdim=True) if row_wise else x.abs().amax().reshape(())
    scale = (amax / 448.0).clamp_min(1e-12).float()
    return (x / scale).to(FP8), scale


def _operands(kind, rank, ws, gen, row_wise, b_layout):
    m, n, k = 24, 32, 48
    if kind == "ag_gemm":
        a_shape, b_shape = (m // ws, k), (k, n // ws)
    else:
        a_shape, b_shape = (m, k // ws), (k // ws, n)
    a = torch.randn(a_shape, generator=gen) * (1.0 + rank)  # every rank's scales its own
    a8, a_scale = _quantized(a, row_wise)
    w = torch.randn(b_shape[::-1], generator=gen) / k**0.5  # [N, K] as a weight holds it
    w8, w_scale = _quantized(w, row_wise)  # one scale per output column: B's [1, N] row-wise
    b8 = w8.t() if b_layout == "weight_t" else w8.t().contiguous()
    b_scale = w_scale.reshape(1, -1) if row_wise else w_scale
    return a8, b8, a_scale, b_scale


def _worker(rank, ws, init, q):
    from syncopate.kernels import scaled
    from syncopate.kernels.library import unfused
    from syncopate.kernels.templates import TEMPLATES, CallSpec

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=ws)
    try:
        flags = []
        real = scaled.scaled_mm

        def recording(*args, fast_accum=False, **kwargs):
            flags.append(fast_accum)
            return real(*args, fast_accum=fast_accum, **kwargs)

        scaled.scaled_mm = recording  # what the unfused path's scaled GEMMs call
        g = dist.group.WORLD
        gen = torch.Generator().manual_seed(100 + rank)
        got = []
        for kind in KINDS:
            for row_wise in (False, True):
                for b_layout in ("weight_t", "row_major"):
                    a8, b8, _, _ = _operands(kind, rank, ws, gen, row_wise, b_layout)
                    spec = CallSpec(
                        kind=kind,
                        group=g,
                        rank=rank,
                        world_size=ws,
                        a_shape=tuple(a8.shape),
                        b_shape=tuple(b8.shape),
                        dtype=FP8,
                        device=a8.device,
                        candidate=unfused_candidate(),
                    )
                    program = TEMPLATES["unfused"].prepare(spec, b8)
                    pending = []
                    for fast in (False, True):  # two calls back to back, fresh inputs, outputs poisoned
                        a8, b8, a_scale, b_scale = _operands(kind, rank, ws, gen, row_wise, b_layout)
                        out = torch.full(spec.out_shape, float("nan"), dtype=spec.out_dtype)
                        # the first as a plain pair, the second asking for fast accumulation
                        program(
                            a8,
                            b8,
                            out,
                            scales=scaled.Scales(a_scale, b_scale, True) if fast else (a_scale, b_scale),
                        )
                        pending.append((out, a8, b8, a_scale, b_scale))
                    lib = unfused(kind, a8, b8, g, scales=(a_scale, b_scale))
                    for out, a8, b8, a_scale, b_scale in pending:
                        ref = reference(kind, a8, b8, g, a_scale, b_scale)
                        unscaled = reference(kind, a8, b8, g)
                        got.append(
                            (
                                kind,
                                row_wise,
                                b_layout,
                                out.dtype,
                                relative_error(out, ref),
                                relative_error(unscaled, ref),
                            )
                        )
                    got.append((kind, row_wise, "library", lib.dtype, relative_error(lib, ref), 1.0))
        q.put((rank, (got, flags)))
    finally:
        dist.destroy_process_group()


def test_the_unfused_fp8_ops_match_the_reference_of_the_same_fp8_operands_on_two_ranks():
    for rank, (got, flags) in run_gloo(_worker, 2, timeout=120):
        # each case's scaled GEMMs: the plain call, the one asking for fast accumulation, the library's
        assert flags == [False, True, False] * (3 * 2 * 2), f"rank {rank}: fast accumulation {flags}"
        assert len(got) == 3 * 2 * 2 * 3  # kinds, scalings, layouts: two calls and the library path
        for kind, row_wise, layout, dtype, err, unscaled in got:
            where = f"rank {rank} {kind} {'row' if row_wise else 'tensor'}-wise, b {layout}"
            assert dtype == torch.bfloat16, where
            assert err <= FP8_TOLERANCE, f"{where}: relative error {err:.3g}"
            assert unscaled > 10 * FP8_TOLERANCE, f"{where}: the scales must matter to the check"


# `syncopate bench --dtype fp8` -------------------------------------------------------------------


def test_bench_takes_dtype_fp8_up_to_the_gpus_it_needs(tmp_path):
    import os
    import subprocess
    import sys

    def bench(*args):
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "syncopate",
                "bench",
                "ag_gemm",
                "--m",
                "8192",
                "--n",
                "8192",
                "--k",
                "8192",
                *args,
            ],
            capture_output=True,
            text=True,
            env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
            timeout=120,
        )

    r = bench("--dtype", "fp8", "--gpus", "2")
    assert r.returncode == 1 and "needs 2 CUDA GPUs on this host; 0 visible" in r.stderr, r.stderr
    r = bench("--dtype", "int8")
    assert r.returncode == 2 and "unknown dtype 'int8'" in r.stderr and "fp8" in r.stderr, r.stderr


def _interpret_quantize(monkeypatch) -> None:
    """Run `quantize`'s Triton kernels under the interpreter (CPU tensors), where they were made
    for it: a process that imported them for a GPU runs them compiled (tests/test_gpu_fp8.py)."""
    from syncopate.kernels import fp8_cast

    if "Interpreted" not in type(fp8_cast.amax_kernel).__name__:
        pytest.skip(
            "fp8_cast's kernels were compiled for a GPU in this process: tests/test_gpu_fp8.py checks them"
        )
    monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.mark.parametrize("kernels", [True, False], ids=["triton-kernels", "torch-ops"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_quantize_gives_the_formulas_bytes_in_the_layout_asked_for(dtype, kernels, monkeypatch):
    """`quantize` (two passes, no clamp) against the documented formula clamp(v / scale, ±448) as
    float8: the same bytes, row by row and column by column, over magnitudes from 1e-4 to 1e4, zero
    rows and columns, and each value at its slice's amax; written row-major, column-major or in
    v's own layout (a transposed view's). Both ways it runs: the Triton kernels (here under the
    interpreter, which leaves the last rounding to torch: `fp8_cast`) and torch's ops."""
    from syncopate.kernels import fp8_cast
    from syncopate.kernels.scaled import AMAX_EPS, E4M3_MAX, quantize

    if kernels:
        _interpret_quantize(monkeypatch)
        calls = []
        launch = fp8_cast.launch_quantize
        monkeypatch.setattr(fp8_cast, "launch_quantize", lambda *a: calls.append(1) or launch(*a))
    else:
        monkeypatch.setattr(fp8_cast, "fits", lambda v: False)
    gen = torch.Generator().manual_seed(9)
    v = torch.randn(48, 80, generator=gen) * torch.logspace(-4, 4, 48).unsqueeze(1)
    v[5] = 0
    v[:, 7] = 0
    v[9, 3] = -v[9].abs().max() * 1.0001  # the amax on a negative value
    v = v.to(dtype)
    for src in (v, v.t()):
        for dim in (0, 1):
            scale = src.float().abs().amax(dim=dim, keepdim=True).clamp_min(AMAX_EPS) * (1 / E4M3_MAX)
            want = (src.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(FP8)
            for layout, strides in (
                (None, src.stride()),
                ("row", (src.shape[1], 1)),
                ("column", (1, src.shape[0])),
            ):
                got, got_scale = quantize(src, dim, layout)
                assert got.stride() == strides and torch.equal(got_scale, scale), (dim, layout)
                assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), (dtype, dim, layout)
    assert not kernels or len(calls) == 12
    with pytest.raises(ConfigError, match=r"layout='diagonal': accepted are 'row', 'column' and None"):
        quantize(v, 1, "diagonal")


@pytest.mark.parametrize("shape", [(1100, 70), (70, 1100), (300, 300)])
def test_the_quantize_kernels_split_long_reductions_across_programs(shape, monkeypatch):
    """The amax kernel splits a reduced dimension longer than its programs' spans over several
    programs whose maxima meet by atomics (the tokens of a weight gradient's operands), and the
    slice kernel reads a slice longer than its chunk in chunks, twice: the scales and bytes of
    every split (the largest value in the first, the middle or the last span or chunk, one shorter
    than the rest) are those of one reduction."""
    from syncopate.kernels import fp8_cast
    from syncopate.kernels.scaled import AMAX_EPS, E4M3_MAX, quantize

    _interpret_quantize(monkeypatch)
    monkeypatch.setattr(fp8_cast, "AMAX_TARGET_PROGRAMS", 64)
    monkeypatch.setattr(fp8_cast, "SLICE_CHUNK", 128)
    gen = torch.Generator().manual_seed(3)
    for where in (0, shape[0] // 2, shape[0] - 1):
        v = torch.randn(*shape, generator=gen).to(torch.bfloat16)
        v[where] *= 50
        for src in (v, v.t()):
            for dim in (0, 1):
                scale = src.float().abs().amax(dim=dim, keepdim=True).clamp_min(AMAX_EPS) * (1 / E4M3_MAX)
                for layout in ("row", "column"):
                    got, got_scale = quantize(src, dim, layout)
                    assert torch.equal(got_scale, scale), (shape, where, dim, layout)
                    want = (src.float() / scale).to(FP8).float()
                    assert torch.equal(got.float(), want), (shape, where, dim, layout)
