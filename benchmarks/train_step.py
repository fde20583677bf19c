"""Training steps of transformers' LlamaForCausalLM under tensor and sequence parallelism, planned as
torchtitan plans Llama, with torch's styles and with syncopate.tp's, eager and compiled.

    torchrun --nproc-per-node 4 benchmarks/train_step.py [--model llama-3-8b] [--layers 4]
        [--tokens 8192] [--batch 1] [--steps 20] [--warmup 5] [--variants ...] [--no-loss-parallel]
        [--launch auto direct graph] [--profile STEPS] [--host-profile STEPS] [--json FILE]
    python benchmarks/train_step.py --cpu --world 2 [--json FILE]      (gloo, tiny widths)

Random weights at the model's widths (`syncopate.models`; `--layers` decoder layers), the same on
every rank and in every variant (one seed), synthetic tokens (one seed), AdamW (fused, as torchtitan
runs it; `--optimizer` picks another implementation). One process a GPU;
`--tokens` is what the tensor-parallel group processes a step (batch × sequence: 2048, 4096 or 8192
at real widths), each rank holding tokens/tp of them between the attention and MLP blocks.

The plan is torchtitan's for Llama, loss included. The embedding is row-parallel (its output
sharded on the sequence), the norms sequence-parallel, q/k/v and gate/up column-parallel, o and
down row-parallel back to the sequence shards. lm_head is column-parallel with its logits left
sharded on the vocabulary, and the loss is torchtitan's: each sample is a sequence and one more
token, split beforehand into inputs and labels (the next tokens); the model is called without
labels, and `cross_entropy(logits.flatten(0, 1).float(), labels.flatten(0, 1))` runs on the
vocabulary shards inside torch's `loss_parallel()`, forward and backward. `--no-loss-parallel` is
torchtitan's `disable_loss_parallel`: the logits all-gathered to every rank and the same loss
computed on each whole. The result (`loss_parallel`) and the table's header say which plan ran.

| variant            | styles    | mode                                                           |
|--------------------|-----------|----------------------------------------------------------------|
| torch              | torch's   | eager                                                          |
| torch-compiled     | torch's   | torch.compile of each decoder layer                            |
| async-tp           | torch's   | compiled with torchtitan's switch: `_micro_pipeline_tp` and     |
|                    |           | symmetric memory on the group (CUDA only)                      |
| torch-graphs       | torch's   | compiled with mode="reduce-overhead" (CUDA graphs; CUDA only)  |
| syncopate          | ours      | eager                                                          |
| syncopate-compiled | ours      | torch.compile of each decoder layer                            |
| syncopate-graphs   | ours      | compiled with mode="reduce-overhead" (CUDA graphs; CUDA only), |
|                    |           | warmed up after `syncopate.set_mode("graph")`                  |

Per variant: the step time (median over the steps after the warm-up, each step timed from a barrier
to its end, device synchronized, the slowest rank's), tokens/s from it, peak device memory (the
largest rank's, from after the model is built), and the loss curve's largest difference from
`torch`'s over every step. The embedding, the final norm, lm_head and the loss are the same in every
variant, torch's styles; the fused ops take their configurations from `syncopate.lookup`
(SYNCOPATE_DB names the database of a sweep on this machine, e.g. one of
`syncopate tune --model llama-3-8b --tp N --tokens T`).

Where the host paces a step: `enqueue ms` is the host's wall time to enqueue a step (to the
optimizer's zero_grad, before the loss is read) and `enqueue cpu` the process's CPU time over it,
every thread's (autograd runs the backward on a thread of its own on a GPU): a wall time well above
it is the host waiting, not working. `--host-profile STEPS` runs STEPS more whole steps under
cProfile and reports rank 0's functions with the most own time a step (the backward run on the
calling thread for it, autograd's multithreading off, so that cProfile sees its Python too) and
the lines where those steps made the host wait for the device (torch's sync debug mode): after such
a wait the device idles until the host has enqueued work again.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import gc
import json
import logging
import os
import statistics
import sys
import time
import traceback
import warnings
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

log = logging.getLogger("train_step")

VARIANTS = (
    "torch",
    "torch-compiled",
    "async-tp",
    "torch-graphs",
    "syncopate",
    "syncopate-compiled",
    "syncopate-graphs",
)
TORCH_TP = ("torch", "torch-compiled", "torch-graphs")
"""torch's TP variants without async-TP, in the order a loss curve's reference is taken from."""
_LAUNCHED = ("syncopate", "syncopate-compiled")
"""The variants whose fused calls run outside CUDA graphs, where `--launch` chooses how."""

TINY = {
    "name": "tiny",
    "hidden": 64,
    "ffn": 128,
    "heads": 4,
    "kv_heads": 2,
    "head_dim": 16,
    "layers": 2,
    "vocab": 256,
}
"""The widths of `--cpu` runs."""


# --- the model and its plan (a user's parallelize.py) --------------------------------------------------------


def build_model(spec, layers: int, vocab: int, device, dtype, seed: int):
    """LlamaForCausalLM with `spec`'s widths and random weights (the same for a seed)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    widths = {
        "hidden_size": spec.hidden,
        "intermediate_size": spec.ffn,
        "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.kv_heads,
        "head_dim": spec.head_dim,
        "num_hidden_layers": layers,
        "vocab_size": vocab,
        "tie_word_embeddings": False,
        "max_position_embeddings": 65536,
    }
    try:
        config = LlamaConfig(**widths, attn_implementation="sdpa")
    except TypeError:  # a transformers that takes the attention implementation on the model only
        config = LlamaConfig(**widths)
        config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    return model.to(dtype)


