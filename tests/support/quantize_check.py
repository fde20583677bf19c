"""Check on one GPU the FP8 quantization kernels (`syncopate.kernels.fp8_cast`, what
`syncopate.kernels.scaled.quantize` runs on a GPU) against torch's reduction and division of the
same operands: the same scales and bytes, at an FP8 MLP layer's operand shapes (LLaMA-3-8B at TP=4,
8192 tokens) and odd ones, row-wise and column-wise, from row-major tensors and transposed views,
written row-major, column-major and in the input's layout, into outputs poisoned with NaN bytes,
calls back to back on fresh inputs. Then prints each case's time against torch's (`--time`).
Run in a fresh process without TRITON_INTERPRET (tests/test_gpu_fp8.py does): one line per check,
exit 1 if one fails, 3 without a GPU.

    python tests/support/quantize_check.py [--time]
"""

from __future__ import annotations

import os
import sys

if os.environ.get("TRITON_INTERPRET", "0") == "1":
    sys.exit("quantize_check: unset TRITON_INTERPRET; it launches compiled kernels")

import torch  # noqa: E402
from checks import run_checks  # noqa: E402

from syncopate.kernels import fp8_cast  # noqa: E402
from syncopate.kernels.scaled import AMAX_EPS, E4M3_MAX, FP8, quantize  # noqa: E402

SHAPES = [(8192, 7168), (8192, 4096), (4096, 3584), (2048, 4096), (1000, 1100), (17, 4099), (640, 14344)]
"""The layer's operands (gate+up output rows, gathered activations, the down weight, a rank's
rows) and odd ones (partial tiles, a reduction split unevenly, slices longer than a chunk)."""
LAYOUTS = (None, "row", "column")


def _reference(v: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    amax = torch.linalg.vector_norm(v, float("inf"), dim=dim, keepdim=True).float()
    scale = amax.clamp_min(AMAX_EPS) * (1 / E4M3_MAX)
    return (v.float() / scale).to(FP8), scale


def check(rows: int, cols: int, dtype: torch.dtype) -> None:
    dev = torch.device("cuda")
    for call in range(3):
        gen = torch.Generator(device=dev).manual_seed(call)
        v = (
            torch.randn(rows, cols, generator=gen, device=dev)
            * torch.logspace(-3, 3, rows, device=dev)[:, None]
        )
        v[rows // 3] = 0
        v = v.to(dtype)
        for src in (v, v.t()):
            for dim in (0, 1):
                want, want_scale = _reference(src, dim)
                for layout in LAYOUTS:
                    got, scale = quantize(src, dim, layout)
                    assert torch.equal(scale, want_scale), (
                        f"call {call}: {tuple(src.shape)} dim {dim}: scales differ"
                    )
                    same = (
                        got.view(torch.uint8).eq(want.view(torch.uint8))
                        if got.stride() == want.stride()
                        else None
                    )
                    if same is None:
                        same = got.float().eq(want.float()) | (got.float().isnan() & want.float().isnan())
                    assert bool(same.all()), (
                        f"call {call}: {tuple(src.shape)} dim {dim} {layout}: bytes differ"
                    )
                # the launcher itself into poisoned outputs (0x7F is float8_e4m3fn's NaN)
                out = torch.full(src.shape, 0x7F, dtype=torch.uint8, device=dev).view(FP8)
                out_scale = torch.full(want_scale.shape, float("nan"), device=dev)
                fp8_cast.launch_quantize(src, dim, out, out_scale, AMAX_EPS, E4M3_MAX)
                assert torch.equal(out_scale, want_scale) and torch.equal(out.float(), want.float()), (
                    f"call {call}: {tuple(src.shape)} dim {dim}: poisoned output not fully written"
                )


def timings() -> None:
    """Each case's device µs a call (`_median_us`): the kernels, torch's ops."""
    dev = torch.device("cuda")
    print(
        f"{'operand':>22} {'dim':>3} {'layout':>6} {'kernels us':>10} {'torch us':>9} {'torch/kernels':>13}"
    )
    for rows, cols in [*SHAPES[:4], (8192, 14336)]:
        v = torch.randn(rows, cols, device=dev).to(torch.bfloat16)
        for name, src in ((f"{rows}x{cols}", v), (f"({rows}x{cols}).t()", v.t())):
            for dim, layout in ((1, "row"), (0, "column")):
                times = []
                for use in (True, False):
                    fits = fp8_cast.fits
                    if not use:
                        fp8_cast.fits = lambda v: False
                    try:
                        times.append(_median_us(lambda: quantize(src, dim, layout)))
                    finally:
                        fp8_cast.fits = fits
                print(
                    f"{name:>22} {dim:>3} {layout:>6} {times[0]:>10.1f} {times[1]:>9.1f} {times[1] / times[0]:>13.2f}"
                )


def _median_us(fn, calls: int = 10, reps: int = 7) -> float:
    """Device µs a call of `fn`: `calls` of them captured in a CUDA graph, the replay's median over
    `reps` (no host time in it)."""
    for _ in range(3):
        fn()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000 / calls)
    return sorted(times)[reps // 2]


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA GPU")
        return 3
    failed = run_checks(
        [
            (f"quantize {r}x{c} {str(d).removeprefix('torch.')}", lambda r=r, c=c, d=d: check(r, c, d))
            for r, c in SHAPES
            for d in ((torch.bfloat16, torch.float32) if r * c < 2**24 else (torch.bfloat16,))
        ]
    )
    if "--time" in sys.argv:
        timings()
    return failed


if __name__ == "__main__":
    sys.exit(main())
