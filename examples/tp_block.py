"""A pre-norm transformer block (attention and a SwiGLU MLP) under tensor and sequence parallelism
on `syncopate.tp`, trained a few steps, each step's loss and gradients checked against the whole
block run on one rank.

    torchrun --nproc-per-node 2 examples/tp_block.py              # GPUs, Syncopate's fused ops
    torchrun --nproc-per-node 2 examples/tp_block.py --impl torch # GPUs, torch's collectives
    python examples/tp_block.py --cpu --world 2                   # CPU processes, gloo, torch's collectives

Every rank holds its block of the sequence between the layers (sequence parallelism): the QKV and
gate/up column layers gather it as their GEMMs consume it, the output and down row layers
reduce-scatter back to it, and the norms' gradients are summed over the group after the backward.
Each rank keeps its share of the heads and of the MLP's hidden features.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from syncopate.tp import ColumnParallelLinear, RowParallelLinear, sync_sequence_parallel_grads  # noqa: E402


class Block(torch.nn.Module):
    """The whole block, as a single GPU runs it: x [s, b, h] → x + attn(norm(x)) → … + mlp(norm(…))."""

    def __init__(self, hidden: int, heads: int, ffn: int, dtype=None, device=None) -> None:
        super().__init__()
        kw = {"dtype": dtype, "device": device}
        self.heads = heads
        self.norm1 = torch.nn.LayerNorm(hidden, **kw)
        self.q, self.k, self.v = (torch.nn.Linear(hidden, hidden, bias=False, **kw) for _ in range(3))
        self.o = torch.nn.Linear(hidden, hidden, bias=False, **kw)
        self.norm2 = torch.nn.LayerNorm(hidden, **kw)
        self.gate, self.up = (torch.nn.Linear(hidden, ffn, bias=False, **kw) for _ in range(2))
        self.down = torch.nn.Linear(ffn, hidden, bias=False, **kw)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.o(attention(self.q(h), self.k(h), self.v(h), self.heads))
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int) -> torch.Tensor:
    """Causal attention over dimension 0 (the sequence) of [s, b, heads·d] tensors."""
    s, b, width = q.shape

    def split(t):
        return t.view(s, b, heads, width // heads).permute(1, 2, 0, 3)  # [b, heads, s, d]

    out = F.scaled_dot_product_attention(split(q), split(k), split(v), is_causal=True)
    return out.permute(2, 0, 1, 3).reshape(s, b, width)


class ParallelBlock(torch.nn.Module):
    """`Block` split over `group`: this rank's heads and hidden features, its block of the sequence."""

    def __init__(self, whole: Block, group=None, impl: str = "fused") -> None:
        super().__init__()
        ws = dist.get_world_size(group)
        if whole.heads % ws:
            raise ValueError(f"{whole.heads} heads are not divisible by the group's size {ws}")
        self.group, self.heads = group, whole.heads // ws
        self.norm1, self.norm2 = copy.deepcopy(whole.norm1), copy.deepcopy(whole.norm2)
        self.qkv = ColumnParallelLinear.from_linear([whole.q, whole.k, whole.v], group, impl=impl)
        self.o = RowParallelLinear.from_linear(whole.o, group, impl=impl)
        self.gate_up = ColumnParallelLinear.from_linear([whole.gate, whole.up], group, impl=impl)
        self.down = RowParallelLinear.from_linear(whole.down, group, impl=impl)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [s/ws, b, h], this rank's block
        q, k, v = self.qkv(self.norm1(x)).split(self.qkv.parts, -1)  # [s, b, h/ws] each: gathered
        x = x + self.o(attention(q, k, v, self.heads))  # reduce-scattered back to [s/ws, b, h]
        gate, up = self.gate_up(self.norm2(x)).split(self.gate_up.parts, -1)
        return x + self.down(F.silu(gate) * up)

    def sync_grads(self) -> None:
        """Sum the norms' gradients over the group (each rank's cover its block of the sequence)."""
        sync_sequence_parallel_grads([*self.norm1.parameters(), *self.norm2.parameters()], self.group)


