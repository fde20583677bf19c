"""Layer: CPU. The host side of a fused call's enqueue: stream programs (`streamops.Program`,
recorded once per prepared call and enqueued again with each call's epoch and tensors), a
context's signal writes recorded into them, the copy-engine backend's programs kept per prepared
call, and the launchers' environment reads."""

from __future__ import annotations

import ctypes
from types import SimpleNamespace

import pytest
import torch

from syncopate.kernels import backends, launch, streamops
from syncopate.kernels.context import OverlapContext
from syncopate.kernels.tables import ENTERED_BASE, plan_for
from syncopate.search_space import Candidate


class HostDriver:
    """The driver's three stream calls, made at once on host memory, and logged."""

    def __init__(self, fail: str | None = None) -> None:
        self.log: list[tuple] = []
        self.fail = fail

    def write(self, stream, address, value, flags):
        self.log.append(("write", stream, address, value))
        if self.fail == "write":
            return 700
        ctypes.c_uint32.from_address(address).value = value
        return 0

    def wait(self, stream, address, value, flags):
        self.log.append(("wait", stream, address, value))
        return 0

    def copy(self, dst, src, nbytes, stream):
        self.log.append(("copy", stream, dst, src, nbytes))
        ctypes.memmove(dst, src, nbytes)
        return 0


def stream(i: int):
    return SimpleNamespace(cuda_stream=i)


def test_a_program_enqueues_its_calls_in_order_with_each_runs_epoch_and_tensors(monkeypatch):
    driver = HostDriver()
    monkeypatch.setattr(streamops, "_driver", lambda: driver)
    pad = torch.zeros(8, dtype=torch.int32)
    dst = torch.zeros(16, dtype=torch.int32)
    p = streamops.Program()
    p.wait(stream(1), pad.data_ptr() + 4)
    p.copy(
        stream(1), dst.data_ptr() + 8 * 4, 4 * 4, 4 * 4, src_base=p.A
    )  # the caller's input, from its fifth word
    p.copy(
        stream(2), 0, 0, 4 * 4, dst_base=p.OUT, src_base=p.A
    )  # its first four words to the caller's output
    p.write(stream(1), pad.data_ptr())
    for epoch in (3, 2**32 + 5):  # an epoch is written as its low 32 bits, as the kernels compare it
        driver.log.clear()
        a = torch.arange(16, dtype=torch.int32) + epoch % 100
        out = torch.full((4,), -1, dtype=torch.int32)
        p.run(epoch, a.data_ptr(), out.data_ptr())
        value = epoch & 0xFFFFFFFF
        assert [op[0] for op in driver.log] == ["wait", "copy", "copy", "write"]
        assert driver.log[0] == ("wait", 1, pad.data_ptr() + 4, value)
        assert driver.log[1][2:] == (dst.data_ptr() + 32, a.data_ptr() + 16, 16)
        assert driver.log[3] == ("write", 1, pad.data_ptr(), value)
        assert torch.equal(dst[8:12], a[4:8]) and torch.equal(out, a[:4])
        assert int(pad[0]) == ctypes.c_int32(value).value


def test_a_failing_driver_call_is_reported_by_name(monkeypatch):
    monkeypatch.setattr(streamops, "_driver", lambda: HostDriver(fail="write"))
    pad = torch.zeros(2, dtype=torch.int32)
    p = streamops.Program()
    p.write(stream(0), pad.data_ptr())
    with pytest.raises(RuntimeError, match="cuStreamWriteValue32 failed with CUDA driver error 700"):
        p.run(1)


@pytest.mark.parametrize("remote_writes", [True, False])
def test_a_context_records_a_peers_signal_as_a_write_or_a_write_and_a_copy(remote_writes, monkeypatch):
    """Where a stream cannot write a peer's memory, the epoch goes into a local word of the stream's
    own and is copied from there."""
    driver = HostDriver()
    monkeypatch.setattr(streamops, "_driver", lambda: driver)
    pads = [torch.zeros(4, dtype=torch.int32) for _ in range(2)]
    streams = [stream(10), stream(11)]
    ctx = SimpleNamespace(
        rank=0,
        remote_writes=remote_writes,
        streams=streams,
        scratch=torch.zeros(4, dtype=torch.int32),
        signal_address=lambda r, word: pads[r].data_ptr() + 4 * word,
    )
    p = streamops.Program()
    OverlapContext.raise_signal(ctx, p, streams[1], 1, 2)
    OverlapContext.raise_signal(ctx, p, streams[1], 0, 3)
    p.run(7)
    assert int(pads[1][2]) == 7 and int(pads[0][3]) == 7
    kinds = [op[0] for op in driver.log]
    assert kinds == (["write", "write"] if remote_writes else ["write", "copy", "write"])
    if not remote_writes:
        assert driver.log[0][2] == ctx.scratch.data_ptr() + 4  # the second stream's word
        assert int(ctx.scratch[1]) == 7