def parallelize(model, mesh, styles: str, loss_parallel: bool = True):
    """torchtitan's Llama plan in transformers' module names, with torch's styles or syncopate.tp's
    (`styles`: torch or syncopate) in the decoder layers; the embedding, final norm and lm_head take
    torch's in every variant (syncopate.tp's styles parallelize nn.Linear only, and neither lm_head's
    vocabulary-sharded DTensor output nor its replicated one is one of theirs). `loss_parallel`:
    lm_head's logits stay sharded on the vocabulary, a DTensor for `cross_entropy` under torch's
    `loss_parallel()`, as torchtitan leaves them by default; otherwise they are all-gathered, a plain
    tensor every rank holds whole (torchtitan's `disable_loss_parallel`)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    if styles == "syncopate":
        from syncopate.tp import ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel

    from torch.distributed.tensor import parallel as torch_tp

    parallelize_module(
        model,
        mesh,
        {
            "model.embed_tokens": torch_tp.RowwiseParallel(
                input_layouts=Replicate(), output_layouts=Shard(1)
            ),
            "model.norm": torch_tp.SequenceParallel(),
            "lm_head": torch_tp.ColwiseParallel(
                input_layouts=Shard(1),
                output_layouts=Shard(-1) if loss_parallel else Replicate(),
                use_local_output=not loss_parallel,
            ),
        },
    )
    # A compiled layer's input must not be the embedding's to_local() view: with it (torch 2.13, torch's
    # styles as well) DTensor's redistribution gets a plain tensor as its gradient in the backward.
    model.model.embed_tokens.register_forward_hook(lambda module, args, out: out.clone())
    for layer in model.model.layers:
        parallelize_module(
            layer,
            mesh,
            {
                "input_layernorm": SequenceParallel(),
                "self_attn": PrepareModuleInput(
                    input_kwarg_layouts={"hidden_states": Shard(1)},
                    desired_input_kwarg_layouts={"hidden_states": Replicate()},
                ),
                "self_attn.q_proj": ColwiseParallel(),
                "self_attn.k_proj": ColwiseParallel(),
                "self_attn.v_proj": ColwiseParallel(),
                "self_attn.o_proj": RowwiseParallel(output_layouts=Shard(1)),
                "post_attention_layernorm": SequenceParallel(),
                "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
                "mlp.gate_proj": ColwiseParallel(),
                "mlp.up_proj": ColwiseParallel(),
                "mlp.down_proj": RowwiseParallel(output_layouts=Shard(1)),
            },
        )
    return model


def next_tokens(tokens):
    """`tokens` [b, s + 1] split as torchtitan's data loader splits a sample: the inputs [b, s] and
    their labels, each position's next token, so that every input position has a label."""
    return tokens[:, :-1], tokens[:, 1:]


def cross_entropy(logits, labels):
    """torchtitan's loss: the mean cross-entropy, in float32, of every position's logits [b, s, vocab]
    against its label [b, s]. On logits sharded on the vocabulary it needs torch's `loss_parallel()`."""
    import torch.nn.functional as F

    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(0, 1))


def forward_backward(model, inputs, labels, positions, loss_parallel: bool):
    """One step's forward and backward, the loss (a plain tensor) returned: the model called without
    labels for its logits (of every position: `logits_to_keep` stays 0), `cross_entropy` of them and
    its backward. With `loss_parallel` (lm_head planned so by `parallelize`) all of it runs inside
    torch's `loss_parallel()`, as torchtitan's training step does: the cross-entropy's forward and its
    backward both work on the vocabulary shards."""
    import contextlib

    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import loss_parallel as vocabulary_sharded_loss

    with vocabulary_sharded_loss() if loss_parallel else contextlib.nullcontext():
        logits = model(input_ids=inputs, position_ids=positions).logits
        loss = cross_entropy(logits, labels)
        loss.backward()
    loss = loss.detach()
    return loss.full_tensor() if isinstance(loss, DTensor) else loss


# --- where a step's GPU time goes ------------------------------------------------------------------------------

KERNEL_CATEGORIES = (
    ("entry", ("graph_entry_kernel",)),
    (
        "syncopate",
        (
            "consumer_kernel",
            "producer_kernel",
            "chunk_copy_kernel",
            "pull_kernel",
            "nvshmem_copy_kernel",
            "dispatch_kernel",
            "combine_kernel",
        ),
    ),
    ("attention", ("flash", "fmha", "attention", "attn")),
    ("gemm", ("gemm", "nvjet", "cutlass", "xmma", "matmul", "sm90_", "sm100_")),
    ("nccl", ("nccl",)),
    ("copy", ("memcpy", "memset")),
    ("optimizer", ("multi_tensor", "adam")),
    ("compiled", ("triton_",)),
)
"""Kernel name fragments (lower case) of each category of `--profile`'s table, first match wins;
`entry`: a captured fused call's start, where its group meets (its time is the wait for the slowest
rank); `compiled`: inductor's generated kernels; everything else is `other` (torch's eager elementwise
kernels, reductions, the loss)."""


def kernel_category(name: str) -> str:
    lowered = name.lower()
    for category, fragments in KERNEL_CATEGORIES:
        if any(f in lowered for f in fragments):
            return category
    return "other"


