"""Check on one GPU the real enqueued work (driver stream waits and writes, copy-engine copies,
cuBLAS into the buffers) of the ops whose GEMMs are cuBLAS's: the a_stationary all-gather matmul,
the c_stationary and the decomposed matmul reduce-scatter and all-reduce, with every "rank" of a
group on the same device: each rank its
own caller's stream, side streams, signal pad and buffers, the peers' addresses pointing at the
other ranks' buffers. Calls are enqueued back to back for every rank before anything is waited
for, with fresh inputs and outputs poisoned with NaN; then each call's output is compared with the
float32 reference. Exits 1 if a check fails, 2 if the device hangs.

    python tests/support/stationary_check.py
"""

from __future__ import annotations

import os
import sys
import time
from types import SimpleNamespace

# Every rank's four streams on one device: with fewer hardware queues than streams, a rank's stream
# waiting for a peer can sit in front of that peer's work in a shared queue (two processes on two
# GPUs have a device each). Set before CUDA starts: run this in a fresh process.
os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = "32"

import torch  # noqa: E402
from checks import run_checks  # noqa: E402

from syncopate.kernels import a_stationary, c_stationary, decomposed, streamops  # noqa: E402
from syncopate.kernels.tables import PAD_WORDS  # noqa: E402
from syncopate.search_space import a_stationary_candidate, block_bounds, row_chunks  # noqa: E402


def _ranks(ws: int, buffers: dict, plan_of, dev):
    """Every rank's context (its pad, buffers and streams) and plan, and its caller's stream."""
    pads = [torch.zeros(PAD_WORDS, dtype=torch.int32, device=dev) for _ in range(ws)]
    bufs = [
        {
            name: torch.full(shape, float("nan"), dtype=dtype, device=dev)
            for name, (shape, dtype) in buffers.items()
        }
        for _ in range(ws)
    ]
    ranks = []
    for r in range(ws):
        streams = [torch.cuda.Stream(device=dev) for _ in range(3)]
        state = {"epoch": 0}

        def begin(stream=None, state=state) -> int:
            state["epoch"] += 1
            return state["epoch"]

        def fork(main, count, streams=streams):
            event = torch.cuda.Event()
            event.record(main)
            for s in streams[:count]:
                s.wait_event(event)
            return streams[:count]

        def join(main, streams):
            for s in streams:
                event = torch.cuda.Event()
                event.record(s)
                main.wait_event(event)

        ctx = SimpleNamespace(
            pads=pads,
            rank=r,
            world_size=ws,
            begin_call=begin,
            fork=fork,
            join=join,
            remote_writes=True,
            sm_pulls=False,  # every rank on one GPU: a kernel spinning for a peer could hold its SMs
            current_stream=torch.cuda.current_stream,
            buffers={
                name: SimpleNamespace(
                    local=bufs[r][name], peer_ptrs=[bufs[q][name].data_ptr() for q in range(ws)]
                )
                for name in bufs[r]
            },
            signal_address=lambda q, word: pads[q].data_ptr() + 4 * word,
            write_signal=lambda stream, q, word, value: streamops.write_value(
                stream.cuda_stream, pads[q].data_ptr() + 4 * word, value
            ),
            stamp=lambda stream: None,
            span=lambda label, chunk, rows, stream, start: None,  # no timeline
        )
        ranks.append((ctx, plan_of(r), torch.cuda.Stream(device=dev)))
    return ranks


def _warm(ranks, shapes, dtype, dev) -> None:
    """Run each GEMM shape (rows, cols, K) of a call once on every rank's stream first: a kernel's
    first launch can load its module, which waits for the whole device, and one rank's stream is
    then waiting for a peer whose work this process has not enqueued yet (on two GPUs each rank
    has a device)."""
    for _, _, main in ranks:
        with torch.cuda.stream(main):
            for rows, cols, k in shapes:
                a = torch.zeros(rows, k, dtype=dtype, device=dev)
                out = torch.zeros(rows, cols, dtype=dtype, device=dev)
                row_major = torch.zeros(k, cols, dtype=dtype, device=dev)
                for b in (row_major, torch.zeros(cols, k, dtype=dtype, device=dev).t()):
                    torch.matmul(a, b, out=out)  # B row-major, and K-major (a kernel of its own)
                    out.addmm_(a, b)
                out.add_(out)  # a third rank's partial onward (decomposed)
    torch.cuda.synchronize()


