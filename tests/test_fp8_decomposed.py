"""Layer: pure CPU. The decomposed reduce-scatter and all-reduce on FP8 operands
(`syncopate/kernels/decomposed.py`, `scales=`): every rank's enqueued work played on the CPU by the
executor of tests/test_stationary.py (streams in random orders, half the runs on one hardware
queue), three calls back to back with fresh FP8 operands and poisoned outputs, each plan variant
(`scaled_sum`, `side_add`) against the float32 sum of the dequantized operands; the scaled GEMMs
are the CPU build's `torch._scaled_mm`, enqueued as the executor's operations."""

from __future__ import annotations

import contextlib

import pytest
import torch

from syncopate.errors import ConfigError
from syncopate.kernels import decomposed
from syncopate.kernels.scaled import SCALE_ALIGN, chunk_scale, quantize, scaled_mm
from syncopate.measure.reference import FP8_TOLERANCE, relative_error
from tests.test_stationary import world  # noqa: F401 - the executor, as a fixture


@pytest.fixture
def fp8_world(world, monkeypatch):  # noqa: F811
    """The executor, its scaled GEMMs enqueued on the current stream (a scratch product in float32,
    as the executor's buffers are) and `torch.cuda.stream` switching the stream enqueued on."""

    def scaled_gemm(a, b, a_scale, b_scale, out=None, fast_accum=False):
        target = torch.empty(a.shape[0], b.shape[1]) if out is None else out
        world.current.ops.append(
            ("run", lambda: target.copy_(scaled_mm(a, b, a_scale, b_scale, fast_accum=fast_accum)))
        )
        return target

    @contextlib.contextmanager
    def stream(s):
        before, world.current = world.current, s
        try:
            yield
        finally:
            world.current = before

    monkeypatch.setattr(decomposed, "scaled_gemm", scaled_gemm)
    monkeypatch.setattr(decomposed.torch.cuda, "stream", stream, raising=False)
    return world


def _operands(m, k, n, gen, row_wise):
    a = torch.randn(m, k, generator=gen) * torch.linspace(0.5, 4.0, m).unsqueeze(1)
    w = torch.randn(n, k, generator=gen) / k**0.5
    a8, sa = quantize(a, 1)
    w8, sw = quantize(w, 1)  # a weight [N, K]: B = its transpose, column-major, scaled per column
    if not row_wise:
        sa = sa.amax().reshape(())
        a8 = (a / sa).to(torch.float8_e4m3fn)
    return a8, w8.t(), sa, sw.reshape(1, -1).contiguous()


