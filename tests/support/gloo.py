"""Run a test's worker on CPU processes joined by a gloo rendezvous, failing fast.

`run_gloo(worker, ws, items)` starts `worker(rank, ws, init, queue)` on `ws` spawned processes
(`init` a file:// rendezvous the worker passes to `init_process_group`) and returns the first
`items` things the workers put on the queue. A process that ends without its share fails the test
at once, with the exit codes, rather than when a queue read times out."""

from __future__ import annotations

import os
import tempfile
import time
from queue import Empty


def run_gloo(worker, ws: int, items: int | None = None, timeout: float = 180) -> list:
    import torch.multiprocessing as mp

    items = ws if items is None else items
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    got: list = []
    with tempfile.TemporaryDirectory() as d:
        init = "file://" + os.path.join(d, "rendezvous")
        procs = [ctx.Process(target=worker, args=(r, ws, init, queue)) for r in range(ws)]
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout
        try:
            while len(got) < items:
                try:
                    got.append(queue.get(timeout=2))
                except Empty:
                    dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                    assert not dead, f"rank processes ended with exit codes {dead} after {len(got)} of {items} results"
                    assert time.monotonic() < deadline, f"{len(got)} of {items} results after {timeout:.0f} s"
        finally:
            for p in procs:
                p.join(timeout=60)
                if p.is_alive():
                    p.kill()
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    return got
