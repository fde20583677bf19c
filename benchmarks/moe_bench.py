"""The MoE ops of `syncopate.moe` (dispatch `a2a_gemm`, combine `gemm_a2a`), unfused, dedup,
pipelined and fused, against torch written plainly, on the expert layers of configs/moe_ep.yaml; and `MoELayer`'s
forward and backward on them against the same layer written with torch.

    torchrun --nproc-per-node 2 benchmarks/moe_bench.py [--models qwen3_30b_a3b] [--tokens 4096]
    python benchmarks/moe_bench.py --ep 2,4          # spawns one process a GPU, each EP size in turn
    python benchmarks/moe_bench.py --cpu --shrink 64 --tokens 16    # gloo ranks: checks the script

Per case (model, EP size, tokens, routing) and kind, in one run, on one routing and one set of
inputs:

- `torch`: all_to_all_single, then torch._grouped_mm (combine: the grouped GEMM, then the
  all-to-all and the weighted top-k sum), index tables made beforehand;
- `a2a` alone and `gemm` alone (the same calls), where copy-engine candidates are timed the copy
  engine's transfers alone too (`a2a_copy_engine`: the pipelined plan's copies, one piece a peer,
  no GEMM), and `bound` = max of the GEMM alone and the fastest all-to-all alone: what a perfect
  overlap of a row a pair would take (`dedup` moves fewer rows and can come in under it: where its
  template is timed, its all-to-all alone is too, `a2a_dedup`, a row a token and rank);
- each candidate of the grid (`--grid`; `unfused`, `dedup` where `nccl` is among the backends,
  then `pipelined` for each backend, chunk count and order, then `dedup` on the copy engine for
  each order, `fused` for each chunk count, order and tile configuration and (dispatch)
  `fused_dedup` for each order and tile configuration where `copy_engine` is among the backends; `--templates` keeps
  some templates only), first checked against the float32 reference computed by the group
  (`moe_*_group_reference`) on two fresh routings, outputs poisoned with NaN, two calls back to
  back with different inputs; a candidate off by more than 1e-2 is not timed.

Times are device times by the project's method (measure/timing.py: warm-up, L2 flush, ranks
started together, CUDA events, max over ranks, median with p20/p80). The table gives, per case and
kind, the fastest candidate, bound/ours (at most about 1) and torch/ours (above 1: faster than
torch), and `eager t/o`: torch's path over the fastest candidate as a layer calls them, back to back
with the host on the path, each call on a layout made for it (the routing's host wait, then the
plan's tables; `syncopate.measure.moe.layer_call`). Then per case the layer: `MoELayer` (router,
SwiGLU experts) forward and backward, called back to back with the host on the path
(`time_eager`), with each layer config's ops against torch's layer, its output and input gradient
checked against torch's layer first. `--phases` adds where each configuration's call spends its
time (`phase_times`): per phase of the forward (route, layout, dispatch, act, combine) and the
backward, the host's time to enqueue it and the span it takes on the device; where the two are
near each other the host paced that phase.

`--json FILE` writes every row (every candidate's times and errors, the environment); `--log-file FILE`
every rank's log (rank r > 0 to FILE.rank<r>); with OUT set they default to $OUT/moe_bench.json
and $OUT/moe_bench.log. `--cpu` runs gloo ranks on the CPU with wall-clock times (it checks the
script, not its figures; no copy-engine candidate there); `--shrink N` divides hidden, ffn and
experts by N. Without a GPU and without --cpu it says so in one line and exits 1; it exits 1 too
if a candidate or layer is wrong, 2 on a bad file or option.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import statistics
import sys
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs", "moe_ep.yaml")
TOLERANCE = 1e-2
"""Largest relative error accepted against the float32 reference (bf16 operands)."""
LAYER_TOLERANCE = 3e-2
"""Largest relative error of a layer's output and input gradient against torch's layer (both bf16)."""

log = logging.getLogger("moe_bench")

from syncopate.measure.moe import (  # noqa: E402 — after the path insert above
    MoeCase,
    check_config,
    copy_engine_a2a,
    dedup_a2a,
    fresh_checks,
    layer_call,
    moe_op,
    moe_reference,
    nvshmem_ops,
    nvshmem_refusal,
    out_shape,
    plain_ops,
    wall_times,
    worst_over_ranks,
)

# Timing ------------------------------------------------------------------------------------------


def _summary(samples) -> dict[str, float]:
    xs = sorted(samples)
    return {"median_us": statistics.median(xs), "p20_us": xs[len(xs) // 5], "p80_us": xs[(4 * len(xs)) // 5]}


def time_op(fn, group, args) -> dict[str, float]:
    if args.cpu:
        return _summary(wall_times(fn, group, args.repetitions))
    from syncopate.measure.timing import time_collective

    t = time_collective(fn, group, repetitions=args.repetitions)
    return {**_summary(t.samples_us), "host_us": t.host_us}


def time_layer(fn, group, args) -> dict[str, float]:
    if args.cpu:
        return _summary(wall_times(fn, group, max(3, args.repetitions // 2), calls=2))
    from syncopate.measure.timing import time_eager

    return _summary(time_eager(fn, group, calls=args.layer_calls))


def phase_times(call, group, cuda: bool, calls: int = 5) -> dict[str, dict[str, float]]:
    """Where one layer call's time goes: `call(stamp)` (the layer's forward with `stamp`, then its
    backward) made `calls` times back to back, each stamped as every phase of its forward has been
    enqueued (`MoELayer.PHASES`) and after its backward, on the host (the wall clock) and on the
    device (CUDA events on the caller's stream; on the CPU the wall clock again). Per phase, the
    median over calls of the slowest rank's µs: host time is what the host spent enqueueing the
    phase (waits for the device included), device time the span between the phase's stamps on the
    device, which a host behind the device stretches too."""
    import time

    import torch

    from syncopate.moe.layer import PHASES

    names = (*PHASES, "backward")
    per_call = []
    for _ in range(calls):
        marks = []

        def mark(phase: str) -> None:
            event = None
            if cuda:
                event = torch.cuda.Event(enable_timing=True)
                event.record()
            marks.append((phase, time.perf_counter(), event))

        mark("start")
        call(mark)
        mark("backward")
        if cuda:
            marks[-1][2].synchronize()
        spans = []
        for (_, h0, e0), (_, h1, e1) in zip(marks, marks[1:], strict=False):
            host = (h1 - h0) * 1e6
            spans += [host, e0.elapsed_time(e1) * 1e3 if cuda else host]
        per_call.append(spans)
    medians = [statistics.median(spans[i] for spans in per_call) for i in range(2 * len(names))]
    from syncopate.kernels.ranks import slowest

    values = slowest(medians, group, "cuda" if cuda else "cpu")
    return {name: {"host_us": values[2 * i], "device_us": values[2 * i + 1]} for i, name in enumerate(names)}


# The grid ----------------------------------------------------------------------------------------


def grid(workload, ws: int, args):
    from syncopate.search_space.moe_workload import moe_space

    backends = ("nccl",) if args.cpu else tuple(args.backends.split(","))
    chunks = (1, 2) if args.grid == "tiny" else (1, 2, 4)
    space = moe_space(workload, ws, backends=backends, chunks=chunks)
    if args.grid == "tiny":
        space = [c for c in space if c.order == "ring"]
    templates = args.templates.split(",")
    return [c for c in space if c.template in templates]


def layer_configs(args, tuned=None):
    """(name, dispatch config, combine config, backward) of each layer timed: unfused, then dedup,
    each pipelined config, dedup on the copy engine, and the fused and fused_dedup ones (128×256×64
    tiles on 4 stages, the fused GEMM's fastest tile on H200) for both ops, then `tuned` (the
    fastest dispatch and combine of this case's op rows, what a tuned database serves each op)
    where given, each with its own plan's backward and with the unfused ops' backward
    (`MoELayer(backward=...)`); last each of those as a tuned layer runs its plans, checked against
    unfused on its first calls (`MoELayer(check_plans=...)`), which keeps the faster."""
    from syncopate.search_space.moe_workload import MoeCandidate

    backends = ("nccl",) if args.cpu else tuple(args.backends.split(","))
    configs = [None, MoeCandidate(template="dedup")] + [
        MoeCandidate(template="pipelined", backend=b, chunks_per_source=2) for b in backends
    ]
    if "copy_engine" in backends:
        tiles = {"block_m": 128, "block_n": 256, "num_warps": 8, "num_stages": 4}
        configs.append(MoeCandidate(template="dedup", backend="copy_engine"))
        configs.append(MoeCandidate(template="fused_dedup", backend="copy_engine", **tiles))
        configs.append(MoeCandidate(template="fused", backend="copy_engine", chunks_per_source=2, **tiles))
    templates = args.templates.split(",")
    chosen = [c for c in configs if (c.template if c is not None else "unfused") in templates]
    pairs = [(c.short(), c, c) for c in chosen if c is not None]
    if tuned is not None and None not in tuned:
        dispatch, combine = tuned
        pairs.append((f"tuned: {dispatch.short()} + {combine.short()}", dispatch, combine))
    return (
        [("unfused", None, None, "plan")] * (None in chosen)
        + [
            (name + (", unfused backward" if backward == "unfused" else ""), d, c, backward)
            for name, d, c in pairs
            for backward in ("plan", "unfused")
            # dedup's (and fused_dedup's) backward is its own autograd either way
            if backward == "plan" or not ({d.template, c.template} & {"dedup", "fused_dedup"})
        ]
        + [(f"{name}, checked", d, c, "plan") for name, d, c in pairs]
    )


def fastest_configs(op_rows):
    """(dispatch, combine): what an eager lookup would serve each kind from `op_rows` (one case's):
    of the candidates timed as a layer calls them (`eager`: unfused and the fastest on the device),
    the fastest so; without those times, the fastest on the device; None for a kind with none timed."""
    from syncopate.search_space.moe_workload import MoeCandidate

    best = {}
    for r in op_rows:
        timed = [c for c in r["candidates"] if c["status"] == "ok"]
        as_layer = [c for c in timed if "eager" in c]
        if as_layer:
            best[r["kind"]] = MoeCandidate.from_dict(
                min(as_layer, key=lambda c: c["eager"]["median_us"])["config"]
            )
        elif timed:
            best[r["kind"]] = MoeCandidate.from_dict(
                min(timed, key=lambda c: c["times"]["median_us"])["config"]
            )
    return best.get("a2a_gemm"), best.get("gemm_a2a")


# One case ----------------------------------------------------------------------------------------


class Case(MoeCase):
    """One (model, EP, tokens, routing) on this rank: its cases (one a kind) over one routing."""

    def __init__(self, cases, group, device, args) -> None:
        self.cases = {c.workload.kind: c for c in cases}
        super().__init__(next(iter(self.cases.values())).workload, group, device)
        self.args = args


def run_kind(kind: str, case: Case) -> dict:
    """Baselines, then each candidate checked and timed; the row of the table (every rank's alike)."""
    import torch

    from syncopate.measure.reference import relative_error

    w, args = case.cases[kind].workload, case.args
    a, wt = case.operands(kind, case.layout)
    whole, a2a, gemm = plain_ops(kind, case, a, wt)
    shape = out_shape(kind, w, case.layout)
    torch_out = torch.full(shape, float("nan"), dtype=case.dtype, device=case.device)
    whole(torch_out)
    ref = moe_reference(kind, case, a, wt, case.ids, case.gates)
    torch_error = worst_over_ranks(relative_error(torch_out, ref) if ref.numel() else 0.0, case)
    times = {"torch": time_op(lambda: whole(), case.group, args)}
    times["a2a"] = time_op(lambda: a2a(), case.group, args)
    times["gemm"] = time_op(lambda: gemm(), case.group, args)
    # torch's NVSHMEM all-to-all in place of NCCL's, where this process's symmetric memory is NVSHMEM's
    nvshmem_error, why_not = None, nvshmem_refusal(case)
    if why_not is None:
        nv_whole, nv_a2a = nvshmem_ops(kind, case, a, wt)
        nv_out = torch.full(shape, float("nan"), dtype=case.dtype, device=case.device)
        nv_whole(nv_out)
        nvshmem_error = worst_over_ranks(relative_error(nv_out, ref) if ref.numel() else 0.0, case)
        times["torch_nvshmem"] = time_op(lambda: nv_whole(), case.group, args)
        times["a2a_nvshmem"] = time_op(lambda: nv_a2a(), case.group, args)
    # the copy engine's transfers alone (no GEMM), where copy-engine candidates are timed
    ce_a2a = copy_engine_a2a(kind, case, a) if "copy_engine" in args.backends.split(",") else None
    if ce_a2a is not None:
        times["a2a_copy_engine"] = time_op(ce_a2a, case.group, args)
    # the dedup template's all-to-all alone (a row a token and rank), where the grid times dedup:
    # beside the bound, not in it
    space = grid(w, case.ws, args)
    if any(c.template == "dedup" for c in space):
        times["a2a_dedup"] = time_op(dedup_a2a(kind, case), case.group, args)
    comm = min(times[k]["median_us"] for k in ("a2a", "a2a_nvshmem", "a2a_copy_engine") if k in times)
    bound = max(comm, times["gemm"]["median_us"])
    log.info(
        "%s %s: torch %.1f µs (rel err %.2e), a2a %.1f, gemm %.1f",
        w,
        f"EP={case.ws}",
        times["torch"]["median_us"],
        torch_error,
        times["a2a"]["median_us"],
        times["gemm"]["median_us"],
    )
    if why_not is None:
        log.info(
            "%s %s: torch with NVSHMEM's all-to-all %.1f µs (rel err %.2e), its a2a %.1f",
            w,
            f"EP={case.ws}",
            times["torch_nvshmem"]["median_us"],
            nvshmem_error,
            times["a2a_nvshmem"]["median_us"],
        )
    prepared = fresh_checks(kind, case)
    op, candidates = moe_op(kind), []
    out = torch.full(shape, float("nan"), dtype=case.dtype, device=case.device)
    configs = {}
    for config in space:
        configs[config.short()] = config
        row = {"config": config.to_dict(), "short": config.short()}
        try:
            row["rel_error"] = check_config(kind, config, case, prepared)
            if row["rel_error"] < TOLERANCE:
                row["times"] = time_op(
                    lambda c=config: op(a, wt, case.gates, case.layout, case.group, out, c), case.group, args
                )
                row["status"] = "ok"
            else:
                row["status"] = "wrong_result"
        except Exception as e:  # noqa: BLE001 — recorded, the others still measured
            log.error("%s %s failed:\n%s", w, config.short(), traceback.format_exc())
            row.update(status="error", error=f"{type(e).__name__}: {e}")
        log.info(
            "%s EP=%d %s: %s%s",
            w,
            case.ws,
            config.short(),
            row["status"],
            f" {row['times']['median_us']:.1f} µs, rel err {row['rel_error']:.2e}" if "times" in row else "",
        )
        candidates.append(row)
    timed = [c for c in candidates if c["status"] == "ok"]
    best = min(timed, key=lambda c: c["times"]["median_us"]) if timed else None
    ours = best["times"]["median_us"] if best else float("nan")
    # torch's path, unfused and the fastest candidate as a layer calls them (calls back to back,
    # each on a layout made for it: the routing's host wait, then the plan's tables)
    eager = {"torch": time_layer(layer_call(lambda layout: whole(), case), case.group, args)}
    for c in timed:
        if c["short"] == "unfused" or c is best:
            cfg = configs[c["short"]]
            c["eager"] = time_layer(
                layer_call(
                    lambda layout, cfg=cfg: op(a, wt, case.gates, layout, case.group, out, cfg),
                    case,
                    cfg is not None and cfg.template in ("dedup", "fused_dedup"),
                ),
                case.group,
                args,
            )
            eager[c["short"]] = c["eager"]
    return {
        "model": case.cases[kind].model,
        "ep": case.ws,
        "kind": kind,
        "workload": w.key(),
        "tokens": w.tokens,
        "routing": w.routing.key(),
        "most_rows_a_rank": case.most_rows,
        "torch_rel_error": torch_error,
        "times": times,
        "bound_us": bound,
        "candidates": candidates,
        "best": best["short"] if best else None,
        "best_us": ours,
        "bound_over_ours": bound / ours if best else None,
        "torch_over_ours": times["torch"]["median_us"] / ours if best else None,
        "torch_nvshmem_rel_error": nvshmem_error,
        "torch_nvshmem_over_ours": (
            times["torch_nvshmem"]["median_us"] / ours if best and "torch_nvshmem" in times else None
        ),
        "torch_nvshmem": why_not or "measured",
        "torch_copies_output": False,  # torch's path and the GEMM alone return their result, uncopied
        "eager": eager,
        "eager_torch_over_ours": (
            eager["torch"]["median_us"] / best["eager"]["median_us"] if best and "eager" in best else None
        ),
    }


# The layer ---------------------------------------------------------------------------------------


def _all_to_all_autograd():
    """torch's all-to-all of rows with autograd: `all_to_all_single_autograd` of the functional
    collectives (what torchtitan's expert parallelism calls), else torch.distributed.nn's."""
    from torch.distributed import _functional_collectives as funcol

    fn = getattr(funcol, "all_to_all_single_autograd", None)
    if fn is not None:
        return lambda rows, out_splits, in_splits, group: funcol.wait_tensor(
            fn(rows, out_splits, in_splits, group)
        )
    import torch.distributed.nn.functional as dnn

    return lambda rows, out_splits, in_splits, group: dnn.all_to_all_single(
        rows.new_empty((sum(out_splits), *rows.shape[1:])), rows, out_splits, in_splits, group=group
    )


def torch_layer(layer, x, group):
    """`layer`'s forward (router, SwiGLU experts) written with torch alone: the top-k, the counts'
    all-to-all, the rows' all-to-all with autograd, torch._grouped_mm, and the gate-weighted top-k
    sum as `MoELayer` takes it (one batched matmul in x's dtype, accumulated in float32)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    ws = dist.get_world_size(group)
    el, k, f = layer.experts // ws, layer.top_k, layer.ffn
    probs = torch.softmax((x @ layer.gate.t()).float(), dim=-1)
    weights, ids = probs.topk(k, dim=-1)
    weights = weights / weights.sum(-1, keepdim=True)
    flat = ids.reshape(-1)
    perm = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=layer.experts)
    got = torch.empty_like(counts)
    dist.all_to_all_single(got, counts, group=group)
    recv_counts = got.view(ws, el).cpu()
    send_splits = counts.view(ws, el).sum(1).tolist()
    recv_splits = recv_counts.sum(1).tolist()
    labels = torch.arange(el).repeat(ws).repeat_interleave(recv_counts.reshape(-1)).to(x.device)
    by_expert = torch.argsort(labels, stable=True)
    offs = torch.cumsum(recv_counts.sum(0), 0).to(device=x.device, dtype=torch.int32)
    a2a = _all_to_all_autograd()
    received = a2a(x[perm // k], recv_splits, send_splits, group)
    h = torch._grouped_mm(received[by_expert], layer.w1, offs=offs)
    act = F.silu(h[:, :f]) * h[:, f:]
    y = torch.empty_like(received)
    y = y.index_copy(0, by_expert, torch._grouped_mm(act, layer.w2, offs=offs))
    back = a2a(y, send_splits, recv_splits, group)
    pairs = torch.empty_like(back).index_copy(0, perm, back).view(x.shape[0], k, -1)
    return torch.bmm(weights.to(x.dtype).unsqueeze(1), pairs).squeeze(1)


def run_layer(case: Case, tuned=None) -> dict:
    import torch

    from syncopate.measure.reference import relative_error
    from syncopate.moe import MoELayer
    from syncopate.moe.layer import CHECK_SAMPLES, CHECK_WARMUP

    w, args = case.w, case.args
    layer = MoELayer(
        hidden=w.hidden,
        ffn=w.ffn,
        experts=w.experts,
        top_k=w.top_k,
        group=case.group,
        dtype=case.dtype,
        device=case.device,
    )
    with torch.no_grad():
        layer.gate.copy_(case.rand(w.experts, w.hidden, scale=w.hidden**-0.5))
    x = case.rand(w.tokens, w.hidden).requires_grad_()
    grad = case.rand(w.tokens, w.hidden)

    def step(forward):
        x.grad = None
        y = forward()
        y.backward(grad)
        return y

    y_torch = step(lambda: torch_layer(layer, x, case.group)).detach()
    gx_torch = x.grad.clone()
    times = {"torch": time_layer(lambda: step(lambda: torch_layer(layer, x, case.group)), case.group, args)}
    rows = []
    for name, dispatch, combine, backward in layer_configs(args, tuned):
        layer.dispatch_config, layer.combine_config = dispatch, combine
        layer.backward = backward
        layer.check_plans = name.endswith(", checked")
        row = {"config": name}
        try:
            if layer.check_plans:  # its first calls time the plans against unfused, then keep one
                for _ in range(2 * (CHECK_WARMUP + CHECK_SAMPLES)):
                    step(lambda: layer(x))
            y = step(lambda: layer(x)).detach()
            if layer.check_plans:
                row["check"] = layer.choices.get(w.tokens)
            error = max(relative_error(y, y_torch), relative_error(x.grad, gx_torch))
            row["rel_error"] = worst_over_ranks(error, case)
            if row["rel_error"] < LAYER_TOLERANCE:
                row["times"] = time_layer(lambda: step(lambda: layer(x)), case.group, args)
                row["torch_over_ours"] = times["torch"]["median_us"] / row["times"]["median_us"]
                if args.phases:
                    row["phases"] = phase_times(
                        lambda stamp: step(lambda: layer(x, stamp=stamp)), case.group, x.is_cuda
                    )
                row["status"] = "ok"
            else:
                row["status"] = "wrong_result"
        except Exception as e:  # noqa: BLE001
            log.error("layer %s failed:\n%s", name, traceback.format_exc())
            row.update(status="error", error=f"{type(e).__name__}: {e}")
        log.info("layer %s EP=%d %s: %s", w, case.ws, name, row)
        rows.append(row)
    return {
        "model": next(iter(case.cases.values())).model,
        "ep": case.ws,
        "tokens": w.tokens,
        "routing": w.routing.key(),
        "times": times,
        "configs": rows,
    }


# Ranks -------------------------------------------------------------------------------------------


def _logging(args, rank: int) -> None:
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    handlers[0].setLevel(logging.WARNING)
    if args.log:
        path = args.log if rank == 0 else f"{args.log}.rank{rank}"
        file = logging.FileHandler(path, mode="w")
        file.setLevel(logging.DEBUG)
        file.setFormatter(logging.Formatter(f"%(asctime)s rank{rank} %(name)s %(levelname)s %(message)s"))
        handlers.append(file)
    logging.basicConfig(level=logging.DEBUG, handlers=handlers, force=True)


def run_rank(cases, group, device, args) -> dict:
    """Every case of this EP size on this rank: the op rows and the layer rows."""
    import torch

    from syncopate.environment import provenance

    log.info("rank on %s: %s", device, provenance())
    keys = list(dict.fromkeys((c.model, c.workload.tokens, c.workload.routing) for c in cases))
    ops, layers = [], []
    for key in keys:
        group_cases = [c for c in cases if (c.model, c.workload.tokens, c.workload.routing) == key]
        case = Case(group_cases, group, device, args)
        rows = [run_kind(kind, case) for kind in case.cases]
        ops += rows
        if not args.no_layer:
            layers.append(run_layer(case, fastest_configs(rows)))
        del case
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return {"ops": ops, "layers": layers}


def worker(rank, world, port, args, cases, queue):
    """A spawned rank: its group (NCCL on its GPU, or gloo with --cpu), its cases."""
    import torch
    import torch.distributed as dist

    _logging(args, rank)
    if args.cpu:
        device = torch.device("cpu")
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    else:
        from syncopate.measure.local_ranks import join_group

        device = join_group(rank, world, port)
    try:
        result = run_rank(cases, dist.group.WORLD, device, args)
        if rank == 0:
            queue.put(result)
    finally:
        from syncopate.moe import close_moe_contexts

        close_moe_contexts()
        dist.destroy_process_group()


# The table ---------------------------------------------------------------------------------------


def _ratio(x) -> str:
    return f"{x:6.2f}" if x is not None else "     -"


def table(result: dict) -> str:
    lines = [
        f"{'model':20s} {'ep':>2s} {'kind':8s} {'tokens':>6s} {'routing':18s} {'rows':>7s} {'torch':>8s} "
        f"{'a2a':>8s} {'gemm':>8s} {'bound':>8s} {'ours':>8s} {'bound/ours':>10s} {'torch/ours':>10s} "
        f"{'eager t/o':>9s}  best"
    ]
    for r in result["ops"]:
        t = r["times"]
        lines.append(
            f"{r['model']:20s} {r['ep']:2d} {r['kind']:8s} {r['tokens']:6d} {r['routing']:18s} "
            f"{r['most_rows_a_rank']:7d} {t['torch']['median_us']:8.1f} {t['a2a']['median_us']:8.1f} "
            f"{t['gemm']['median_us']:8.1f} {r['bound_us']:8.1f} {r['best_us']:8.1f} "
            f"{_ratio(r['bound_over_ours']):>10s} {_ratio(r['torch_over_ours']):>10s} "
            f"{_ratio(r.get('eager_torch_over_ours')):>9s}  {r['best']}"
        )
        if "torch_nvshmem" in t:
            lines.append(
                f"    torch with NVSHMEM's all-to-all {t['torch_nvshmem']['median_us']:.1f}, its a2a "
                f"{t['a2a_nvshmem']['median_us']:.1f}; torch-nvshmem/ours {_ratio(r['torch_nvshmem_over_ours'])}"
            )
        bad = [c for c in r["candidates"] if c["status"] != "ok"]
        for c in bad:
            lines.append(f"    {c['short']}: {c['status']} {c.get('rel_error', c.get('error', ''))}")
    if result["layers"]:
        lines += ["", "MoELayer forward + backward, µs a call (calls back to back); torch/ours in ()"]
        for r in result["layers"]:
            parts = [f"torch {r['times']['torch']['median_us']:.1f}"]
            for c in r["configs"]:
                if c["status"] == "ok":
                    parts.append(f"{c['config']} {c['times']['median_us']:.1f} ({c['torch_over_ours']:.2f})")
                else:
                    parts.append(f"{c['config']} {c['status']}")
            lines.append(
                f"{r['model']:20s} {r['ep']:2d} {r['tokens']:6d} {r['routing']:18s} " + ", ".join(parts)
            )
    phased = [(r, c) for r in result["layers"] for c in r["configs"] if "phases" in c]
    if phased:
        names = list(phased[0][1]["phases"])
        lines += [
            "",
            "MoELayer phases, host / device µs a call (median of 5, the slowest rank): a phase whose "
            "host time is near its device time was paced by the host",
            f"{'case, config':64s} " + " ".join(f"{n:>13s}" for n in names),
        ]
        for r, c in phased:
            case = f"EP={r['ep']} {r['tokens']} {r['routing']}, {c['config']}"
            cells = [f"{p['host_us']:.0f}/{p['device_us']:.0f}".rjust(13) for p in c["phases"].values()]
            lines.append(f"{case[:64]:64s} " + " ".join(cells))
    return "\n".join(lines)


def failures(result: dict) -> list[str]:
    bad = [
        f"{r['model']} EP={r['ep']} {r['kind']} {r['routing']}: {c['short']} {c['status']}"
        for r in result["ops"]
        for c in r["candidates"]
        if c["status"] != "ok"
    ]
    bad += [
        f"layer {r['model']} EP={r['ep']} {r['routing']}: {c['config']} {c['status']}"
        for r in result["layers"]
        for c in r["configs"]
        if c["status"] != "ok"
    ]
    return bad


# Main --------------------------------------------------------------------------------------------


def _shrunk(case, n: int):
    """`case` with hidden, ffn and experts divided by n (widths kept multiples of 8, experts a
    multiple of the EP size and at least top_k)."""
    w = case.workload
    experts = max(w.experts // n, w.top_k, case.ep)
    experts = -(-experts // case.ep) * case.ep
    width = lambda d: max(8, d // n // 8 * 8)  # noqa: E731  (torch._grouped_mm: rows of 16 bytes)
    small = dataclasses.replace(w, hidden=width(w.hidden), ffn=width(w.ffn), experts=experts)
    return dataclasses.replace(case, workload=small)


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default=CONFIG, help="the MoE benchmark file (configs/moe_ep.yaml)")
    p.add_argument("--models", help="only these models, comma-separated")
    p.add_argument("--ep", help="only these EP sizes, comma-separated (under torchrun: its world size)")
    p.add_argument("--tokens", type=int, help="tokens a rank instead of the file's")
    p.add_argument("--routings", help="only these distributions (uniform, skewed), comma-separated")
    p.add_argument(
        "--grid",
        choices=("small", "tiny"),
        default="small",
        help="small: chunks 1, 2, 4 and both orders; tiny: chunks 1 and 2, ring",
    )
    p.add_argument(
        "--backends",
        default="nccl,copy_engine",
        help="pipelined backends, comma-separated (nvshmem: every rank's symmetric memory is NVSHMEM's)",
    )
    p.add_argument(
        "--templates",
        default="unfused,dedup,pipelined,fused",
        help="only candidates of these templates, comma-separated (fused takes backend copy_engine)",
    )
    p.add_argument("--repetitions", type=int, default=20)
    p.add_argument("--layer-calls", type=int, default=5, help="layer calls back to back a repetition")
    p.add_argument("--no-layer", action="store_true", help="skip the MoELayer forward + backward")
    p.add_argument(
        "--phases",
        action="store_true",
        help="also time each layer configuration's phases, host and device (route, layout, dispatch, "
        "act, combine, backward)",
    )
    p.add_argument("--cpu", action="store_true", help="gloo ranks on the CPU (checks the script)")
    p.add_argument("--shrink", type=int, default=1, help="divide hidden, ffn and experts by this")
    p.add_argument("--json", help="write every row here (default $OUT/moe_bench.json where OUT is set)")
    p.add_argument(
        "--log-file", dest="log", help="every rank's log (default $OUT/moe_bench.log where OUT is set)"
    )
    args = p.parse_args(argv)
    out = os.environ.get("OUT")
    if out:
        args.json = args.json or os.path.join(out, "moe_bench.json")
        args.log = args.log or os.path.join(out, "moe_bench.log")
    if args.repetitions < 1 or args.layer_calls < 1 or args.shrink < 1:
        p.error("--repetitions, --layer-calls and --shrink take positive numbers")
    from syncopate.search_space.moe_workload import MOE_BACKENDS, MOE_TEMPLATES

    unknown = sorted(set(args.backends.split(",")) - set(MOE_BACKENDS))
    if unknown:
        p.error(f"unknown backend(s) {', '.join(unknown)}: accepted are {', '.join(MOE_BACKENDS)}")
    if args.cpu and "nvshmem" in args.backends.split(","):
        p.error("backend nvshmem puts rows between GPUs: it does not go with --cpu (gloo ranks run nccl)")
    unknown = sorted(set(args.templates.split(",")) - set(MOE_TEMPLATES))
    if unknown:
        p.error(f"unknown template(s) {', '.join(unknown)}: accepted are {', '.join(MOE_TEMPLATES)}")
    return args


def select(args, torchrun_world: int | None):
    """The cases of the file after the filters; raises ConfigError on a bad file or filter."""
    from syncopate.errors import ConfigError
    from syncopate.moe.bench_config import load_moe_config

    if args.phases and args.no_layer:
        raise ConfigError("--phases times the layer's phases: it does not go with --no-layer")
    cases = load_moe_config(args.config)
    if args.models:
        cases = [c for c in cases if c.model in args.models.split(",")]
    if torchrun_world is not None:
        cases = [c for c in cases if c.ep == torchrun_world]
    elif args.ep:
        cases = [c for c in cases if str(c.ep) in args.ep.split(",")]
    if args.routings:
        cases = [c for c in cases if c.workload.routing.distribution in args.routings.split(",")]
    if args.tokens:
        cases = [
            dataclasses.replace(c, workload=dataclasses.replace(c.workload, tokens=args.tokens))
            for c in cases
        ]
    if args.shrink > 1:
        cases = [_shrunk(c, args.shrink) for c in cases]
    cases = list(dict.fromkeys(cases))
    if not cases:
        where = (
            f"EP={torchrun_world} (torchrun's world size)"
            if torchrun_world
            else "--models / --ep / --routings"
        )
        raise ConfigError(f"no case of {args.config} is left after {where}")
    return cases


def report(result: dict, args) -> int:
    print(table(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    bad = failures(result)
    for line in bad:
        print(f"moe_bench.py: {line}", file=sys.stderr)
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    from syncopate.errors import ConfigError

    under_torchrun = "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ
    try:
        cases = select(args, int(os.environ["WORLD_SIZE"]) if under_torchrun else None)
    except ConfigError as e:
        print(f"moe_bench.py: {e}", file=sys.stderr)
        return 2

    import torch

    if "nvshmem" in args.backends.split(","):
        # Every rank's symmetric memory NVSHMEM's, applied at Syncopate's first context (the spawned
        # ranks inherit the setting); the other backends and torch's baselines run on it too.
        from syncopate.kernels.symmetric_memory import MEMORY_VAR

        os.environ[MEMORY_VAR] = "nvshmem"
    if under_torchrun:
        import torch.distributed as dist

        from syncopate.environment import provenance
        from syncopate.measure.local_ranks import join_torchrun
        from syncopate.moe import close_moe_contexts

        device = join_torchrun()
        rank = dist.get_rank()
        _logging(args, rank)
        try:
            result = run_rank(cases, dist.group.WORLD, device, args)
            result["environment"] = provenance()
        finally:
            close_moe_contexts()
            dist.destroy_process_group()
        return report(result, args) if rank == 0 else 0

    gpus = 0 if args.cpu else (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    if not args.cpu and gpus == 0:
        print(
            "moe_bench.py: needs a CUDA GPU (one a rank), none is visible; --cpu runs gloo ranks",
            file=sys.stderr,
        )
        return 1
    from syncopate.environment import provenance
    from syncopate.measure.local_ranks import spawn_ranks

    result = {"ops": [], "layers": [], "environment": provenance()}
    for ep in sorted({c.ep for c in cases}):
        if not args.cpu and gpus < ep:
            print(f"moe_bench.py: EP={ep} skipped: it needs {ep} CUDA GPUs, {gpus} present", file=sys.stderr)
            continue
        got = spawn_ranks(worker, ep, args=(args, [c for c in cases if c.ep == ep]), what="benchmark")
        result["ops"] += got["ops"]
        result["layers"] += got["layers"]
    return report(result, args)


if __name__ == "__main__":
    sys.exit(main())
