"""Layer: two GPUs on one host (multigpu). FP8 beyond the ops' public matrix (tests/test_gpu_fp8.py):

- the decomposed reduce-scatter's and all-reduce's FP8 plan variants (`scaled_sum`, `side_add`,
  `fast_accum`; num_splits 1, 2, 4, and a block whose chunks' scale rows start off a 16-byte
  boundary), and the public op with `out=`: three calls back to back on fresh inputs, outputs and
  the context's symmetric buffers poisoned with NaN first, against the float32 product of the
  dequantized operands (`FP8_TOLERANCE`);
- the float8 layers with `impl="async_tp"` (torch's fused scaled ops) against float32 GEMMs of the
  same FP8 operands and against the bf16 layer (tests/test_tp_float8.py's checks);
- the layer `syncopate bench --layer mlp --dtype fp8` times, for each implementation (torch,
  async_tp, the fused ops with decomposed configurations, the defaults), forward and backward
  captured in a CUDA graph (`torch.cuda.graph`, as the bench's `graph` mode does) and replayed on
  fresh inputs into NaN-poisoned outputs and gradients: the same numbers as the eager step on
  those inputs.
"""

from __future__ import annotations

import pytest
from test_gpu_ops import needs_gpus, run_ranks

pytestmark = pytest.mark.multigpu


