"""Layer: pure CPU logic, a one-rank gloo group, and the Triton interpreter on the CPU.

The `nvshmem` backend: candidates take it with comm_sms > 0; the search space and the bench grid
hold it only where asked; a process whose symmetric memory is not NVSHMEM's (here: a torch without
NVSHMEM) refuses it with the cause and the fix before anything is made, and so does a context of
ranks sharing a GPU; its copier, run in plain mode (loads and stores through the same address
arithmetic as its NVSHMEM calls), moves the job lists of the SM copier's plans (pushes, pulls,
forwarded chunks, jobs within the rank; uneven sizes over several programs) as a Python reference
of those job lists does, raises each job's signal in the right pad and leaves its counters at 0.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"

from types import SimpleNamespace

import pytest
import torch

from syncopate.errors import ConfigError, RuntimeUnavailableError
from syncopate.kernels import symmetric_memory
from syncopate.kernels.backends import (
    BACKEND_IMPLS,
    CopyJob,
    GatherCall,
    NvshmemBackend,
    ScatterCall,
    gather_jobs,
    scatter_jobs,
)
from syncopate.kernels.launch import launch_chunk_copy
from syncopate.kernels.nvshmem_copy import LOCAL, PULL, PUSH, launch_nvshmem_copy
from syncopate.kernels.tables import ENTERED_BASE, PAD_WORDS, READY_BASE, plan_for, recv_rows
from syncopate.search_space import (
    BACKENDS,
    DEFAULT_BACKENDS,
    Candidate,
    SpaceOptions,
    Topology,
    Workload,
    bench_grid,
    check_candidate,
    space,
)

CPU = torch.device("cpu")
TOPO = Topology.from_key("H100x4-nvswitch")
W = Workload.from_dict({"kind": "gemm_rs", "m": 8192, "n": 4096, "k": 8192, "dtype": "bf16"})


# -- candidates and the space ----------------------------------------------------------------------


def test_nvshmem_candidates_need_communication_sms():
    assert "nvshmem" in BACKENDS and "nvshmem" not in DEFAULT_BACKENDS
    assert Candidate(backend="nvshmem", comm_sms=16).comm_sms == 16
    with pytest.raises(
        ConfigError, match=r"^backend nvshmem needs comm_sms >= 1 \(SMs for communication\), got 0$"
    ):
        Candidate(backend="nvshmem", comm_sms=0)


def test_the_space_and_the_bench_grid_hold_nvshmem_only_where_asked():
    assert not [c for c in space(W, TOPO) if c.backend == "nvshmem"]
    assert not [c for c in bench_grid(W, TOPO, "small", DEFAULT_BACKENDS) if c.backend == "nvshmem"]
    asked = space(W, TOPO, SpaceOptions(backends=("copy_engine", "nvshmem")))
    nv = [c for c in asked if c.backend == "nvshmem"]
    assert nv and {c.comm_sms for c in nv} == {16, 32, 64}
    for c in nv:
        check_candidate(c, W, TOPO)  # liveness and the rest, as for sm_copy
    sm = {
        c.replace(backend="nvshmem")
        for c in space(W, TOPO, SpaceOptions(backends=("sm_copy",)))
        if c.backend == "sm_copy"
    }
    assert set(nv) == sm  # the same plans, orders and tiles as the SM copier
    grid = bench_grid(W, TOPO, "tiny", ("nvshmem",))
    assert grid and {c.backend for c in grid if c.template not in ("unfused",)} <= {
        "nvshmem",
        "copy_engine",
        "nccl",
    }
    assert {c.comm_sms for c in grid if c.backend == "nvshmem"} == {16, 32}


# -- opting in -------------------------------------------------------------------------------------


def test_without_nvshmem_the_opt_in_and_the_backend_are_refused_with_the_fix(tmp_path, monkeypatch):
    """This torch has no NVSHMEM (`is_nvshmem_available()` is False): the real checks say so."""
    import torch.distributed as dist

    import syncopate
    from syncopate.kernels.ops import check_backend_group

    assert syncopate.use_nvshmem is symmetric_memory.use_nvshmem
    with pytest.raises(RuntimeUnavailableError, match="NVSHMEM is not available.*use backend 'sm_copy'"):
        syncopate.use_nvshmem()
    assert symmetric_memory.process_memory() == "cuda"
    why = symmetric_memory.process_refusal()
    assert (
        why.startswith("backend 'nvshmem' needs NVSHMEM, which this torch")
        and "choose backend 'sm_copy'" in why
    )
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdv'}", rank=0, world_size=1)
    try:
        with pytest.raises(ConfigError, match="^backend 'nvshmem' needs NVSHMEM"):
            check_backend_group(Candidate(backend="nvshmem", comm_sms=16), dist.group.WORLD)
        check_backend_group(Candidate(backend="sm_copy", comm_sms=16), dist.group.WORLD)
    finally:
        dist.destroy_process_group()


def test_a_process_whose_memory_cannot_become_nvshmem_says_why_and_what_to_do(monkeypatch):
    """NVSHMEM said to be there, torch's own `set_backend` refusing (here it finds no NVSHMEM
    allocator; after a CUDA allocation it refuses the change): a ConfigError naming the fix."""
    import torch.distributed._symmetric_memory as symm_mem

    monkeypatch.setattr(symm_mem, "is_nvshmem_available", lambda: True)
    with pytest.raises(ConfigError, match="cannot make this process's symmetric memory NVSHMEM's") as info:
        symmetric_memory.use_nvshmem()
    assert "call syncopate.use_nvshmem() first thing on every rank" in str(info.value)
    why = symmetric_memory.process_refusal(environ={})
    assert why == (
        "backend 'nvshmem' needs NVSHMEM symmetric memory, but this process's is 'cuda': call "
        "syncopate.use_nvshmem() on every rank before the first fused call (or set "
        "SYNCOPATE_SYMMETRIC_MEMORY=nvshmem), or choose backend 'sm_copy'"
    )
    # asked for by the environment: applied when the first context is made, so not refused yet
    assert symmetric_memory.process_refusal(environ={"SYNCOPATE_SYMMETRIC_MEMORY": "nvshmem"}) is None
    with pytest.raises(ConfigError, match="cannot make this process's symmetric memory NVSHMEM's"):
        symmetric_memory.apply_requested({"SYNCOPATE_SYMMETRIC_MEMORY": "nvshmem"})
    symmetric_memory.apply_requested({"SYNCOPATE_SYMMETRIC_MEMORY": "cuda"})  # nothing to do
    symmetric_memory.apply_requested({})


def test_the_memory_variable_takes_cuda_or_nvshmem():
    assert symmetric_memory.requested_memory({}) == "cuda"
    assert symmetric_memory.requested_memory({"SYNCOPATE_SYMMETRIC_MEMORY": " NVSHMEM "}) == "nvshmem"
    with pytest.raises(
        ConfigError,
        match="^SYNCOPATE_SYMMETRIC_MEMORY='nccl' is not a symmetric memory: accepted are cuda, nvshmem$",
    ):
        symmetric_memory.requested_memory({"SYNCOPATE_SYMMETRIC_MEMORY": "nccl"})


@pytest.mark.parametrize(
    ("memory", "why"),
    [
        ("cuda", "needs NVSHMEM symmetric memory, but this process's is 'cuda'"),
        ("ipc", "needs one GPU a rank, but ranks of this group share a GPU"),
    ],
)
def test_a_context_not_in_nvshmem_memory_refuses_the_backend_before_a_call(memory, why):
    ctx = SimpleNamespace(memory=memory)
    with pytest.raises(ConfigError, match=why):
        NvshmemBackend().check_context(ctx)
    NvshmemBackend().check_context(SimpleNamespace(memory="nvshmem"))
    for name in ("copy_engine", "sm_copy", "nccl"):
        BACKEND_IMPLS[name].check_context(ctx)  # they run on any symmetric memory


# -- the copier in plain mode against the job lists ------------------------------------------------


class _World:
    """Symmetric buffers of `ws` ranks in this process: every rank's copy is a CPU tensor, and
    `peer_ptrs` their addresses, as torch's handles give them."""

    def __init__(self, ws: int) -> None:
        self.ws = ws
        self.tensors: list[torch.Tensor] = []
        self.pads = [self.keep(torch.zeros(PAD_WORDS, dtype=torch.int32)) for _ in range(ws)]

    def keep(self, t: torch.Tensor) -> torch.Tensor:
        self.tensors.append(t)
        return t

    def buffer(self, shape, seed: int, dtype=torch.float16):
        g = torch.Generator().manual_seed(seed)
        copies = [self.keep(torch.randn(shape, generator=g).to(dtype)) for _ in range(self.ws)]
        return SimpleNamespace(local=None, copies=copies, peer_ptrs=[t.data_ptr() for t in copies])

    def at(self, address: int, elems: int, dtype=torch.float16) -> torch.Tensor:
        """The `elems` elements at `address` of one of the tensors kept here."""
        for t in self.tensors:
            start = t.data_ptr()
            if start <= address < start + t.numel() * t.element_size():
                off = address - start
                assert off % t.element_size() == 0
                return t.view(-1)[off // t.element_size() : off // t.element_size() + elems].view(dtype)
        raise AssertionError(f"address {address:#x} is in none of the tensors")

    def context(self, rank: int):
        return SimpleNamespace(
            device=CPU,
            rank=rank,
            world_size=self.ws,
            signals=SimpleNamespace(local=self.pads[rank]),
            peer_signal_ptrs=torch.tensor([p.data_ptr() for p in self.pads]),
            counters=torch.zeros(4096, dtype=torch.int64),
            error=torch.zeros(1, dtype=torch.int32),
            cache={},
        )

    def snapshot(self) -> list[torch.Tensor]:
        return [t.clone() for t in self.tensors]

    def restore(self, saved: list[torch.Tensor]) -> None:
        for t, s in zip(self.tensors, saved):
            t.copy_(s)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8)