@pytest.mark.parametrize("remote_writes", [True, False])
def test_a_contexts_signal_write_is_recorded_once_and_writes_each_calls_value(remote_writes, monkeypatch):
    """`write_signal` keeps the program it records per stream, rank and word: the second call with
    the same ones records nothing new and writes its own value; another word or stream records its
    own program."""
    driver = HostDriver()
    monkeypatch.setattr(streamops, "_driver", lambda: driver)
    pads = [torch.zeros(4, dtype=torch.int32) for _ in range(2)]
    streams = [stream(10), stream(11)]
    ctx = SimpleNamespace(
        rank=0,
        remote_writes=remote_writes,
        streams=streams,
        scratch=torch.zeros(4, dtype=torch.int32),
        signal_address=lambda r, word: pads[r].data_ptr() + 4 * word,
        _kept={},
    )
    ctx.raise_signal = lambda program, s, r, word: OverlapContext.raise_signal(ctx, program, s, r, word)
    for value in (5, 6):
        driver.log.clear()
        OverlapContext.write_signal(ctx, streams[1], 1, 2, value)
        assert int(pads[1][2]) == value
        assert [op[0] for op in driver.log] == (["write"] if remote_writes else ["write", "copy"])
    assert len(ctx._kept) == 1
    OverlapContext.write_signal(ctx, streams[0], 1, 2, 7)
    OverlapContext.write_signal(ctx, streams[1], 1, 3, 8)
    assert len(ctx._kept) == 3 and int(pads[1][2]) == 7 and int(pads[1][3]) == 8


def _gather_call(programs, a_local, rank=0, ws=2, template="direct", scale=None):
    """A copy-engine all-gather call of rank 0 whose addresses are made up (nothing is run);
    `scale`: an FP8 call's scale buffer."""
    plan = plan_for("ag_gemm", template, ws, 256, 2, 32)
    ctx = SimpleNamespace(
        rank=rank,
        world_size=ws,
        timeline=None,
        raise_signal=lambda program, s, r, word: program.write(s, 1000 * r + word),
        signal_address=lambda r, word: 1000 * r + word,
    )
    c = Candidate(backend="copy_engine", num_splits=2, block_m=32, block_n=64, block_k=32)
    buf = SimpleNamespace(peer_ptrs=[(r + 1) << 20 for r in range(ws)])
    return backends.GatherCall(
        ctx=ctx,
        plan=plan,
        candidate=c,
        epoch=0,
        main=None,
        a_local=a_local,
        a_full=buf,
        r0=0,
        row_bytes=64,
        copy_own=False,
        programs=programs,
        scale=scale,
    )


