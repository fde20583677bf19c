"""What cutting a GEMM into the pieces of a cuBLAS template costs, on one GPU: each way of computing
one rank's output block (or the whole GEMM) timed against the whole GEMM.

    python benchmarks/gemm_split.py rs 8192 8192 2048 [--ranks 2]   # c_stationary's two terms of a block
    python benchmarks/gemm_split.py ar 8192 4096 11008 [--ranks 2]  # decomposed's row chunks

M N K as `syncopate bench` takes them (K the whole reduction; a rank holds K/ranks of it). Events
around each variant, enqueued during a device sleep, 10 warm-up calls, the median of 50; bf16. A variant's time is the sum of its
GEMMs as they run back to back on one stream; `rate` is the whole GEMM's time for the same FLOPs
over the variant's. Not `gpu_single.py`'s timing (L2 flushed, a device sleep before each call): a
template's GEMMs run back to back in a call, warm, and cold-started the same comparison reads
otherwise (two H200 terms at 0.933 of the whole GEMM flushed, 0.918 back to back; the op's
timeline, 0.92).
"""

from __future__ import annotations

import argparse
import statistics
import sys


SLEEP_CYCLES = 2_000_000
"""A device sleep before each timed variant (~1 ms): without it a variant's time held the host's
time to enqueue it (cuBLAS GEMMs of 512 rows read 57 µs against their kernels' 31)."""


def _time(fn, reps: int = 50, warmup: int = 10) -> float:
    import torch

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(SLEEP_CYCLES)  # the host enqueues the variant while the device sleeps
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0)
    return statistics.median(times)


def _on_streams(steps, streams):
    """Run `steps` [(stream index, after [step indices], fn)] with each on its stream, a step
    waiting for the events of the steps it follows; the caller's stream waits for all at the end."""
    import torch

    main = torch.cuda.current_stream()
    start = torch.cuda.Event()
    start.record(main)
    for s in streams:
        s.wait_event(start)
    events = []
    for where, after, fn in steps:
        stream = streams[where]
        for j in after:
            stream.wait_event(events[j])
        with torch.cuda.stream(stream):
            fn()
        events.append(torch.cuda.Event())
        events[-1].record(stream)
    for s in streams:
        end = torch.cuda.Event()
        end.record(s)
        main.wait_event(end)


