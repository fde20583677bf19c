"""`syncopate tune --model NAME --tp N --tokens T`: tune every fused op a model's tensor-parallel
decoder layer calls, then show the configuration `lookup` will give each. `syncopate tune --layer
mlp|attention [--model NAME | --hidden H --ffn F --heads Q --kv-heads KV] --tp N --tokens T`: the
same for one layer's ops, then, on GPUs, the layer itself timed with what lookup now serves against
torch, async-TP and the untuned defaults (`syncopate bench --layer`), with a line for each mode and
pass where the tuned layer is slower than the defaults or torch.

The ops are those of `syncopate.models.layer_ops` (q/k/v and gate/up merged, o_proj and down, forward
and backward, under sequence parallelism unless --no-sequence-parallel), written as a sweep config
(the schema of configs/*.yaml; kept with --config-out) and tuned by `tune` itself. With
`--runner model` the cost model predicts (no GPU); `lookup` serves measured trials only, so there
every op shows what a job would get without them.

`tune` is defined in tune_cmds.py with a sweep CONFIG; this module extends that command: its CONFIG
becomes optional and these options join it, every other option staying tune's own and passed
through (`extend_tune`, run once the commands are registered).
"""

from __future__ import annotations

import inspect
import logging
import tempfile
import typing
from pathlib import Path

import typer
import yaml
from rich.table import Table

from syncopate.cli import app, console, tune_cmds  # noqa: F401  (tune_cmds registers `tune`, extended here)
from syncopate.errors import ConfigError

__all__ = ["bound_lines", "check_layer", "extend_tune", "layer_verdicts", "model_sweep"]

_OPTIONS = {
    "model": (
        str | None,
        typer.Option(
            None,
            "--model",
            help="Tune the fused ops of this model's tensor-parallel layers instead of a CONFIG: a "
            "known name (llama-3-8b, llama-3-70b, qwen3-8b, qwen3-14b, qwen3-32b) or a Hugging Face config.json.",
        ),
    ),
    "layer": (
        str | None,
        typer.Option(
            None,
            "--layer",
            help="Tune only this layer's ops (mlp or attention), widths from --model or --hidden/--ffn/--heads/"
            "--kv-heads, then time the layer (on GPUs).",
        ),
    ),
    "hidden": (
        int | None,
        typer.Option(None, "--hidden", help="With --layer: the model width (default 4096)."),
    ),
    "ffn": (int | None, typer.Option(None, "--ffn", help="With --layer mlp: the MLP width (default 14336).")),
    "heads": (
        int | None,
        typer.Option(None, "--heads", help="With --layer attention: query heads (default 32)."),
    ),
    "kv_heads": (
        int | None,
        typer.Option(None, "--kv-heads", help="With --layer attention: key/value heads (default 8)."),
    ),
    "tp": (int | None, typer.Option(None, "--tp", help="With --model: the tensor-parallel degree (ranks).")),
    "tokens": (
        int | None,
        typer.Option(
            None,
            "--tokens",
            help="With --model: tokens a step of the tensor-parallel group, batch × sequence "
            "(each op's M; default 8192).",
        ),
    ),
    "sequence_parallel": (
        bool,
        typer.Option(
            True,
            "--sequence-parallel/--no-sequence-parallel",
            help="With --model: the plan's sequence parallelism (all-gather / reduce-scatter ops) or not (all-reduce).",
        ),
    ),
    "dtype": (
        str | None,
        typer.Option(
            None,
            "--dtype",
            help="With --model or --layer: the ops' operands, bf16 (the default) or fp8 (e4m3, row-wise "
            "scales, bf16 out: as syncopate.tp's FP8 layers call them).",
        ),
    ),
    "config_out": (
        Path | None,
        typer.Option(
            None, "--config-out", help="With --model: also keep the derived sweep config in this YAML file."
        ),
    ),
}

_DEFAULT_TOKENS = 8192