@pytest.mark.parametrize("template, ws", [("direct", 2), ("ring", 3), ("bidirectional_ring", 4)])
def test_an_fp8_gather_copies_each_transfers_scale_rows_before_its_rows_and_its_word(
    template, ws, monkeypatch
):
    """Each transfer's scale rows go from this rank's scale buffer (its own rows, or a forwarded
    chunk's, there since its word was waited for) to the same rows of the peer's, on the transfer's
    stream, before its rows; the word that says the chunk is there is raised after both."""
    log: list = []
    driver = SimpleNamespace(
        write=lambda s, address, value, flags: log.append(("write", s, address)) or 0,
        wait=lambda s, address, value, flags: log.append(("wait", s, address)) or 0,
        copy=lambda dst, src, n, s: log.append(("copy", s, dst, src, n)) or 0,
    )
    monkeypatch.setattr(streamops, "_driver", lambda: driver)
    scale = SimpleNamespace(peer_ptrs=[(r + 1) << 30 for r in range(ws)])
    call = _gather_call(
        {}, torch.zeros(256 // ws, 16, dtype=torch.int32), ws=ws, template=template, scale=scale
    )
    backends.BACKEND_IMPLS["copy_engine"].stage_gather(call, [stream(i) for i in range(3)])()
    sends = call.plan.sends(0, "gather")
    copies = [i for i, op in enumerate(log) if op[0] == "copy"]
    assert len(copies) == 2 * len(sends)
    for t, (i, j) in zip(sends, zip(copies[::2], copies[1::2]), strict=True):
        scales, rows = log[i], log[j]
        assert scales[1] == rows[1] == t.stream, "on the transfer's stream"
        assert scales[2:] == (
            scale.peer_ptrs[t.dst] + t.row_start * 4,
            scale.peer_ptrs[0] + t.row_start * 4,
            t.rows * 4,
        ), "the transfer's scale rows, from this rank's buffer to the same rows of the peer's"
        assert rows[2] == call.a_full.peer_ptrs[t.dst] + t.row_start * 64 and j == i + 1
        assert log[j + 1] == ("write", rows[1], 1000 * t.dst + t.signal), "the word after both"


def test_the_copy_engine_records_a_call_once_and_enqueues_it_with_each_calls_shard(monkeypatch):
    driver = SimpleNamespace(log=[])
    driver.write = lambda s, address, value, flags: driver.log.append(("write", s, address, value)) or 0
    driver.wait = lambda s, address, value, flags: driver.log.append(("wait", s, address, value)) or 0
    driver.copy = lambda dst, src, n, s: driver.log.append(("copy", s, dst, src, n)) or 0
    monkeypatch.setattr(streamops, "_driver", lambda: driver)
    streams = [stream(i) for i in range(3)]
    programs: dict = {}
    impl = backends.BACKEND_IMPLS["copy_engine"]
    logs, shards = [], []
    for epoch in (1, 2, 3):
        a_local = torch.zeros(128, 16, dtype=torch.int32)  # a new shard every call (all kept: new addresses)
        shards.append(a_local)
        call = _gather_call(programs, a_local)
        call.epoch = epoch
        driver.log.clear()
        impl.stage_gather(call, streams)()
        logs.append((a_local.data_ptr(), list(driver.log)))
        assert len(programs) == 1
    fresh = []
    for epoch, (ptr, log) in zip((1, 2, 3), logs, strict=True):
        assert {op[3] for op in log if op[0] in ("write", "wait")} == {epoch}
        copies = [op for op in log if op[0] == "copy"]
        assert copies and all(ptr <= op[3] < ptr + 128 * 64 for op in copies)  # from this call's shard
        # what recording the call anew enqueues
        driver.log.clear()
        call = _gather_call(None, SimpleNamespace(data_ptr=lambda ptr=ptr: ptr))
        call.epoch = epoch
        impl.start_gather(call, streams)
        fresh.append(list(driver.log))
    assert [log for _, log in logs] == fresh
    assert any(
        op[0] == "write" and op[2] == 1000 * 1 + ENTERED_BASE for op in fresh[0]
    )  # entry told to the peer


def test_the_launchers_settings_follow_the_environment(monkeypatch):
    """`launch.getenv` reads what os.environ holds now, and the relaunch key's settings (the
    interpreter flag, the Gluon kernels) change with it."""
    monkeypatch.delenv("SYNCOPATE_GLUON", raising=False)
    assert launch.getenv("SYNCOPATE_GLUON", "0") == "0"
    before = launch._settings()
    monkeypatch.setenv("SYNCOPATE_GLUON", "1")
    assert launch.getenv("SYNCOPATE_GLUON", "0") == "1"
    assert launch._settings() != before
    monkeypatch.setenv("SYNCOPATE_GLUON", "é1")
    assert launch.getenv("SYNCOPATE_GLUON") == "é1"
    monkeypatch.delenv("SYNCOPATE_GLUON")
    assert launch.getenv("SYNCOPATE_GLUON") is None and launch._settings() == before
    monkeypatch.setenv("TRITON_INTERPRET", "1" if before[0] != "1" else "0")
    assert launch._settings() != before


def test_with_the_timeline_on_each_copy_is_marked_between_its_waits_and_its_signal(monkeypatch):
    """`benchmarks/timeline.py`'s events: one where a chunk's copy can start (after its waits),
    one after its signal; a program recorded with the timeline on is kept apart from one without."""
    log: list = []
    driver = SimpleNamespace(
        write=lambda s, address, value, flags: log.append(("write", s)) or 0,
        wait=lambda s, address, value, flags: log.append(("wait", s)) or 0,
        copy=lambda dst, src, n, s: log.append(("copy", s)) or 0,
    )
    monkeypatch.setattr(streamops, "_driver", lambda: driver)

    class Timeline:
        def __init__(self) -> None:
            self.marks = []

        def record(self, s):
            log.append(("event", s.cuda_stream))
            return ("event", len(log))

        def mark(self, label, chunk, rows, ready, done):
            self.marks.append((label, chunk, rows, ready, done))

    programs: dict = {}
    streams = [stream(i) for i in range(3)]
    call = _gather_call(programs, torch.zeros(128, 16, dtype=torch.int32))
    call.ctx.timeline = timeline = Timeline()
    backends.BACKEND_IMPLS["copy_engine"].stage_gather(call, streams)()
    copies = [i for i, op in enumerate(log) if op[0] == "copy"]
    assert len(timeline.marks) == len(copies) == len(call.plan.sends(0, "gather"))
    for i in copies:
        s = log[i][1]
        assert log[i - 1] == ("event", s) and log[i + 1] == ("write", s) and log[i + 2] == ("event", s)
    assert all(ready is not None and done is not None for *_, ready, done in timeline.marks)
    call.ctx.timeline = None
    log.clear()
    backends.BACKEND_IMPLS["copy_engine"].stage_gather(call, streams)()
    assert len(programs) == 2 and not any(op[0] == "event" for op in log)


def test_a_relaunch_calls_the_launcher_directly_only_without_launch_hooks():
    """Triton's launch hooks (a profiler's) need the launch metadata its own run builds."""
    import triton.knobs

    assert launch._unhooked(None)
    chain = triton.knobs.HookChain()
    assert launch._unhooked(chain)
    chain.add(print)
    assert not launch._unhooked(chain)
    assert not launch._unhooked(print)


def test_writes_and_waits_in_a_row_on_a_stream_go_in_one_batch(monkeypatch):
    """Where the driver batches stream memory operations (`cuStreamBatchMemOp`), a program makes the
    same operations in the same order, with fewer calls; the batch entries carry each run's epoch."""
    assert ctypes.sizeof(streamops.MemOp) == 48  # CUstreamBatchMemOpParams
    p = streamops.Program()
    p.write(stream(0), 0x100)
    p.write(stream(0), 0x104)
    p.wait(stream(0), 0x200)  # three in a row on stream 0: one batch
    p.copy(stream(0), 0x1000, 0x2000, 64)
    p.write(stream(0), 0x108)  # alone between copies on its stream: a call of its own
    p.wait(stream(1), 0x204)  # another stream: not with the write before it
    p.copy(stream(1), 0x3000, 0x4000, 64)
    p.write(stream(1), 0x10C)
    p.wait(stream(1), 0x208)

    def flat(driver) -> list[tuple]:
        """Every operation the driver was asked for, batches unpacked."""
        out = []
        for call in driver.log:
            if call[0] == "batch":
                out.extend(call[2])
            else:
                out.append(call)
        return out

    class Plain(HostDriver):
        def write(self, stream, address, value, flags):
            self.log.append(("write", stream, address, value))
            return 0

        def copy(self, dst, src, nbytes, stream):
            self.log.append(("copy", stream, dst, src, nbytes))
            return 0

    class Batching(Plain):
        def mem_ops(self, stream, count, ops, flags):
            assert flags == 0 and count == len(ops)
            names = {streamops.MEM_OP_WRITE_VALUE_32: "write", streamops.MEM_OP_WAIT_VALUE_32: "wait"}
            self.log.append(
                ("batch", stream, [(names[m.operation], stream, m.address, m.value) for m in ops])
            )
            return 0

    plain, batched = Plain(), Batching()
    for epoch in (5, 6):
        for d in (plain, batched):
            d.log.clear()
            monkeypatch.setattr(streamops, "_driver", lambda d=d: d)
            p.run(epoch)
        assert flat(batched) == flat(plain) and len(flat(plain)) == 9
        assert [c[0] for c in batched.log] == ["batch", "copy", "write", "wait", "copy", "batch"]
        assert all(op[3] == epoch for op in flat(batched) if op[0] != "copy")


def test_a_relaunch_encodes_a_descriptor_once_an_address_and_keeps_no_tensor_it_passes_as_is():
    """`_Relaunch._encoded`: a TMA descriptor (with metadata) is encoded once per address, at most
    `ENCODED` kept; one the kernel takes as its tensor and sizes (no metadata) is made every call
    and never kept (it would hold the caller's tensor)."""
    made = []

    def encode(desc, meta):
        made.append((desc, meta))
        return [desc, meta]

    relaunch = launch._Relaunch.__new__(launch._Relaunch)
    relaunch.direct = SimpleNamespace(encoded={"b_desc": {}}, encode=encode)
    relaunch.describe = lambda t, box: ("descriptor", t.data_ptr(), tuple(box))
    relaunch.boxes = {"b_desc": [64, 32]}
    tensors = [torch.zeros(4) for _ in range(launch._Relaunch.ENCODED + 1)]
    first = relaunch._encoded("b_desc", tensors[0], "tma")
    assert relaunch._encoded("b_desc", tensors[0], "tma") is first and len(made) == 1
    for t in tensors[1:]:
        relaunch._encoded("b_desc", t, "tma")
    kept = relaunch.direct.encoded["b_desc"]
    assert len(kept) <= launch._Relaunch.ENCODED and tensors[-1].data_ptr() in kept
    made.clear()
    before = dict(kept)
    fresh = torch.zeros(4)
    plain = relaunch._encoded("b_desc", fresh, None)
    again = relaunch._encoded("b_desc", fresh, None)
    assert plain == again and len(made) == 2 and kept == before


def test_the_gathered_a_is_copied_out_once_every_chunk_is_in(monkeypatch):
    """`return_gathered`'s copy: this rank's rows from its shard at once, then a wait on each peer
    chunk's arrival word, then the peers' rows from the gathered buffer (one copy before the
    shard's rows, one after), with each call's epoch, shard and tensor; kept with the prepared
    call's programs."""
    driver = HostDriver()
    monkeypatch.setattr(streamops, "_driver", lambda: driver)
    programs: dict = {}
    ws, rows = 4, 256
    full = torch.arange(rows * 16, dtype=torch.int32).view(rows, 16)  # the gathered buffer: 64-byte rows
    for epoch in (4, 5):
        shard = torch.full((rows // ws, 16), -epoch, dtype=torch.int32)  # rank 1's rows [64, 128)
        call = _gather_call(programs, shard, rank=1, ws=ws)
        call.epoch, call.r0 = epoch, 64
        call.a_full = SimpleNamespace(peer_ptrs=[0, full.data_ptr(), 0, 0], local=full)
        driver.log.clear()
        gathered = torch.full_like(full, 7)
        backends.stage_gathered_copy(call, stream(2))(gathered)
        kinds = [op[0] for op in driver.log]
        waits = [op for op in driver.log if op[0] == "wait"]
        assert kinds == ["copy"] + ["wait"] * len(waits) + ["copy", "copy"] and {
            op[1] for op in driver.log
        } == {2}
        assert {op[3] for op in waits} == {epoch}
        assert {op[2] for op in waits} == {1000 + t.signal for t in call.plan.recvs(1, "gather")} and len(
            waits
        ) == 6
        assert driver.log[0][2:] == (gathered.data_ptr() + 64 * 64, shard.data_ptr(), 64 * 64)
        assert torch.equal(gathered[64:128], shard) and torch.equal(gathered[:64], full[:64])
        assert torch.equal(gathered[128:], full[128:])
    assert list(programs) == [("gathered",)]


def test_inside_watching_every_stream_wait_is_recorded_with_its_value(monkeypatch):
    """A bounded call (SYNCOPATE_SPIN_LIMIT) learns which words its streams wait for: the waits it
    enqueues directly and those its programs replay, batched or not, each with the call's value."""
    p = streamops.Program()
    p.write(stream(0), 0x100)
    p.wait(stream(0), 0x200)  # batched with the write where the driver batches
    p.copy(stream(0), 0x1000, 0x2000, 64)
    p.wait(stream(1), 0x204)

    class Plain(HostDriver):
        def write(self, stream, address, value, flags):
            return 0

        def copy(self, dst, src, nbytes, stream):
            return 0

    class Batching(Plain):
        def mem_ops(self, stream, count, ops, flags):
            return 0

    for driver in (Plain(), Batching()):
        monkeypatch.setattr(streamops, "_driver", lambda d=driver: d)
        p.run(3)  # not watched: nothing kept
        with streamops.watching() as outer:
            streamops.wait_value(5, 0x300, 2**32 + 7)
            with streamops.watching() as inner:
                p.run(2**32 + 8)
            assert inner == [(0x200, 8), (0x204, 8)]
        assert outer == [(0x300, 7), (0x200, 8), (0x204, 8)]  # an inner watch's waits are the outer's too
        with streamops.watching() as again:
            pass
        assert again == []
