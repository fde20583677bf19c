"""The host time a call of the public ops and of `syncopate.tp`'s layers costs over torch's own path
for the same work, the served configuration being `unfused` (torch's collective, then the matmul).

Operands are tiny, so that what is timed is the Python on a call's path rather than the work: a
round times `--calls` calls back to back (`--clock`: this thread's CPU time on the CPU, so that
other processes' load stays out; time.perf_counter on a GPU), the paths taking turns round after
round; each column is the median over rounds of µs a call, each difference the median of the
rounds' differences with its p20..p80. Columns: `bare`, torch's calls written out with nothing
else (the floor); `torch`, torch's unfused path as a job calls it (`syncopate.kernels.library.unfused`,
for a layer the same layer with impl="torch"); `ours`, the public op with its configuration looked
up (served `unfused`) or given, for a layer impl="fused".

On the CPU (the default where no GPU is visible) everything runs in this process: in torch's fake
process group of `--world` ranks (collectives that move nothing), or with `--group gloo` in a gloo
group of one rank (its collectives run, and the results are compared). The fused ops take CUDA
tensors only and look configurations up for a GPU topology, so here the first call of each shape
is made with the device check lifted and the topology given (`served_unfused`); the calls timed
are the ops' own later calls, unchanged. On a GPU (`--device cuda`): an NCCL group of one rank (or
`--group fake`), the GPU kept busy by a device sleep while a round's calls are enqueued (as
`syncopate.measure.timing` times a call's host time), so that the host never waits for it.

    python benchmarks/call_overhead.py                  # CPU, fake group of 2 ranks
    python benchmarks/call_overhead.py --group gloo     # CPU, gloo group of one rank
    python benchmarks/call_overhead.py --device cuda    # one GPU, NCCL group of one rank
    python benchmarks/call_overhead.py --profile FILE   # also where our calls' time goes (cProfile)
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import io
import pstats
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from unittest import mock

import torch
import torch.distributed as dist

from syncopate.kernels import ops
from syncopate.kernels.library import unfused
from syncopate.measure.local_ranks import free_port
from syncopate.search_space import Topology, Workload, unfused_candidate
from syncopate.tp import ColumnParallelLinear, RowParallelLinear

Path = Callable[[], object]
"""One call of a path, its operands bound."""

_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


@contextlib.contextmanager
def served_unfused(group, on_cpu: bool) -> Iterator[None]:
    """First calls made inside are served `unfused` by the configuration lookup (as a database
    holding it would); on the CPU, or in a fake group, with the group's topology given (detection
    needs GPUs, and a real group) and, on the CPU, the operands' device check lifted."""
    patches = [mock.patch.object(ops._REGISTRY, "config", lambda workload, group, mode: unfused_candidate())]
    if on_cpu or str(dist.get_backend(group)) == "fake":
        topology = Topology.from_key(f"H100x{dist.get_world_size(group)}-nvlink")
        patches.append(mock.patch.object(ops._REGISTRY, "topology", lambda group: topology))
    if on_cpu:
        patches.append(mock.patch.object(ops, "_check_devices", lambda a, b: None))
    with contextlib.ExitStack() as stack:
        for p in patches:
            stack.enter_context(p)
        yield


