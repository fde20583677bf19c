"""Check on one GPU the a_stationary all-gather matmul's real enqueued work (driver stream waits and
writes, copy-engine copies, cuBLAS into the buffers) with every "rank" of a group on the same
device: each rank its own caller's stream, side streams, signal pad and buffers, the peers'
addresses pointing at the other ranks' buffers. Calls are enqueued back to back for every rank
before anything is waited for, with fresh inputs and outputs poisoned with NaN; then each call's
output is compared with all_gather(A) @ B_r in float32. Exits 1 if a check fails.

    python tests/support/a_stationary_check.py
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from types import SimpleNamespace

# Every rank's four streams on one device: with fewer hardware queues than streams, a rank's stream
# waiting for a peer can sit in front of that peer's work in a shared queue (two processes on two
# GPUs have a device each). Set before CUDA starts: run this in a fresh process.
os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = "32"

import torch  # noqa: E402

from syncopate.kernels import a_stationary, streamops  # noqa: E402
from syncopate.kernels.tables import PAD_WORDS  # noqa: E402
from syncopate.search_space import a_stationary_candidate, row_chunks  # noqa: E402


def _ranks(ws: int, m_local: int, n_local: int, k: int, splits: int, dtype, dev):
    pads = [torch.zeros(PAD_WORDS, dtype=torch.int32, device=dev) for _ in range(ws)]
    bufs = [{name: torch.full(shape, float("nan"), dtype=dtype, device=dev) for name, (shape, _) in
             a_stationary.a_stationary_buffers(ws, m_local, n_local, k, dtype).items()} for _ in range(ws)]
    ranks = []
    for r in range(ws):
        streams = [torch.cuda.Stream(device=dev) for _ in range(3)]
        state = {"epoch": 0}

        def begin(state=state) -> int:
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
            pads=pads, rank=r, world_size=ws, begin_call=begin, fork=fork, join=join,
            buffers={name: SimpleNamespace(local=bufs[r][name], peer_ptrs=[bufs[q][name].data_ptr() for q in range(ws)])
                     for name in bufs[r]},
            signal_address=lambda q, word: pads[q].data_ptr() + 4 * word,
            write_signal=lambda stream, q, word, value: streamops.write_value(
                stream.cuda_stream, pads[q].data_ptr() + 4 * word, value),
        )
        plan = a_stationary.AStationaryPlan.of(a_stationary_candidate(splits), r, ws, m_local, n_local, k)
        ranks.append((ctx, plan, torch.cuda.Stream(device=dev)))
    return ranks


def _warm(ranks, m_local, n_local, k, splits, dtype, dev) -> None:
    """Run each GEMM shape of a call once on every rank's stream first: a kernel's first launch can
    load its module, which waits for the whole device, and one rank's stream is then waiting for
    a peer whose work this process has not enqueued yet (on two GPUs each rank has a device)."""
    a = torch.zeros(m_local, k, dtype=dtype, device=dev)
    b = torch.zeros(k, n_local, dtype=dtype, device=dev)
    shapes = {m_local // 2, m_local - m_local // 2} | {hi - lo for lo, hi in row_chunks(m_local, splits)}
    for _, _, main in ranks:
        with torch.cuda.stream(main):
            for rows in shapes:
                torch.matmul(a[:rows], b, out=torch.empty(rows, n_local, dtype=dtype, device=dev))
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
                words = [p[:512].to("cpu", non_blocking=False).tolist() for p in pads_of]
            print("HUNG: streams done", [e.query() for e in events], flush=True)
            for r, w in enumerate(words):
                print(f"rank {r} pad:", {i: v for i, v in enumerate(w) if v}, flush=True)
            os._exit(2)
        time.sleep(0.01)


def check(ws: int, splits: int, dtype=torch.bfloat16, calls: int = 20, m_local=512, n_local=384, k=640) -> None:
    dev = torch.device("cuda", 0)
    ranks = _ranks(ws, m_local, n_local, k, splits, dtype, dev)
    _warm(ranks, m_local, n_local, k, splits, dtype, dev)
    gen = torch.Generator(device=dev).manual_seed(ws * 100 + splits)
    done = []
    for _ in range(calls):
        a = [torch.randn(m_local, k, device=dev, generator=gen).to(dtype) for _ in range(ws)]
        b = [(torch.randn(k, n_local, device=dev, generator=gen) / k**0.5).to(dtype) for _ in range(ws)]
        outs = [torch.full((m_local * ws, n_local), float("nan"), dtype=dtype, device=dev) for _ in range(ws)]
        for r, (ctx, plan, main) in enumerate(ranks):
            main.wait_stream(torch.cuda.current_stream())  # the inputs are made on the default stream
            with torch.cuda.stream(main):
                a_stationary.run(ctx, plan, a[r], b[r], outs[r])
        done.append((a, b, outs))
    _wait(ranks, ranks[0][0].pads)
    torch.cuda.synchronize()
    for i, (a, b, outs) in enumerate(done):
        full = torch.cat(a).float()
        for r in range(ws):
            ref = full @ b[r].float()
            err = ((outs[r].float() - ref).norm() / ref.norm()).item()
            assert not outs[r].isnan().any(), f"call {i}, rank {r}: NaN left in the output"
            assert err < 1e-2, f"call {i}, rank {r}: relative error {err:.2e}"


def main() -> int:
    failed = 0
    for ws, splits, dtype in [(2, 1, torch.bfloat16), (2, 2, torch.float16), (3, 2, torch.bfloat16),
                              (4, 4, torch.bfloat16)]:
        name = f"{ws} ranks, {splits} splits, {dtype}"
        try:
            check(ws, splits, dtype)
            print(f"ok    {name}", flush=True)
        except Exception:
            failed += 1
            print(f"FAIL  {name}\n{traceback.format_exc()}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
