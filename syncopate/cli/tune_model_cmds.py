"""`syncopate tune --model NAME --tp N --tokens T`: tune every fused op a model's tensor-parallel
decoder layer calls, then show the configuration `lookup` will give each.

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

__all__ = ["extend_tune", "model_sweep"]

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


def model_sweep(
    spec, tp: int, tokens: int, *, topology: str, runner: str, sequence_parallel: bool = True
) -> tuple:
    """(the sweep config's YAML text, the ops it tunes) for `spec` under TP `tp` at `tokens` tokens."""
    from syncopate.models import layer_ops

    calls = layer_ops(spec, tp, tokens, sequence_parallel=sequence_parallel)
    shapes: dict[str, list[list[int]]] = {}
    for c in calls:
        s = c.workload.shape
        entry = shapes.setdefault(c.workload.kind, [])
        if [s.m, s.n, s.k] not in entry:
            entry.append([s.m, s.n, s.k])
    sp = "sequence parallelism" if sequence_parallel else "no sequence parallelism"
    data = {
        "name": f"{spec.name.replace('/', '-')}-tp{tp}-{tokens}{'' if sequence_parallel else '-nosp'}",
        "description": f"every fused op of a {spec.name} decoder layer, forward and backward, at TP={tp} with "
        f"{sp}, {tokens} tokens a step",
        "topology": topology,
        "dtype": "bf16",
        "tokens": tokens,
        "workloads": [{"kind": kind, "shapes": s} for kind, s in shapes.items()],
        "strategy": {"name": "seeded", "max_trials": 64, "seed": 0},
        "space": {"num_splits": [1, 2, 4, 8]},
        "runner": runner,
        "timing": {"warmup": 5, "repetitions": 20, "deadline_s": 120},
    }
    flag = "" if sequence_parallel else " --no-sequence-parallel"
    header = [
        f"# Derived by `syncopate tune --model {spec.name} --tp {tp} --tokens {tokens}{flag}`: "
        f"each shape is (M, N, K),",
        "# M the tokens of a step; the op of each projection and pass:",
    ]
    header += [
        f"#   {c.projection:8s} {c.direction:9s} {c.workload.kind} {c.workload.shape.key()}" for c in calls
    ]
    return "\n".join(header) + "\n" + yaml.safe_dump(data, sort_keys=False, default_flow_style=None), calls


def _lookup_table(spec, tp: int, tokens: int, calls: list, topology: str | None, db: str | None) -> Table:
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
        "measured µs",
        title=f"what lookup gives each op of a {spec.name} layer at TP={tp}, {tokens} tokens"
        f"{f' on {topology}' if topology else ''}",
    )
    try:
        for c in calls:
            w = c.workload
            r = lookup(w.shape, topology, kind=w.kind, dtype=w.dtype, db=db)
            table.add_row(
                c.projection,
                c.direction,
                w.kind,
                w.shape.key(),
                r.candidate.short(),
                r.match,
                "–" if r.time_us is None else f"{r.time_us:.1f}",
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
        f"of that model's tensor-parallel decoder layer, then what lookup gives each."
    )
    tune_cmd._with_model = True
    info.callback = tune_cmd


def _tune(tune, kwargs: dict, *, model, tp, tokens, sequence_parallel, config_out) -> None:
    given = [
        f for f, v in (("--tp", tp), ("--tokens", tokens), ("--config-out", config_out)) if v is not None
    ]
    if not sequence_parallel:
        given.append("--no-sequence-parallel")
    if model is None:
        if kwargs["config"] is None:
            raise ConfigError("give a sweep CONFIG (YAML), or --model NAME --tp N to tune a model's layers")
        if given:
            raise ConfigError(
                f"{', '.join(given)} {'go' if len(given) > 1 else 'goes'} with --model: a sweep CONFIG "
                f"names its own workloads"
            )
        tune(**kwargs)
        return
    if kwargs["config"] is not None:
        raise ConfigError(f"give a sweep CONFIG ({kwargs['config']}) or --model {model}, not both")
    if tp is None:
        raise ConfigError(f"--model {model} needs --tp N, the tensor-parallel degree")
    from syncopate.models import model_spec
    from syncopate.search_space import Topology

    spec = model_spec(model)
    tokens = _DEFAULT_TOKENS if tokens is None else tokens
    runner = kwargs["runner"] or "gpu"
    topology = kwargs["topology"]
    chosen = topology is None and runner == "model"
    if topology is None:
        topology = default_topology(tp) if runner == "model" else "detect"
    text, calls = model_sweep(
        spec, tp, tokens, topology=topology, runner=runner, sequence_parallel=sequence_parallel
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
        _lookup_table(spec, tp, tokens, calls, None if topology == "detect" else topology, kwargs["db"])
    )
    if runner != "gpu":
        out.print(
            "lookup serves measured trials only: where none is stored, an op gets the nearest measured shape, "
            "another environment's, or the default (match column)",
            highlight=False,
        )


extend_tune()
