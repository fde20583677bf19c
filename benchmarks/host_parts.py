"""The host cost of the pieces a fused call is made of, and of whole calls, on one GPU in a group of
one rank: µs a call, the median of 9 batches (7 of 20 for the ops).

    python benchmarks/host_parts.py

The pieces: environment reads (`os.environ.get` and the launchers' `getenv`), the current stream,
a tensor's allocation, CUDA events, the driver's stream write / wait / copy (through ctypes), a TMA
descriptor, a Candidate's hash; the ops with the candidate of `benchmarks/op_host.py`. Where a
call's host time goes is the sum of what it makes of these (`OP_HOST_PROFILE` of op_host.py counts
them).
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

import syncopate
from syncopate.kernels import launch, streamops
from syncopate.kernels.local_ranks import free_port, join_group


def per_call_us(fn, n: int = 200, batches: int = 9) -> float:
    """`gpu_single.host_us` (median over batches of calls enqueued back to back), `n` calls a batch."""
    from gpu_single import host_us

    return host_us(fn, calls=n, batches=batches)


def program_rows(dev, side) -> list[tuple[str, float]]:
    """A stream program shaped as an 8-rank all-gather's rank enqueues it (8 entry writes, then per
    peer a wait for its entry, a copy and a signal; all into local words, so that every wait is
    met), run with writes and waits batched (`cuStreamBatchMemOp`) and with one call each."""
    pad = torch.zeros(64, dtype=torch.int32, device=dev)
    base = pad.data_ptr()
    program = streamops.Program()
    for r in range(8):
        program.write(side, base + 4 * r)
    for r in range(1, 8):
        program.wait(side, base + 4 * r)
        program.copy(side, base + 4 * (32 + r), base + 4 * r, 4)
        program.write(side, base + 4 * (16 + r))
    driver = streamops._driver()
    epoch = iter(range(1, 1 << 30))
    rows = [("program, 8 ranks, batched", per_call_us(lambda: program.run(next(epoch))))]
    kept, driver.mem_ops = driver.mem_ops, None
    try:
        program._batched = None
        rows.append(("program, 8 ranks, a call each", per_call_us(lambda: program.run(next(epoch)))))
    finally:
        driver.mem_ops = kept
        program._batched = None
    return rows


def main() -> int:
    if not torch.cuda.is_available():
        print("host_parts: needs a CUDA GPU; none is visible", file=sys.stderr)
        return 1
    from triton.tools.tensor_descriptor import TensorDescriptor

    from op_host import CANDIDATE

    dev = join_group(0, 1, free_port())
    side = torch.cuda.Stream()
    main_stream = torch.cuda.current_stream()
    word = torch.zeros(64, dtype=torch.int32, device=dev)
    address, handle = word.data_ptr(), side.cuda_stream
    event = torch.cuda.Event()
    x = torch.empty((8192, 1024), dtype=torch.bfloat16, device=dev)
    rows = [
        ("os.environ.get", per_call_us(lambda: os.environ.get("SYNCOPATE_GLUON", "0"))),
        ("launch.getenv", per_call_us(lambda: launch.getenv("SYNCOPATE_GLUON", "0"))),
        ("settings (relaunch key)", per_call_us(launch._settings)),
        ("torch.cuda.current_stream()", per_call_us(torch.cuda.current_stream)),
        ("raw current stream handle", per_call_us(lambda: torch._C._cuda_getCurrentRawStream(0))),
        ("is_current_stream_capturing", per_call_us(torch.cuda.is_current_stream_capturing)),
        ("torch.empty 8192x1024 bf16", per_call_us(lambda: torch.empty((8192, 1024), dtype=torch.bfloat16, device=dev))),
        ("new Event + record", per_call_us(lambda: torch.cuda.Event().record(main_stream))),
        ("Event record (kept)", per_call_us(lambda: event.record(main_stream))),
        ("Stream.wait_event", per_call_us(lambda: side.wait_event(event))),
        ("stream write (driver)", per_call_us(lambda: streamops.write_value(handle, address, 1))),
        ("stream wait, met (driver)", per_call_us(lambda: streamops.wait_value(handle, address, 0))),
        ("copy 4 B (driver)", per_call_us(lambda: streamops.copy_async(handle, address + 4, address, 4))),
        ("TensorDescriptor.from_tensor", per_call_us(lambda: TensorDescriptor.from_tensor(x, [128, 64]))),
        ("hash(Candidate)", per_call_us(lambda: hash(CANDIDATE))),
    ]
    rows += program_rows(dev, side)
    g = dist.group.WORLD
    shapes = {"all_gather_matmul": ((8192, 8192), (8192, 2048)), "matmul_reduce_scatter": ((8192, 2048), (2048, 8192)),
              "matmul_all_reduce": ((8192, 2048), (2048, 8192))}
    for name, (sa, sb) in shapes.items():
        op = getattr(syncopate, name)
        a = torch.randn(sa, device=dev).to(torch.bfloat16)
        b = torch.randn(sb, device=dev).to(torch.bfloat16)
        for _ in range(3):
            op(a, b, g, CANDIDATE)
        torch.cuda.synchronize()
        rows.append((f"{name} (whole call)", per_call_us(lambda: op(a, b, g, CANDIDATE), n=20, batches=7)))
    torch.cuda.synchronize()
    syncopate.close_contexts()
    dist.destroy_process_group()
    for name, us in rows:
        print(f"{name:32s} {us:8.2f}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.exit(main())