def _reference(world: _World, jobs: list[CopyJob], epoch: int) -> None:
    """What a copier must do with `jobs`, in Python: each job's elements copied, its signal raised."""
    for j in jobs:
        world.at(j.dst, j.elems).copy_(world.at(j.src, j.elems))
        if j.signal >= 0:
            world.pads[j.peer][j.signal] = epoch


def _run_both(world: _World, rank: int, jobs: list[CopyJob], epoch: int, programs: int) -> None:
    """The NVSHMEM copier (plain mode) against the reference, and the SM copier against it too."""
    for p in world.pads:
        p[ENTERED_BASE : ENTERED_BASE + world.ws] = epoch
    start = world.snapshot()
    _reference(world, jobs, epoch)
    expected = world.snapshot()
    pes = list(range(10, 10 + world.ws))  # PEs unlike the ranks: plain mode must not use them
    table = [j.nvshmem(rank, pes) for j in jobs]
    for runner in ("nvshmem", "sm_copy"):
        world.restore(start)
        ctx = world.context(rank)
        if runner == "nvshmem":
            launch_nvshmem_copy(
                ctx, None, table, programs, epoch, torch.float16, torch.tensor(pes, dtype=torch.int32)
            )
        else:
            launch_chunk_copy(ctx, None, [j.sm_copy() for j in jobs], programs, epoch, torch.float16)
        for i, (got, want) in enumerate(zip(world.snapshot(), expected)):
            assert torch.equal(_bytes(got), _bytes(want)), (runner, i)  # NaN poison compared bit for bit
        assert int(ctx.counters.abs().sum()) == 0 and int(ctx.error.item()) == 0, runner


