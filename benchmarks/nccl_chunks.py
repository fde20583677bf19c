"""Whether NCCL overlaps a GEMM here: the matmul all-reduce and reduce-scatter cut into cuBLAS row
chunks, each chunk's NCCL collective on a side stream once its GEMM has ended, against the GEMM
alone, the collective alone and both in sequence (what a job does without Syncopate).

    torchrun --nproc-per-node 4 benchmarks/nccl_chunks.py [--kinds ar,rs] [--splits 2,4,8] [--ctas 16,32]
        [--carveout 0,16,32]

M N K as `syncopate bench` takes them (K the whole reduction; a rank holds K/ranks of it); the
default shapes are the suites' (configs/llama_tp2.yaml, llama_tp4.yaml). A reduce-scatter's chunk j
is rows chunk j of every rank's block, computed by one batched GEMM into the layout NCCL's
reduce-scatter takes. `--carveout 0,16,32` runs the chunked calls with cuBLAS told to leave that many
SMs free (torch's experimental SM carveout, and the SM count target of torch's cuBLAS handle), so
that NCCL's kernels find SMs while a chunk's GEMM runs; the GEMM alone under each carveout is printed
too. `--ctas N` adds process groups whose communicator runs on at most N CTAs (and at least 4),
`--high-priority` gives their internal stream a high priority. bf16; timed by
`syncopate.kernels.timing.time_collective` (L2 flushed, the ranks started together, the largest
over the ranks; the median of 15 after 4 warm-up calls); error against the fp32 product reduced by
the same collective. Rank 0 prints one line a variant, with bound/time
(bound: the slower of the GEMM alone and the collective alone).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPES = {
    2: {"ar": [(8192, 4096, 11008), (8192, 4096, 14336)], "rs": [(8192, 4096, 11008)]},
    4: {"ar": [(8192, 4096, 11008), (8192, 8192, 8192), (8192, 8192, 28672)],
        "rs": [(8192, 4096, 11008), (8192, 8192, 8192)]},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kinds", default="ar,rs")
    ap.add_argument("--splits", default="2,4,8")
    ap.add_argument("--ctas", default="", help="NCCL max CTAs of extra process groups, comma-separated")
    ap.add_argument("--high-priority", action="store_true", help="the extra groups' streams at high priority")
    ap.add_argument("--carveout", default="0",
                    help="SMs cuBLAS leaves free in the chunked calls (torch's SM carveout), comma-separated")
    ap.add_argument("--shape", action="append", default=[], help="M,N,K (repeatable; default: the suites')")
    args = ap.parse_args()

    import torch
    import torch.distributed as dist

    from syncopate.kernels.local_ranks import join_torchrun
    from syncopate.kernels.timing import time_collective

    dev = join_torchrun()
    rank, ws = dist.get_rank(), dist.get_world_size()
    ranks = list(range(ws))
    groups = {"default": dist.new_group(ranks)}
    for c in [int(x) for x in args.ctas.split(",") if x]:
        opts = dist.ProcessGroupNCCL.Options(is_high_priority_stream=args.high_priority)
        opts.config.max_ctas, opts.config.min_ctas = c, min(c, 4)
        name = f"ctas{c}{'-hi' if args.high_priority else ''}"
        groups[name] = dist.new_group(ranks, backend="nccl", pg_options=opts)
    main_stream, side = torch.cuda.current_stream(), torch.cuda.Stream()
    splits = [int(s) for s in args.splits.split(",")]
    carveouts = [int(c) for c in args.carveout.split(",")]
    sm_count = torch.cuda.get_device_properties(dev).multi_processor_count

    def set_carveout(carve: int) -> None:
        """torch's carveout, and the SM count target of torch's cuBLAS handle set directly (the
        library torch loaded, found in this process's maps): 0 lifts both."""
        import ctypes

        torch._C._set_sm_carveout_experimental(carve or None)
        torch.matmul(torch.ones(8, 8, device=dev), torch.ones(8, 8, device=dev))  # cuBLAS loaded
        with open("/proc/self/maps") as f:
            path = next((line.split()[-1] for line in f if "libcublas.so" in line), None)
        if path is None:
            return
        lib = ctypes.CDLL(path)
        err = lib.cublasSetSmCountTarget(ctypes.c_void_p(torch.cuda.current_blas_handle()),
                                         ctypes.c_int(sm_count - carve if carve else 0))
        if err != 0 and rank == 0:
            print(f"cublasSetSmCountTarget failed: {err}")

    def timed(fn) -> float:
        return time_collective(fn, dist.group.WORLD, warmup=4, repetitions=15).median_us

    def report(kind, shape, name, us, bound, err=None) -> None:
        if rank == 0:
            e = f"  err {err:.1e}" if err is not None else ""
            m, n, k = shape
            print(f"{kind} {m}x{n}x{k} {name:24s} {us:8.1f} us  bound/x {bound / us:.3f}{e}", flush=True)

    def chunks(rows: int, s: int) -> list[tuple[int, int]]:
        return [(rows * j // s, rows * (j + 1) // s) for j in range(s)]

    def overlapped(compute, collective, rows: int, s: int, pg):
        def call() -> None:
            for lo, hi in chunks(rows, s):
                compute(lo, hi)
                done = torch.cuda.Event()
                done.record(main_stream)
                side.wait_event(done)
                with torch.cuda.stream(side):
                    collective(lo, hi, pg)
            main_stream.wait_stream(side)
        return call

    shapes = [tuple(int(x) for x in s.split(",")) for s in args.shape]
    for kind in args.kinds.split(","):
        for m, n, k in shapes or SHAPES.get(ws, SHAPES[2])[kind]:
            kl, rows = k // ws, m // ws
            torch.manual_seed(rank)
            a = torch.randn(m, kl, device=dev, dtype=torch.bfloat16) / 8
            b = torch.randn(kl, n, device=dev, dtype=torch.bfloat16) / 8
            full = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
            ref = a.float() @ b.float()
            if kind == "ar":
                dist.all_reduce(ref)
                out = full
                gemm = timed(lambda: torch.matmul(a, b, out=full))
                coll = timed(lambda: dist.all_reduce(full))
                seq = timed(lambda: (torch.matmul(a, b, out=full), dist.all_reduce(full)))

                def compute(lo, hi):
                    torch.matmul(a[lo:hi], b, out=full[lo:hi])

                def collective(lo, hi, pg):
                    dist.all_reduce(full[lo:hi], group=pg)
                span = m
            else:
                red = torch.empty(rows, n, device=dev)
                dist.reduce_scatter_tensor(red, ref)
                ref = red
                out = torch.empty(rows, n, device=dev, dtype=torch.bfloat16)
                stage = torch.empty(m * n, device=dev, dtype=torch.bfloat16)
                a3, b3 = a.view(ws, rows, kl), b.expand(ws, kl, n)
                gemm = timed(lambda: torch.matmul(a, b, out=full))
                coll = timed(lambda: dist.reduce_scatter_tensor(out, full))
                seq = timed(lambda: (torch.matmul(a, b, out=full), dist.reduce_scatter_tensor(out, full)))

                def part(lo, hi):
                    return stage[ws * lo * n : ws * hi * n].view(ws, hi - lo, n)

                def compute(lo, hi):
                    torch.bmm(a3[:, lo:hi], b3, out=part(lo, hi))

                def collective(lo, hi, pg):
                    dist.reduce_scatter_tensor(out[lo:hi], part(lo, hi).view(ws * (hi - lo), n), group=pg)
                span = rows
            bound = max(gemm, coll)
            shape = (m, n, k)
            report(kind, shape, "gemm alone", gemm, bound)
            report(kind, shape, "collective alone", coll, bound)
            report(kind, shape, "in sequence", seq, bound)
            for carve in carveouts:
                set_carveout(carve)
                tag = f", cuBLAS leaves {carve} SMs" if carve else ""
                if carve:
                    gemm_carved = timed(lambda: torch.matmul(a, b, out=full))
                    report(kind, shape, f"gemm alone{tag}", gemm_carved, bound)
                for name, pg in groups.items():
                    for s in splits:
                        call = overlapped(compute, collective, span, s, pg)
                        out.fill_(float("nan"))
                        call()
                        torch.cuda.synchronize()
                        err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
                        report(kind, shape, f"{s} chunks, {name}{tag}", timed(call), bound, err)
            set_carveout(0)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