def run(args, rank: int, world: int, device: torch.device) -> list[str]:
    """Train the split block `args.steps` steps beside the whole one; the lines it reports."""
    dtype = torch.float64 if device.type == "cpu" else torch.bfloat16
    torch.manual_seed(0)  # the same whole block and data on every rank
    whole = Block(args.hidden, args.heads, args.ffn, dtype=dtype, device=device)
    split = ParallelBlock(whole, impl=args.impl)
    opt_whole = torch.optim.SGD(whole.parameters(), lr=args.lr)
    opt_split = torch.optim.SGD(split.parameters(), lr=args.lr)
    s = args.seq
    rows = slice(rank * s // world, (rank + 1) * s // world)
    lines = []
    for step in range(args.steps):
        x = torch.randn(s, args.batch, args.hidden, dtype=dtype, device=device)
        target = torch.randn_like(x)
        for opt in (opt_whole, opt_split):
            opt.zero_grad(set_to_none=True)
        count = (
            x.numel()
        )  # each rank's loss a sum over its rows, over the whole's count: they add up to the mean
        loss_whole = F.mse_loss(whole(x).double(), target.double(), reduction="sum") / count
        loss_whole.backward()
        loss_mine = F.mse_loss(split(x[rows]).double(), target[rows].double(), reduction="sum") / count
        loss_mine.backward()
        split.sync_grads()
        loss_split = loss_mine.detach().clone()
        dist.all_reduce(loss_split, group=split.group)  # the sequence's blocks' losses, summed
        # The split block's weights are this rank's rows (column layers) or columns (row layers).
        n = args.ffn // world
        pairs = {
            "norm1": (split.norm1.weight.grad, whole.norm1.weight.grad),
            "down": (split.down.weight.grad, whole.down.weight.grad[:, rank * n : (rank + 1) * n]),
            "gate": (split.gate_up.weight.grad[:n], whole.gate.weight.grad[rank * n : (rank + 1) * n]),
        }
        worst = max(_rel(got, want) for got, want in pairs.values())
        lines.append(
            f"step {step}: loss {loss_whole.item():.6g} whole, {loss_split.item():.6g} split "
            f"(relative difference {abs(loss_split.item() / loss_whole.item() - 1):.3g}); "
            f"gradients' largest relative difference {worst:.3g}"
        )
        opt_whole.step()
        opt_split.step()
    return lines


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want.double()).norm() / want.double().norm().clamp_min(1e-30))


def _cpu_rank(rank: int, world: int, init: str, args, queue) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        lines = run(args, rank, world, torch.device("cpu"))
        if rank == 0:
            queue.put(lines)
        dist.barrier()  # no rank tears its connections down while a peer still uses them
    finally:
        dist.destroy_process_group()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--impl", default="fused", choices=("fused", "torch", "async_tp"))
    p.add_argument("--cpu", action="store_true", help="CPU processes in a gloo group (impl torch)")
    p.add_argument("--world", type=int, default=2, help="with --cpu: processes to start")
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--ffn", type=int, default=4096)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--lr", type=float, default=0.1)
    args = p.parse_args(argv)
    if args.cpu:
        import tempfile

        import torch.multiprocessing as mp

        args.impl = "torch"
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        with tempfile.TemporaryDirectory() as d:
            procs = [
                ctx.Process(target=_cpu_rank, args=(r, args.world, f"file://{d}/rdzv", args, queue))
                for r in range(args.world)
            ]
            for proc in procs:
                proc.start()
            for proc in procs:
                proc.join()
        if any(proc.exitcode for proc in procs):
            print("a rank failed; see its output above", file=sys.stderr)
            return 1
        print("\n".join(queue.get()))
        return 0
    if "RANK" not in os.environ or not torch.cuda.is_available():
        p.error(
            "run it under torchrun on GPUs (torchrun --nproc-per-node N examples/tp_block.py), or on CPU "
            "processes with --cpu --world N"
        )
    from syncopate.workers.env import MULTICAST_OFF

    for key, value in MULTICAST_OFF.items():  # NVLink multicast off, unless the launcher says otherwise
        os.environ.setdefault(key, value)
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    lines = run(args, dist.get_rank(), dist.get_world_size(), torch.device("cuda", local))
    if dist.get_rank() == 0:
        print("\n".join(lines))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