def test_jobs_name_the_remote_side_by_its_local_symmetric_address_and_pe():
    buf = SimpleNamespace(peer_ptrs=[1000, 5000, 9000])
    push = CopyJob(40, 5000 + 64, 8, 3, 7, 1, 1, False, buf)
    assert push.nvshmem(0, [4, 5, 6]) == (40, 1000 + 64, 8, 4000, 3, 7, 1, 5, PUSH)
    pull = CopyJob(9000 + 16, 77, 8, 2, -1, 0, 2, True, buf)
    assert pull.nvshmem(0, [4, 5, 6]) == (1000 + 16, 77, 8, 8000, 2, -1, 0, 6, PULL)
    own = CopyJob(1000, 1200, 8, -1, 3, 0, 0, False, buf)
    assert own.nvshmem(0, [4, 5, 6]) == (1000, 1200, 8, 0, -1, 3, 0, 4, LOCAL)
    assert push.sm_copy() == (40, 5000 + 64, 8, 3, 7, 1)


@pytest.mark.parametrize(("template", "ws", "splits", "programs"), [("direct", 3, 2, 3), ("ring", 4, 1, 5)])
def test_the_copier_moves_an_all_reduce_jobs_pushes_and_pulls_as_the_reference(
    template, ws, splits, programs
):
    m, n, block_m, rank, epoch = 96 * ws + 40, 96, 32, 1, 5  # rows not a multiple of the blocks
    plan = plan_for("gemm_ar", template, ws, m, splits, block_m)
    world = _World(ws)
    recv = world.buffer((recv_rows(plan) + m, n), seed=1)
    reduced = world.buffer((m, n), seed=2)
    send = world.keep(torch.randn(m, n).to(torch.float16))
    out = world.keep(torch.full((m, n), float("nan"), dtype=torch.float16))
    for i in range(len(plan.sends(rank, "reduce"))):
        world.pads[rank][READY_BASE + i] = epoch
    for t in plan.recvs(rank, "gather"):
        world.pads[rank][t.signal] = epoch
    call = ScatterCall(
        ctx=world.context(rank),
        plan=plan,
        candidate=Candidate(backend="nvshmem", comm_sms=programs, template=template, num_splits=splits),
        epoch=epoch,
        main=None,
        send=send,
        recv=recv,
        n_cols=n,
        elem=2,
        out=out,
        reduced=reduced,
    )
    jobs = scatter_jobs(call)
    kinds = {j.nvshmem(rank, list(range(ws)))[-1] for j in jobs}
    assert kinds == {PUSH, PULL} and any(j.elems > 4096 and j.elems % 4096 for j in jobs)  # shared unevenly
    _run_both(world, rank, jobs, epoch, programs)


