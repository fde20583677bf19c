"""One GPU: the compute side of the ops that move operands (a_stationary all-gather matmul,
c_stationary matmul reduce-scatter) against the GEMM alone.

`template: a_stationary` (syncopate/kernels/a_stationary.py) runs, on each rank's stream, cuBLAS
GEMMs in this order: the first half of the own rows, the peer's product in `num_splits` row
chunks (once the peer's B is there), the second half of the own rows; B's push and the products'
pulls are copy-engine copies on side streams. On two ranks the overlap bound of ag_gemm N=2048 is
the all-gather of A alone (~212 µs) and the GEMM alone is ~176 µs, so what the template can reach
is set by how close that sequence of GEMMs comes to one GEMM of the same work, and by the tail
(the last chunk's pull) after it.

Per case (M=8192 rows over two ranks: a rank's rows 4096; N/ws columns; K), µs, median of 20, L2
flushed: one cuBLAS GEMM of the rank's whole work ([M, K] @ [K, N/ws], the bound's GEMM alone);
the sequence of GEMMs alone; the sequence with the copy engine moving what a rank's HBM sees on
two GPUs beside it (B's 2-byte K x N/ws read once, each product chunk read once after it is made
and the peer's chunk written into the output; here local copies, which run faster than the link,
so this is the memory traffic, not the link's pace); and the relative error of the output of the
sequence against float32.

`template: c_stationary` (syncopate/kernels/c_stationary.py): a rank's own term
A_r[own rows] @ B_r, then each peer's term added in place once its rows of A and its B have landed
(cuBLAS addmm). The cases `c …`: the same three timings for a rank of two (M=8192, K/ws, N), the
traffic being the peer's rows of A and B landing and this rank's going out.

Prints a table; writes JSON to $OUT/stationary_single.json when set.

    python benchmarks/stationary_single.py
"""

from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_single import DEV, bench  # noqa: E402  (the same timing as the other one-GPU benchmarks)


