"""Check the fused ops captured in CUDA graphs, on every rank of a group: for each op and candidate
(each backend, the stationary templates), one call outside the capture (it makes the context and
compiles the kernel), then a graph of two calls with different inputs, replayed with fresh inputs
and poisoned outputs, an uncaptured call with its own tensors between replays, and replays back to
back with inputs changed between them in stream order; every output against float32. The first call
of a shape, a bounded wait and a configuration whose replay stalls (the nccl backend's chunk plans,
unless NCCL registers no captured buffer: NCCL_GRAPH_REGISTER=0) are refused under capture with
their ConfigError.

One GPU, a group of one rank (tests/test_gpu_capture.py runs it so, in a fresh process without
TRITON_INTERPRET): it prints one line per check and exits 1 if one fails.

    python tests/support/capture_check.py

Several ranks: `run_all` on each (tests/test_gpu_capture.py: two ranks sharing one GPU, and two GPUs).
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__" and os.environ.get("TRITON_INTERPRET", "0") == "1":
    sys.exit("capture_check: unset TRITON_INTERPRET; it launches compiled kernels")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import run_checks  # noqa: E402

import syncopate  # noqa: E402
from syncopate.errors import ConfigError  # noqa: E402
from syncopate.measure.local_ranks import free_port, join_group  # noqa: E402
from syncopate.measure.reference import gathered_rows, reference, relative_error  # noqa: E402
from syncopate.search_space import (  # noqa: E402
    Candidate,
    Workload,
    a_stationary_candidate,
    c_stationary_candidate,
    decomposed_candidate,
    nccl_chunks_replay,
)

OPS = {
    "ag_gemm": syncopate.all_gather_matmul,
    "gemm_rs": syncopate.matmul_reduce_scatter,
    "gemm_ar": syncopate.matmul_all_reduce,
}
SHAPES = {"ag_gemm": (1040, 768, 512), "gemm_rs": (1040, 512, 768), "gemm_ar": (1040, 512, 768)}
"""M/ws not a multiple of the tiles' rows at one, two and four ranks."""
TOL = 1e-2
REPLAYS = 4


def candidate(backend: str, splits: int = 2) -> Candidate:
    return Candidate(
        backend=backend,
        num_splits=splits,
        comm_sms={"copy_engine": 0, "sm_copy": 16, "nccl": 64}[backend],
        block_m=128,
        block_n=128,
        block_k=64,
        group_m=8,
        num_warps=8,
        num_stages=3,
    )


def cases(nccl: bool) -> list[tuple[str, Candidate]]:
    """(kind, candidate) of every backend (NCCL only where the group has it) and cuBLAS template."""
    backends = ["copy_engine", "sm_copy"] + (["nccl"] if nccl else [])
    cublas = {
        "ag_gemm": [a_stationary_candidate(2), decomposed_candidate(2)],
        "gemm_rs": [c_stationary_candidate(), decomposed_candidate(2)],
        "gemm_ar": [c_stationary_candidate(2), decomposed_candidate(2)],
    }
    return [(kind, c) for kind in OPS for c in [*(candidate(b) for b in backends), *cublas[kind]]]


class Inputs:
    def __init__(self, kind: str, world: int, dev: torch.device, gen: torch.Generator, shape=None):
        self.kind, self.dev, self.gen = kind, dev, gen
        m, n, self.k = shape or SHAPES[kind]
        self.local = Workload(kind=kind, shape=(m, n, self.k), dtype="bf16").local_shapes(world)

    def a(self) -> torch.Tensor:
        return torch.randn(self.local["a"], generator=self.gen, device=self.dev).bfloat16()

    def b(self) -> torch.Tensor:
        return (torch.randn(self.local["b"], generator=self.gen, device=self.dev) / self.k**0.5).bfloat16()

    def poisoned(self) -> torch.Tensor:
        return torch.full(self.local["out"], float("nan"), dtype=torch.bfloat16, device=self.dev)


def _error(kind, out, a, b, group) -> float:
    err = relative_error(out, reference(kind, a, b, group))
    return err if err == err else float("inf")  # a NaN left in the output


