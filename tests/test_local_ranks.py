"""Layer: CPU processes. `spawn_ranks` (one process per GPU for `syncopate bench` and
`calibrate`) never leaves a rank running alone: a rank that fails, ranks that end without a result,
and Ctrl-C or SIGTERM of the parent each end every rank, and the parent says what happened."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from support import rank_targets
from support.signals import default_stops

from syncopate.measure.local_ranks import spawn_ranks

pytestmark = pytest.mark.timeout(180)

REPO = Path(__file__).resolve().parents[1]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _pids(folder: Path, world: int, timeout: float = 60.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = sorted(folder.glob("rank*.pid"))
        if len(found) == world and all(p.read_text() for p in found):
            return [int(p.read_text()) for p in found]
        time.sleep(0.1)
    raise AssertionError(f"ranks did not start: {sorted(p.name for p in folder.iterdir())}")


def test_a_failed_rank_ends_the_others(tmp_path):
    with pytest.raises(RuntimeError, match="a test process failed"):
        spawn_ranks(rank_targets.one_fails, 3, (str(tmp_path),), "test")
    assert not any(_alive(pid) for pid in _pids(tmp_path, 3))


def test_ranks_that_end_without_a_result(tmp_path):
    with pytest.raises(RuntimeError, match="every test process ended without a result"):
        spawn_ranks(rank_targets.silent, 2, (str(tmp_path),), "test")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_stopped_parent_ends_every_rank(tmp_path, signum):
    script = textwrap.dedent(f"""
        import signal, sys
        sys.path.insert(0, {str(REPO / "tests")!r})
        from syncopate.errors import Terminated
        from syncopate.measure.local_ranks import spawn_ranks
        from support import rank_targets

        def stop(signum, frame):
            raise Terminated()

        signal.signal(signal.SIGTERM, stop)
        try:
            spawn_ranks(rank_targets.sleeper, 2, ({str(tmp_path)!r},), "test")
        except KeyboardInterrupt:
            sys.exit(130)
    """)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH")))),
    }
    parent = subprocess.Popen(
        [sys.executable, "-c", script], env=env, start_new_session=True, preexec_fn=default_stops
    )
    try:
        ranks = _pids(tmp_path, 2)
        parent.send_signal(signum)
        assert parent.wait(timeout=30) == 130
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(_alive(pid) for pid in ranks):
            time.sleep(0.1)
        assert not any(_alive(pid) for pid in ranks)
    finally:
        try:
            os.killpg(parent.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_the_group_port_is_free_and_outside_the_ephemeral_range():
    """The port the ranks meet on is taken below Linux's ephemeral ports, which the kernel may hand
    to another process's connection before rank 0 listens; one already listened on is skipped."""
    import socket

    from syncopate.measure.local_ranks import free_port

    ports = {free_port() for _ in range(20)}
    assert all(20000 <= p < 32000 for p in ports), ports
    with socket.socket() as held:
        held.bind(("127.0.0.1", min(ports)))
        held.listen()
        for _ in range(50):
            p = free_port()
            assert p != min(ports)
            with socket.socket() as s:
                s.bind(("127.0.0.1", p))


def test_a_torchrun_process_joins_on_its_local_gpu_with_multicast_off(monkeypatch):
    """`join_torchrun` (the torchrun benchmarks): LOCAL_RANK's GPU selected, the NCCL group formed
    from torchrun's environment on that device, and NVLink multicast off even where the environment
    had turned it on."""
    import torch
    import torch.distributed as dist

    from syncopate.measure.local_ranks import join_torchrun
    from syncopate.workers.env import MULTICAST_OFF

    calls = []
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    for var in MULTICAST_OFF:
        monkeypatch.setenv(var, os.environ.get(var, ""))  # restored after the test
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: calls.append(("set_device", index)))
    monkeypatch.setattr(
        dist, "init_process_group", lambda backend, device_id: calls.append((backend, device_id))
    )
    device = join_torchrun()
    assert device == torch.device("cuda", 3)
    assert calls == [("set_device", 3), ("nccl", torch.device("cuda", 3))]
    assert {var: os.environ[var] for var in MULTICAST_OFF} == MULTICAST_OFF
