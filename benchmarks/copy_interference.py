"""How much a cuBLAS GEMM slows while copy-engine traffic runs beside it, and how fast a local copy
goes by the copy engine and by the SMs: what decides where a cuBLAS template's copies go.

    python benchmarks/copy_interference.py [M N K]   # default 8192 4096 11008: decomposed's pieces on two ranks

One process, GPU 0 (and GPU 1 for the transfers over the link, where there is one). The GEMMs are
row pieces of one rank's [M, K/2] @ [K/2, N], bf16: 1024 rows with beta=1, 2048 with beta=0 and 512
with beta=1. Each is timed with events on its own stream (median of 30, after a device sleep), alone
and with copies started with it on a side stream: `local` (GPU 0's engine within GPU 0), `pull` and
`push` (GPU 0's engine reading or writing GPU 1), `peerpull` and `peerpush` (GPU 1's engine reading or
writing GPU 0: a peer pulling this rank's rows, or pushing to it). Then local copies of 4-32 MiB
timed alone (`gemm_split.py`'s timing), by the copy engine and by `pull_kernel` with no wait (the
decomposed all-reduce's SM copy).
"""

from __future__ import annotations

import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

SLEEP_CYCLES = 1_000_000
KINDS = (["local"], ["pull"], ["push"], ["peerpull"], ["peerpush"], ["local", "peerpull"], ["pull", "peerpull"])


def main(argv: list[str]) -> int:
    import torch

    if not torch.cuda.is_available():
        print("copy_interference.py needs a GPU", file=sys.stderr)
        return 2
    from syncopate.kernels import streamops

    m, n, k = (int(x) for x in argv) if len(argv) == 3 else (8192, 4096, 11008)
    kl = k // 2
    two = torch.cuda.device_count() >= 2
    d0, d1 = torch.device("cuda", 0), torch.device("cuda", 1 if two else 0)
    torch.cuda.set_device(d0)
    a = torch.randn(m, kl, device=d0, dtype=torch.bfloat16)
    b = torch.randn(kl, n, device=d0, dtype=torch.bfloat16) / kl ** 0.5
    acc = torch.randn(m, n, device=d0, dtype=torch.bfloat16)
    src0, dst0 = (torch.empty(64 << 20, dtype=torch.uint8, device=d0) for _ in range(2))
    buf1, buf1b = (torch.empty(64 << 20, dtype=torch.uint8, device=d1) for _ in range(2))
    buf1.copy_(src0)  # turns peer access on
    torch.cuda.synchronize(d0), torch.cuda.synchronize(d1)
    side = torch.cuda.Stream(d0)
    side1 = torch.cuda.Stream(d1)
    routes = {"local": (side, dst0, src0), "pull": (side, dst0, buf1), "push": (side, buf1, src0),
              "peerpull": (side1, buf1b, src0), "peerpush": (side1, dst0, buf1b)}

    def gemm_time(rows: int, beta: int, kinds: list[str], nbytes: int, reps: int = 30) -> float:
        main_stream = torch.cuda.current_stream(d0)
        times = []
        for i in range(reps + 5):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize(d0), torch.cuda.synchronize(d1)
            torch.cuda._sleep(SLEEP_CYCLES)
            go = torch.cuda.Event()
            go.record(main_stream)
            side.wait_event(go)
            side1.wait_event(go)
            for kind in kinds:
                stream, dst, src = routes[kind]
                streamops.copy_async(stream.cuda_stream, dst.data_ptr(), src.data_ptr(), nbytes)
            start.record(main_stream)
            if beta:
                acc[:rows].addmm_(a[:rows], b)
            else:
                torch.matmul(a[:rows], b, out=acc[:rows])
            end.record(main_stream)
            end.synchronize()
            if i >= 5:
                times.append(start.elapsed_time(end) * 1000.0)
        torch.cuda.synchronize(d0), torch.cuda.synchronize(d1)
        return statistics.median(times)

    print(f"{torch.cuda.get_device_name(d0)}, GEMM pieces of [{m}, {kl}] @ [{kl}, {n}] bf16"
          f"{'' if two else ' (one GPU: the link routes are local copies)'}")
    print(f"{'rows':>5} {'beta':>4} {'beside it':22s} {'MiB':>4} {'us':>7} {'x alone':>7}")
    for rows, beta in ((1024, 1), (2048, 0), (512, 1)):
        alone = gemm_time(rows, beta, [], 0)
        print(f"{rows:5d} {beta:4d} {'nothing':22s} {0:4d} {alone:7.1f} {1.0:7.3f}")
        for kinds in KINDS:
            for mib in ((8, 16) if rows >= 1024 else (4,)):
                us = gemm_time(rows, beta, kinds, mib << 20)
                print(f"{rows:5d} {beta:4d} {'+'.join(kinds):22s} {mib:4d} {us:7.1f} {us / alone:7.3f}")
    copy_rates(torch, d0)
    return 0


def copy_rates(torch, device) -> None:
    """Local copies alone: the copy engine against `pull_kernel` with no wait (16 KiB a program)."""
    import triton

    from benchmarks.gemm_split import _time
    from syncopate.kernels.launch import PULL_BLOCK
    from syncopate.kernels.triton_kernels import pull_kernel

    src = torch.randn(16 << 20, device=device).view(torch.int32)
    dst = torch.empty_like(src)
    pad = torch.zeros(1024, dtype=torch.int32, device=device)
    error = torch.zeros(1, dtype=torch.int32, device=device)

    print(f"\n{'local copy':24s} {'MiB':>4} {'us':>7} {'TB/s r+w':>8}")
    for mib in (4, 16, 28, 32):
        words = mib << 18
        grid = (triton.cdiv(words, PULL_BLOCK),)
        for name, fn in (("copy engine", lambda w=words: dst[:w].copy_(src[:w])),
                         ("SMs (pull_kernel)", lambda w=words, g=grid: pull_kernel[g](
                             src, dst, w, pad, -1, 0, error, -1, BLOCK=PULL_BLOCK, num_warps=4))):
            us = _time(fn, reps=30, warmup=3)
            print(f"{name:24s} {mib:4d} {us:7.1f} {2 * (mib << 20) / us / 1e6:8.2f}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
