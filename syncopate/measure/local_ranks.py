"""One process per local GPU, joined in an NCCL group: what `syncopate bench`, `syncopate
calibrate`, the two-GPU tests and `benchmarks/probe_faults.py` share.

`spawn_ranks(target, world, args, what)` starts `target(rank, world, port, *args, queue)` in a
spawned process per GPU (NVLink multicast off in all of them) and returns the first item a rank
puts on `queue`, failing as soon as a rank dies; each rank starts with `join_group(rank, world, port)`.
A process that torchrun started joins with `join_torchrun()` (`benchmarks/train_step.py`).
"""

from __future__ import annotations

import os
import random
import socket
from collections.abc import Callable
from queue import Empty
from typing import Any

from syncopate.platform import MULTICAST_OFF

__all__ = ["free_port", "join_group", "join_torchrun", "spawn_ranks"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now, below Linux's ephemeral range
    (32768-60999): a port the kernel handed out could be handed again, to another process's
    connection, before rank 0 listens on it, which then fails with EADDRINUSE."""
    rng = random.Random()
    for _ in range(64):
        port = rng.randrange(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def join_group(rank: int, world: int, port: int, shared_gpu: bool = False):
    """In a spawned rank: multicast off, this rank's GPU selected, the NCCL group formed; its device.

    With `shared_gpu` every rank runs on GPU 0 in a gloo group (NCCL takes one GPU a rank): the ops
    with transfers between processes on a one-GPU machine, for correctness, not speed.
    A rank runs the compiled kernels: TRITON_INTERPRET, inherited from a parent that interprets
    them on the CPU (a test process), is dropped before they are imported."""
    os.environ.update(MULTICAST_OFF)
    os.environ.pop("TRITON_INTERPRET", None)
    import torch
    import torch.distributed as dist

    index = 0 if shared_gpu else rank
    device = torch.device("cuda", index)
    torch.cuda.set_device(index)
    init = f"tcp://127.0.0.1:{port}"
    if shared_gpu:
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    else:
        dist.init_process_group("nccl", init_method=init, rank=rank, world_size=world, device_id=device)
    return device


def join_torchrun():
    """In a process torchrun started: multicast off, the GPU of its LOCAL_RANK selected, the NCCL
    group formed from torchrun's environment; its device."""
    os.environ.update(MULTICAST_OFF)
    import torch
    import torch.distributed as dist

    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    device = torch.device("cuda", local)
    dist.init_process_group("nccl", device_id=device)
    return device


def spawn_ranks(target: Callable[..., None], world: int, args: tuple = (), what: str = "rank") -> Any:
    """Run `target(rank, world, port, *args, queue)` on `world` spawned processes; the first item put
    on the queue, once every process has ended. A process that dies first raises RuntimeError
    naming `what` ("a benchmark process failed")."""
    import torch.multiprocessing as mp

    os.environ.update(MULTICAST_OFF)
    port = free_port()
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=target, args=(r, world, port, *args, results)) for r in range(world)]
    for p in procs:
        p.start()
    result = None
    try:
        while result is None:
            try:
                result = results.get(timeout=5)
            except Empty:
                if any(p.exitcode not in (None, 0) for p in procs):
                    raise RuntimeError(f"a {what} process failed; see its output above") from None
                if all(p.exitcode == 0 for p in procs) and results.empty():
                    raise RuntimeError(f"every {what} process ended without a result") from None
    except BaseException:  # a failure, Ctrl-C or SIGTERM: no rank may go on alone on its GPU
        for p in procs:
            if p.is_alive():
                p.kill()
        for p in procs:
            p.join(timeout=10)
        raise
    for p in procs:
        p.join()
    return result
