"""Transformer widths, and the fused ops a model's tensor-parallel decoder layer calls.

`MODEL_SPECS` holds the widths of well-known Llama- and Qwen-style models; `model_spec` takes a
name from it or a Hugging Face `config.json` (or the folder holding one). `layer_ops` lists the ops
one decoder layer calls under the plan of `syncopate.tp`'s styles (docs/tp.md): q/k/v in one
column-parallel op, o_proj row-parallel, gate/up in one column-parallel op, down row-parallel. A
column-parallel linear of in → out features calls `ag_gemm` M×out×in in its forward and `gemm_rs`
M×in×out for its input's gradient; a row-parallel one `gemm_rs` M×out×in and `ag_gemm` M×in×out
(without sequence parallelism: the column layer's forward is local and its backward `gemm_ar`
M×in×out, the row layer's forward `gemm_ar` M×out×in and its backward local). M is the number of
tokens the tensor-parallel group processes in a step (batch × sequence): under sequence parallelism
each rank holds M/tp of them and the op gathers or scatters the rest.

Pure Python (no torch), as the CLI reads it before it tunes.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from syncopate.errors import ConfigError
from syncopate.search_space import Shape, Workload

__all__ = ["MODEL_SPECS", "ModelSpec", "OpCall", "layer_ops", "model_spec"]


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelSpec:
    """The widths of a decoder-only transformer with grouped-query attention and a gated MLP."""

    name: str
    """A name for tables and sweep names (the table's key, or the config file's model)."""
    hidden: int
    """hidden_size: the residual stream's width."""
    ffn: int
    """intermediate_size: the MLP's width (each of gate and up projects to it)."""
    heads: int
    """num_attention_heads."""
    kv_heads: int
    """num_key_value_heads."""
    head_dim: int
    """Each head's width (not always hidden / heads: Qwen3-32B's 64 heads of 128 over 5120)."""
    layers: int = 1
    """num_hidden_layers."""
    vocab: int = 32000
    """vocab_size."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ConfigError(f"model name {self.name!r} must be a non-empty string")
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name != "name" and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise ConfigError(f"model {self.name!r}: {f.name}={v!r} must be a positive integer")
        if self.heads % self.kv_heads:
            raise ConfigError(
                f"model {self.name!r}: heads={self.heads} is not a multiple of kv_heads={self.kv_heads}"
            )

    @property
    def q_features(self) -> int:
        return self.heads * self.head_dim

    @property
    def qkv_features(self) -> int:
        """q, k and v projected together: what the merged column-parallel op computes."""
        return (self.heads + 2 * self.kv_heads) * self.head_dim

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelSpec:
        return cls(**data)

    @classmethod
    def from_hf_config(cls, path: str | Path) -> ModelSpec:
        """The widths in a Hugging Face `config.json` (a path to it, or to the folder holding it)."""
        p = Path(path)
        if p.is_dir():
            p = p / "config.json"
        try:
            data = json.loads(p.read_text())
        except FileNotFoundError:
            raise ConfigError(f"model config {str(p)!r} does not exist") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ConfigError(f"model config {str(p)!r} cannot be read as JSON: {e}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"model config {str(p)!r} is not a JSON object")
        data = data.get("text_config", data) if "hidden_size" not in data else data
        missing = [k for k in ("hidden_size", "intermediate_size", "num_attention_heads") if k not in data]
        if missing:
            raise ConfigError(
                f"model config {str(p)!r} has no {', '.join(missing)}: a decoder-only transformer's "
                f"config.json names hidden_size, intermediate_size and num_attention_heads"
            )
        heads = data["num_attention_heads"]
        hidden = data["hidden_size"]
        head_dim = data.get("head_dim") or (
            hidden // heads if isinstance(hidden, int) and isinstance(heads, int) and heads else None
        )
        name = str(data.get("_name_or_path") or data.get("model_type") or p.parent.name or p.stem)
        try:
            return cls(
                name=name,
                hidden=hidden,
                ffn=data["intermediate_size"],
                heads=heads,
                kv_heads=data.get("num_key_value_heads") or heads,
                head_dim=head_dim,
                layers=data.get("num_hidden_layers", 1),
                vocab=data.get("vocab_size", 32000),
            )
        except ConfigError as e:
            raise ConfigError(f"model config {str(p)!r}: {e}") from None


MODEL_SPECS: dict[str, ModelSpec] = {
    s.name: s
    for s in (
        ModelSpec(
            name="llama-3-8b",
            hidden=4096,
            ffn=14336,
            heads=32,
            kv_heads=8,
            head_dim=128,
            layers=32,
            vocab=128256,
        ),
        ModelSpec(
            name="llama-3-70b",
            hidden=8192,
            ffn=28672,
            heads=64,
            kv_heads=8,
            head_dim=128,
            layers=80,
            vocab=128256,
        ),
        ModelSpec(
            name="qwen3-8b",
            hidden=4096,
            ffn=12288,
            heads=32,
            kv_heads=8,
            head_dim=128,
            layers=36,
            vocab=151936,
        ),
        ModelSpec(
            name="qwen3-14b",
            hidden=5120,
            ffn=17408,
            heads=40,
            kv_heads=8,
            head_dim=128,
            layers=40,
            vocab=151936,
        ),
        ModelSpec(
            name="qwen3-32b",
            hidden=5120,
            ffn=25600,
            heads=64,
            kv_heads=8,
            head_dim=128,
            layers=64,
            vocab=151936,
        ),
    )
}
"""Known models by name (Llama 3.1 and 3.3 have Llama 3's widths)."""


def model_spec(model: str | Path) -> ModelSpec:
    """A model of `MODEL_SPECS` by name (any case), or the widths in a Hugging Face config.json at
    that path (or in the folder there)."""
    spec = MODEL_SPECS.get(str(model).lower())
    if spec is not None:
        return spec
    p = Path(model)
    if p.suffix == ".json" or p.is_dir() or p.exists():
        return ModelSpec.from_hf_config(p)
    raise ConfigError(
        f"unknown model {str(model)!r}: known are {', '.join(MODEL_SPECS)}, or give the path of a "
        f"Hugging Face config.json"
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class OpCall:
    """One fused op a decoder layer calls."""

    projection: str
    """qkv, o, gate_up or down."""
    direction: str
    """forward, or backward (the input's gradient)."""
    workload: Workload
    """Its kind and global shape."""


_PROJECTIONS = ("qkv", "o", "gate_up", "down")


def layer_ops(
    spec: ModelSpec, tp: int, tokens: int, *, sequence_parallel: bool = True, dtype: str = "bf16"
) -> list[OpCall]:
    """The fused ops one decoder layer of `spec` calls, forward and backward, under tensor
    parallelism `tp` at `tokens` tokens a step (see the module docstring); raises ConfigError where
    a width or the token count does not split evenly over `tp` ranks."""
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 2:
        raise ConfigError(
            f"--tp {tp!r} must be an integer of at least 2: a tensor-parallel group of one rank "
            f"calls no collective"
        )
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 1:
        raise ConfigError(f"--tokens {tokens!r} must be a positive integer")
    for what, size in (
        ("heads", spec.heads),
        ("kv_heads", spec.kv_heads),
        ("ffn", spec.ffn),
        ("hidden", spec.hidden),
        ("tokens", tokens),
    ):
        if size % tp:
            raise ConfigError(
                f"model {spec.name!r}: {what}={size} is not divisible by tp={tp}: each rank holds an "
                f"equal share of it"
            )
    column = {"qkv": (spec.hidden, spec.qkv_features), "gate_up": (spec.hidden, 2 * spec.ffn)}
    row = {"o": (spec.q_features, spec.hidden), "down": (spec.ffn, spec.hidden)}
    calls = []
    for name in _PROJECTIONS:
        if name in column:
            n_in, n_out = column[name]
            forward = ("ag_gemm", Shape(m=tokens, n=n_out, k=n_in)) if sequence_parallel else None
            backward = ("gemm_rs" if sequence_parallel else "gemm_ar", Shape(m=tokens, n=n_in, k=n_out))
        else:
            n_in, n_out = row[name]
            forward = ("gemm_rs" if sequence_parallel else "gemm_ar", Shape(m=tokens, n=n_out, k=n_in))
            backward = ("ag_gemm", Shape(m=tokens, n=n_in, k=n_out)) if sequence_parallel else None
        for direction, op in (("forward", forward), ("backward", backward)):
            if op is not None:
                w = Workload(kind=op[0], shape=op[1], dtype=dtype)
                w.check_world_size(tp)
                calls.append(OpCall(projection=name, direction=direction, workload=w))
    return calls
