"""Run the fused ops one call at a time on two GPUs, candidate by candidate, and say what each did.

    python benchmarks/probe_faults.py [--calls 3] [--spin 262144] [--only SUBSTRING]

Every call is synchronized and timed on its own; after it, rank 0 prints the call's time, the
context's timeout flag, the relative error against the float32 reference and, after a timeout,
which signal words of this call had not arrived. Waits are bounded by --spin polls, so a signal
that never comes costs a fraction of a second, not a hang. Candidates that ran clean in earlier
measurements come first: a fault that kills the CUDA context then shows which candidate caused it.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import sys
import time


def cases():
    """(label, kind, (M, N, K), candidate fields) in the order they run."""
    t256 = dict(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3)
    t128 = dict(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=3)
    t128s4 = dict(t128, num_stages=4)
    t128w4 = dict(t128, num_warps=4)
    ag, rs = (8192, 2048, 8192), (8192, 8192, 2048)
    odd = (4160, 1024, 1536)  # M/ws not a multiple of BLOCK_M, as in tests/test_gpu_ops.py
    ce = dict(backend="copy_engine", template="direct", comm_sms=0, group_m=8)
    out = [
        ("ag ce s2 128x256", "ag_gemm", ag, dict(ce, num_splits=2, **t256)),
        ("ag ce s1 128x256", "ag_gemm", ag, dict(ce, num_splits=1, **t256)),
        ("ag ce s8 128x256", "ag_gemm", ag, dict(ce, num_splits=8, **t256)),
        ("rs ce s2 128x256", "gemm_rs", rs, dict(ce, num_splits=2, **t256)),
        ("ar ce s2 128x256", "gemm_ar", rs, dict(ce, num_splits=2, **t256)),
        ("ag nccl s2 128x256", "ag_gemm", ag, dict(ce, backend="nccl", comm_sms=16, num_splits=2, **t256)),
        ("ag ce s2 128x128 w4", "ag_gemm", ag, dict(ce, num_splits=2, **t128w4)),
        ("ag ce s2 128x128", "ag_gemm", ag, dict(ce, num_splits=2, **t128)),
        ("ag ce s2 128x128 st4", "ag_gemm", ag, dict(ce, num_splits=2, **t128s4)),
        ("rs ce s2 128x128", "gemm_rs", rs, dict(ce, num_splits=2, **t128)),
        ("ag sm32 s2 128x256", "ag_gemm", ag, dict(ce, backend="sm_copy", comm_sms=32, num_splits=2, **t256)),
        ("rs sm32 s2 128x256", "gemm_rs", rs, dict(ce, backend="sm_copy", comm_sms=32, num_splits=2, **t256)),
        ("rs nccl16 s2 128x256", "gemm_rs", rs, dict(ce, backend="nccl", comm_sms=16, num_splits=2, **t256)),
        ("rs nccl64 s2 128x256", "gemm_rs", rs, dict(ce, backend="nccl", comm_sms=64, num_splits=2, **t256)),
        (
            "rs nccl16 s4 128x128 M=4160",
            "gemm_rs",
            odd,
            dict(ce, backend="nccl", comm_sms=16, num_splits=4, **t128),
        ),
        (
            "rs nccl64 s4 128x128 M=4160",
            "gemm_rs",
            odd,
            dict(ce, backend="nccl", comm_sms=64, num_splits=4, **t128),
        ),
        (
            "rs nccl16 s4 128x128 M=8192",
            "gemm_rs",
            (8192, 1024, 1536),
            dict(ce, backend="nccl", comm_sms=16, num_splits=4, **t128),
        ),
        (
            "ar nccl16 s4 128x128 M=4160",
            "gemm_ar",
            odd,
            dict(ce, backend="nccl", comm_sms=16, num_splits=4, **t128),
        ),
        (
            "rs sm16 s4 128x128 M=4160",
            "gemm_rs",
            odd,
            dict(ce, backend="sm_copy", comm_sms=16, num_splits=4, **t128),
        ),
        ("ag nccl64 s2 128x256", "ag_gemm", ag, dict(ce, backend="nccl", comm_sms=64, num_splits=2, **t256)),
        ("ar nccl64 s2 128x256", "gemm_ar", rs, dict(ce, backend="nccl", comm_sms=64, num_splits=2, **t256)),
        (
            "ar nccl64 s4 128x128 M=4160",
            "gemm_ar",
            odd,
            dict(ce, backend="nccl", comm_sms=64, num_splits=4, **t128),
        ),
        ("ar sm32 s2 128x256", "gemm_ar", rs, dict(ce, backend="sm_copy", comm_sms=32, num_splits=2, **t256)),
        (
            "ar ce s4 kept_interleaved 128x256",
            "gemm_ar",
            rs,
            dict(ce, num_splits=4, tile_order="kept_interleaved", **t256),
        ),
        (
            "rs ce s4 kept_interleaved 128x256",
            "gemm_rs",
            rs,
            dict(ce, num_splits=4, tile_order="kept_interleaved", **t256),
        ),
        (
            "ar sm32 s4 kept_interleaved 128x128 M=4160",
            "gemm_ar",
            odd,
            dict(ce, backend="sm_copy", comm_sms=32, num_splits=4, tile_order="kept_interleaved", **t128),
        ),
    ]
    return out


def worker(rank: int, world: int, port: int, args) -> None:
    faulthandler.dump_traceback_later(args.watchdog, exit=True)
    from syncopate.measure.local_ranks import join_group

    dev = join_group(rank, world, port)
    import torch
    import torch.distributed as dist

    from syncopate.kernels import ops
    from syncopate.measure.reference import reference, relative_error
    from syncopate.search_space import Candidate, Workload

    g = dist.group.WORLD
    fused = {
        "ag_gemm": ops.all_gather_matmul,
        "gemm_rs": ops.matmul_reduce_scatter,
        "gemm_ar": ops.matmul_all_reduce,
    }

    def say(*a):
        if rank == 0:
            print(*a, flush=True)

    say(
        f"torch {torch.__version__}, {torch.cuda.get_device_name(0)} x{world}, "
        f"CUDA_DEVICE_MAX_CONNECTIONS={os.environ.get('CUDA_DEVICE_MAX_CONNECTIONS', 'unset')}"
    )
    for label, kind, shape, fields in cases():
        if args.only and not any(part in label for part in args.only.split(",")):
            continue
        try:
            w = Workload(kind=kind, shape=shape, dtype="bf16")
            shapes = w.local_shapes(world)
            c = Candidate(**{"tile_order": "arrival", **fields})
            k = shape[2]
            for i in range(args.calls):
                a = torch.randn(shapes["a"], device=dev).to(torch.bfloat16)
                b = (torch.randn(shapes["b"], device=dev) / k**0.5).to(torch.bfloat16)
                out = torch.full(shapes["out"], float("nan"), dtype=torch.bfloat16, device=dev)
                dist.barrier(device_ids=[rank])
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                fused[kind](a, b, g, c, out=out, spin_limit=args.spin)
                torch.cuda.synchronize()
                dt = (time.perf_counter() - t0) * 1e3
                ctx = ops.get_context(
                    kind, g, (shape[0], k) if kind == "ag_gemm" else (shape[0], shape[1]), torch.bfloat16
                )
                flag = int(ctx.error.item())
                err = relative_error(out, reference(kind, a, b, g))
                late = ""
                if flag:
                    epoch = ctx.epoch
                    sig = ctx.signals.local.cpu()
                    late = " late words: " + str(
                        [j for j in range(sig.numel()) if 0 < int(sig[j]) < epoch][:12]
                    )
                    ctx.error.zero_()
                flags = torch.tensor([flag], device=dev)
                dist.all_reduce(flags)
                say(
                    f"{label:28s} call {i}: {dt:9.2f} ms  timeout flags {int(flags.item())}  rel err {err:.2e}{late}"
                )
        except Exception as e:
            say(f"{label:28s} FAILED {type(e).__name__}: {str(e)[:300]}")
            if "illegal" in str(e) or "CUDA error" in str(e):
                break
    faulthandler.cancel_dump_traceback_later()
    ops.close_contexts()
    dist.destroy_process_group()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=3)
    p.add_argument("--spin", type=int, default=1 << 18, help="poll bound of every wait")
    p.add_argument(
        "--only", default="", help="run only the cases whose label contains one of these (comma-separated)"
    )
    p.add_argument(
        "--watchdog",
        type=float,
        default=200.0,
        help="seconds after which each rank dumps its stack and exits",
    )
    args = p.parse_args()
    import torch.multiprocessing as mp

    from syncopate.measure.local_ranks import free_port

    mp.start_processes(worker, args=(2, free_port(), args), nprocs=2, start_method="spawn")
    return 0


if __name__ == "__main__":
    sys.exit(main())