def profile_summary(events, steps: int, top: int = 12) -> dict:
    """GPU time a step by `kernel_category` and the `top` kernels, from a profiler's `key_averages()`
    (`events`: objects with `key`, `count` and `device_time_total` or `cuda_time_total`, µs) over
    `steps` steps. Kernels of several streams overlap, so the categories can sum to more than a step."""
    totals: dict[str, float] = {}
    kernels = []
    for e in events:
        us = getattr(e, "device_time_total", None)
        if us is None:
            us = getattr(e, "cuda_time_total", 0.0)
        if not us or getattr(e, "device_type", None) is not None and "CUDA" not in str(e.device_type):
            continue
        category = kernel_category(e.key)
        totals[category] = totals.get(category, 0.0) + us / steps
        kernels.append((us / steps, e.key, e.count // max(1, steps), category))
    kernels.sort(reverse=True)
    return {
        "steps": steps,
        "category_us": dict(sorted(totals.items(), key=lambda kv: -kv[1])),
        "top": [
            {"kernel": name[:120], "us": us, "calls": calls, "category": c}
            for us, name, calls, c in kernels[:top]
        ],
    }


def host_profiled_steps(step, steps: int, device, top: int = 15) -> dict:
    """`step()` (a whole training step) run `steps` times under cProfile, each after the device has
    finished the one before and the group has met, as a timed step starts: this rank's host wall
    time and process CPU time a step, and the `top` functions by their own time (ms a step, calls a
    step, cumulative ms a step), which says where a host-paced step's enqueue goes. The backward
    runs on the calling thread here (autograd's multithreading off), so that cProfile sees it."""
    import cProfile
    import pstats

    import torch
    import torch.distributed as dist

    prof = cProfile.Profile()
    wall = cpu = 0.0
    syncs: collections.Counter = collections.Counter()
    for _ in range(steps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dist.barrier()
        start, busy = time.perf_counter(), time.process_time()
        prof.enable()
        try:
            with torch.autograd.set_multithreading_enabled(False), _syncs_seen(device, syncs):
                step()  # the backward's Python on this thread too
        finally:
            prof.disable()
        wall += time.perf_counter() - start
        cpu += time.process_time() - busy
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    functions = []
    for (path, line, name), (_, calls, own, cumulative, _) in pstats.Stats(prof).stats.items():
        where = name if path == "~" else f"{'/'.join(Path(path).parts[-2:])}:{line}({name})"
        functions.append(
            {
                "function": where,
                "calls": calls / steps,
                "own_ms": own * 1e3 / steps,
                "cumulative_ms": cumulative * 1e3 / steps,
            }
        )
    functions.sort(key=lambda f: -f["own_ms"])
    return {
        "steps": steps,
        "wall_ms": wall * 1e3 / steps,
        "cpu_ms": cpu * 1e3 / steps,
        "top": functions[:top],
        # where the step made the host wait for the device (torch's sync debug mode): calls a step
        "syncs": [{"where": w, "calls": n / steps} for w, n in syncs.most_common()],
    }


@contextlib.contextmanager
def _syncs_seen(device, seen: collections.Counter):
    """Count, by the Python line that made it, each synchronization of the host with the device in
    the block (torch's sync debug mode in `warn`, its warnings caught rather than printed)."""
    import torch

    if device.type != "cuda":
        yield
        return
    before = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode(before)
    for w in caught:  # the mode's own notice that it is a prototype is not a synchronization
        if "synchroniz" in str(w.message) and "debug mode is a prototype" not in str(w.message):
            seen[
                f"{'/'.join(Path(w.filename).parts[-2:])}:{w.lineno}: {str(w.message).splitlines()[0][:80]}"
            ] += 1


def cudagraph_state(device) -> dict:
    """What reduce-overhead's CUDA-graph trees hold on `device` and what compilation counted so far:
    the graphs recorded (nodes of the trees), the runs done without a graph (warm-up nodes), and
    dynamo's and inductor's counters about graphs (unique graphs, graph breaks, cudagraph skips and
    re-recordings). A count that still grows over the timed steps is a step not replayed."""
    from torch._dynamo.utils import counters

    recorded = warmups = 0
    if device.type == "cuda":
        from torch._inductor import cudagraph_trees

        manager = cudagraph_trees.get_manager(device.index or 0, create_if_none_exists=False)
        if manager is not None and manager.roots is not None:
            nodes = list(manager.get_roots())
            while nodes:
                node = nodes.pop()
                recorded += 1
                nodes.extend(n for children in node.children.values() for n in children)
            # itertools.count(start=-1, step=-1): its repr carries the next value
            warmups = -int(repr(manager.warmup_node_counter).split("(")[1].split(",")[0]) - 1
    return {
        "recorded_graphs": recorded,
        "warmup_runs": warmups,
        "unique_graphs": counters["stats"]["unique_graphs"],
        "graph_breaks": sum(counters["graph_break"].values()),
        **{k: v for k, v in counters["inductor"].items() if "cudagraph" in k},
    }


def profiled_steps(step, steps: int) -> dict:
    """`step()` run `steps` times under torch's profiler (CUDA kernels only), summarized by
    `profile_summary`."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    return profile_summary(prof.key_averages(), steps)


def traced_step(step, path: str | None, device, keep: bool = True) -> dict | None:
    """One `step()` (a whole training step) under torch's profiler, host and device; with `keep`,
    the chrome trace written to `path` (gzip) where given, and its `timeline_summary` (None without:
    a rank that only takes part in the step)."""
    import gzip
    import tempfile

    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize(device)
    if not keep:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        raw = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(raw)
        with open(raw, "rb") as f:
            data = f.read()
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with gzip.open(path, "wb") as f:
            f.write(data)
    return timeline_summary(json.loads(data))


_DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


def timeline_summary(trace: dict, top: int = 8, gap_us: float = 20.0) -> dict:
    """Where a traced step's device was idle and what the host was doing then, from a chrome trace
    of torch's profiler (`traceEvents`: device events of categories kernel, gpu_memcpy and gpu_memset;
    host events cpu_op, and cuda_runtime and cuda_driver calls linked to the device's by
    `args.correlation`).

    The device's busy time is the union of its events over every stream; a gap is a stretch of
    `gap_us` or more with nothing running. Each of the `top` longest gaps is reported with the
    device work that ended it and where the host was when it launched that work (the innermost
    host ops around the launch): a gap whose launch came late is the host's, one whose launch came
    early is a wait on the device (another rank, a stream join). The host's time in CUDA's calls
    (`host_calls`: a graph's launch, a kernel's, a synchronization) comes with them."""
    events = trace.get("traceEvents", [])
    device = sorted(
        (e for e in events if e.get("cat") in _DEVICE_CATEGORIES and e.get("dur") is not None),
        key=lambda e: e["ts"],
    )
    if not device:
        return {
            "span_ms": 0.0,
            "busy_ms": 0.0,
            "idle_ms": 0.0,
            "gaps_over_us": gap_us,
            "gap_count": 0,
            "gap_ms": 0.0,
            "gaps": [],
            "host_calls": [],
        }
    launches, calls = {}, {}  # CUDA calls by correlation (those that launch device work), totals by name
    for e in events:
        if e.get("cat") not in ("cuda_runtime", "cuda_driver"):
            continue
        if "correlation" in e.get("args", {}):
            launches[e["args"]["correlation"]] = e
        if e.get("dur") is not None:
            total = calls.setdefault(e["name"], [0, 0.0])
            total[0] += 1
            total[1] += e["dur"]
    ops = sorted(
        (e for e in events if e.get("cat") == "cpu_op" and e.get("dur") is not None), key=lambda e: e["ts"]
    )
    start, end = device[0]["ts"], max(e["ts"] + e["dur"] for e in device)
    busy, gaps, reach = 0.0, [], start
    for e in device:
        if e["ts"] - reach >= gap_us:
            gaps.append((e["ts"] - reach, reach, e))
        lo, hi = max(e["ts"], reach), e["ts"] + e["dur"]
        if hi > lo:
            busy += hi - lo
        reach = max(reach, hi)
    gaps.sort(key=lambda g: -g[0])

    def host_at(launch) -> str:
        inside = [
            o
            for o in ops
            if o.get("tid") == launch.get("tid") and o["ts"] <= launch["ts"] <= o["ts"] + o["dur"]
        ]
        inside.sort(key=lambda o: o["dur"])  # innermost first
        return " < ".join(o["name"][:60] for o in inside[:3]) or "(no op)"

    reported = []
    for length, at, after in gaps[:top]:
        launch = launches.get(after.get("args", {}).get("correlation"))
        reported.append(
            {
                "at_ms": (at - start) / 1e3,
                "us": length,
                "next": after["name"][:80],
                # the launch's time after the gap opened: near the gap's length, the host was late
                "launched_us_into_gap": None if launch is None else launch["ts"] - at,
                "host": None if launch is None else host_at(launch),
            }
        )
    return {
        "span_ms": (end - start) / 1e3,
        "busy_ms": busy / 1e3,
        "idle_ms": (end - start - busy) / 1e3,
        "gaps_over_us": gap_us,
        "gap_count": len(gaps),
        "gap_ms": sum(g[0] for g in gaps) / 1e3,
        "gaps": reported,
        # the host's time in CUDA's runtime and driver calls, by call, the costliest first (µs a step)
        "host_calls": [
            {"call": name, "calls": n, "us": us}
            for name, (n, us) in sorted(calls.items(), key=lambda c: -c[1][1])[:top]
        ],
    }


# --- one variant -----------------------------------------------------------------------------------------------


def _not_here(variant: str, device) -> str | None:
    if device.type == "cuda":
        return None
    if variant == "async-tp":
        return "not possible on the CPU: torch's micro-pipeline pass fuses into its CUDA symmetric-memory ops"
    if variant.endswith("-graphs"):
        return "not possible on the CPU: mode='reduce-overhead' replays CUDA graphs"
    return None


def run_variant(variant: str, args, spec, mesh, device, dtype, batches, launch: str = "auto") -> dict:
    import torch
    import torch._dynamo
    import torch._inductor.config
    import torch.distributed as dist

    name = variant if launch == "auto" else f"{variant}/{launch}"
    skipped = _not_here(variant, device)
    if skipped:
        return {"variant": name, "skipped": skipped}
    ours = variant.startswith("syncopate")
    if ours and device.type == "cuda":
        import syncopate

        syncopate.set_launch(launch)  # on every rank; also drops the choices of the variant before
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    inductor = torch._inductor.config
    pipeline = inductor._micro_pipeline_tp
    ops_mode = None
    if variant == "syncopate-graphs":  # reduce-overhead's first runs are its warm-up: prepare graph configs
        import syncopate

        ops_mode = syncopate.get_mode()
        syncopate.set_mode("graph")
    try:
        model = parallelize(
            build_model(spec, args.layers, args.vocab, device, dtype, args.seed),
            mesh,
            "syncopate" if ours else "torch",
            loss_parallel=args.loss_parallel,
        )
        if variant == "async-tp":
            from syncopate.kernels.context import enable_symm_mem

            enable_symm_mem(mesh.get_group().group_name)
            inductor._micro_pipeline_tp = True
        if variant not in ("torch", "syncopate"):
            mode = "reduce-overhead" if variant.endswith("-graphs") else None
            for layer in model.model.layers:
                layer.compile(mode=mode, backend=args.backend)
        opt = torch.optim.AdamW(
            model.parameters(),
            lr=args.lr,
            **({"fused": True} if args.optimizer == "fused" else {"foreach": args.optimizer == "foreach"}),
        )
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        positions = torch.arange(batches[0][0].shape[1], device=device).unsqueeze(0)

        def train(inputs, labels):
            """One training step, as timed: forward and backward, the optimizer's step; the loss."""
            loss = forward_backward(model, inputs, labels, positions, args.loss_parallel)
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss

        losses, times, enqueued, busy, graphs = [], [], [], [], []
        for inputs, labels in batches:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            dist.barrier()
            start, cpu = time.perf_counter(), time.process_time()
            loss = train(inputs, labels)
            enqueued.append(time.perf_counter() - start)
            busy.append(time.process_time() - cpu)
            losses.append(loss.item())
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - start)
            graphs.append(cudagraph_state(device))
        mine = torch.tensor([times, enqueued, busy], dtype=torch.float64, device=device)
        ranks = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
        dist.all_gather(ranks, mine)
        slowest = torch.stack(ranks)[:, 0].amax(0)
        peak = torch.tensor(
            [torch.cuda.max_memory_allocated(device) if device.type == "cuda" else -1],
            dtype=torch.float64,
            device=device,
        )
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
        timed = slowest.tolist()[args.warmup :]
        median = statistics.median(timed)
        profiled = None
        if args.profile and device.type == "cuda":
            inputs, labels = batches[-1]

            def step():
                forward_backward(model, inputs, labels, positions, args.loss_parallel)
                opt.zero_grad(set_to_none=True)

            profiled = profiled_steps(step, args.profile)
        timeline = None
        if args.trace and device.type == "cuda":
            path = os.path.join(args.trace, f"trace-{name.replace('/', '-')}.json.gz")
            timeline = traced_step(lambda: train(*batches[-1]), path, device, keep=dist.get_rank() == 0)
        host = None
        if args.host_profile:
            host = host_profiled_steps(
                lambda: train(*batches[-1]), args.host_profile, device
            )  # every rank alike
            host = host if dist.get_rank() == 0 else None
        return {
            "variant": name,
            **(
                {"launch": launch, "launch_choices": syncopate.launch_choices()}
                if ours and device.type == "cuda"
                else {}
            ),
            **({"profile": profiled} if profiled else {}),
            **({"host_profile": host} if host else {}),
            **({"timeline": timeline} if timeline else {}),
            "step_ms": median * 1e3,
            "step_ms_all": [t * 1e3 for t in slowest.tolist()],
            # each rank's steps and the host's time to enqueue each (to the optimizer's zero_grad,
            # before the loss is read): a step whose enqueue takes about as long as the step is host-bound
            "step_ms_by_rank": [[t * 1e3 for t in r[0].tolist()] for r in ranks],
            "enqueue_ms_by_rank": [[t * 1e3 for t in r[1].tolist()] for r in ranks],
            # the process's CPU time over the same span (every thread's: autograd's backward runs on its
            # own): well below the enqueue's wall time, the host waited (a synchronization, a full
            # launch queue) rather than worked
            "enqueue_cpu_ms_by_rank": [[t * 1e3 for t in r[2].tolist()] for r in ranks],
            # rank 0's CUDA-graph trees and compile counters after each step (warm-up steps included)
            "cudagraph_by_step": graphs,
            "tokens_per_s": args.tokens / median,
            "peak_bytes": None if peak.item() < 0 else int(peak.item()),
            "losses": losses,
        }
    except Exception as e:  # noqa: BLE001  a variant that fails is reported, the others still run
        log.error("variant %s failed on rank %d:\n%s", variant, dist.get_rank(), traceback.format_exc())
        return {
            "variant": name,
            "failed": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
        }
    finally:
        inductor._micro_pipeline_tp = pipeline
        if ops_mode is not None:
            syncopate.set_mode(ops_mode)
        model = opt = None
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()


# --- a rank ----------------------------------------------------------------------------------------------------


def run_rank(args, device) -> dict | None:
    """Every variant on this rank (the process group formed); the results on rank 0."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from syncopate.models import ModelSpec, model_spec

    world = dist.get_world_size()
    spec = ModelSpec(**TINY) if args.cpu else model_spec(args.model)
    dtype = torch.float32 if args.cpu else torch.bfloat16
    mesh = init_device_mesh(device.type, (world,))
    gen = torch.Generator().manual_seed(args.seed + 1)
    seq = args.tokens // args.batch
    batches = [
        next_tokens(torch.randint(0, args.vocab, (args.batch, seq + 1), generator=gen).to(device))
        for _ in range(args.warmup + args.steps)
    ]
    rows = []
    runs = [(v, launch) for v in args.variants for launch in (args.launch if v in _LAUNCHED else ["auto"])]
    for v, launch in runs:
        if dist.get_rank() == 0:
            log.info("variant %s%s ...", v, "" if launch == "auto" else f", launch {launch}")
        rows.append(run_variant(v, args, spec, mesh, device, dtype, batches, launch))
        if dist.get_rank() == 0 and args.json:
            # what has run so far, so that a run stopped at a time limit keeps its finished variants
            write_json(args.json, result_of(args, spec, world, seq, dtype, device, rows))
    if device.type == "cuda":
        from syncopate import close_contexts

        close_contexts()
    if dist.get_rank() != 0:
        return None
    return result_of(args, spec, world, seq, dtype, device, rows)


def result_of(args, spec, world: int, seq: int, dtype, device, rows: list[dict]) -> dict:
    """The run's result from the variants' rows so far: each variant's loss curve set against
    torch's TP (`torch`, else `torch-compiled`, else `torch-graphs`: the first of them that ran,
    `loss_reference`), the model, the plan and the environment."""
    import torch
    import transformers

    ran = {r["variant"]: r for r in rows if "losses" in r}
    reference = next((v for v in TORCH_TP if v in ran), None)
    for r in ran.values():
        if reference is not None:
            r["max_loss_diff_vs_torch"] = max(
                abs(a - b) for a, b in zip(r["losses"], ran[reference]["losses"])
            )
    return {
        "loss_reference": reference,
        "model": {**spec.to_dict(), "layers": args.layers, "vocab": args.vocab},
        "world": world,
        "tokens": args.tokens,
        "batch": args.batch,
        "sequence": seq,
        "dtype": str(dtype),
        "steps": args.steps,
        "warmup": args.warmup,
        "lr": args.lr,
        "optimizer": args.optimizer,
        "seed": args.seed,
        "backend": args.backend,
        "loss_parallel": args.loss_parallel,
        "configurations": _configurations(),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "triton": _version("triton"),
        },
        "git": _git(),
        "variants": rows,
    }


def write_json(path: str, result: dict) -> None:
    """`result` into `path` whole (`syncopate.files.write_atomically`)."""
    from syncopate.files import write_atomically

    write_atomically(Path(path), json.dumps(result, indent=2).encode())


def _configurations() -> str:
    """Where the fused ops' configurations came from: the results database `lookup` read
    (SYNCOPATE_DB, its file name), or the per-user default database."""
    from syncopate.results_db.urls import ENV_VAR

    db = os.environ.get(ENV_VAR)
    return f"lookup on {os.path.basename(db.split('///')[-1]) if db else 'the per-user default database'}"


def _version(name: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:  # noqa: BLE001
        return None


def _git() -> str | None:
    try:
        from syncopate.environment import git_revision

        return git_revision()
    except Exception:  # noqa: BLE001
        return None


def _cpu_rank(rank: int, world: int, port: int, args, queue) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        result = run_rank(args, torch.device("cpu"))
        if result is not None:
            queue.put(result)
    finally:
        dist.destroy_process_group()


def _run_cpu(args) -> dict:
    import torch.multiprocessing as mp

    from syncopate.measure.local_ranks import free_port

    port = free_port()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [
        ctx.Process(target=_cpu_rank, args=(r, args.world, port, args, queue)) for r in range(args.world)
    ]
    for p in procs:
        p.start()
    try:
        while True:
            try:
                return queue.get(timeout=5)
            except Exception:  # noqa: BLE001  (queue.Empty)
                if any(p.exitcode not in (None, 0) for p in procs):
                    raise SystemExit("a rank failed; see its output above") from None
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()


# --- the table -------------------------------------------------------------------------------------------------


_LOSS_PLANS = {
    True: "loss parallel (logits sharded on the vocabulary)",
    False: "logits replicated (all-gathered, loss on every rank)",
}
"""The loss plan as the table's header says it; a result without `loss_parallel` (written before the
field was) ran with the logits replicated."""


def table(result: dict) -> str:
    m = result["model"]
    lines = [
        (
            f"{m['name']} widths (hidden {m['hidden']}, ffn {m['ffn']}, {m['heads']} heads, {m['kv_heads']} kv "
            f"heads), {m['layers']} layers, vocab {m['vocab']}; TP={result['world']} on {result['device']}, "
            f"{result['tokens']} tokens a step ({result['batch']} × {result['sequence']}), {result['dtype']}; "
            f"{_LOSS_PLANS[result.get('loss_parallel', False)]}; "
            f"median of {result['steps']} steps after {result['warmup']}; torch {result['versions']['torch']}, "
            f"transformers {result['versions']['transformers']}"
        ),
        f"{'variant':<20} {'step ms':>10} {'enqueue ms':>10} {'enqueue cpu':>11} {'tokens/s':>12} {'peak GiB':>9} "
        f"{'max |Δloss|':>12} {'torch TP/':>10} {'async-TP/':>10}  note",
    ]
    ms = {r["variant"]: r["step_ms"] for r in result["variants"] if r.get("step_ms")}
    torch_tp = min((ms[v] for v in TORCH_TP if v in ms), default=None)
    async_tp = ms.get("async-tp")

    def over(base, step) -> str:
        return "–" if base is None else f"{base / step:.3f}"

    for r in result["variants"]:
        if "step_ms" not in r:
            lines.append(
                f"{r['variant']:<20} {'–':>10} {'–':>10} {'–':>11} {'–':>12} {'–':>9} {'–':>12}  "
                f"{r.get('skipped') or r.get('failed')}"
            )
            continue
        peak = "–" if r["peak_bytes"] is None else f"{r['peak_bytes'] / 2**30:.2f}"
        diff = r.get("max_loss_diff_vs_torch")
        lines.append(
            f"{r['variant']:<20} {r['step_ms']:>10.2f} {_enqueue_ms(r, result['warmup']):>10} "
            f"{_enqueue_ms(r, result['warmup'], 'enqueue_cpu_ms_by_rank'):>11} "
            f"{r['tokens_per_s']:>12.0f} {peak:>9} "
            f"{'–' if diff is None else f'{diff:.2e}':>12} {over(torch_tp, r['step_ms']):>10} "
            f"{over(async_tp, r['step_ms']):>10}  {_launch_note(r)}".rstrip()
        )
    for r in result["variants"]:
        states = r.get("cudagraph_by_step") or []
        if len(states) > result["warmup"] and states[-1]["recorded_graphs"] + states[-1]["warmup_runs"]:
            lines.append(f"{r['variant']}: {cudagraph_growth(states, result['warmup'])}")
    lines.append(
        "enqueue ms: the host's time to enqueue a step (the slowest rank's, median); enqueue cpu: the process's "
        "CPU time over it (the same rank and step); torch TP/, async-TP/: the step of torch's fastest TP "
        "variant (eager, compiled or graphs), of async-TP, over this one's"
    )
    return "\n".join(lines)


def cudagraph_growth(states: list[dict], warmup: int) -> str:
    """The CUDA-graph trees after the warm-up steps and what grew over the timed ones (rank 0)."""
    before, after = states[warmup - 1] if warmup else {}, states[-1]
    grown = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
    held = ", ".join(f"{k} {v}" for k, v in after.items() if v)
    return f"CUDA graphs and compiles {held}; over the timed steps " + (
        ", ".join(f"{k} +{v}" for k, v in grown.items()) if grown else "nothing new (every step replayed)"
    )


def _enqueue_ms(row: dict, warmup: int, key: str = "enqueue_ms_by_rank") -> str:
    """The median over the timed steps of the slowest rank's host time to enqueue the step; with
    `key` another per-rank series (the enqueue's CPU time), taken at that same rank each step."""
    walls, series = row.get("enqueue_ms_by_rank"), row.get(key)
    if not walls or not series:
        return "–"
    steps = list(zip(*walls))[warmup:]
    values = list(zip(*series))[warmup:]
    return f"{statistics.median(v[max(range(len(w)), key=w.__getitem__)] for w, v in zip(steps, values)):.2f}"


def _launch_note(row: dict) -> str:
    """How the variant's fused calls outside graphs were launched, where it says."""
    choices = row.get("launch_choices")
    if not choices or not any(choices.values()):
        return ""
    return f"launch {row['launch']}: " + ", ".join(f"{n} {what}" for what, n in choices.items() if n)


def host_profile_table(result: dict, top: int = 12) -> str:
    """`--host-profile`'s rank 0 host time a step of each profiled variant and its `top` functions
    by own time; empty when no variant was."""
    profiled = [r for r in result["variants"] if r.get("host_profile")]
    lines = []
    for r in profiled:
        h = r["host_profile"]
        lines.append(
            f"host a step of {r['variant']} (rank 0, {h['steps']} steps under cProfile): wall {h['wall_ms']:.2f} ms, "
            f"CPU {h['cpu_ms']:.2f} ms; functions by own ms a step (calls a step, cumulative ms):"
        )
        for f in h["top"][:top]:
            lines.append(
                f"  {f['own_ms']:>9.3f} {f['calls']:>7.0f} {f['cumulative_ms']:>9.3f}  {f['function'][:100]}"
            )
        for sync in h.get("syncs", []):
            lines.append(
                f"  the host waited for the device {sync['calls']:g} times a step at {sync['where']}"
            )
    return "\n".join(lines)


def timeline_table(result: dict) -> str:
    """`--trace`'s traced step of each variant: the device's span, busy and idle time, and its
    longest idle gaps with the host's place at the launch that ended each; empty when none was traced."""
    lines = []
    for r in result["variants"]:
        t = r.get("timeline")
        if not t:
            continue
        lines.append(
            f"traced step of {r['variant']} (rank 0): device span {t['span_ms']:.2f} ms, busy {t['busy_ms']:.2f}, "
            f"idle {t['idle_ms']:.2f} ({t['gap_count']} gaps of {t['gaps_over_us']:g} µs or more: "
            f"{t['gap_ms']:.2f} ms); longest gaps (at ms, µs, launched µs into the gap, next, host at launch):"
        )
        for g in t["gaps"]:
            late = "–" if g["launched_us_into_gap"] is None else f"{g['launched_us_into_gap']:.0f}"
            lines.append(
                f"  {g['at_ms']:8.2f} {g['us']:8.0f} {late:>8}  {g['next'][:50]:<50}  {g['host'] or '–'}"
            )
    return "\n".join(lines)


def profile_table(result: dict) -> str:
    """`--profile`'s GPU time a step by kernel category, a column per profiled variant (ms), then
    each one's top kernels; empty when no variant was profiled."""
    profiled = [r for r in result["variants"] if r.get("profile")]
    if not profiled:
        return ""
    categories = list(dict.fromkeys(c for r in profiled for c in r["profile"]["category_us"]))
    lines = [
        "GPU time a step by kernel category, rank 0, ms (kernels of several streams overlap):",
        f"{'category':<12} " + " ".join(f"{r['variant']:>20}" for r in profiled),
    ]
    for c in categories:
        cells = (r["profile"]["category_us"].get(c, 0.0) / 1e3 for r in profiled)
        lines.append(f"{c:<12} " + " ".join(f"{v:>20.2f}" for v in cells))
    for r in profiled:
        lines.append(f"top kernels of {r['variant']} (ms a step, calls a step):")
        for k in r["profile"]["top"]:
            lines.append(f"  {k['us'] / 1e3:8.3f} {k['calls']:>4}  {k['category']:<10} {k['kernel'][:90]}")
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    """The command line, its defaults filled in for the CPU or the GPUs; one that cannot run (a world
    under 2, tokens that do not split into the ranks' sequence blocks, no torchrun) is refused, exit 2."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu", action="store_true", help="gloo on the CPU, tiny widths, --world processes")
    p.add_argument("--world", type=int, default=2, help="with --cpu: ranks (torchrun's otherwise)")
    p.add_argument("--model", default="llama-3-8b", help="widths from syncopate.models (not with --cpu)")
    p.add_argument("--layers", type=int, default=None, help="decoder layers (default 4; 2 with --cpu)")
    p.add_argument("--vocab", type=int, default=None, help="vocabulary (default the model's; 256 with --cpu)")
    p.add_argument(
        "--tokens",
        type=int,
        default=None,
        help="tokens a step, batch × sequence (default 8192; 256 with --cpu)",
    )
    p.add_argument(
        "--batch", type=int, default=1, help="sequences a step (folded into the sequence is fastest)"
    )
    p.add_argument("--steps", type=int, default=None, help="timed steps (default 20; 4 with --cpu)")
    p.add_argument("--warmup", type=int, default=None, help="steps before them (default 5; 2 with --cpu)")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    p.add_argument(
        "--loss-parallel",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="lm_head's logits sharded on the vocabulary and the loss computed on the shards, torchtitan's "
        "default; --no-loss-parallel all-gathers the logits and computes the loss on every rank whole",
    )
    p.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="STEPS",
        help="after the timed steps, profile STEPS more (no optimizer step) and report rank 0's GPU time a step "
        "by kernel category and its top kernels (CUDA only)",
    )
    p.add_argument(
        "--host-profile",
        type=int,
        default=0,
        metavar="STEPS",
        help="after the timed steps, run STEPS more whole steps under cProfile and report rank 0's host wall and "
        "CPU time a step and the functions with the most own time",
    )
    p.add_argument(
        "--trace",
        default=None,
        metavar="DIR",
        help="after the timed steps, trace one more whole step (host and device) and write rank 0's chrome "
        "trace to DIR/trace-VARIANT.json.gz; the table reports the device's idle gaps and where the host was "
        "(CUDA only)",
    )
    p.add_argument(
        "--launch",
        nargs="+",
        default=["auto"],
        choices=("auto", "direct", "graph"),
        help="how syncopate and syncopate-compiled launch the fused calls (syncopate.set_launch), each variant "
        "once per value given; rows of another than auto are named VARIANT/LAUNCH",
    )
    p.add_argument("--backend", default="inductor", help="torch.compile backend of the compiled variants")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument(
        "--optimizer",
        choices=("fused", "foreach", "for-loop"),
        default="fused",
        help="AdamW's implementation (torchtitan's default is fused: one kernel a parameter group, the "
        "least host time a step)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args(argv)
    cpu = args.cpu
    args.layers = args.layers or (TINY["layers"] if cpu else 4)
    args.tokens = args.tokens or (256 if cpu else 8192)
    args.steps = args.steps or (4 if cpu else 20)
    args.warmup = args.warmup if args.warmup is not None else (2 if cpu else 5)
    if args.vocab is None:
        from syncopate.models import model_spec

        args.vocab = TINY["vocab"] if cpu else model_spec(args.model).vocab
    world = args.world if cpu else int(os.environ.get("WORLD_SIZE", "0"))
    if not cpu and not world:
        p.error("run it under torchrun (one process a GPU), or with --cpu --world N")
    if world < 2:
        p.error(f"world size {world}: tensor parallelism needs at least 2 ranks")
    if args.tokens % args.batch or (args.tokens // args.batch) % world:
        p.error(
            f"--tokens {args.tokens} must be --batch {args.batch} sequences of a length divisible by {world}"
        )
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    cpu = args.cpu
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if cpu:
        result = _run_cpu(args)
    else:
        import torch.distributed as dist

        from syncopate.measure.local_ranks import join_torchrun

        device = join_torchrun()
        try:
            result = run_rank(args, device)
        finally:
            dist.destroy_process_group()
        if result is None:
            return 0
    print(table(result))
    profiles = profile_table(result)
    if profiles:
        print(profiles)
    for text in (host_profile_table(result), timeline_table(result)):
        if text:
            print(text)
    if args.json:  # run_rank wrote it after the last variant
        print(f"written: {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
