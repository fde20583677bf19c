"""Layer: pure CPU logic and the Triton interpreter on the CPU.

The MoE ops' `nvshmem` backend: candidates take it for `pipelined` only, with `comm_sms` (which the
other backends leave out of their JSON, so their keys are unchanged); a search tries it only where
asked; CPU tensors and processes without NVSHMEM memory are refused with the fix. Its copier, one
put a launch from scalar arguments, run in plain mode (loads and stores through the same address
arithmetic as its NVSHMEM calls) on buffers of several ranks kept in this process: it moves exactly
the rows asked for to the peer's copy of the buffer at the right row, over several programs with
uneven shares, raises the receiver's word only, leaves its counter at 0, and does so call after
call with a new epoch.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"

from types import SimpleNamespace

import pytest
import torch

from syncopate.errors import ConfigError
from syncopate.kernels.nvshmem_copy import launch_nvshmem_put
from syncopate.kernels.symmetric_memory import nvshmem_refusal
from syncopate.kernels.tables import ENTERED_BASE, PAD_WORDS
from syncopate.search_space.moe_workload import (
    MOE_BACKENDS,
    MOE_DEFAULT_BACKENDS,
    MoeCandidate,
    MoeWorkload,
    RoutingSpec,
    moe_space,
)

WORKLOAD = MoeWorkload(
    kind="a2a_gemm", tokens=4096, hidden=2048, ffn=768, experts=128, top_k=8, routing=RoutingSpec()
)


# -- candidates and the space ----------------------------------------------------------------------


def test_nvshmem_candidates_are_pipelined_with_communication_programs():
    assert "nvshmem" in MOE_BACKENDS and "nvshmem" not in MOE_DEFAULT_BACKENDS
    c = MoeCandidate(template="pipelined", backend="nvshmem", chunks_per_source=2, comm_sms=32)
    assert c.to_dict()["comm_sms"] == 32 and c.short() == "pipelined/nvshmem/c2/ring/sm32"
    assert MoeCandidate.from_json(c.to_json()) == c and c.as_pipelined() == c
    ce = MoeCandidate(template="pipelined", backend="copy_engine", chunks_per_source=2)
    assert "comm_sms" not in ce.to_dict() and ce.short() == "pipelined/copy_engine/c2/ring"
    assert c.key() != c.replace(comm_sms=16).key()
    with pytest.raises(ConfigError, match=r"^comm_sms=8 applies to backend 'nvshmem' only"):
        MoeCandidate(template="pipelined", backend="copy_engine", comm_sms=8)
    with pytest.raises(ConfigError, match=r"^backend nvshmem moves the pieces of template 'pipelined' only"):
        MoeCandidate(template="fused", backend="nvshmem")
    with pytest.raises(
        ConfigError, match=r"^comm_sms=12 is not accepted for backend nvshmem: give one of 8, 16"
    ):
        MoeCandidate(template="pipelined", backend="nvshmem", comm_sms=12)


def test_a_search_tries_nvshmem_only_where_asked():
    assert not [c for c in moe_space(WORKLOAD, 4) if c.backend == "nvshmem"]
    asked = moe_space(WORKLOAD, 4, backends=("copy_engine", "nvshmem"), chunks=(2,))
    nv = [c for c in asked if c.backend == "nvshmem"]
    assert {(c.template, c.order, c.comm_sms) for c in nv} == {
        ("pipelined", o, n) for o in ("ring", "pairwise") for n in (16, 32)
    }
    assert [c for c in asked if c.template == "fused"] and all(
        c.backend == "copy_engine" for c in asked if c.template == "fused"
    )
    with pytest.raises(ConfigError, match=r"^comm_sms=3 in comm_sms is not accepted"):
        moe_space(WORKLOAD, 4, backends=("nvshmem",), comm_sms=(3,))


def test_without_nvshmem_memory_or_a_gpu_the_backend_is_refused_with_the_fix():
    why = nvshmem_refusal("cuda", instead="copy_engine")
    assert why.startswith("backend 'nvshmem' needs NVSHMEM symmetric memory, but this process's is 'cuda'")
    assert "syncopate.use_nvshmem()" in why and why.endswith("or choose backend 'copy_engine'")
    assert nvshmem_refusal("ipc", instead="copy_engine").endswith("choose backend 'copy_engine'")
    assert nvshmem_refusal("nvshmem", instead="copy_engine") is None
    from syncopate.moe.exchange import open_exchange

    with pytest.raises(
        ConfigError, match=r"^backend nvshmem puts rows into CUDA symmetric memory: .* 'nccl' there$"
    ):
        open_exchange("nvshmem", None, None, torch.device("cpu"), 8, torch.bfloat16, 16, 16)


def test_a_dispatch_on_cpu_tensors_refuses_nvshmem_before_anything_moves(tmp_path):
    import torch.distributed as dist

    from syncopate.moe.ops import dispatch_gemm, exchange_layout

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdv'}", rank=0, world_size=1)
    try:
        x = torch.randn(8, 16)
        ids = torch.stack([torch.randperm(4)[:2] for _ in range(8)])
        layout = exchange_layout(ids, 4, dist.group.WORLD)
        config = MoeCandidate(template="pipelined", backend="nvshmem")
        with pytest.raises(ConfigError, match="^backend nvshmem puts rows into CUDA symmetric memory"):
            dispatch_gemm(x, torch.randn(4, 16, 8), layout, dist.group.WORLD, config=config)
    finally:
        dist.destroy_process_group()


# -- the put in plain mode -------------------------------------------------------------------------


class _Ranks:
    """`ws` ranks' symmetric buffers of rows and their pads, each a CPU tensor of this process."""

    def __init__(self, ws: int, rows: int, width: int) -> None:
        self.ws, self.width = ws, width
        self.rows = [torch.full((rows, width), float("nan"), dtype=torch.bfloat16) for _ in range(ws)]
        self.pads = [torch.zeros(PAD_WORDS, dtype=torch.int32) for _ in range(ws)]

    def context(self, rank: int):
        rows = SimpleNamespace(local=self.rows[rank], peer_ptrs=[t.data_ptr() for t in self.rows])
        return SimpleNamespace(
            device=torch.device("cpu"),
            rank=rank,
            buffers={"rows": rows},
            signals=SimpleNamespace(local=self.pads[rank], peer_ptrs=[p.data_ptr() for p in self.pads]),
            counters=torch.zeros(4096, dtype=torch.int64),
            error=torch.zeros(1, dtype=torch.int32),
        )


