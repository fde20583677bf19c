"""Candidates of one workload timed in turn, round after round, in the same processes: for telling
apart variants a few microseconds apart, which separate `syncopate bench` runs cannot (the same
candidate's median moves between runs by more than the differences looked for).

    python benchmarks/side_by_side.py gemm_ar 8192 4096 11008 decomposed:4 decomposed:2 \
        "decomposed:4 SYNCOPATE_SOME_SWITCH=1" [--rounds 8] [--gpus 2] [--repetitions 10]

A variant is `TEMPLATE[:SPLITS]` (a_stationary, c_stationary, decomposed, or a fused template with
the default tile `128x256x64w8s3` and `arrival` order) and environment settings for it alone, set
before each of its calls and taken away after (switches read at call time; one read at import
takes the first variant's). One process per GPU; each variant is checked against float32 once
(output poisoned first), then each round times every variant in turn by the project's method
(measure/timing.py: warm-up, L2 flush, ranks started together, events, max over ranks, median of
the repetitions). Printed: each variant's median and least over the rounds, the GEMM alone timed
the same way, the median host time to enqueue one call (the device sleep before each timed call,
`--sleep-us`, is at least twice a warm-up call's), and every round's figure.
"""

from __future__ import annotations

import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def parse_variant(text: str) -> tuple[str, int, dict[str, str]]:
    """`TEMPLATE[:SPLITS] [NAME=VALUE ...]` -> (template, splits, env)."""
    head, *settings = text.split()
    template, _, splits = head.partition(":")
    env = {}
    for s in settings:
        name, eq, value = s.partition("=")
        if not eq or not name:
            raise ValueError(f"variant {text!r}: {s!r} is not NAME=VALUE")
        env[name] = value
    try:
        count = int(splits) if splits else 2
    except ValueError:
        raise ValueError(f"variant {text!r}: splits {splits!r} is not a whole number") from None
    return template, count, env


def _candidate(kind: str, template: str, splits: int):
    from types import SimpleNamespace

    from benchmarks.timeline import candidate

    return candidate(
        SimpleNamespace(
            kind=kind, template=template, splits=splits, tile="128x256x64w8s3", order="arrival", group_m=8
        )
    )


def worker(rank: int, world: int, port: int, args, queue) -> None:
    from syncopate.measure.local_ranks import join_group

    dev = join_group(rank, world, port)
    import torch
    import torch.distributed as dist

    from benchmarks.timeline import workload_operands
    from syncopate.kernels import ops
    from syncopate.measure.reference import reference, relative_error
    from syncopate.measure.timing import time_collective

    torch.manual_seed(rank)
    fused, a, b, out = workload_operands(args, world, dev)
    g = dist.group.WORLD
    variants = []
    for text in args.variants:
        template, splits, env = parse_variant(text)
        variants.append((text, _candidate(args.kind, template, splits), env))
    switches = {name for *_, env in variants for name in env}
    saved = {name: os.environ.get(name) for name in switches}

    def with_env(env, fn):
        os.environ.update(env)
        try:
            return fn()
        finally:
            for name in env:
                if saved[name] is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = saved[name]

    ref = reference(args.kind, a, b, g)
    errors, times, hosts = {}, {text: [] for text, *_ in variants}, {text: [] for text, *_ in variants}
    for text, c, env in variants:

        def check(c=c):
            fused(a, b, g, c, out=out)
            out.fill_(float("nan"))
            fused(a, b, g, c, out=out)
            torch.cuda.synchronize()
            return relative_error(out, ref)

        errors[text] = with_env(env, check)
    for _ in range(args.rounds):
        for text, c, env in variants:
            t = with_env(
                env,
                lambda c=c: time_collective(
                    lambda: fused(a, b, g, c, out=out),
                    g,
                    warmup=3,
                    repetitions=args.repetitions,
                    sleep_us=args.sleep_us,
                ),
            )
            times[text].append(statistics.median(t.samples_us))
            hosts[text].append(t.host_us)
    gemm = time_collective(lambda: torch.matmul(a, b), g, warmup=3, repetitions=2 * args.repetitions)
    if rank == 0:
        queue.put((times, errors, hosts, statistics.median(gemm.samples_us)))
    ops.close_contexts()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    from benchmarks.timeline import workload_parser

    p = workload_parser(__doc__.splitlines()[0])
    p.add_argument("variants", nargs="+", help="TEMPLATE[:SPLITS] [NAME=VALUE ...], quoted")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--repetitions", type=int, default=10)
    p.add_argument("--gpus", type=int, default=2)
    p.add_argument(
        "--sleep-us",
        type=float,
        default=1500.0,
        help="least device sleep queued before each timed call (default 1500; at least twice a warm-up call's enqueue)",
    )
    args = p.parse_args(argv)
    try:
        for text in args.variants:
            template, splits, _ = parse_variant(text)
            _candidate(args.kind, template, splits)
    except ValueError as e:
        print(f"side_by_side.py: {e}", file=sys.stderr)
        return 2
    import torch
    import torch.multiprocessing as mp

    from syncopate.measure.local_ranks import free_port

    if torch.cuda.device_count() < args.gpus:
        print(
            f"side_by_side.py: {args.gpus} GPUs asked for, {torch.cuda.device_count()} present",
            file=sys.stderr,
        )
        return 2
    for name, value in {
        "NCCL_NVLS_ENABLE": "0",
        "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
        "NVSHMEM_DISABLE_NVLS": "1",
    }.items():
        os.environ.setdefault(name, value)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    mp.start_processes(
        worker, args=(args.gpus, free_port(), args, queue), nprocs=args.gpus, start_method="spawn"
    )
    times, errors, hosts, gemm = queue.get(timeout=10)
    print(
        f"{args.kind} {args.m}x{args.n}x{args.k} bf16 on {args.gpus} GPUs, {args.rounds} rounds; "
        f"GEMM alone {gemm:.1f} µs (0.90 of it: {gemm / 0.9:.1f})"
    )
    print(
        f"{'variant':44s} {'median':>8s} {'least':>8s} {'GEMM/med':>8s} {'rel.err':>9s} {'host':>7s}  rounds"
    )
    for text, xs in times.items():
        med = statistics.median(xs)
        print(
            f"{text:44s} {med:8.1f} {min(xs):8.1f} {gemm / med:8.3f} {errors[text]:9.2e} "
            f"{statistics.median(hosts[text]):7.1f}  " + " ".join(f"{x:.1f}" for x in xs)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
