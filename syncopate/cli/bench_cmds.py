"""`syncopate bench`: the fused ops against torch's paths and the overlap bound, on the GPUs at hand."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from syncopate.cli import app
from syncopate.errors import ConfigError, RuntimeUnavailableError

if TYPE_CHECKING:
    from syncopate.search_space import Topology


def bench_world_size(
    topology: Topology | None, gpus: int | None, visible: int, suite: Path | None = None
) -> int:
    """How many GPUs (one process each) `syncopate bench` runs on: the suite's topology's world size
    where the suite names one, else `--gpus`, else every visible GPU. Raises ConfigError where
    `--gpus` contradicts the topology, and RuntimeUnavailableError where this host has fewer GPUs
    than that; both messages name the count needed and the count visible."""
    if topology is not None:
        need = topology.world_size
        if topology.nodes > 1:
            raise ConfigError(
                f"suite {suite} runs on topology {topology.key()} ({topology.nodes} nodes): syncopate bench "
                f"runs on one host; tune it with `syncopate tune {suite}` on a Ray cluster"
            )
        if gpus is not None and gpus != need:
            raise ConfigError(
                f"--gpus {gpus} contradicts suite {suite}: its topology {topology.key()} has world size "
                f"{need}; leave out --gpus"
            )
        if visible < need:
            raise RuntimeUnavailableError(
                f"suite {suite} needs {need} CUDA GPUs on this host (topology {topology.key()}, world size "
                f"{need}); {visible} visible. Run it on a host with {need} GPUs, or let the cost model "
                f"predict it: `syncopate tune {suite} --runner model`"
            )
        return need
    if gpus is not None and gpus < 2:
        raise ConfigError(f"--gpus {gpus}: syncopate bench needs at least 2 GPUs (one process each)")
    if gpus is None and visible < 2:
        raise RuntimeUnavailableError(
            f"syncopate bench needs at least 2 CUDA GPUs on this host; {visible} visible"
        )
    if gpus is not None and visible < gpus:
        raise RuntimeUnavailableError(
            f"syncopate bench --gpus {gpus} needs {gpus} CUDA GPUs on this host; {visible} visible"
        )
    return gpus or visible


@app.command("bench")
def bench_cmd(
    kind: str = typer.Argument(
        None, help="ag_gemm, gemm_rs or gemm_ar (with --m/--n/--k), or omit with --suite."
    ),
    m: int = typer.Option(None, help="Global M."),
    n: int = typer.Option(None, help="Global N."),
    k: int = typer.Option(None, help="Global K."),
    dtype: str = typer.Option(
        None,
        help="bf16 (the default), fp16, fp32 or fp8 (e4m3 operands, bf16 output); with --layer, bf16 or fp8 "
        "(every GEMM of the layer in FP8, scaled row-wise, on every implementation).",
    ),
    suite: Path = typer.Option(
        None, help="A sweep config whose workloads to benchmark (e.g. configs/llama_tp2.yaml)."
    ),
    kinds: str = typer.Option(None, help="With --suite: only these kinds, comma-separated."),
    backends: str = typer.Option(
        None,
        help=(
            "Backends to try, comma-separated (default: copy_engine,sm_copy,nccl; nvshmem runs every rank with "
            "NVSHMEM symmetric memory, without the torch async-TP baseline)."
        ),
    ),
    grid: str = typer.Option("small", help="Candidate grid per backend: small or tiny."),
    repetitions: int = typer.Option(20, min=1, help="Timed repetitions per measurement."),
    warmup: int = typer.Option(5, min=0, help="Untimed calls first."),
    json_out: Path = typer.Option(
        None,
        "--json",
        help="Write every number to this JSON file (replaced atomically; its folder must exist).",
    ),
    gpus: int = typer.Option(
        None, help="GPUs to use (default: the suite's topology's world size, else all visible)."
    ),
    layer: str = typer.Option(
        None,
        help="Time a tensor-parallel layer instead of ops: mlp or attention (with --hidden, --ffn, --tokens, "
        "--tp), against torch's path and async-TP, eager and in CUDA graphs.",
    ),
    model: str = typer.Option(
        None,
        help="A known model name (such as llama-3-8b or qwen3-14b) or a Hugging Face config.json: with --layer, "
        "its widths instead of --hidden/--ffn/--heads/--kv-heads; without, benchmark every fused op of its "
        "decoder layer, forward and backward, at --tokens on --tp GPUs (what `syncopate tune --model` tunes).",
    ),
    hidden: int = typer.Option(4096, help="With --layer: the model width."),
    ffn: int = typer.Option(14336, help="With --layer mlp: the MLP width (gate and up each)."),
    heads: int = typer.Option(32, help="With --layer attention: query heads."),
    kv_heads: int = typer.Option(8, help="With --layer attention: key/value heads."),
    tokens: int = typer.Option(8192, help="With --layer or --model: tokens of the whole layer (the ops' M)."),
    tp: int = typer.Option(
        None,
        help="With --layer: tensor-parallel ranks (default: every visible GPU); with --model alone: required.",
    ),
    sequence_parallel: bool = typer.Option(
        True,
        "--sp/--no-sp",
        help="With --layer: sequence parallel (all-gather, reduce-scatter) or not (all-reduce).",
    ),
    launch: str = typer.Option(
        "auto",
        help="With --layer: how Syncopate's eager calls are launched: auto (replayed where the host is on "
        "the path), graph (always replayed) or direct; or several, comma-separated (auto,graph,direct): the "
        "layer runs with the first as asked, then eagerly with torch and ours under each other launch, and a "
        "table sets the launches side by side.",
    ),
    impls: str = typer.Option(
        None,
        help="With --layer: the implementations to time, comma-separated (default all: "
        "torch,async_tp,syncopate,default,bound).",
    ),
    profile: Path = typer.Option(
        None,
        help="With --layer: write a profiler trace of each implementation's eager forward + backward to this "
        "folder and print where each spends its device time.",
    ),
) -> None:
    """Time torch_seq, torch async-TP, GEMM alone, collective alone, the bound and the best candidate per backend.

    With --layer: a tensor-parallel layer forward and forward + backward, eager and in CUDA graphs,
    Syncopate (configurations from lookup, and the untuned defaults) against torch and async-TP."""

    op_options = (("KIND", kind), ("--m", m), ("--n", n), ("--k", k), ("--suite", suite))
    if layer is not None:
        _refuse_given(
            op_options,
            "--layer exclude each other: --layer times a layer of the widths --hidden/--ffn/--heads and "
            "--tokens; give either",
        )
        if model is not None:
            from syncopate.models import model_spec

            spec = model_spec(model)
            hidden, ffn, heads, kv_heads, head_dim = (
                spec.hidden,
                spec.ffn,
                spec.heads,
                spec.kv_heads,
                spec.head_dim,
            )
        else:
            head_dim = 0
        _bench_layer(
            layer,
            hidden,
            ffn,
            heads,
            kv_heads,
            head_dim,
            tokens,
            tp,
            sequence_parallel,
            repetitions,
            json_out,
            profile,
            launch,
            impls,
            dtype,
        )
        return
    from syncopate.autotuner.sweep import load_sweep
    from syncopate.search_space import (
        BACKENDS,
        DEFAULT_BACKENDS,
        GRIDS,
        KINDS,
        Shape,
        Workload,
        unknown_backend,
    )
    from syncopate.search_space.workload import kind_refusal

    topology = None
    if model is not None:  # the ops of the model's decoder layer, forward and backward
        _refuse_given(
            op_options,
            "--model exclude each other: --model benchmarks the ops of the model's decoder layer at "
            "--tokens and --tp; give either",
        )
        workloads = model_workloads(model, tp, tokens, sequence_parallel, dtype)
        if gpus is not None and gpus != tp:
            raise ConfigError(
                f"--gpus {gpus} contradicts --tp {tp}: the model's ops run on --tp GPUs; leave out --gpus"
            )
    elif suite is not None:
        _refuse_given(
            (*op_options[:4], ("--dtype", dtype)),
            "--suite exclude each other: the suite's workloads are benchmarked (narrow them with --kinds); "
            "give either KIND --m --n --k, or --suite CONFIG",
        )
        sweep = load_sweep(suite)
        workloads = list(sweep.workloads)
        topology = None if sweep.detect_topology else sweep.topology()
        if kinds:
            wanted = [x.strip() for x in kinds.split(",")]
            for x in wanted:
                if x not in KINDS:
                    raise ConfigError(f"--kinds: {kind_refusal(x)}")
            workloads = [w for w in workloads if w.kind in wanted]
            if not workloads:
                raise ConfigError(
                    f"suite {suite} has no workload of kind {kinds}: it has "
                    f"{', '.join(sorted({w.kind for w in sweep.workloads}))}"
                )
    else:
        if kinds:
            raise ConfigError("--kinds narrows a suite: give it with --suite CONFIG")
        if kind is None or None in (m, n, k):
            raise ConfigError("give KIND with --m, --n and --k, or --suite CONFIG")
        workloads = [Workload(kind=kind, shape=Shape(m=m, n=n, k=k), dtype=dtype or "bf16")]
    chosen = tuple(x.strip() for x in backends.split(",")) if backends else DEFAULT_BACKENDS
    for b in chosen:
        if b not in BACKENDS:
            raise ConfigError(unknown_backend(b, " in --backends"))
    if grid not in GRIDS:
        raise ConfigError(f"unknown grid {grid!r}: accepted are {', '.join(GRIDS)}")
    if json_out is not None:
        from syncopate.files import check_writable

        check_writable(json_out, "bench.json")  # before the GPUs are measured, not after
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if model is not None and count < tp:
        raise RuntimeUnavailableError(
            f"syncopate bench --model {model} --tp {tp} needs {tp} CUDA GPUs on this host; {count} visible. "
            f"Run it on a host with {tp} GPUs, or let the cost model predict the ops: "
            f"`syncopate tune --model {model} --tp {tp} --tokens {tokens} --runner model`"
        )
    world = tp if model is not None else bench_world_size(topology, gpus, count, suite)
    for w in workloads:
        w.check_world_size(world)
    from syncopate.measure.bench import BenchOptions, format_layer_totals, format_table, run_bench

    result = run_bench(
        BenchOptions(
            workloads=workloads,
            out_json=json_out,
            warmup=warmup,
            repetitions=repetitions,
            grid=grid,
            backends=chosen,
        ),
        world,
    )
    print(
        f"\n{result['gpu']} x{world} on {result['host']}, torch {result['torch']}, {result['date']} (times in us)"
    )
    print(format_table(result))
    if model is not None:
        totals = format_layer_totals(result)
        if totals:
            print(totals)


def _refuse_given(options, rest: str) -> None:
    """ConfigError "<the given ones> and <rest>" where any of `options` ((name, value) pairs) was given."""
    given = [name for name, value in options if value is not None]
    if given:
        raise ConfigError(f"{', '.join(given)} and {rest}")


def model_workloads(
    model: str, tp: int | None, tokens: int, sequence_parallel: bool, dtype: str | None
) -> list:
    """The distinct workloads of one decoder layer of `model` (a known name or a config.json path),
    forward and backward, under `tp` ranks at `tokens` tokens a step, in `dtype` (bf16 by default):
    the ops `syncopate tune --model` derives."""
    from syncopate.models import layer_ops, model_spec
    from syncopate.search_space import canonical_dtype

    if tp is None:
        raise ConfigError("--model without --layer benchmarks the ops of its decoder layer: give --tp N")
    calls = layer_ops(
        model_spec(model),
        tp,
        tokens,
        sequence_parallel=sequence_parallel,
        dtype="bf16" if dtype is None else canonical_dtype(dtype),
    )
    return list(dict.fromkeys(c.workload for c in calls))


def _bench_layer(
    layer,
    hidden,
    ffn,
    heads,
    kv_heads,
    head_dim,
    tokens,
    tp,
    sequence_parallel,
    repetitions,
    json_out,
    profile,
    launch="auto",
    impls=None,
    dtype=None,
) -> None:
    import json

    from syncopate.search_space import canonical_dtype
    from syncopate.tp.bench import (
        LayerBench,
        format_launch,
        format_launches,
        format_layer_table,
        format_profile,
    )

    dtype = "bf16" if dtype is None else canonical_dtype(dtype)
    launches = _launches(launch)

    if json_out is not None:
        from syncopate.files import check_writable

        check_writable(json_out, "bench.json")
    import torch

    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    bench = LayerBench(
        layer=layer,
        hidden=hidden,
        ffn=ffn,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        tokens=tokens,
        tp=tp or max(visible, 2),
        sequence_parallel=sequence_parallel,
        repetitions=min(repetitions, 7),
        profile_dir=str(profile) if profile is not None else None,
        launch=launches[0],
        dtype=dtype,
        **({"impls": tuple(i.strip() for i in impls.split(",") if i.strip())} if impls else {}),
    )
    if len(launches) > 1 and not {"torch", "syncopate"} <= set(bench.impls):
        raise ConfigError(
            f"--launch {launch}: several launches set Syncopate's eager calls beside torch's under each; "
            f"--impls must include torch and syncopate, got {','.join(bench.impls)}"
        )
    if visible < bench.tp:
        raise RuntimeUnavailableError(
            f"syncopate bench --layer needs {bench.tp} CUDA GPUs on this host (--tp "
            f"{bench.tp}); {visible} visible"
        )
    from syncopate.files import write_atomically
    from syncopate.tp.bench import run_layer_bench

    result = run_layer_bench(bench)
    runs = [result]
    for other in launches[1:]:  # the launch changes only ours' eager calls
        eager = dataclasses.replace(
            bench, launch=other, impls=("torch", "syncopate"), modes=("eager",), profile_dir=None
        )
        runs.append(run_layer_bench(eager))
    if json_out is not None:
        doc = result if len(runs) == 1 else {"runs": runs}
        write_atomically(json_out, json.dumps(doc, indent=1).encode())
    sp = "sequence parallel" if sequence_parallel else "all-reduce"
    print(
        f"\n{layer} hidden {hidden} {'ffn ' + str(ffn) if layer == 'mlp' else f'heads {heads}/{kv_heads}'} "
        f"tokens {tokens} tp {bench.tp} ({sp}, {dtype}); {result['gpu']} on {result['host']}, torch {result['torch']}, "
        f"{result['date']} (us an iteration)"
    )
    print(format_layer_table(result))
    launched = format_launch(result)
    if launched:
        print(f"\neager calls launched ({bench.launch}), rank 0:")
        print(launched)
    if profile is not None:
        print(f"\ndevice time of one eager forward + backward, rank 0 (traces in {profile}):")
        print(format_profile(result))
    if len(runs) > 1:
        print(f"\neager, each launch its own run with torch's path beside it (us an iteration): {launch}")
        print(format_launches(runs))


def _launches(launch: str) -> list[str]:
    """`--launch`'s value as a list of distinct launches (`syncopate.set_launch`'s), checked."""
    from syncopate.kernels.replay import LAUNCHES

    names = [name.strip() for name in str(launch).split(",")]
    bad = [name for name in names if name not in LAUNCHES]
    if bad or len(set(names)) != len(names):
        raise ConfigError(
            f"--launch {launch!r}: give one of {', '.join(LAUNCHES)}, or several of them comma-separated, "
            f"each once"
        )
    return names