def _plans_target(rank, world, port, q):
    from syncopate.measure.local_ranks import join_group

    device = join_group(rank, world, port)
    import dataclasses

    import torch
    import torch.distributed as dist

    import syncopate
    from syncopate.kernels.scaled import FP8, quantize
    from syncopate.kernels.templates import CallSpec, template_for
    from syncopate.measure.reference import FP8_TOLERANCE, reference, relative_error
    from syncopate.measure.timing import barrier
    from syncopate.search_space import decomposed_candidate

    g = dist.group.WORLD
    gen = torch.Generator(device=device).manual_seed(11 + rank)

    def operands(m, n, k_local):
        a = torch.randn(m, k_local, generator=gen, device=device) * (1.0 + rank)
        w = torch.randn(n, k_local, generator=gen, device=device) / (k_local * world) ** 0.5
        a8, sa = quantize(a, 1)
        w8, sw = quantize(w, 1)
        return a8, w8.t(), sa, sw.reshape(1, -1).contiguous()

    variants = {
        "gemm_rs": [{}, {"side_add": True}, {"scaled_sum": "accumulator"}, {"fast_accum": True}],
        "gemm_ar": [{}, {"fast_accum": True}],
    }
    failed = []
    try:
        cases = [
            (kind, shape, s)
            for kind in ("gemm_rs", "gemm_ar")
            for shape, splits in (((2048, 1024, 2048), (1, 2, 4)), ((240, 256, 512), (4,)))
            for s in splits
        ]
        for kind, (m, n, k), s in cases:
            k_local = k // world
            a8, b8, _, _ = operands(m, n, k_local)
            spec = CallSpec(
                kind=kind,
                group=g,
                rank=rank,
                world_size=world,
                a_shape=tuple(a8.shape),
                b_shape=tuple(b8.shape),
                dtype=FP8,
                device=device,
                candidate=decomposed_candidate(s),
            )
            program = template_for(spec.candidate, kind).prepare(spec, b8)
            plan = program.plan
            for fields in variants[kind]:
                case = f"{kind} {m}x{n}x{k} s{s} {fields or 'default'}"
                try:
                    program.plan = dataclasses.replace(plan, **fields)
                    for buf in program.context.buffers.values():
                        buf.local.fill_(float("nan"))
                    barrier(g, device)
                    pending = []
                    for _ in range(3):
                        a8, b8, sa, sb = operands(m, n, k_local)
                        out = torch.full(spec.out_shape, float("nan"), dtype=torch.bfloat16, device=device)
                        program(a8, b8, out, scales=(sa, sb))
                        pending.append((out, a8, b8, sa, sb))
                    for out, a8, b8, sa, sb in pending:
                        err = relative_error(out, reference(kind, a8, b8, g, sa, sb))
                        if not err <= FP8_TOLERANCE:
                            failed.append(f"{case}: relative error {err:.3g}")
                            break
                except Exception as e:  # noqa: BLE001 - named in the report
                    failed.append(f"{case}: {type(e).__name__}: {e}")
        op = {"gemm_rs": syncopate.matmul_reduce_scatter, "gemm_ar": syncopate.matmul_all_reduce}
        for kind, fn in op.items():  # the public op into a poisoned out=
            m, n, k = 2048, 1024, 2048
            pending = []
            for _ in range(3):
                a8, b8, sa, sb = operands(m, n, k // world)
                rows = m // world if kind == "gemm_rs" else m
                out = torch.full((rows, n), float("nan"), dtype=torch.bfloat16, device=device)
                fn(a8, b8, g, decomposed_candidate(4), out=out, a_scale=sa, b_scale=sb)
                pending.append((out, a8, b8, sa, sb))
            for out, a8, b8, sa, sb in pending:
                err = relative_error(out, reference(kind, a8, b8, g, sa, sb))
                if not err <= FP8_TOLERANCE:
                    failed.append(f"{kind} public op, out=: relative error {err:.3g}")
        q.put((rank, failed))
    finally:
        syncopate.close_contexts()
        dist.destroy_process_group()


def test_fp8_decomposed_plan_variants_match_the_reference_into_poisoned_outputs_on_two_gpus():
    needs_gpus(2)
    reports = run_ranks(_plans_target, 2, timeout=600)
    failed = sorted({f for r in reports.values() for f in r})
    assert not failed, "\n".join(failed)


def _async_tp_target(rank, world, port, q):
    from syncopate.measure.local_ranks import join_group

    device = join_group(rank, world, port)
    import torch.distributed as dist
    from test_tp_float8 import layer_failures, layer_report

    import syncopate

    try:
        try:
            report = layer_report(rank, world, impl="async_tp", shape=(512, 1024, 2048), device=device)
            failures = layer_failures(rank, report, " async_tp")
        except Exception as e:  # noqa: BLE001 - named in the report
            failures = [f"rank {rank} async_tp: {type(e).__name__}: {e}"]
        q.put((rank, failures))
    finally:
        syncopate.close_contexts()
        dist.destroy_process_group()


@pytest.mark.timeout(600)
def test_fp8_layers_on_torchs_fused_scaled_ops_match_their_fp8_reference_on_two_gpus():
    needs_gpus(2)
    reports = run_ranks(_async_tp_target, 2, timeout=500)
    failed = [f for r in reports.values() for f in r]
    assert not failed, "\n".join(failed)


def _capture_target(rank, world, port, q):
    from syncopate.measure.local_ranks import join_group

    device = join_group(rank, world, port)
    import gc

    import torch
    import torch.distributed as dist

    import syncopate
    from syncopate.measure.reference import relative_error
    from syncopate.platform import detect_topology
    from syncopate.search_space import decomposed_candidate
    from syncopate.tp.bench import LayerBench, _build, _default_configs

    g = dist.group.WORLD
    bench = LayerBench(layer="mlp", hidden=1024, ffn=2048, tokens=1024, tp=world, dtype="fp8")
    torch.manual_seed(0)
    weights = {
        "col": [
            torch.nn.Linear(1024, 2048, bias=False, device=device, dtype=torch.bfloat16) for _ in range(2)
        ],
        "row": torch.nn.Linear(2048, 1024, bias=False, device=device, dtype=torch.bfloat16),
    }
    decomposed = {"ag_gemm": decomposed_candidate(2), "gemm_rs": decomposed_candidate(2)}
    configs = {
        "torch": None,
        "async_tp": None,
        "syncopate": (decomposed, decomposed),
        "default": _default_configs(bench, detect_topology(g)),
    }
    gen = torch.Generator(device=device).manual_seed(100 + rank)
    rows = bench.tokens // world
    report = {}
    try:
        for impl, cfg in configs.items():
            graph = static = y_static = None
            try:
                forward, params = _build(bench, impl, g, device, weights, cfg)
                x = (
                    torch.randn(rows, bench.hidden, generator=gen, device=device)
                    .bfloat16()
                    .requires_grad_(True)
                )
                dy = torch.randn(rows, bench.hidden, generator=gen, device=device).bfloat16()

                def step(forward=forward, x=x, dy=dy):
                    y = forward(x)
                    y.backward(dy)
                    return y

                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for _ in range(3):
                        step()
                torch.cuda.current_stream().wait_stream(side)
                for t in (x, *params):
                    t.grad = None
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    y_static = step()
                static = [y_static, x.grad, *(p.grad for p in params)]
                errors = []
                for _ in range(2):
                    with torch.no_grad():
                        x.copy_(torch.randn(rows, bench.hidden, generator=gen, device=device))
                        dy.copy_(torch.randn(rows, bench.hidden, generator=gen, device=device))
                        for t in static:  # detached: torch's fused scaled ops return views of their buffers
                            t.detach().fill_(float("nan"))
                    graph.replay()
                    torch.cuda.synchronize()
                    replayed = [t.clone() for t in static]
                    for t in (x, *params):
                        t.grad = None
                    y = step()
                    eager = [y.detach(), x.grad, *(p.grad for p in params)]
                    errors.append([relative_error(r, e) for r, e in zip(replayed, eager, strict=True)])
                report[impl] = errors
            except Exception as e:  # noqa: BLE001 - named in the report
                report[impl] = f"{type(e).__name__}: {e}"
            finally:  # a live graph of torch's NCCL collectives keeps destroy_process_group from returning
                graph = static = y_static = None
                gc.collect()
                torch.cuda.synchronize()
                dist.barrier()
        q.put((rank, report))
    finally:
        syncopate.close_contexts()
        dist.destroy_process_group()


@pytest.mark.timeout(600)
def test_the_fp8_bench_layer_of_every_impl_replays_from_a_cuda_graph_as_it_runs_eagerly_on_two_gpus():
    needs_gpus(2)
    reports = run_ranks(_capture_target, 2, timeout=500)
    failed = []
    for rank, report in reports.items():
        for impl, errors in report.items():
            if isinstance(errors, str):
                failed.append(f"rank {rank} {impl}: {errors}")
            elif not all(e <= 1e-3 for replay in errors for e in replay):
                failed.append(f"rank {rank} {impl}: replay against eager (y, dx, dW...): {errors}")
    assert not failed, "\n".join(failed)
