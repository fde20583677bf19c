"""Layer: two GPUs on one host (multigpu). The FP8 ops through the public entry points against the
float32 reference of the same FP8 operands and scales (`FP8_TOLERANCE`), and the harness's FP8
baselines.

Templates `unfused` and `decomposed` (num_splits 1, 2, 4) and the fused Triton templates (FP8
tiles; copy engine, and SM copies for the reductions), each kind, tensor-wise and row-wise
scales, B as `weight.t()` and row-major; outputs poisoned with NaN before each call, fresh random
inputs every call, three calls back to back before any is checked. Then the harness of an fp8
workload: every baseline it reports (torch's fused scaled async-TP ops where the installed torch
has them) and a verified, timed decomposed candidate. The cases run in one process a rank; a
failure names every case that failed. The fused templates' cases also run with two ranks sharing
one GPU (a gloo group, correctness only: `gpu`).
"""

from __future__ import annotations

import pytest
from test_gpu_ops import needs_gpus, run_ranks


def fused_configs(kind: str, world: int, nccl: bool = False) -> list:
    """The fused templates' FP8 candidates the cases run: direct on the copy engine with whole
    128x256 tiles (TMA epilogue) and with 128x128 ones (a tail cut in K where it applies), a
    reduction also with SM copies, its kept chunks interleaved and in the Gluon kernel (and with
    `nccl`, one GPU a rank, on NCCL's sends), and a ring from three ranks."""
    from syncopate.search_space import Candidate

    wide = dict(block_m=128, block_n=256, block_k=128, num_warps=8, num_stages=3, group_m=8)
    narrow = dict(block_m=128, block_n=128, block_k=128, num_warps=4, num_stages=4, group_m=8)
    out = [
        Candidate(backend="copy_engine", template="direct", num_splits=2, **wide),
        Candidate(backend="copy_engine", template="direct", num_splits=1, **narrow),
    ]
    if kind != "ag_gemm":
        out.append(Candidate(backend="sm_copy", template="direct", num_splits=2, comm_sms=16, **narrow))
        out.append(Candidate(template="direct", num_splits=2, tile_order="kept_interleaved", **narrow))
        out.append(Candidate(template="direct", num_splits=2, kernel="gluon", **wide))
        if nccl:
            out.append(Candidate(backend="nccl", template="direct", num_splits=2, comm_sms=64, **narrow))
    if world > 2:
        out.append(Candidate(backend="copy_engine", template="ring", num_splits=2, **narrow))
    return out


def _quantized(x, row_wise: bool):
    import torch

    amax = x.abs().amax(dim=1, keepdim=True) if row_wise else x.abs().amax().reshape(())
    scale = (amax / 448.0).clamp_min(1e-12).float()
    return (x / scale).to(torch.float8_e4m3fn), scale