def test_the_copier_forwards_a_ring_all_gather_and_copies_within_the_rank_as_the_reference():
    ws, m, k, rank, epoch, programs = 4, 4 * 200, 72, 2, 9, 3
    plan = plan_for("ag_gemm", "ring", ws, m, 2, 32)
    world = _World(ws)
    a_full = world.buffer((m, k), seed=3)
    r0 = plan.chunk_bounds[rank][0][0]
    a_local = world.keep(torch.randn(plan.chunk_bounds[rank][-1][1] - r0, k).to(torch.float16))
    for t in plan.recvs(rank, "gather"):
        world.pads[rank][t.signal] = epoch  # forwarded chunks have arrived here
    call = GatherCall(
        ctx=world.context(rank),
        plan=plan,
        candidate=Candidate(backend="nvshmem", comm_sms=programs, template="ring", num_splits=2),
        epoch=epoch,
        main=None,
        a_local=a_local,
        a_full=a_full,
        r0=r0,
        row_bytes=k * 2,
    )
    jobs = gather_jobs(call)
    assert any(j.wait >= 0 for j in jobs) and any(j.wait < 0 for j in jobs)  # forwarded and own chunks
    scratch = world.keep(torch.zeros(5000, dtype=torch.float16))
    mine = a_full.peer_ptrs[rank]
    jobs += [  # within the rank: one into its own gathered buffer (signalled), one into plain memory
        CopyJob(a_local.data_ptr(), mine + 2 * k, 3 * k, -1, 40, rank, rank, False, a_full),
        CopyJob(mine, scratch.data_ptr(), 4999, -1, -1, rank),
    ]
    _run_both(world, rank, jobs, epoch, programs)


def test_a_bounded_wait_for_a_chunk_that_never_comes_reports_an_error():
    world = _World(2)
    ctx = world.context(0)
    for p in world.pads:
        p[ENTERED_BASE : ENTERED_BASE + 2] = 3
    src = world.keep(torch.ones(100, dtype=torch.float16))
    dst = world.buffer((100,), seed=4)
    job = CopyJob(src.data_ptr(), dst.peer_ptrs[1], 100, 17, 5, 1, 1, False, dst).nvshmem(0, [0, 1])
    launch_nvshmem_copy(ctx, None, [job], 2, 3, torch.float16, torch.tensor([0, 1], dtype=torch.int32), 50)
    assert int(ctx.error.item()) & 1  # the waited-for word named (`_timed_out`)