@pytest.mark.parametrize(("rows", "width", "programs"), [(37, 24, 3), (5, 8, 4), (64, 130, 5)])
def test_the_put_moves_the_rows_to_the_peer_and_raises_its_word_call_after_call(rows, width, programs):
    ws, rank, peer, at, word = 3, 0, 2, 11, 5
    world = _Ranks(ws, at + rows + 7, width)
    ctx = world.context(rank)
    for epoch in (1, 2, 3):
        world.pads[rank][ENTERED_BASE + peer] = epoch  # the peer has entered this call
        send = torch.randn(rows, width).to(torch.bfloat16)
        before = [t.clone() for t in world.rows]
        dst = world.rows[rank].data_ptr() + at * width * 2  # the local symmetric address of row `at`
        launch_nvshmem_put(
            ctx, None, send, dst, peer, pe=40 + peer, signal=word, epoch=epoch, programs=programs
        )
        want = before[peer].clone()
        want[at : at + rows] = send
        got = world.rows[peer]
        assert torch.equal(got.view(torch.int16), want.view(torch.int16))  # NaN poison compared bit for bit
        for r in (0, 1):
            assert torch.equal(world.rows[r].view(torch.int16), before[r].view(torch.int16))
        assert int(world.pads[peer][word]) == epoch
        assert int(world.pads[peer].sum()) == epoch and int(world.pads[1].sum()) == 0
        assert int(ctx.counters.abs().sum()) == 0 and int(ctx.error.item()) == 0


def test_an_address_outside_the_contexts_buffers_is_refused():
    world = _Ranks(2, 4, 8)
    stray = torch.zeros(4, 8, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="lies in none of the context's buffers"):
        launch_nvshmem_put(world.context(0), None, stray, stray.data_ptr(), 1, 1, 0, 1, 2)


def test_an_empty_put_moves_nothing_and_raises_no_word():
    """What a first launch that only loads the put runs (`stage_nvshmem_put`): epoch 0, signal -1."""
    world = _Ranks(2, 4, 8)
    ctx = world.context(0)
    before = [t.clone() for t in world.rows]
    empty = torch.empty(0, dtype=torch.bfloat16)
    launch_nvshmem_put(ctx, None, empty, world.rows[0].data_ptr(), 0, 0, -1, 0, 4)
    for got, want in zip(world.rows, before, strict=True):
        assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    assert int(world.pads[0].abs().sum()) == int(world.pads[1].abs().sum()) == 0
    assert int(ctx.counters.abs().sum()) == 0 and int(ctx.error.item()) == 0