def _operands(kind, rank, ws, m, n, k, row_wise, b_layout, device):
    import torch

    a_shape, b_shape = ((m // ws, k), (k, n // ws)) if kind == "ag_gemm" else ((m, k // ws), (k // ws, n))
    a = torch.randn(a_shape, device=device) * (1.0 + rank)
    a8, a_scale = _quantized(a, row_wise)
    w = torch.randn(b_shape[::-1], device=device) / k**0.5
    w8, w_scale = _quantized(w, row_wise)
    b8 = w8.t() if b_layout == "weight_t" else w8.t().contiguous()
    return a8, b8, a_scale, w_scale.reshape(1, -1).contiguous() if row_wise else w_scale


def _public_ops() -> dict:
    """The three public ops by kind."""
    import syncopate

    return {
        "ag_gemm": syncopate.all_gather_matmul,
        "gemm_rs": syncopate.matmul_reduce_scatter,
        "gemm_ar": syncopate.matmul_all_reduce,
    }


def _no_failures(target, timeout: int, shared_gpu: bool = False) -> None:
    """`target` on two GPUs (or two ranks sharing one: `shared_gpu`): every rank's failed cases, none expected."""
    if not shared_gpu:
        needs_gpus(2)
    reports = run_ranks(target, 2, (shared_gpu,), timeout=timeout)
    failed = sorted({f for r in reports.values() for f in r})
    assert not failed, "\n".join(failed)


def _ops_target(rank, world, port, shared_gpu, q):
    from syncopate.measure.local_ranks import join_group

    device = join_group(rank, world, port, shared_gpu=shared_gpu)
    import torch
    import torch.distributed as dist

    import syncopate
    from syncopate.measure.reference import FP8_TOLERANCE, reference, relative_error
    from syncopate.search_space import decomposed_candidate, unfused_candidate

    ops = _public_ops()
    g = dist.group.WORLD
    torch.manual_seed(7 + rank)
    failed = []
    m, n, k = 2048, 1024, 1024
    cublas = () if shared_gpu else (unfused_candidate(), *(decomposed_candidate(s) for s in (1, 2, 4)))
    try:
        for kind, config, row_wise, layout in (
            (kind, config, row_wise, layout)
            for op_kind in ops
            for kind, config in (
                (op_kind, c) for c in (*cublas, *fused_configs(op_kind, world, not shared_gpu))
            )
            for row_wise in (False, True)
            for layout in ("weight_t", "row_major")
        ):
            if kind == "ag_gemm" and config.num_splits == 4 and world == 2:
                config = decomposed_candidate(2)
            case = f"{kind} {config.short()} {'row' if row_wise else 'tensor'}-wise b {layout}"
            try:
                pending = []
                for _ in range(3):
                    a8, b8, sa, sb = _operands(kind, rank, world, m, n, k, row_wise, layout, device)
                    out = ops[kind](a8, b8, g, config, a_scale=sa, b_scale=sb)
                    pending.append((out, a8, b8, sa, sb))
                for out, a8, b8, sa, sb in pending:
                    err = relative_error(out, reference(kind, a8, b8, g, sa, sb))
                    if out.dtype != torch.bfloat16 or not err <= FP8_TOLERANCE:
                        failed.append(f"{case}: {out.dtype}, relative error {err:.3g}")
                        break
            except Exception as e:  # noqa: BLE001 - named in the report
                failed.append(f"{case}: {type(e).__name__}: {e}")
        q.put((rank, failed))
    finally:
        syncopate.close_contexts()
        dist.destroy_process_group()


@pytest.mark.multigpu
def test_fp8_ops_match_the_reference_of_the_same_fp8_operands_on_two_gpus():
    _no_failures(_ops_target, 900)


@pytest.mark.gpu
def test_the_fused_fp8_templates_match_the_reference_with_two_ranks_sharing_one_gpu():
    _no_failures(_ops_target, 900, shared_gpu=True)


def _harness_target(rank, world, port, q):
    from syncopate.measure.local_ranks import join_group

    join_group(rank, world, port)
    import torch
    import torch.distributed as dist

    from syncopate.measure.bench import BenchOptions
    from syncopate.measure.harness import Harness
    from syncopate.search_space import Workload, decomposed_candidate, unfused_candidate

    report = {}
    try:
        options = BenchOptions(workloads=[], warmup=2, repetitions=5)
        for kind in ("ag_gemm", "gemm_rs", "gemm_ar"):
            h = Harness(Workload(kind=kind, shape=(4096, 2048, 2048), dtype="fp8"), dist.group.WORLD, options)
            base = {b.name: b for b in h.measure_baselines()}
            results = {c.short(): h.run_candidate(c) for c in (unfused_candidate(), decomposed_candidate(2))}
            report[kind] = (
                {name: (len(b.samples_us), b.detail) for name, b in base.items()},
                {name: (r.status, r.max_rel_error, r.error) for name, r in results.items()},
                hasattr(torch.ops.symm_mem, "fused_all_gather_scaled_matmul"),
            )
            h.close()
        q.put((rank, report))
    finally:
        dist.destroy_process_group()


@pytest.mark.multigpu
def test_the_harness_measures_fp8_baselines_and_candidates_on_two_gpus():
    needs_gpus(2)
    from syncopate.measure.reference import FP8_TOLERANCE

    reports = run_ranks(_harness_target, 2, timeout=900)
    for kind, (base, results, has_scaled_async_tp) in reports[0].items():
        assert {"torch_seq", "gemm_alone", "comm_alone"} <= set(base), (kind, base)
        assert "_scaled_mm" in base["torch_seq"][1], base["torch_seq"]
        if has_scaled_async_tp:
            assert "torch_async_tp" in base, (kind, base)
            if kind != "gemm_ar":
                assert "scaled" in base["torch_async_tp"][1], base["torch_async_tp"]
        for name, (status, err, error) in results.items():
            assert status == "ok" and err <= FP8_TOLERANCE, (kind, name, status, err, error)


def _fused_harness_target(rank, world, port, q):
    """The tuner's harness on two ranks sharing the GPU: the fused templates' FP8 candidates of
    each kind verified against the reference and timed, as a sweep runs them."""
    from syncopate.measure.local_ranks import join_group

    join_group(rank, world, port, shared_gpu=True)
    from types import SimpleNamespace

    import torch.distributed as dist

    import syncopate
    from syncopate.measure.harness import Harness
    from syncopate.search_space import Workload

    report = {}
    try:
        options = SimpleNamespace(warmup=1, repetitions=2, flush_l2=False)
        for kind in ("ag_gemm", "gemm_rs", "gemm_ar"):
            h = Harness(Workload(kind=kind, shape=(4096, 1024, 1536), dtype="fp8"), dist.group.WORLD, options)
            for c in fused_configs(kind, world)[:2]:
                r = h.run_candidate(c)
                report[f"{kind} {c.short()}"] = (r.status, r.max_rel_error, r.error, len(r.samples_us))
            h.close()
        q.put((rank, report))
    finally:
        syncopate.close_contexts()
        dist.destroy_process_group()


@pytest.mark.gpu
def test_the_harness_verifies_and_times_the_fused_fp8_candidates_with_two_ranks_sharing_one_gpu():
    from syncopate.measure.reference import FP8_TOLERANCE

    reports = run_ranks(_fused_harness_target, 2, timeout=600)
    assert len(reports[0]) == 6
    for case, (status, err, error, samples) in reports[0].items():
        assert status == "ok" and err <= FP8_TOLERANCE and samples, (case, status, err, error)


def _replay_target(rank, world, port, shared_gpu, q):
    """FP8 calls replayed from their own graphs (`set_launch("graph")`): three sets of addresses
    (operands, scales, poisoned output), each refilled in place with fresh values before every
    call; every call right against the reference of the operands and scales it was given, and one
    graph captured per set (every later call a replay)."""
    from syncopate.measure.local_ranks import join_group

    device = join_group(rank, world, port, shared_gpu=shared_gpu)
    import torch
    import torch.distributed as dist

    import syncopate
    from syncopate.kernels import ops as ops_mod
    from syncopate.measure.reference import FP8_TOLERANCE, reference, relative_error
    from syncopate.search_space import decomposed_candidate

    ops = _public_ops()
    g = dist.group.WORLD
    torch.manual_seed(11 + rank)
    failed = []
    m, n, k = 2048, 1024, 1024
    try:
        ops_mod.set_launch("graph")
        for kind, config in (
            (op_kind, config)
            for op_kind in ops
            for config in ((decomposed_candidate(2),) if not shared_gpu else ())
            + (fused_configs(op_kind, world)[0],)
        ):
            for row_wise in (False, True):
                case = f"{kind} {config.short()} {'row' if row_wise else 'tensor'}-wise, replayed"
                sets = [_operands(kind, rank, world, m, n, k, row_wise, "weight_t", device) for _ in range(3)]
                first = ops[kind](*sets[0][:2], g, config, a_scale=sets[0][2], b_scale=sets[0][3])
                outs = [torch.full_like(first, float("nan")) for _ in sets]
                program = next(
                    p
                    for p in ops_mod._REGISTRY.programs.values()
                    if p.spec.kind == kind
                    and p.spec.dtype == torch.float8_e4m3fn
                    and p.spec.candidate == config
                )
                kept = program.__dict__.get("launch_graph")
                before = 0 if kept is None else kept.captures
                errors = []
                try:
                    for _ in range(4):
                        for (a8, b8, sa, sb), out in zip(sets, outs):
                            fresh = _operands(kind, rank, world, m, n, k, row_wise, "weight_t", device)
                            for t, new in zip((a8, sa, sb), (fresh[0], fresh[2], fresh[3])):
                                t.copy_(new)
                            out.fill_(float("nan"))
                            ops[kind](a8, b8, g, config, out=out, a_scale=sa, b_scale=sb)
                            errors.append(relative_error(out, reference(kind, a8, b8, g, sa, sb)))
                    captures = program.__dict__["launch_graph"].captures - before
                    if not max(errors) <= FP8_TOLERANCE:
                        failed.append(f"{case}: relative errors {[f'{e:.3g}' for e in errors]}")
                    elif captures != len(sets):
                        failed.append(f"{case}: {captures} graphs captured for {len(sets)} address sets")
                except Exception as e:  # noqa: BLE001 - named in the report
                    failed.append(f"{case}: {type(e).__name__}: {e}")
        q.put((rank, failed))
    finally:
        ops_mod.set_launch("auto")
        syncopate.close_contexts()
        dist.destroy_process_group()


@pytest.mark.multigpu
def test_fp8_calls_replayed_from_their_graphs_match_the_reference_on_two_gpus():
    _no_failures(_replay_target, 900)


@pytest.mark.gpu
def test_fused_fp8_calls_replayed_from_their_graphs_with_two_ranks_sharing_one_gpu():
    _no_failures(_replay_target, 900, shared_gpu=True)