def case(m_local, n_local, k, splits):
    a = torch.randn(m_local, k, device=DEV).to(torch.bfloat16)
    a_peer = torch.randn(m_local, k, device=DEV).to(torch.bfloat16)
    b = (torch.randn(k, n_local, device=DEV) / k**0.5).to(torch.bfloat16)
    b_peer = (torch.randn(k, n_local, device=DEV) / k**0.5).to(torch.bfloat16)
    b_recv = torch.empty_like(b)
    out = torch.empty(2 * m_local, n_local, device=DEV, dtype=torch.bfloat16)
    c_send = torch.empty(m_local, n_local, device=DEV, dtype=torch.bfloat16)
    peer_rows = torch.empty(m_local, n_local, device=DEV, dtype=torch.bfloat16)  # the peer's product for us
    whole_a = torch.cat([a, a_peer])
    half = m_local // 2
    chunks = [(j * m_local // splits, (j + 1) * m_local // splits) for j in range(splits)]
    side = [torch.cuda.Stream(device=DEV) for _ in range(2)]

    def sequence(traffic: bool):
        main = torch.cuda.current_stream()
        if traffic:
            start = torch.cuda.Event()
            start.record(main)
            side[0].wait_event(start)
            with torch.cuda.stream(side[0]):
                b_recv.copy_(b_peer)  # stands for B's push out (a read of ours) and the peer's B landing
        torch.matmul(a[:half], b, out=out[:half])
        if traffic:
            landed = torch.cuda.Event()
            landed.record(side[0])
            main.wait_event(landed)
        src = b_recv if traffic else b_peer
        for lo, hi in chunks:
            torch.matmul(a[lo:hi], src, out=c_send[lo:hi])
            if traffic:
                made = torch.cuda.Event()
                made.record(main)
                side[1].wait_event(made)
                with torch.cuda.stream(side[1]):  # the chunk read by the peer; the peer's chunk landing here
                    out[m_local + lo : m_local + hi].copy_(peer_rows[lo:hi])
                    peer_rows[lo:hi].copy_(c_send[lo:hi])
        torch.matmul(a[half:], b, out=out[half:m_local])
        if traffic:
            for s in side:
                done = torch.cuda.Event()
                done.record(s)
                main.wait_event(done)

    t_gemm = bench(lambda: torch.matmul(whole_a, b))
    t_seq = bench(lambda: sequence(False))
    t_traffic = bench(lambda: sequence(True))
    sequence(False)
    torch.cuda.synchronize()
    ref = a.float() @ b.float()
    err_own = ((out[:m_local].float() - ref).norm() / ref.norm()).item()
    ref_peer = a.float() @ b_peer.float()
    err_peer = ((c_send.float() - ref_peer).norm() / ref_peer.norm()).item()
    return {"case": f"{m_local}x{n_local}x{k} splits {splits}", "gemm_alone_us": t_gemm, "sequence_us": t_seq,
            "with_traffic_us": t_traffic, "rel_err": max(err_own, err_peer)}


def c_case(m, n, k_local):
    rows = m // 2
    a = torch.randn(m, k_local, device=DEV).to(torch.bfloat16)
    b = (torch.randn(k_local, n, device=DEV) / k_local**0.5).to(torch.bfloat16)
    a_peer = torch.randn(rows, k_local, device=DEV).to(torch.bfloat16)  # the peer's columns for our rows
    b_peer = (torch.randn(k_local, n, device=DEV) / k_local**0.5).to(torch.bfloat16)
    a_recv, b_recv = torch.empty_like(a_peer), torch.empty_like(b_peer)
    a_out, b_out = torch.empty_like(a_peer), torch.empty_like(b)  # what leaves for the peer
    out = torch.empty(rows, n, device=DEV, dtype=torch.bfloat16)
    side = torch.cuda.Stream(device=DEV)

    def sequence(traffic: bool):
        main = torch.cuda.current_stream()
        if traffic:
            start = torch.cuda.Event()
            start.record(main)
            side.wait_event(start)
            with torch.cuda.stream(side):
                a_out.copy_(a[rows:])
                b_out.copy_(b)
                a_recv.copy_(a_peer)
                b_recv.copy_(b_peer)
        torch.matmul(a[:rows], b, out=out)
        if traffic:
            landed = torch.cuda.Event()
            landed.record(side)
            main.wait_event(landed)
        out.addmm_(a_recv if traffic else a_peer, b_recv if traffic else b_peer)

    t_gemm = bench(lambda: torch.matmul(a, b))
    t_seq = bench(lambda: sequence(False))
    t_traffic = bench(lambda: sequence(True))
    sequence(False)
    torch.cuda.synchronize()
    ref = a[:rows].float() @ b.float() + a_peer.float() @ b_peer.float()
    err = ((out.float() - ref).norm() / ref.norm()).item()
    return {"case": f"c {m}x{n}x{k_local}", "gemm_alone_us": t_gemm, "sequence_us": t_seq,
            "with_traffic_us": t_traffic, "rel_err": err}


def main():
    rows = []
    for n_local, k in [(1024, 8192), (2048, 8192)]:
        for splits in (1, 2, 4):
            r = case(4096, n_local, k, splits)
            rows.append(r)
            print(json.dumps(r), flush=True)
    for n, k_local in [(8192, 1024), (8192, 2048)]:
        r = c_case(8192, n, k_local)
        rows.append(r)
        print(json.dumps(r), flush=True)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "stationary_single.json"), "w") as f:
            json.dump(rows, f, indent=1)
    print("\ncase | GEMM alone | sequence | with traffic | sequence/GEMM | rel err")
    for r in rows:
        print(f"{r['case']} | {r['gemm_alone_us']:.1f} | {r['sequence_us']:.1f} | "
              f"{r['with_traffic_us']:.1f} | {r['sequence_us'] / r['gemm_alone_us']:.3f} | {r['rel_err']:.1e}")


if __name__ == "__main__":
    main()
