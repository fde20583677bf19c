"""Check on one GPU that a fused kernel relaunched from a context's cache (`launch._Relaunch`)
computes what a launch through Triton's dispatch computes, with the caller's tensors of each call:
fresh inputs and outputs every call, outputs poisoned, against the float32 reference, and a tensor
whose address changes alignment takes the full launch again. The consumer and the producers are
checked in Triton and in Gluon (`gluon_kernels.py`, SYNCOPATE_GLUON=1), there with a K-major B too,
and the Gluon consumer with chunks that land while it runs; the MoE combine's gathered sum and its
gradients, whose grids are two-dimensional.

Run in a fresh process without TRITON_INTERPRET (tests/test_gpu_relaunch.py does): it prints one
line per check and exits 1 if one fails, 3 where this Triton release is not relaunched.

    python tests/support/relaunch_check.py
"""

from __future__ import annotations

import os
import sys

if os.environ.get("TRITON_INTERPRET", "0") == "1":
    sys.exit("relaunch_check: unset TRITON_INTERPRET; it launches compiled kernels")

import torch  # noqa: E402
import triton  # noqa: E402
from checks import run_checks  # noqa: E402

from syncopate.kernels import launch, streamops  # noqa: E402
from syncopate.kernels.tables import (  # noqa: E402
    ENTERED_BASE,
    LOCAL_BASE,
    PAD_WORDS,
    READY_BASE,
    consumer_tables,
    plan_for,
    producer_tables,
    recv_offset,
)
from syncopate.measure.reference import relative_error  # noqa: E402
from syncopate.search_space import Candidate, block_bounds  # noqa: E402

TILE = dict(block_m=128, block_n=128, block_k=64, group_m=8, num_warps=8, num_stages=3)


def relaunches(cache):
    return [k for k in cache if isinstance(k, tuple) and k[:1] == ("relaunch",)]


class gluon_kernels:
    """`with gluon_kernels(on):` the Gluon kernels (SYNCOPATE_GLUON=1) or the Triton ones."""

    def __init__(self, on: bool) -> None:
        self.on = on

    def __enter__(self) -> None:
        self.saved = os.environ.get("SYNCOPATE_GLUON")
        os.environ["SYNCOPATE_GLUON"] = "1" if self.on else "0"

    def __exit__(self, *exc) -> None:
        if self.saved is None:
            del os.environ["SYNCOPATE_GLUON"]
        else:
            os.environ["SYNCOPATE_GLUON"] = self.saved


def launched(cache, gluon: bool) -> None:
    """The relaunches in `cache` are of the kernels asked for, and call the compiled launcher
    directly (`launch._direct_launch`) with the descriptors each call's tensors need."""
    kept = [v for k, v in cache.items() if k in relaunches(cache)]
    kinds = {type(v).__name__ for v in kept}
    assert kinds == {"_GluonRelaunch" if gluon else "_Relaunch"}, f"launched {kinds}"
    assert all(v.direct is not None and v.direct_launches > 0 for v in kept), (
        "a relaunch went through the compiled kernel's run"
    )


def consumer_check(gluon: bool = False, kmajor: bool = False, m: int = 2048, dtype=torch.bfloat16) -> None:
    """`m` rows of A over two ranks (2000: 1000 a rank, chunks and tiles out of step); `kmajor`: B a
    transposed weight."""
    dev = torch.device("cuda", 0)
    n, k = 768, 512
    c = Candidate(num_splits=2, **TILE)
    plan = plan_for("ag_gemm", "direct", 2, m, 2, c.block_m)
    tables = consumer_tables(plan, 0, n, c, dev)
    signals = torch.zeros(PAD_WORDS, dtype=torch.int32, device=dev)
    error = torch.zeros(1, dtype=torch.int32, device=dev)
    slots = torch.tensor(
        [t.signal for t in plan.recvs(0, "gather")] + [LOCAL_BASE, LOCAL_BASE + 1], device=dev
    )
    a_full = torch.empty(m, k, dtype=dtype, device=dev)
    cache = {}
    with gluon_kernels(gluon):
        for epoch in range(1, 6):
            a_full.copy_(torch.randn(m, k, device=dev))
            b = (torch.randn(k, n, device=dev) / k**0.5).to(dtype)
            if kmajor:
                b = b.t().contiguous().t()
            out = torch.full((m, n), float("nan"), dtype=dtype, device=dev)
            signals.index_fill_(0, slots, epoch)
            launch.launch_consumer(
                a_full, b, out, tables, c, epoch, signals, error, 132, 1 << 20, cache=cache
            )
            torch.cuda.synchronize()
            assert int(error.item()) == 0
            assert relative_error(out, a_full.float() @ b.float()) < 1e-2, f"call {epoch}"
        assert len(relaunches(cache)) == 1, "every call after the first relaunched the first one's kernel"
        launched(cache, gluon)
        wide = torch.full((m * n + 8,), float("nan"), dtype=dtype, device=dev)
        out = wide[1 : 1 + m * n].view(m, n)  # 2-byte aligned: another specialization, the full launch again
        signals.index_fill_(0, slots, 6)
        launch.launch_consumer(a_full, b, out, tables, c, 6, signals, error, 132, 1 << 20, cache=cache)
        torch.cuda.synchronize()
        assert relative_error(out, a_full.float() @ b.float()) < 1e-2
        assert len(relaunches(cache)) == 2


