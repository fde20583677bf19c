"""Named model shapes: the MLP of well-known transformer models under tensor parallelism.

An MLP under tensor parallelism is an up-projection (hidden → ffn, column-parallel: `ag_gemm`) and a
down-projection (ffn → hidden, row-parallel: `gemm_rs` or `gemm_ar`). So a model gives
(N, K) = (ffn, hidden) for `ag_gemm` and (N, K) = (hidden, ffn) for the other kinds; M is the
number of tokens.
"""

from __future__ import annotations

from syncopate.errors import ConfigError
from syncopate.search_space.workload import Shape

__all__ = ["MODELS", "model_shape"]

MODELS: dict[str, tuple[int, int]] = {
    "llama-7b": (4096, 11008),
    "llama-3.1-8b": (4096, 14336),
    "mistral-7b": (4096, 14336),
    "llama-3.1-70b": (8192, 28672),
    "qwen2-72b": (8192, 29568),
    "llama-3.1-405b": (16384, 53248),
}
"""Model name → (hidden size, MLP intermediate size)."""


def model_shape(model: str, kind: str, tokens: int) -> Shape:
    """The GEMM shape of `model`'s MLP projection that `kind` computes, for `tokens` rows."""
    try:
        hidden, ffn = MODELS[model.lower()]
    except KeyError:
        raise ConfigError(f"unknown model {model!r}: known are {', '.join(MODELS)}") from None
    if kind == "ag_gemm":
        return Shape(m=tokens, n=ffn, k=hidden)
    return Shape(m=tokens, n=hidden, k=ffn)
