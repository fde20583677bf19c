"""JSON with explicit non-finite floats.

JSON has no spelling for ±inf and NaN, and PostgreSQL's JSON types reject Python's `NaN` token, so
a non-finite float is written as the tagged object `{"$float": "inf" | "-inf" | "nan"}` and read back
as the float. Finite floats, ints, strings, bools, None, lists and dicts pass unchanged; anything
else (a datetime, a path, a tensor) is refused with a message naming the field. No SQLAlchemy here.
"""

from __future__ import annotations

import json
import math
from typing import Any

from syncopate.errors import ConfigError

__all__ = ["decode", "dumps", "encode", "loads"]

_TAG = "$float"
_SPELLING = {math.inf: "inf", -math.inf: "-inf"}
_VALUES = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


def encode(value: Any, where: str = "value") -> Any:
    """A JSON-safe copy of `value` with non-finite floats tagged; `where` names it in errors."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return {_TAG: "nan" if math.isnan(value) else _SPELLING[value]}
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise ConfigError(
                    f"{where} has key {k!r} of type {type(k).__name__}: JSON keys must be strings"
                )
            out[k] = encode(v, f"{where}.{k}")
        return out
    if isinstance(value, (list, tuple)):
        return [encode(v, f"{where}[{i}]") for i, v in enumerate(value)]
    raise ConfigError(
        f"{where}={value!r} of type {type(value).__name__} cannot be stored as JSON: give numbers, "
        f"strings, booleans, lists or dicts"
    )


def decode(value: Any) -> Any:
    """The inverse of :func:`encode`."""
    if isinstance(value, dict):
        if len(value) == 1 and _TAG in value and value[_TAG] in _VALUES:
            return _VALUES[value[_TAG]]
        return {k: decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [decode(v) for v in value]
    return value


def dumps(value: Any, where: str = "value", **kwargs: Any) -> str:
    """Strict JSON text of `value` (non-finite floats tagged)."""
    return json.dumps(encode(value, where), allow_nan=False, **kwargs)


def loads(text: str) -> Any:
    return decode(json.loads(text))
