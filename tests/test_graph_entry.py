"""Layer: kernels on the CPU (TRITON_INTERPRET=1). The start of a call captured in a CUDA graph
(`graph_entry_kernel`): every rank's pad cleared below MEET_BASE, with the group met before and
after, in processes that share their pads (CPU tensors in shared memory), as ranks share theirs.

Each rank runs rounds like a captured call's: the entry, then a word of this round raised in every
pad (an announcement), then a wait for every peer's word of the round in its own pad. After the
entry every word of the round before must read 0 — cleared, and no peer's late write landing after
the clearing — and the meeting words must be back at 0 at the end.
"""

from __future__ import annotations

import functools
import os
import sys
import time

import pytest
import torch
import triton
from support.gloo import run_gloo

from syncopate.kernels.tables import MEET_BASE, PAD_WORDS
from syncopate.kernels.triton_kernels import graph_entry_kernel

pytestmark = pytest.mark.timeout(300)

ROUNDS = 5
JUNK = 700
"""A word each rank fills with junk after each round, as a call's own signals would be left."""


def _enter(pad: torch.Tensor, peers: torch.Tensor, rank: int, world: int) -> None:
    graph_entry_kernel[(1,)](
        pad,
        peers,
        rank,
        MEET_BASE,
        WORLD=world,
        CLEAR=MEET_BASE,
        BLOCK=1024,
        LANES=triton.next_power_of_2(world),
    )


def _rank(pads, rank, world, init, queue):
    os.environ["TRITON_INTERPRET"] = "1"
    peers = torch.tensor([p.data_ptr() for p in pads], dtype=torch.int64)  # this process's mappings
    mine = pads[rank]
    problems = []
    for i in range(ROUNDS):
        _enter(mine, peers, rank, world)
        stale = {w: int(mine[w]) for w in [*range(2 * world), JUNK + rank] if int(mine[w]) not in (0, i + 1)}
        if stale:
            problems.append(f"round {i}: rank {rank}'s pad after the entry holds {stale}")
        for q in range(world):
            pads[q][(i % 2) * world + rank] = i + 1
        deadline = time.monotonic() + 20
        while any(int(mine[(i % 2) * world + q]) != i + 1 for q in range(world)):
            if time.monotonic() > deadline:  # a word cleared after its peer raised it: the others wait in
                print(
                    f"round {i}: rank {rank} never saw every peer's word "  # a meeting for good
                    f"{mine[(i % 2) * world : (i % 2 + 1) * world].tolist()}",
                    file=sys.stderr,
                    flush=True,
                )
                os._exit(1)
            time.sleep(0.001)
        mine[JUNK + rank] = 12345
    meet = mine[MEET_BASE : PAD_WORDS - 1].tolist()
    if any(meet):
        problems.append(f"rank {rank}'s meeting words not lowered: {[w for w, v in enumerate(meet) if v]}")
    queue.put((rank, problems))


@pytest.mark.parametrize("world", [2, 3])
def test_a_captured_calls_entry_clears_every_pad_between_two_meetings(world):
    pads = [torch.zeros(PAD_WORDS, dtype=torch.int32).share_memory_() for _ in range(world)]
    for r, pad in enumerate(pads):  # what a previous call outside the graph left: its epochs
        pad[:MEET_BASE] = 1000 + r
    results = run_gloo(functools.partial(_rank, pads), world, timeout=240)
    problems = [p for _, ps in sorted(results) for p in ps]
    assert not problems, "\n".join(problems)
    for pad in pads:
        assert int(pad[PAD_WORDS - 1]) == 0


def test_a_group_of_one_is_only_cleared():
    pad = torch.arange(PAD_WORDS, dtype=torch.int32)
    pad[MEET_BASE:] = 0
    pad[PAD_WORDS - 1] = 9
    _enter(pad, torch.tensor([pad.data_ptr()], dtype=torch.int64), 0, 1)
    assert not pad[:MEET_BASE].any()
    assert int(pad[PAD_WORDS - 1]) == 9  # the spare word is not the entry's