def _play(make_world, ws, m, n, k, all_reduce, plan_fields, seed):
    """Three calls of a world `make_world(fields)` makes, played with `seed`: each call's outputs and
    the float32 sum over ranks of the dequantized products."""
    w = make_world(plan_fields)
    calls = []
    for call in range(3):
        gen = torch.Generator().manual_seed(100 * seed + call)
        ops = [_operands(m, k, n, gen, row_wise=call != 1) for _ in range(ws)]
        outs = [torch.full((m if all_reduce else m // ws, n), float("nan")) for _ in range(ws)]
        for r in range(ws):
            a8, b8, sa, sb = ops[r]
            type(w).current = w.mains[r]
            decomposed.run(w.ctxs[r], w.plans[r], a8, b8, outs[r], scales=(sa, sb))
        want = sum((a8.float() * sa) @ (b8.float() * sb) for a8, b8, sa, sb in ops)
        calls.append((outs, want))
    w.play(seed, one_queue=seed % 2 == 1)
    return w, calls


def _make(fp8_world, ws, m, n, all_reduce, splits):
    def make(fields):
        return fp8_world(
            ws,
            decomposed.decomposed_buffers(ws, m, n, torch.float32, all_reduce),
            lambda r: decomposed.DecomposedPlan.of(r, ws, m, n, all_reduce, splits, **fields),
            decomposed,
        )

    return make


VARIANTS = [
    {},
    {"scaled_sum": "out", "side_add": True},
    {"scaled_sum": "accumulator"},
    {"fast_accum": True},
]


@pytest.mark.parametrize(
    "all_reduce, ws, m, splits",
    [
        (False, 2, 64, 4),
        (False, 2, 96, 3),
        (False, 3, 96, 2),
        (False, 4, 128, 2),
        (True, 2, 64, 4),
        (True, 3, 96, 2),
    ],
)
def test_every_fp8_call_sums_the_dequantized_products_over_the_ranks(fp8_world, all_reduce, ws, m, splits):
    """Each variant's outputs, call after call, against the float32 sum of the dequantized products;
    the variants' outputs are the same sums in the same order, so they agree bit for bit."""
    n, k = 32, 48
    make = _make(fp8_world, ws, m, n, all_reduce, splits)
    for seed in range(2):
        got = {}
        for fields in VARIANTS if not all_reduce else [{}, {"fast_accum": True}]:
            _, calls = _play(make, ws, m, n, k, all_reduce, fields, seed)
            for call, (outs, want) in enumerate(calls):
                for r in range(ws):
                    rows = slice(None) if all_reduce else slice(r * m // ws, (r + 1) * m // ws)
                    err = relative_error(outs[r], want[rows])
                    assert err <= FP8_TOLERANCE, f"{fields} seed {seed} call {call} rank {r}: {err:.3g}"
            got[str(fields)] = [torch.cat(outs) for outs, _ in calls]
        first = next(iter(got.values()))
        for name, outs in got.items():
            assert all(torch.equal(x, y) for x, y in zip(outs, first)), f"{name} differs from the default"


def test_an_own_chunks_fp8_gemm_waits_for_no_partial_and_its_sum_lands_in_the_output(fp8_world):
    """scaled_sum="out": on the caller's stream each own chunk's GEMM comes before the waits for the
    peers' partials of it, and nothing is copied into the output after (no copy on any side stream
    into it); with side_add the sums and their waits leave the caller's stream."""
    ws, m, n, k = 2, 64, 32, 48
    make = _make(fp8_world, ws, m, n, False, 4)
    w, _ = _play(make, ws, m, n, k, False, {}, 0)
    plan = w.plans[0]
    assert plan.scaled_sum == "out" and not plan.side_add
    own = len(plan.own_chunks(0))
    main = w.mains[0].ops
    runs = [i for i, op in enumerate(main) if op[0] == "run"]
    gemms_first = len(plan.halves) * (ws - 1)  # a call's partial GEMMs for the peer come first
    first_own_gemm = runs[gemms_first]
    first_wait = next(i for i, op in enumerate(main) if op[0] == "event" and i > runs[gemms_first - 1])
    assert first_own_gemm < first_wait, "the own chunk's GEMM must not wait for the peer's partial"
    copies_into_out = [op for s in w.ctxs[0].streams for op in s.ops if op[0] == "copy"]
    assert len(copies_into_out) == 3 * len(plan.halves), "only the partials' pushes: nothing copied into out"
    side = _make(fp8_world, ws, m, n, False, 4)
    w2, _ = _play(side, ws, m, n, k, False, {"side_add": True}, 1)
    main_runs = sum(op[0] == "run" for op in w2.mains[0].ops)
    ready_runs = sum(op[0] == "run" for op in w2.ctxs[0].streams[1].ops)
    assert (main_runs, ready_runs) == (3 * (len(plan.halves) + own), 3 * own), (
        "GEMMs on the caller's, sums beside"
    )


def test_a_reduce_scatter_sums_into_the_output_and_an_all_reduce_in_the_accumulator_by_default():
    assert decomposed.DecomposedPlan.of(0, 2, 64, 32, False, 2).scaled_sum == "out"
    assert decomposed.DecomposedPlan.of(0, 2, 64, 32, True, 2).scaled_sum == "accumulator"
    plan = decomposed.DecomposedPlan.of(0, 2, 64, 32, False, 2, scaled_sum="accumulator", fast_accum=True)
    assert (plan.scaled_sum, plan.side_add, plan.fast_accum) == ("accumulator", False, True)


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"scaled_sum": "sum"}, r"scaled_sum='sum': accepted are out, accumulator"),
        ({"scaled_sum": "accumulator", "side_add": True}, r"side_add=True .* got scaled_sum='accumulator'"),
        ({"fast_accum": 1}, r"fast_accum=1 must be True or False"),
    ],
)
def test_bad_fp8_plan_fields_are_refused_naming_the_value(fields, message):
    with pytest.raises(ConfigError, match=message):
        decomposed.DecomposedPlan.of(0, 2, 64, 32, False, 2, **fields)
    with pytest.raises(ConfigError, match=r"scaled_sum='out' is for a reduce-scatter"):
        decomposed.DecomposedPlan.of(0, 2, 64, 32, True, 2, scaled_sum="out")


def test_a_chunks_scale_rows_start_on_a_16_byte_boundary():
    """torch's row-wise scaled GEMM reads its scales in 16-byte words: rows of a scale that start
    between two are a copy, rows on a boundary the scale's own view."""
    scale = torch.rand(64, 1) + 0.5
    assert scale.data_ptr() % SCALE_ALIGN == 0
    for lo in (1, 2, 3, 5, 6):
        rows = chunk_scale(scale, lo, lo + 8)
        assert rows.data_ptr() % SCALE_ALIGN == 0 and torch.equal(rows, scale[lo : lo + 8]), lo
    on = chunk_scale(scale, 4, 12)
    assert on.data_ptr() == scale[4:].data_ptr(), "rows on a boundary are not copied"