def default_topology(tp: int) -> str:
    """The topology `--runner model` predicts for when none is given: H200s, as the suites of
    configs/ (two joined by NVLink, more by NVSwitch)."""
    return f"H200x{tp}-nvlink" if tp == 2 else f"H200x{tp}-nvswitch"


LAYER_PROJECTIONS = {"mlp": ("gate_up", "down"), "attention": ("qkv", "o")}
"""The projections of each layer `--layer` tunes."""


def model_sweep(
    spec,
    tp: int,
    tokens: int,
    *,
    topology: str,
    runner: str,
    sequence_parallel: bool = True,
    layer: str | None = None,
    dtype: str = "bf16",
) -> tuple:
    """(the sweep config's YAML text, the ops it tunes) for `spec` under TP `tp` at `tokens` tokens:
    every op of its decoder layer, or of its `layer` (`mlp` or `attention`) only, on `dtype` operands."""
    from syncopate.models import layer_ops

    calls = layer_ops(spec, tp, tokens, sequence_parallel=sequence_parallel, dtype=dtype)
    if layer is not None:
        calls = [c for c in calls if c.projection in LAYER_PROJECTIONS[layer]]
    shapes: dict[str, list[list[int]]] = {}
    for c in calls:
        s = c.workload.shape
        entry = shapes.setdefault(c.workload.kind, [])
        if [s.m, s.n, s.k] not in entry:
            entry.append([s.m, s.n, s.k])
    sp = "sequence parallelism" if sequence_parallel else "no sequence parallelism"
    part = f"{layer} layer" if layer else "decoder layer"
    data = {
        "name": f"{spec.name.replace('/', '-')}{'-' + layer if layer else ''}-tp{tp}-{tokens}"
        f"{'' if sequence_parallel else '-nosp'}{'' if dtype == 'bf16' else '-' + dtype}",
        "description": f"every fused op of a {spec.name} {part}, forward and backward, at TP={tp} with "
        f"{sp}, {tokens} tokens a step, {dtype} operands",
        "topology": topology,
        "dtype": dtype,
        "tokens": tokens,
        "workloads": [{"kind": kind, "shapes": s} for kind, s in shapes.items()],
        "strategy": {"name": "seeded", "max_trials": 64, "seed": 0},
        "space": {"num_splits": [1, 2, 4, 8]},
        "runner": runner,
        "timing": {"warmup": 5, "repetitions": 20, "deadline_s": 120},
    }
    flag = ("" if sequence_parallel else " --no-sequence-parallel") + (f" --layer {layer}" if layer else "")
    flag += "" if dtype == "bf16" else f" --dtype {dtype}"
    header = [
        f"# Derived by `syncopate tune --model {spec.name} --tp {tp} --tokens {tokens}{flag}`: "
        f"each shape is (M, N, K),",
        "# M the tokens of a step; the op of each projection and pass:",
    ]
    header += [
        f"#   {c.projection:8s} {c.direction:9s} {c.workload.kind} {c.workload.shape.key()}" for c in calls
    ]
    return "\n".join(header) + "\n" + yaml.safe_dump(data, sort_keys=False, default_flow_style=None), calls


