"""The MoE benchmark's data file (configs/moe_ep.yaml): models' expert layers, EP sizes, token
counts and routings, expanded into `MoeCase`s (one per model, EP size, tokens, routing and kind).

Not a sweep file: a sweep config takes the same `models:` mapping in its `moe:` section
(docs/moe.md, "Tuning and lookup").
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from syncopate.errors import ConfigError
from syncopate.search_space.moe_workload import MoeWorkload, RoutingSpec
from syncopate.search_space.workload import MOE_KINDS

__all__ = ["MoeCase", "load_moe_config", "moe_cases"]

_KEYS = {"name", "dtype", "ep", "tokens", "routings", "models"}
_MODEL_KEYS = {"hidden", "ffn", "experts", "top_k"}


@dataclass(frozen=True, kw_only=True, slots=True)
class MoeCase:
    """One benchmarked workload: a model's expert layer as one kind at one EP size."""

    model: str
    """The model's name in the file."""
    ep: int
    """The EP size: ranks the experts are spread over."""
    workload: MoeWorkload

    def __post_init__(self) -> None:
        self.workload.check_world_size(self.ep)


def _list(data: dict, key: str) -> list:
    value = data[key]
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{key}={value!r} must be a non-empty list")
    return value


def moe_cases(data: dict[str, Any]) -> list[MoeCase]:
    """The cases of a parsed file (module docstring), validated."""
    if not isinstance(data, dict):
        raise ConfigError(f"a MoE benchmark file holds a mapping, not {type(data).__name__}")
    unknown, missing = sorted(set(data) - _KEYS), sorted(_KEYS - {"name", "dtype"} - set(data))
    if unknown or missing:
        raise ConfigError(
            f"MoE benchmark file: unknown key(s) {unknown}, missing {missing}; accepted are {', '.join(sorted(_KEYS))}"
        )
    routings = [RoutingSpec.from_dict(r) for r in _list(data, "routings")]
    models = data["models"]
    if not isinstance(models, dict) or not models:
        raise ConfigError(f"models={models!r} must map model names to {', '.join(sorted(_MODEL_KEYS))}")
    cases = []
    for model, dims in models.items():
        if not isinstance(dims, dict) or set(dims) != _MODEL_KEYS:
            raise ConfigError(f"model {model!r} has {dims!r}: give exactly {', '.join(sorted(_MODEL_KEYS))}")
        for ep in _list(data, "ep"):
            for tokens in _list(data, "tokens"):
                for routing in routings:
                    for kind in MOE_KINDS:
                        w = MoeWorkload(
                            kind=kind, tokens=tokens, routing=routing, dtype=data.get("dtype", "bf16"), **dims
                        )
                        cases.append(MoeCase(model=model, ep=ep, workload=w))
    return cases


def load_moe_config(path: str | Path) -> list[MoeCase]:
    """The cases of the MoE benchmark file at `path`."""
    import yaml

    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except OSError as e:
        raise ConfigError(f"cannot read MoE benchmark file {p}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"MoE benchmark file {p} is not valid YAML: {e}") from None
    try:
        return moe_cases(data)
    except ConfigError as e:
        raise ConfigError(f"{p}: {e}") from None