def rs_variants(m: int, n: int, k: int, ws: int):
    """c_stationary's block (M/ws rows, the own term then each peer's added with beta=1) and its
    alternatives: one GEMM over the terms side by side in K, or the own term alone on a prefix of
    the rows (the transfer's time) and the rest in one GEMM over all the terms."""
    import torch

    kl, rows = k // ws, m // ws
    a = torch.randn(m, kl, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(kl, n, device="cuda", dtype=torch.bfloat16)
    a_cat = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    b_cat = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    whole = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(rows, n, device="cuda", dtype=torch.bfloat16)
    yield "whole GEMM", 1.0, lambda: torch.matmul(a, b, out=whole)

    def terms():
        torch.matmul(a[:rows], b, out=out)
        for _ in range(ws - 1):
            out.addmm_(a[rows:2 * rows], b)
    yield f"{ws} terms, beta=1 after the first", 1.0, terms
    for chunks in (2, 4):
        bounds = [(j * rows // chunks, (j + 1) * rows // chunks) for j in range(chunks)]

        def chunked(bounds=bounds):  # c_stationary's terms in row chunks, the second pass backwards
            for lo, hi in bounds:
                torch.matmul(a[lo:hi], b, out=out[lo:hi])
            for lo, hi in bounds[::-1]:
                out[lo:hi].addmm_(a[rows + lo:rows + hi], b)
        yield f"{ws} terms in {chunks} row chunks, backwards", 1.0, chunked

        def two_streams(bounds=bounds, streams=(torch.cuda.Stream(), torch.cuda.Stream())):
            # the own term's chunks on one stream, each peer term's chunk on the other after it
            steps = [(0, [], lambda lo=lo, hi=hi: torch.matmul(a[lo:hi], b, out=out[lo:hi])) for lo, hi in bounds]
            steps += [(1, [j], lambda lo=lo, hi=hi: out[lo:hi].addmm_(a[rows + lo:rows + hi], b))
                      for j, (lo, hi) in enumerate(bounds)]
            _on_streams(steps, streams)
        yield f"{ws} terms in {chunks} row chunks, two streams", 1.0, two_streams
    yield "own term alone", 1.0 / ws, lambda: torch.matmul(a[:rows], b, out=out)
    yield "a term added (beta=1)", 1.0 / ws, lambda: out.addmm_(a[rows:2 * rows], b)
    yield "terms side by side in K (one GEMM)", 1.0, lambda: torch.matmul(a_cat, b_cat, out=out)
    for h in (rows // 2, 3 * rows // 4):
        def prefix(h=h):
            torch.matmul(a[:h], b, out=out[:h])
            torch.matmul(a_cat[h:], b_cat, out=out[h:])
            for _ in range(ws - 1):
                out[:h].addmm_(a[rows:rows + h], b)
        yield f"own term on {h} rows, the rest side by side", 1.0, prefix


def ar_variants(m: int, n: int, k: int, ws: int):
    """decomposed's GEMMs: row chunks of a block, beta=0 (a peer's partial) and beta=1 (the own rows
    summed onto the peers' partials)."""
    import torch

    kl, rows = k // ws, m // ws
    a = torch.randn(m, kl, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(kl, n, device="cuda", dtype=torch.bfloat16)
    whole = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    yield "whole GEMM", 1.0, lambda: torch.matmul(a, b, out=whole)
    for chunk in (rows // 2, rows // 4, rows // 8, rows // 16):
        if chunk < 128:
            continue
        acc = torch.randn(chunk, n, device="cuda", dtype=torch.bfloat16)
        yield f"{chunk} rows, beta=0", chunk / m, lambda c=chunk, o=acc: torch.matmul(a[:c], b, out=o)
        yield f"{chunk} rows, beta=1", chunk / m, lambda c=chunk, o=acc: o.addmm_(a[:c], b)
    acc = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    for splits in (2, 4, 8):
        # decomposed's GEMMs for a block of `rows`: the peer's partial in two GEMMs (beta=0), then
        # the own rows in `splits` chunks, the last cut in two (beta=1), one stream or two in turn
        step = rows // splits
        pieces = [(0, rows // 2, 0), (rows // 2, rows, 0)]
        own = [(rows + j * step, rows + (j + 1) * step) for j in range(splits - 1)]
        own += [(rows + (splits - 1) * step, rows + rows - step // 2), (rows + rows - step // 2, 2 * rows)]
        pieces += [(lo, hi, 1) for lo, hi in own]

        def gemm(lo, hi, beta):
            if beta:
                acc[lo:hi].addmm_(a[lo:hi], b)
            else:
                torch.matmul(a[lo:hi], b, out=acc[lo:hi])
        for count in (1, 2):
            steps = [(j % count, [], lambda p=p: gemm(*p)) for j, p in enumerate(pieces)]
            yield (f"decomposed s{splits}, {count} stream{'s' * (count > 1)}", 2 * rows / m,
                   lambda steps=steps: _on_streams(steps, streams))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", choices=["rs", "ar"])
    parser.add_argument("m", type=int)
    parser.add_argument("n", type=int)
    parser.add_argument("k", type=int)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--blas", choices=["default", "cublas", "cublaslt"], default="default",
                        help="torch.backends.cuda.preferred_blas_library for every GEMM timed")
    args = parser.parse_args(argv)
    import torch

    if args.blas != "default":
        torch.backends.cuda.preferred_blas_library(args.blas)

    if not torch.cuda.is_available():
        print("gemm_split.py needs a GPU", file=sys.stderr)
        return 2
    variants = rs_variants if args.kind == "rs" else ar_variants
    print(f"{torch.cuda.get_device_name()}, {args.kind} {args.m}x{args.n}x{args.k} on {args.ranks} ranks, bf16, "
          f"BLAS {torch.backends.cuda.preferred_blas_library()}")
    whole_us = None
    print(f"{'variant':48s} {'us':>8s} {'share':>6s} {'rate':>6s}")
    for name, share, fn in variants(args.m, args.n, args.k, args.ranks):
        us = _time(fn)
        whole_us = whole_us or us
        print(f"{name:48s} {us:8.1f} {share:6.3f} {whole_us * share / us:6.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