def replayed(kind: str, cand: Candidate, dev, group, world: int, gen) -> str:
    """A graph of two calls, replayed with fresh inputs; raises AssertionError with the errors."""
    op, x = OPS[kind], Inputs(kind, world, dev, gen)
    a1, a2, b = x.a(), x.a(), x.b()
    out1, out2 = x.poisoned(), x.poisoned()
    op(a1, b, group, cand, out=out1)  # outside the capture: the context, the kernel
    torch.cuda.synchronize()
    if not (cand.replays_in_graph or nccl_chunks_replay()):  # it would stall: refused under capture
        _refused_in_capture(
            lambda: op(a1, b, group, cand, out=out1), "cannot be captured in a CUDA graph", cand.short()
        )
        assert _error(kind, out1, a1, b, group) <= TOL
        return "refused under capture with its ConfigError, right outside it"
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        op(a1, b, group, cand, out=out1)
        op(a2, b, group, cand, out=out2)
    errors = []
    for _ in range(REPLAYS):
        a1.copy_(x.a())
        a2.copy_(x.a())
        b.copy_(x.b())
        out1.fill_(float("nan"))
        out2.fill_(float("nan"))
        graph.replay()
        errors += [_error(kind, out1, a1, b, group), _error(kind, out2, a2, b, group)]
        a3, b3, out3 = x.a(), x.b(), x.poisoned()  # outside the graph, between its replays
        op(a3, b3, group, cand, out=out3)
        errors.append(_error(kind, out3, a3, b3, group))
    inputs = [(x.a(), x.a(), x.b()) for _ in range(3)]  # back to back: inputs changed in stream order
    kept = []
    for i1, i2, ib in inputs:
        a1.copy_(i1)
        a2.copy_(i2)
        b.copy_(ib)
        graph.replay()
        kept.append((out1.clone(), out2.clone()))
    for (i1, i2, ib), (o1, o2) in zip(inputs, kept, strict=True):
        errors += [_error(kind, o1, i1, ib, group), _error(kind, o2, i2, ib, group)]
    if max(errors) > TOL:
        raise AssertionError(f"relative errors {[f'{e:.3g}' for e in errors]}")
    return f"max rel err {max(errors):.3g} over {len(errors)} outputs"


def gathered(dev, group, world: int, gen) -> str:
    """`return_gathered` captured: the gathered A comes out of each replay too (the fused consumer
    and the decomposed all-gather)."""
    x = Inputs("ag_gemm", world, dev, gen)
    for cand in (candidate("copy_engine"), decomposed_candidate(1)):
        a, b = x.a(), x.b()
        syncopate.all_gather_matmul(a, b, group, cand, return_gathered=True)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out, full = syncopate.all_gather_matmul(a, b, group, cand, return_gathered=True)
        for _ in range(REPLAYS):
            a.copy_(x.a())
            out.fill_(float("nan"))
            full.fill_(float("nan"))
            graph.replay()
            err = _error("ag_gemm", out, a, b, group)
            assert err <= TOL, f"{cand.short()}: rel err {err:.3g}"
            assert torch.equal(full, gathered_rows(a, group)), (
                f"{cand.short()}: the gathered A differs from the shards"
            )
    return "gathered A right in every replay (fused consumer, decomposed)"


def _refused_in_capture(call, words: str, what: str) -> None:
    """`call()` under a CUDA graph capture raises ConfigError saying `words`; AssertionError naming
    `what` where it was captured instead."""
    try:
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            call()
    except ConfigError as e:
        assert words in str(e), e
    else:
        raise AssertionError(f"captured {what}")


def refused(dev, group, world: int, gen) -> str:
    """The first call of a shape, and a bounded wait, under capture: ConfigError, nothing captured."""
    x = Inputs("gemm_rs", world, dev, gen, shape=(1056, 512, 768))
    a, b = x.a(), x.b()
    cand = candidate("copy_engine")
    for kwargs, words in (({}, "first call with these shapes"), ({"spin_limit": 1 << 20}, "spin_limit=")):
        _refused_in_capture(
            lambda kwargs=kwargs: syncopate.matmul_reduce_scatter(a, b, group, cand, **kwargs),
            words,
            f"with {kwargs}",
        )
        if not kwargs:  # now made outside the capture, it is right
            out = x.poisoned()
            syncopate.matmul_reduce_scatter(a, b, group, cand, out=out)
            assert _error("gemm_rs", out, a, b, group) <= TOL
    return "refused with its ConfigError, right outside the capture"


def run_all(
    dev, group, rank: int, world: int, nccl: bool, templates: tuple[str, ...] | None = None
) -> list[tuple[str, str | None, str]]:
    """(name, failure or None, detail) of every check, in the same order on every rank; with
    `templates`, only the replays of candidates of those templates."""
    gen = torch.Generator(device=dev)
    gen.manual_seed(11 + rank)
    checks = [
        (
            f"{kind} {c.short()}: replays right",
            lambda kind=kind, c=c: replayed(kind, c, dev, group, world, gen),
        )
        for kind, c in cases(nccl)
        if templates is None or c.template in templates
    ]
    if templates is None:
        checks += [
            ("ag_gemm return_gathered captured", lambda: gathered(dev, group, world, gen)),
            ("first call and bounded waits refused under capture", lambda: refused(dev, group, world, gen)),
        ]
    results = []
    for name, check in checks:
        try:
            results.append((name, None, check()))
        except Exception as e:  # noqa: BLE001 — reported, and the next check runs
            import traceback

            results.append((name, f"{type(e).__name__}: {e}", traceback.format_exc()))
    return results


def main() -> int:
    if not torch.cuda.is_available():
        print("capture_check: needs a CUDA GPU; none is visible", file=sys.stderr)
        return 1
    dev = join_group(0, 1, free_port())
    try:
        results = run_all(dev, dist.group.WORLD, 0, 1, nccl=True)
    finally:
        syncopate.close_contexts()
        dist.destroy_process_group()

    def check(detail):
        def run():
            raise AssertionError(detail)

        return run

    return run_checks(
        (name, check(detail)) if failure else (f"{name}: {detail}", lambda: None)
        for name, failure, detail in results
    )


if __name__ == "__main__":
    sys.exit(main())