def _lookup_table(
    spec,
    tp: int,
    tokens: int,
    calls: list,
    topology: str | None,
    db: str | None,
    layer: str | None = None,
    mode: str = "eager",
) -> Table:
    """What lookup gives each op in `mode`, with the measured time that answer was ranked by: the
    back-to-back eager time in mode eager (device time where the trial has none), device time in
    mode graph."""
    from syncopate.errors import RuntimeUnavailableError
    from syncopate.results_db.lookups import TopologyUndetected, lookup

    quiet = logging.getLogger("syncopate.results_db.lookups")  # the table's match column says it
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    table = Table(
        "projection",
        "pass",
        "kind",
        "shape (MxNxK)",
        "config",
        "match",
        f"measured µs ({mode})",
        title=f"what lookup gives each op of a {spec.name} {layer or 'layer'} at TP={tp}, {tokens} tokens"
        f"{f' on {topology}' if topology else ''}",
    )
    try:
        for c in calls:
            w = c.workload
            r = lookup(w.shape, topology, kind=w.kind, dtype=w.dtype, db=db, mode=mode)
            us = r.eager_us if mode == "eager" and r.eager_us is not None else r.time_us
            table.add_row(
                c.projection,
                c.direction,
                w.kind,
                w.shape.key(),
                r.candidate.short(),
                r.match,
                "–"
                if us is None
                else f"{us:.1f}" + ("" if mode == "graph" or us == r.eager_us else " (device)"),
            )
    except TopologyUndetected as e:
        raise RuntimeUnavailableError(
            f"cannot detect this machine's topology ({e.reason}): pass --topology KEY"
        ) from None
    finally:
        quiet.setLevel(level)
    return table


def extend_tune() -> None:
    """Give the registered `tune` command the options of `_OPTIONS` and the --model path."""
    info = next(c for c in app.registered_commands if c.name == "tune")
    tune = info.callback
    if getattr(tune, "_with_model", False):
        return
    hints = typing.get_type_hints(tune)
    params = []
    for p in inspect.signature(tune).parameters.values():
        annotation, default = hints.get(p.name, p.annotation), p.default
        if p.name == "config":
            annotation = Path | None
            default = typer.Argument(
                None,
                metavar="[CONFIG]",
                help="Sweep config (YAML); or give --model instead.",
                show_default=False,
            )
        params.append(p.replace(annotation=annotation, default=default))
    params += [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=annotation)
        for name, (annotation, option) in _OPTIONS.items()
    ]

    def tune_cmd(**kwargs) -> None:
        extra = {name: kwargs.pop(name) for name in _OPTIONS}
        _tune(tune, kwargs, **extra)

    tune_cmd.__signature__ = inspect.Signature(params)
    tune_cmd.__annotations__ = {p.name: p.annotation for p in params}
    tune_cmd.__doc__ = (
        f"{(tune.__doc__ or '').strip()} Or, with --model NAME --tp N --tokens T: every fused op "
        f"of that model's tensor-parallel decoder layer, then what lookup gives each; with --layer mlp|attention, "
        f"that layer's ops, then the layer timed on GPUs."
    )
    tune_cmd._with_model = True
    info.callback = tune_cmd