def late_chunk_check() -> None:
    """The Gluon consumer with the peer's chunks copied in and raised while it runs by the copy engine
    (as the copy-engine backend does; no kernel that would need an SM the consumer holds), the
    last one late (a 512 MiB copy first): every tile of a chunk waits for it, a tile's first loads
    left for its start where the chunk was not there when the tile before looked."""
    dev = torch.device("cuda", 0)
    m, n, k = 4096, 2048, 1024
    c = Candidate(num_splits=4, **TILE)
    plan = plan_for("ag_gemm", "direct", 2, m, 4, c.block_m)
    tables = consumer_tables(plan, 0, n, c, dev)
    signals = torch.zeros(PAD_WORDS, dtype=torch.int32, device=dev)
    error = torch.zeros(1, dtype=torch.int32, device=dev)
    own = torch.tensor([LOCAL_BASE + j for j in range(4)], device=dev)
    peer = [(t.row_start, t.row_end, t.signal) for t in plan.recvs(0, "gather")]
    source = torch.empty(m, k, dtype=torch.bfloat16, device=dev)
    a_full = torch.empty_like(source)
    scratch = torch.empty(2, 256 << 20, dtype=torch.uint8, device=dev)
    side = torch.cuda.Stream()
    row = k * source.element_size()
    with gluon_kernels(True):
        for epoch in range(1, 6):
            source.copy_(torch.randn(m, k, device=dev))
            b = (torch.randn(k, n, device=dev) / k**0.5).to(torch.bfloat16)
            out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=dev)
            a_full.fill_(float("nan"))
            a_full[: m // 2] = source[: m // 2]
            signals.index_fill_(0, own, epoch)
            side.wait_stream(torch.cuda.current_stream())
            for j, (lo, hi, slot) in enumerate(peer):
                if j == len(peer) - 1:
                    streamops.copy_async(
                        side.cuda_stream, scratch[1].data_ptr(), scratch[0].data_ptr(), 256 << 20
                    )
                    streamops.copy_async(
                        side.cuda_stream, scratch[0].data_ptr(), scratch[1].data_ptr(), 256 << 20
                    )
                streamops.copy_async(
                    side.cuda_stream,
                    a_full.data_ptr() + lo * row,
                    source.data_ptr() + lo * row,
                    (hi - lo) * row,
                )
                streamops.write_value(side.cuda_stream, signals.data_ptr() + 4 * slot, epoch)
            launch.launch_consumer(a_full, b, out, tables, c, epoch, signals, error, 132, 1 << 26)
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            assert int(error.item()) == 0
            assert relative_error(out, source.float() @ b.float()) < 1e-2, f"call {epoch}"


def own_shard_check(gluon: bool = False) -> None:
    """The consumer reading its own rows from a fresh shard tensor each call: the relaunch must take
    the new shard (and its descriptor), never the first call's; the buffer's own rows stay NaN and
    their words are never raised."""
    with gluon_kernels(gluon):
        _own_shard_check(gluon)


def _own_shard_check(gluon: bool) -> None:
    dev = torch.device("cuda", 0)
    m, n, k = 2048, 768, 512
    c = Candidate(num_splits=2, **TILE)
    plan = plan_for("ag_gemm", "direct", 2, m, 2, c.block_m)
    tables = consumer_tables(plan, 0, n, c, dev)
    assert tables.own_tiles == (m // 2 // c.block_m) * (n // c.block_n) and not tables.own_rows_later
    signals = torch.zeros(PAD_WORDS, dtype=torch.int32, device=dev)
    error = torch.zeros(1, dtype=torch.int32, device=dev)
    slots = torch.tensor([t.signal for t in plan.recvs(0, "gather")], device=dev)
    a_full = torch.full((m, k), float("nan"), dtype=torch.bfloat16, device=dev)
    cache = {}
    for epoch in range(1, 6):
        shard = torch.randn(m // 2, k, device=dev).to(torch.bfloat16)
        a_full[m // 2 :] = torch.randn(m // 2, k, device=dev).to(torch.bfloat16)
        b = (torch.randn(k, n, device=dev) / k**0.5).to(torch.bfloat16)
        out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=dev)
        signals.index_fill_(0, slots, epoch)
        launch.launch_consumer(
            a_full,
            b,
            out,
            tables,
            c,
            epoch,
            signals,
            error,
            132,
            1 << 20,
            cache=cache,
            a_own=shard,
            own_row0=0,
        )
        torch.cuda.synchronize()
        assert int(error.item()) == 0
        ref = torch.cat([shard, a_full[m // 2 :]]).float() @ b.float()
        assert relative_error(out, ref) < 1e-2, f"call {epoch}"
    assert len(relaunches(cache)) == 1, "every call after the first relaunched the first one's kernel"
    launched(cache, gluon)


def producer_check(all_reduce: bool, gluon: bool = False, kmajor: bool = False) -> None:
    """With `gluon`, the producer in Gluon (SYNCOPATE_GLUON=1); `kmajor`: B a transposed weight."""
    with gluon_kernels(gluon):
        _producer_check(all_reduce, gluon, kmajor)


def _producer_check(all_reduce: bool, gluon: bool, kmajor: bool) -> None:
    dev = torch.device("cuda", 0)
    m, n, k = 2048, 768, 512
    kind = "gemm_ar" if all_reduce else "gemm_rs"
    c = Candidate(num_splits=2, **TILE)
    plan = plan_for(kind, "direct", 2, m, 2, c.block_m)
    tables = producer_tables(plan, 0, n, c, all_reduce, dev)
    lo, hi = block_bounds(m, 2, 0)
    recv = torch.zeros(m, n, dtype=torch.bfloat16, device=dev)
    send = torch.empty(m, n, dtype=torch.bfloat16, device=dev)
    reduced = torch.empty(m, n, dtype=torch.bfloat16, device=dev) if all_reduce else None
    pad = torch.zeros(PAD_WORDS, dtype=torch.int32, device=dev)
    counters = torch.zeros(4096, dtype=torch.int64, device=dev)
    error = torch.zeros(1, dtype=torch.int32, device=dev)
    peers = torch.tensor([pad.data_ptr(), pad.data_ptr()], dtype=torch.int64, device=dev)
    raised = torch.tensor(
        [t.signal for t in plan.recvs(0, "reduce")] + [ENTERED_BASE, ENTERED_BASE + 1], device=dev
    )
    off = recv_offset(plan, 1, 0, n)
    cache = {}
    for epoch in range(1, 6):
        a = torch.randn(m, k, device=dev).to(torch.bfloat16)
        b = (torch.randn(k, n, device=dev) / k**0.5).to(torch.bfloat16)
        if kmajor:
            b = b.t().contiguous().t()
        partial = torch.randn(m, n, device=dev).to(torch.bfloat16)
        recv.view(-1)[off + lo * n : off + hi * n] = partial[lo:hi].reshape(-1)
        out = torch.full((m if all_reduce else hi - lo, n), float("nan"), dtype=torch.bfloat16, device=dev)
        send.fill_(float("nan"))
        pad.index_fill_(0, raised, epoch)
        launch.launch_producer(
            a,
            b,
            send,
            out,
            reduced,
            recv,
            0 if all_reduce else lo,
            tables,
            c,
            epoch,
            pad,
            counters,
            peers,
            2,
            0,
            error,
            132,
            1 << 20,
            cache=cache,
        )
        torch.cuda.synchronize()
        full = a.float() @ b.float()
        mine = out[lo:hi] if all_reduce else out
        assert int(error.item()) == 0
        assert relative_error(mine, full[lo:hi] + partial[lo:hi].float()) < 1e-2, f"call {epoch}: kept rows"
        assert relative_error(send[hi:], full[hi:]) < 1e-2, f"call {epoch}: rows sent"
        if all_reduce:
            assert torch.equal(reduced[lo:hi], mine)
        assert int(counters.abs().sum().item()) == 0
        assert all(int(pad[READY_BASE + x].item()) == epoch for x in tables.chunk_ready.tolist() if x >= 0), (
            f"call {epoch}: a chunk that leaves was not signalled"
        )
    assert len(relaunches(cache)) == 1, "every call after the first relaunched the first one's kernel"
    launched(cache, gluon)


def gathered_sum_check() -> None:
    """The gathered sum and its gradients (`syncopate.moe.kernels`), grids of several column blocks,
    three calls back to back (the second and third relaunched) with fresh inputs into poisoned
    outputs, against float32."""
    from syncopate.moe import kernels as moe_kernels
    from syncopate.moe.routing import inverse

    tokens, top_k, width = 300, 8, 2 * moe_kernels.SUM_BLOCK + 72
    dev = torch.device("cuda")
    for call in range(3):
        gen = torch.Generator(device=dev).manual_seed(call)
        rows = torch.randn(tokens * top_k, width, generator=gen, device=dev).to(torch.bfloat16)
        order = torch.randperm(tokens * top_k, generator=gen, device=dev)
        index = inverse(order)
        gates = torch.rand(tokens, top_k, generator=gen, device=dev) + 0.1
        grad = torch.randn(tokens, width, generator=gen, device=dev).to(torch.bfloat16)
        out = torch.full((tokens, width), float("nan"), dtype=torch.bfloat16, device=dev)
        grad_rows = torch.full_like(rows, float("nan"))
        grad_gates = torch.full((tokens, top_k), float("nan"), device=dev)
        moe_kernels.launch_gathered_sum(rows, index, gates, out)
        moe_kernels.launch_gathered_sum_grads(grad, rows, index, order, gates, grad_rows, grad_gates)
        pairs = rows.float()[index].view(tokens, top_k, width)
        want = (gates.unsqueeze(-1) * pairs).sum(1)
        want_rows = torch.empty(rows.shape, device=dev)
        want_rows[index] = gates.reshape(-1, 1) * grad.float().repeat_interleave(top_k, 0)
        want_gates = (pairs * grad.float().unsqueeze(1)).sum(-1)
        for name, got, ref, tol in (
            ("sum", out, want, 1e-2),
            ("rows' gradient", grad_rows, want_rows, 1e-2),
            ("gates' gradient", grad_gates, want_gates, 1e-4),
        ):
            err = relative_error(got.float(), ref)
            assert err < tol, f"call {call}: the {name} is off by {err:.2e}"
    kept = [k for k in moe_kernels._RELAUNCHES if k[0].startswith("gathered_sum")]
    assert len(kept) == 3, f"the sum and its two gradients each kept for relaunch, got {kept}"


def main() -> int:
    if not triton.__version__.startswith(launch.RELAUNCH_TRITON):
        print(f"relaunching is used with Triton {launch.RELAUNCH_TRITON}, not {triton.__version__}")
        return 3
    return run_checks(
        [
            ("consumer", consumer_check),
            ("consumer reading its own shard", own_shard_check),
            ("reduce-scatter producer", lambda: producer_check(False)),
            ("all-reduce producer", lambda: producer_check(True)),
            ("reduce-scatter producer in Gluon", lambda: producer_check(False, gluon=True)),
            ("all-reduce producer in Gluon, B k-major", lambda: producer_check(True, True, True)),
            ("consumer in Gluon", lambda: consumer_check(gluon=True)),
            (
                "consumer in Gluon, fp16, B k-major, 1000 rows a rank",
                lambda: consumer_check(True, True, 2000, torch.float16),
            ),
            ("consumer in Gluon reading its own shard", lambda: own_shard_check(gluon=True)),
            ("consumer in Gluon, chunks landing late", late_chunk_check),
            ("MoE gathered sum and its gradients, two-dimensional grids", gathered_sum_check),
        ]
    )


if __name__ == "__main__":
    sys.exit(main())
