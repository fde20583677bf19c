"""Run a test's worker on CPU processes joined by a gloo rendezvous, failing fast.

`run_gloo(worker, ws, items)` starts `worker(rank, ws, init, queue)` on `ws` new processes (`init`
a file:// rendezvous the worker passes to `init_process_group`) and returns the first `items`
things the workers put on the queue. A process that ends without its share fails the test at once,
with the exit codes, rather than when a queue read times out.

The processes come from a fork server that has imported torch once (the `forkserver` start method,
torch preloaded), not each from a fresh interpreter: importing torch is most of what starting a rank
costs, and the suite starts dozens of ranks. Each rank is still a process of its own that imports
the worker's module and shares nothing with the test's process but what it is passed. The worker
runs in the environment and folder the test has when it starts the rank, as in a spawned one; the
imports before it see the environment of when the server started (the first ranks of the session).
"""

from __future__ import annotations

import os
import tempfile
import time
from queue import Empty

PRELOAD = ["torch", "torch.distributed"]
"""What the fork server imports once for every rank it starts."""


def context():
    """The `forkserver` multiprocessing context, its server preloading torch."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def in_environment(environ: dict[str, str], cwd: str, target, *args) -> None:
    """Run `target(*args)` with the environment and folder of the process that started this one
    (a forked rank otherwise has the fork server's, those of when the server started)."""
    os.environ.clear()
    os.environ.update(environ)
    os.chdir(cwd)
    target(*args)


def start(ctx, target, args: tuple):
    """A started process of `ctx` that runs `target(*args)` as `in_environment` says."""
    p = ctx.Process(target=in_environment, args=(dict(os.environ), os.getcwd(), target, *args))
    p.start()
    return p


def run_gloo(worker, ws: int, items: int | None = None, timeout: float = 180) -> list:
    items = ws if items is None else items
    ctx = context()
    queue = ctx.Queue()
    got: list = []
    with tempfile.TemporaryDirectory() as d:
        init = "file://" + os.path.join(d, "rendezvous")
        procs = [start(ctx, worker, (r, ws, init, queue)) for r in range(ws)]
        deadline = time.monotonic() + timeout
        try:
            while len(got) < items:
                try:
                    got.append(queue.get(timeout=2))
                except Empty:
                    dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                    assert not dead, (
                        f"rank processes ended with exit codes {dead} after {len(got)} of {items} results"
                    )
                    assert time.monotonic() < deadline, f"{len(got)} of {items} results after {timeout:.0f} s"
        finally:
            for p in procs:
                p.join(timeout=60)
                if p.is_alive():
                    p.kill()
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    return got