def _tune(
    tune,
    kwargs: dict,
    *,
    model,
    layer,
    hidden,
    ffn,
    heads,
    kv_heads,
    tp,
    tokens,
    sequence_parallel,
    config_out,
    dtype,
) -> None:
    widths = {"--hidden": hidden, "--ffn": ffn, "--heads": heads, "--kv-heads": kv_heads}
    given = [
        f
        for f, v in (("--tp", tp), ("--tokens", tokens), ("--dtype", dtype), ("--config-out", config_out))
        if v is not None
    ]
    if not sequence_parallel:
        given.append("--no-sequence-parallel")
    named_widths = [f for f, v in widths.items() if v is not None]
    if layer is None and named_widths:
        raise ConfigError(
            f"{', '.join(named_widths)} give a layer's widths: use them with --layer mlp|attention"
        )
    if layer is not None and layer not in LAYER_PROJECTIONS:
        raise ConfigError(f"--layer {layer!r}: accepted are {', '.join(LAYER_PROJECTIONS)}")
    what = f"--model {model}" if model is not None else f"--layer {layer}" if layer is not None else None
    if what is None:
        if kwargs["config"] is None:
            raise ConfigError(
                "give a sweep CONFIG (YAML), or --model NAME --tp N (or --layer mlp|attention --tp N) to tune "
                "a model's layers"
            )
        if given:
            raise ConfigError(
                f"{', '.join(given)} {'go' if len(given) > 1 else 'goes'} with --model or --layer: a sweep CONFIG "
                f"names its own workloads"
            )
        tune(**kwargs)
        return
    if kwargs["config"] is not None:
        raise ConfigError(f"give a sweep CONFIG ({kwargs['config']}) or {what}, not both")
    if tp is None:
        raise ConfigError(f"{what} needs --tp N, the tensor-parallel degree")
    if model is not None and named_widths:
        raise ConfigError(
            f"--model {model} gives the widths: leave out {', '.join(named_widths)}, or --model"
        )
    from syncopate.models import ModelSpec, model_spec
    from syncopate.search_space import Topology

    if model is not None:
        spec = model_spec(model)
    else:
        hidden, ffn = hidden or 4096, ffn or 14336
        heads, kv_heads = heads or 32, kv_heads or 8
        if hidden % heads:
            raise ConfigError(
                f"--hidden {hidden} must be a multiple of --heads {heads} (each head hidden/heads wide)"
            )
        spec = ModelSpec(
            name=f"{layer}-h{hidden}" + (f"-f{ffn}" if layer == "mlp" else f"-q{heads}-kv{kv_heads}"),
            hidden=hidden,
            ffn=ffn,
            heads=heads,
            kv_heads=kv_heads,
            head_dim=hidden // heads,
        )
    tokens = _DEFAULT_TOKENS if tokens is None else tokens
    dtype = _layer_dtype(dtype)
    runner = kwargs["runner"] or "gpu"
    topology = kwargs["topology"]
    chosen = topology is None and runner == "model"
    if topology is None:
        topology = default_topology(tp) if runner == "model" else "detect"
    text, calls = model_sweep(
        spec,
        tp,
        tokens,
        topology=topology,
        runner=runner,
        sequence_parallel=sequence_parallel,
        layer=layer,
        dtype=dtype,
    )
    if topology != "detect" and Topology.from_key(topology).world_size != tp:
        raise ConfigError(
            f"--topology {topology} has {Topology.from_key(topology).world_size} GPUs but --tp is {tp}: "
            f"the sweep measures the group of the tensor-parallel degree"
        )
    if chosen:
        console(stderr=True).print(
            f"predicting for {topology} (pass --topology KEY for another)", highlight=False
        )
    with tempfile.TemporaryDirectory(prefix="syncopate-model-") as tmp:
        path = Path(tmp) / "sweep.yaml"
        path.write_text(text)
        from syncopate.autotuner.sweep import load_sweep

        load_sweep(path)  # a bad derivation fails here, before --config-out is written
        if config_out is not None:
            try:
                Path(config_out).write_text(text)
            except OSError as e:
                raise ConfigError(
                    f"--config-out {str(config_out)!r} cannot be written: {e.strerror}"
                ) from None
            path = Path(config_out)
        tune(**{**kwargs, "config": path})
    out = console()
    if config_out is not None:
        out.print(f"sweep config: {config_out}", highlight=False)
    out.print(
        _lookup_table(
            spec, tp, tokens, calls, None if topology == "detect" else topology, kwargs["db"], layer
        )
    )
    if runner != "gpu":
        out.print(
            "lookup serves measured trials only: where none is stored, an op gets the nearest measured shape, "
            "another environment's, or the default (match column)",
            highlight=False,
        )
        if layer is not None:
            out.print(f"the {layer} layer itself is timed on GPUs only (runner gpu)", highlight=False)
    elif layer is not None:
        check_layer(spec, layer, tp, tokens, sequence_parallel, kwargs["db"], dtype)


LAYER_DTYPES = ("bf16", "fp8")
"""The operands `--dtype` takes for a model's ops: those `syncopate.tp`'s layers call them with."""