def _wait(ranks, pads_of, seconds: float = 60.0) -> None:
    """Wait for every rank's caller's stream, at most `seconds`; on a hang print the pads and exit 2."""
    events = []
    for _, _, main in ranks:
        event = torch.cuda.Event()
        event.record(main)
        events.append(event)
    deadline = time.monotonic() + seconds
    while not all(e.query() for e in events):
        if time.monotonic() > deadline:
            side = torch.cuda.Stream()
            with torch.cuda.stream(side):
                words = [p[:1100].to("cpu", non_blocking=False).tolist() for p in pads_of]
            print("HUNG: streams done", [e.query() for e in events], flush=True)
            for r, w in enumerate(words):
                print(f"rank {r} pad:", {i: v for i, v in enumerate(w) if v}, flush=True)
            os._exit(2)
        time.sleep(0.01)


def _run_calls(ranks, module, inputs, out_shape, dtype, dev):
    outs_of_calls = []
    for a, b in inputs:
        outs = [torch.full(out_shape, float("nan"), dtype=dtype, device=dev) for _ in ranks]
        for r, (ctx, plan, main) in enumerate(ranks):
            main.wait_stream(torch.cuda.current_stream())  # the inputs are made on the default stream
            with torch.cuda.stream(main):
                module.run(ctx, plan, a[r], b[r], outs[r])
        outs_of_calls.append(outs)
    _wait(ranks, ranks[0][0].pads)
    torch.cuda.synchronize()
    return outs_of_calls


def _close(got, ref, what: str) -> None:
    err = ((got.float() - ref).norm() / ref.norm()).item()
    assert not got.isnan().any(), f"{what}: NaN left in the output"
    assert err < 1e-2, f"{what}: relative error {err:.2e}"


def _b(k: int, n: int, dev, gen, scale: float, dtype, kmajor: bool) -> torch.Tensor:
    """A random B[k, n]: row-major, or an nn.Linear weight's transpose (`kmajor`)."""
    if kmajor:
        return (torch.randn(n, k, device=dev, generator=gen) * scale).to(dtype).t()
    return (torch.randn(k, n, device=dev, generator=gen) * scale).to(dtype)