def op_cases(group, device: torch.device, dtype: torch.dtype, mnk: tuple[int, int, int]) -> list:
    """(name, bare, torch, ours) of each op: `bare` torch's calls written out, `torch` torch's
    unfused path (`library.unfused`), `ours` the public op (its configuration looked up)."""
    ws = dist.get_world_size(group)
    cases = []
    given = unfused_candidate()
    for kind in ("ag_gemm", "gemm_rs", "gemm_ar"):
        shapes = Workload(kind=kind, shape=mnk, dtype="fp32").local_shapes(ws)
        a = torch.randn(shapes["a"], device=device).to(dtype)
        b = torch.randn(shapes["b"], device=device).to(dtype)
        if kind == "ag_gemm":
            full_shape = (a.shape[0] * ws, a.shape[1])

            def bare(a=a, b=b):
                full = a.new_empty(full_shape)
                _ALL_GATHER(full, a, group=group)
                return full @ b

            def bare_gathered(a=a, b=b):
                full = a.new_empty(full_shape)
                _ALL_GATHER(full, a, group=group)
                return full @ b, full

            cases += [
                (
                    "all_gather_matmul",
                    bare,
                    lambda a=a, b=b: unfused("ag_gemm", a, b, group),
                    lambda a=a, b=b: ops.all_gather_matmul(a, b, group),
                ),
                (
                    "all_gather_matmul, config given",
                    bare,
                    lambda a=a, b=b: unfused("ag_gemm", a, b, group),
                    lambda a=a, b=b: ops.all_gather_matmul(a, b, group, given),
                ),
                (
                    "all_gather_matmul, return_gathered",
                    bare_gathered,
                    lambda a=a, b=b: unfused("ag_gemm", a, b, group, gathered=True),
                    lambda a=a, b=b: ops.all_gather_matmul(a, b, group, return_gathered=True),
                ),
            ]
        elif kind == "gemm_rs":
            out_shape = (a.shape[0] // ws, b.shape[1])

            def bare_rs(a=a, b=b):
                partial = a @ b
                out = partial.new_empty(out_shape)
                _REDUCE_SCATTER(out, partial, group=group)
                return out

            cases.append(
                (
                    "matmul_reduce_scatter",
                    bare_rs,
                    lambda a=a, b=b: unfused("gemm_rs", a, b, group),
                    lambda a=a, b=b: ops.matmul_reduce_scatter(a, b, group),
                )
            )
        else:

            def bare_ar(a=a, b=b):
                out = a @ b
                dist.all_reduce(out, group=group)
                return out

            cases.append(
                (
                    "matmul_all_reduce",
                    bare_ar,
                    lambda a=a, b=b: unfused("gemm_ar", a, b, group),
                    lambda a=a, b=b: ops.matmul_all_reduce(a, b, group),
                )
            )
    return cases


def layer_cases(group, device: torch.device, dtype: torch.dtype, mnk: tuple[int, int, int]) -> list:
    """(name, bare, torch, ours) of each layer: the same layer with impl="torch" and impl="fused";
    `bare` (no-grad forwards only) torch's collective and linear written out."""
    ws = dist.get_world_size(group)
    tokens, hidden, ffn = mnk
    cases = []

    def pair(cls, fin, fout, sp):
        made = []
        for impl in ("torch", "fused"):
            torch.manual_seed(0)
            made.append(cls(fin, fout, group, sequence_parallel=sp, impl=impl, device=device, dtype=dtype))
        return made

    def grad_step(layer, x, dy):
        def step():
            layer(x).backward(dy)

        return step

    def no_grad(layer, x):
        def forward():
            with torch.no_grad():
                return layer(x)

        return forward

    # column, sequence parallel: all_gather_matmul forward, matmul_reduce_scatter backward
    col_t, col_f = pair(ColumnParallelLinear, hidden, ffn, True)
    x = torch.randn(tokens // ws, hidden, device=device, dtype=dtype, requires_grad=True)
    dy = torch.randn(tokens, ffn // ws, device=device, dtype=dtype)
    full_shape = (tokens, hidden)

    def bare_col(x=x, w=col_t.weight, bias=col_t.bias):
        with torch.no_grad():
            full = x.new_empty(full_shape)
            _ALL_GATHER(full, x, group=group)
            return torch.nn.functional.linear(full, w, bias)

    cases.append(("ColumnParallelLinear, no grad", bare_col, no_grad(col_t, x), no_grad(col_f, x)))
    cases.append(("ColumnParallelLinear, fwd+bwd", None, grad_step(col_t, x, dy), grad_step(col_f, x, dy)))
    # row, sequence parallel: matmul_reduce_scatter forward, all_gather_matmul backward
    row_t, row_f = pair(RowParallelLinear, ffn, hidden, True)
    h = torch.randn(tokens, ffn // ws, device=device, dtype=dtype, requires_grad=True)
    dz = torch.randn(tokens // ws, hidden, device=device, dtype=dtype)
    out_shape = (tokens // ws, hidden)

    def bare_row(h=h, w=row_t.weight, bias=row_t.bias):
        with torch.no_grad():
            partial = h @ w.t()
            out = partial.new_empty(out_shape)
            _REDUCE_SCATTER(out, partial, group=group)
            return out.add_(bias)

    cases.append(("RowParallelLinear, no grad", bare_row, no_grad(row_t, h), no_grad(row_f, h)))
    cases.append(("RowParallelLinear, fwd+bwd", None, grad_step(row_t, h, dz), grad_step(row_f, h, dz)))
    # row, no sequence parallelism: matmul_all_reduce forward
    ar_t, ar_f = pair(RowParallelLinear, ffn, hidden, False)
    dr = torch.randn(tokens, hidden, device=device, dtype=dtype)
    cases.append(
        ("RowParallelLinear(sp=False), fwd+bwd", None, grad_step(ar_t, h, dr), grad_step(ar_f, h, dr))
    )
    # 3-D input ([s, b, h]): the output a view of the op's rows
    x3 = torch.randn(tokens // ws // 2, 2, hidden, device=device, dtype=dtype)
    cases.append(("ColumnParallelLinear 3-D, no grad", None, no_grad(col_t, x3), no_grad(col_f, x3)))
    cases += style_cases(group, device, dtype, mnk)
    return cases


def style_cases(group, device: torch.device, dtype: torch.dtype, mnk: tuple[int, int, int]) -> list:
    """(name, None, torch, ours) of an nn.Linear parallelized by `syncopate.tp`'s styles, forward
    only: the same style with impl="torch" and impl="fused" (on CPU tensors the ops' custom ops)."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import parallelize_module

    from syncopate.tp import ColwiseParallel, RowwiseParallel

    ws = dist.get_world_size(group)
    mesh = DeviceMesh(device.type, list(range(ws)))
    tokens, hidden, ffn = mnk
    cases = []
    for name, style, fin, fout in (
        ("ColwiseParallel, no grad", ColwiseParallel, hidden, ffn),
        ("RowwiseParallel, no grad", RowwiseParallel, ffn, hidden),
    ):
        made = []
        for impl in ("torch", "fused"):
            torch.manual_seed(0)
            linear = torch.nn.Linear(fin, fout, device=device, dtype=dtype)
            made.append(parallelize_module(linear, mesh, style(impl=impl)))
        x = torch.randn(tokens, fin // ws if style is RowwiseParallel else fin, device=device, dtype=dtype)

        def forward(linear, x=x):
            def call():
                with torch.no_grad():
                    return linear(x)

            return call

        cases.append((name, None, forward(made[0]), forward(made[1])))
    return cases


def check_results(cases: list, device: torch.device) -> None:
    """Ours gives what torch's path gives (in a group whose collectives run)."""
    for name, _, theirs, ours in cases:
        if "fwd+bwd" in name:
            continue
        want, got = theirs(), ours()
        want = want if isinstance(want, tuple) else (want,)
        got = got if isinstance(got, tuple) else (got,)
        for w, g in zip(want, got):
            if not torch.allclose(w.float(), g.float(), rtol=1e-3, atol=1e-3):
                raise SystemExit(f"call_overhead: {name}: ours differs from torch's path")


class Clock:
    """How a round is timed: `now` is this thread's CPU time (`thread`: what the calls cost on a
    machine whose cores other processes share too) or the wall clock (`wall`, time.perf_counter);
    on a GPU the device is kept busy before a round (a sleep sized to outlast its enqueueing) and
    synchronized after it."""

    def __init__(self, device: torch.device, clock: str) -> None:
        self.cuda = device.type == "cuda"
        self.now = time.thread_time if clock == "thread" else time.perf_counter
        self.sleep_cycles = 0

    def before(self) -> None:
        if self.cuda:
            torch.cuda._sleep(self.sleep_cycles)

    def after(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def size(self, round_us: float) -> None:
        """Keep the GPU busy for twice a round's host time (at clocks up to 2 GHz)."""
        self.sleep_cycles = int(2 * round_us * 2.0e3)


def time_paths(paths: list[Path], calls: int, rounds: int, clock: Clock) -> list[list[float]]:
    """µs a call of each path, one sample a round; the paths take turns, their order reversed
    every other round."""
    samples: list[list[float]] = [[] for _ in paths]
    order = list(range(len(paths)))
    for r in range(rounds):
        for i in order if r % 2 == 0 else order[::-1]:
            fn = paths[i]
            clock.before()
            t0 = clock.now()
            for _ in range(calls):
                fn()
            samples[i].append((clock.now() - t0) / calls * 1e6)
            clock.after()
    return samples


def quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def measure(cases: list, calls: int, rounds: int, clock: Clock) -> list[tuple]:
    rows = []
    for name, bare, theirs, ours in cases:
        paths = [p for p in (bare, theirs, ours) if p is not None]
        for fn in paths:  # warm-up: the first calls prepare (and, on a GPU, size the device sleep)
            for _ in range(3):
                fn()
            clock.after()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            clock.size(max(clock.sleep_cycles / 4.0e3, (time.perf_counter() - t0) * 1e6))
            clock.after()
        gc.collect()
        gc.disable()
        try:
            samples = time_paths(paths, calls, rounds, clock)
        finally:
            gc.enable()
        if bare is None:
            samples.insert(0, None)
        bare_s, torch_s, ours_s = samples
        diff = [o - t for o, t in zip(ours_s, torch_s)]
        over_bare = None if bare_s is None else statistics.median(o - b for o, b in zip(ours_s, bare_s))
        rows.append(
            (
                name,
                None if bare_s is None else statistics.median(bare_s),
                statistics.median(torch_s),
                statistics.median(ours_s),
                statistics.median(diff),
                quantile(diff, 0.2),
                quantile(diff, 0.8),
                over_bare,
            )
        )
    return rows


def table(rows: list[tuple]) -> str:
    def num(v):
        return "-" if v is None else f"{v:.2f}"

    head = f"{'case':<38} {'bare':>7} {'torch':>7} {'ours':>7} {'ours-torch':>11} {'p20..p80':>14} {'ours-bare':>10}"
    lines = [head, "-" * len(head)]
    for name, bare, theirs, ours, diff, lo, hi, over_bare in rows:
        lines.append(
            f"{name:<38} {num(bare):>7} {num(theirs):>7} {num(ours):>7} {diff:>+11.2f} "
            f"{f'{lo:+.2f}..{hi:+.2f}':>14} {'-' if over_bare is None else f'{over_bare:+.2f}':>10}"
        )
    return "\n".join(lines)


def profile(cases: list, calls: int, path: str) -> None:
    """Where our calls' host time goes: `calls` calls of each case under cProfile, into `path`."""
    with open(path, "w") as f:
        for name, _, _, ours in cases:
            profiler = cProfile.Profile()
            profiler.enable()
            for _ in range(calls):
                ours()
            profiler.disable()
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(15)
            f.write(f"== {name}: {calls} calls\n{text.getvalue()}\n")


def join(group_kind: str, device: torch.device, world: int):
    """The process group the calls run in (this process its rank 0)."""
    if group_kind == "fake":
        from torch.testing._internal.distributed.fake_pg import FakeStore

        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    else:
        dist.init_process_group(
            group_kind, init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
        )
    return dist.group.WORLD


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Host time of a call of the public ops and tp layers over torch's own path "
        "(served configuration: unfused), µs a call."
    )
    parser.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="where the operands live (default: cuda where a GPU is visible, else cpu)",
    )
    parser.add_argument(
        "--group",
        choices=["fake", "gloo", "nccl"],
        help="the process group: fake (torch's, collectives move nothing; the CPU's default), "
        "gloo (one rank), nccl (one rank, one GPU; the GPU's default)",
    )
    parser.add_argument("--world", type=int, default=2, help="ranks of the fake group (default 2)")
    parser.add_argument(
        "--calls",
        type=int,
        help="calls a round (default 200 on the CPU; 20 on a GPU, whose launch queue holds a round's "
        "kernels behind the device sleep)",
    )
    parser.add_argument("--rounds", type=int, default=31, help="rounds a path (default 31)")
    parser.add_argument(
        "--shape",
        default="64x64x64",
        metavar="MxNxK",
        help="global GEMM dims of the ops; for the layers tokens x hidden x ffn (default 64x64x64)",
    )
    parser.add_argument(
        "--clock",
        choices=["thread", "wall"],
        help="thread: this thread's CPU time (the CPU's default: other processes' load left out); "
        "wall: time.perf_counter (the GPU's default, and only choice there: the host's time to enqueue)",
    )
    parser.add_argument("--only", choices=["ops", "layers"], help="time only the ops or only the layers")
    parser.add_argument("--profile", metavar="FILE", help="also cProfile our calls, into FILE")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("call_overhead: --device cuda, but no CUDA GPU is visible", file=sys.stderr)
        return 1
    group_kind = args.group or ("nccl" if device.type == "cuda" else "fake")
    if group_kind == "nccl" and device.type != "cuda":
        print("call_overhead: --group nccl needs --device cuda", file=sys.stderr)
        return 2
    try:
        mnk = tuple(int(d) for d in args.shape.split("x"))
        if len(mnk) != 3 or min(mnk) < 1:
            raise ValueError
    except ValueError:
        print(f"call_overhead: --shape {args.shape!r}: give MxNxK, three positive integers", file=sys.stderr)
        return 2
    world = args.world if group_kind == "fake" else 1
    if world < 1 or any(d % world for d in mnk):
        print(
            f"call_overhead: --world {world}: give a count of ranks that divides {args.shape}",
            file=sys.stderr,
        )
        return 2
    calls = args.calls or (20 if device.type == "cuda" else 200)
    clock = "wall" if device.type == "cuda" else args.clock or "thread"
    if device.type == "cuda":
        torch.cuda.set_device(0)
        device = torch.device("cuda", 0)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if device.type == "cpu":
        # The work stays tiny and in this thread: one intra-op thread (no pool waking on a busy
        # machine), and no denormals (a fake group's gathered rows are uninitialised memory).
        torch.set_num_threads(1)
        torch.set_flush_denormal(True)
    group = join(group_kind, device, world)
    try:
        cases = []
        with served_unfused(group, device.type == "cpu"):
            if args.only != "layers":
                cases += op_cases(group, device, dtype, mnk)
            if args.only != "ops":
                cases += layer_cases(group, device, dtype, mnk)
            for _, _, theirs, ours in cases:  # first calls: prepared (and checked) here
                theirs()
                ours()
        if group_kind != "fake":
            check_results(cases, device)
        rows = measure(cases, calls, args.rounds, Clock(device, clock))
        where = f"{device.type}, {group_kind} group of {world} rank{'s' if world > 1 else ''}, {dtype}, {clock} clock"
        print(
            f"call_overhead: µs a call ({where}; {args.rounds} rounds of {calls} calls; shape {args.shape})"
        )
        print(table(rows))
        if args.profile:
            profile(cases, calls * 10, args.profile)
            print(f"call_overhead: cProfile of our calls written to {args.profile}")
        ops.close_contexts()
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