def _layer_dtype(dtype: str | None) -> str:
    """`--dtype` as its canonical name (None: bf16); ConfigError naming the accepted ones."""
    from syncopate.search_space import canonical_dtype

    if dtype is None:
        return "bf16"
    try:
        name = canonical_dtype(dtype)
    except ConfigError:
        name = None
    if name not in LAYER_DTYPES:
        raise ConfigError(f"--dtype {dtype!r}: accepted are {', '.join(LAYER_DTYPES)} (the layers' operands)")
    return name


def check_layer(
    spec, layer: str, tp: int, tokens: int, sequence_parallel: bool, db: str | None, dtype: str = "bf16"
) -> dict:
    """Time the `layer` of `spec` with what lookup serves from `db` (`syncopate bench --layer`'s
    benchmark) and print its table and a line for each mode and pass where the tuned layer is
    slower than the untuned defaults or torch: ops tuned one by one can lose in the layer."""
    import os

    import torch

    from syncopate.errors import RuntimeUnavailableError
    from syncopate.tp.bench import LayerBench, format_layer_table, run_layer_bench

    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if visible < tp:
        raise RuntimeUnavailableError(
            f"timing the {layer} layer needs {tp} CUDA GPUs on this host; {visible} visible (the ops are tuned "
            f"and stored: `syncopate bench --layer {layer} --tp {tp}` times it where they are)"
        )
    bench = LayerBench(
        layer=layer,
        hidden=spec.hidden,
        ffn=spec.ffn,
        heads=spec.heads,
        kv_heads=spec.kv_heads,
        head_dim=spec.head_dim,
        tokens=tokens,
        tp=tp,
        sequence_parallel=sequence_parallel,
        dtype=dtype,
    )
    saved = os.environ.get("SYNCOPATE_DB")
    if db is not None:
        os.environ["SYNCOPATE_DB"] = db  # the ranks' lookups read the tuned database
    try:
        result = run_layer_bench(bench)
    finally:
        if db is not None:
            if saved is None:
                os.environ.pop("SYNCOPATE_DB", None)
            else:
                os.environ["SYNCOPATE_DB"] = saved
    out = console()
    out.print(f"\nthe {layer} layer with what lookup serves now (µs an iteration):", highlight=False)
    out.print(format_layer_table(result), highlight=False, markup=False)
    for line in [*layer_verdicts(result), *bound_lines(result)]:
        out.print(line, highlight=False)
    return result


def bound_lines(result: dict) -> list[str]:
    """A line for each mode/pass with the layer's bound measured (the layer without its
    communication): the most any overlap could gain over torch's path there, and how close the
    tuned layer comes, so that a target above the first is seen to be out of overlap's reach."""
    res = result["results"]
    ours, bound, torch_path = (res.get(k, {}) for k in ("syncopate", "bound", "torch"))
    lines = []
    for key, us in sorted(bound.items()):
        if "/" not in key or not us or not ours.get(key) or not torch_path.get(key):
            continue
        lines.append(
            f"{key}: without communication the layer takes {us:.1f} µs: overlap can make it at most "
            f"{torch_path[key] / us:.3f}x torch's path; the tuned layer is at {us / ours[key]:.3f} of that bound"
        )
    return lines


def layer_verdicts(result: dict) -> list[str]:
    """A line for each mode/pass of a layer benchmark's result where the tuned layer (`syncopate`) is
    slower than the untuned defaults or torch's path; one line saying so where it is slower than neither."""
    res = result["results"]
    ours = res.get("syncopate", {})
    lines = []
    for key, us in sorted(ours.items()):
        if "/" not in key or not us:
            continue
        for impl, name in (("default", "the untuned defaults"), ("torch", "torch's path")):
            other = res.get(impl, {}).get(key)
            if other and us > other:
                lines.append(
                    f"{key}: the tuned layer takes {us:.1f} µs, {us / other - 1:.1%} more than with {name} "
                    f"({other:.1f} µs)"
                )
    return lines or [
        "the tuned layer is no slower than the untuned defaults or torch's path in any mode and pass"
    ]


extend_tune()