def check_a(
    ws: int, splits: int, dtype=torch.bfloat16, calls: int = 20, m_local=512, n_local=384, k=640, kmajor=False
) -> None:
    dev = torch.device("cuda", 0)
    ranks = _ranks(
        ws,
        a_stationary.a_stationary_buffers(ws, m_local, n_local, k, dtype),
        lambda r: a_stationary.AStationaryPlan.of(
            a_stationary_candidate(splits), r, ws, m_local, n_local, k, kmajor
        ),
        dev,
    )
    rows = {m_local // 2, m_local - m_local // 2} | {hi - lo for lo, hi in row_chunks(m_local, splits)}
    _warm(ranks, [(x, n_local, k) for x in rows], dtype, dev)
    gen = torch.Generator(device=dev).manual_seed(ws * 100 + splits)
    inputs = [
        (
            [torch.randn(m_local, k, device=dev, generator=gen).to(dtype) for _ in range(ws)],
            [_b(k, n_local, dev, gen, k**-0.5, dtype, kmajor) for _ in range(ws)],
        )
        for _ in range(calls)
    ]
    outs = _run_calls(ranks, a_stationary, inputs, (m_local * ws, n_local), dtype, dev)
    for i, ((a, b), got) in enumerate(zip(inputs, outs, strict=True)):
        full = torch.cat(a).float()
        for r in range(ws):
            _close(got[r], full @ b[r].float(), f"call {i}, rank {r}")


def check_c(
    ws: int,
    dtype=torch.bfloat16,
    calls: int = 20,
    m=1536,
    n=384,
    k_local=320,
    all_reduce=False,
    splits=1,
    kmajor=False,
) -> None:
    dev = torch.device("cuda", 0)
    ranks = _ranks(
        ws,
        c_stationary.c_stationary_buffers(ws, m, n, k_local, dtype, all_reduce),
        lambda r: c_stationary.CStationaryPlan.of(r, ws, m, n, k_local, all_reduce, splits, kmajor),
        dev,
    )
    blocks = {hi - lo for lo, hi in (block_bounds(m, ws, q) for q in range(ws))}
    _warm(
        ranks,
        [(x, n, k_local) for x in blocks]
        + [(hi - lo, n, k_local) for x in blocks for lo, hi in row_chunks(x, splits)],
        dtype,
        dev,
    )
    _check_sums(ranks, c_stationary, ws, dtype, calls, m, n, k_local, all_reduce, kmajor)


def check_d(
    ws: int, dtype=torch.bfloat16, calls: int = 20, m=1536, n=384, k_local=320, all_reduce=False, splits=2
) -> None:
    dev = torch.device("cuda", 0)
    ranks = _ranks(
        ws,
        decomposed.decomposed_buffers(ws, m, n, dtype, all_reduce),
        lambda r: decomposed.DecomposedPlan.of(r, ws, m, n, all_reduce, splits),
        dev,
    )
    plan = ranks[0][1]
    rows = set()
    for q in range(ws):
        chunks = plan.chunks(q)
        rows |= {hi - lo for lo, hi in chunks} | {chunks[h[-1]][1] - chunks[h[0]][0] for h in plan.halves}
    _warm(ranks, [(x, n, k_local) for x in rows], dtype, dev)
    _check_sums(ranks, decomposed, ws, dtype, calls, m, n, k_local, all_reduce)


def _check_sums(ranks, module, ws, dtype, calls, m, n, k_local, all_reduce, kmajor=False) -> None:
    """Calls back to back with fresh inputs: each rank's output is its block of the sum over ranks
    of A_q @ B_q (an all-reduce: all of it); `kmajor`: every B an nn.Linear weight's transpose."""
    dev = torch.device("cuda", 0)
    gen = torch.Generator(device=dev).manual_seed(ws * 1000 + m)
    inputs = [
        (
            [torch.randn(m, k_local, device=dev, generator=gen).to(dtype) for _ in range(ws)],
            [_b(k_local, n, dev, gen, (k_local * ws) ** -0.5, dtype, kmajor) for _ in range(ws)],
        )
        for _ in range(calls)
    ]
    outs = _run_calls(ranks, module, inputs, (m if all_reduce else m // ws, n), dtype, dev)
    for i, ((a, b), got) in enumerate(zip(inputs, outs, strict=True)):
        total = sum(x.float() @ y.float() for x, y in zip(a, b, strict=True))
        for r in range(ws):
            _close(
                got[r], total if all_reduce else total[r * m // ws : (r + 1) * m // ws], f"call {i}, rank {r}"
            )


CHECKS = [
    ("a_stationary, 2 ranks, 1 split, bf16", lambda: check_a(2, 1)),
    ("a_stationary, 2 ranks, 2 splits, fp16", lambda: check_a(2, 2, torch.float16)),
    ("a_stationary, 3 ranks, 2 splits, bf16", lambda: check_a(3, 2)),
    ("a_stationary, 4 ranks, 4 splits, bf16", lambda: check_a(4, 4)),
    ("c_stationary, 2 ranks, bf16", lambda: check_c(2)),
    ("c_stationary, 2 ranks, fp16", lambda: check_c(2, torch.float16)),
    ("c_stationary, 3 ranks, bf16", lambda: check_c(3)),
    ("c_stationary, 4 ranks, bf16", lambda: check_c(4)),
    ("c_stationary all-reduce, 2 ranks, 1 split, bf16", lambda: check_c(2, all_reduce=True)),
    (
        "c_stationary all-reduce, 2 ranks, 4 splits, fp16",
        lambda: check_c(2, torch.float16, all_reduce=True, splits=4),
    ),
    ("c_stationary all-reduce, 3 ranks, 2 splits, bf16", lambda: check_c(3, all_reduce=True, splits=2)),
    ("c_stationary all-reduce, 4 ranks, 2 splits, bf16", lambda: check_c(4, all_reduce=True, splits=2)),
    (
        "c_stationary all-reduce, 2 ranks, M=1537, 2 splits, bf16",
        lambda: check_c(2, m=1537, all_reduce=True, splits=2),
    ),
    ("a_stationary, 2 ranks, 2 splits, B k-major, bf16", lambda: check_a(2, 2, kmajor=True)),
    ("c_stationary, 3 ranks, B k-major, bf16", lambda: check_c(3, kmajor=True)),
    (
        "c_stationary all-reduce, 2 ranks, 2 splits, B k-major, fp16",
        lambda: check_c(2, torch.float16, all_reduce=True, splits=2, kmajor=True),
    ),
    ("decomposed, 2 ranks, 2 splits, bf16", lambda: check_d(2)),
    ("decomposed, 2 ranks, 1 split, fp16", lambda: check_d(2, torch.float16, splits=1)),
    ("decomposed, 3 ranks, 2 splits, bf16", lambda: check_d(3)),
    ("decomposed, 4 ranks, 4 splits, bf16", lambda: check_d(4, splits=4)),
    ("decomposed all-reduce, 2 ranks, 4 splits, bf16", lambda: check_d(2, all_reduce=True, splits=4)),
    ("decomposed all-reduce, 2 ranks, 2 splits, fp16", lambda: check_d(2, torch.float16, all_reduce=True)),
    ("decomposed all-reduce, 3 ranks, M=1537, 2 splits, bf16", lambda: check_d(3, m=1537, all_reduce=True)),
    ("decomposed all-reduce, 4 ranks, 2 splits, bf16", lambda: check_d(4, all_reduce=True)),
]


def main() -> int:
    return run_checks(CHECKS)


if __name__ == "__main__":
    sys.exit(main())
