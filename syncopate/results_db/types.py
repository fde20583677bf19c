"""Column types that keep values exactly: ±inf and NaN, JSON documents, UTC times.

- :class:`ExactFloat`: a float column that stores ±inf and NaN as themselves, never as NULL.
  PostgreSQL's double precision holds all three; SQLite holds ±inf as REAL but turns a REAL NaN into
  NULL, so on SQLite NaN is stored as the text `'NaN'` (SQLite columns accept any type) and read
  back as the float.
- :class:`JSONDoc`: JSON (JSONB on PostgreSQL) through :mod:`~syncopate.results_db.codec`, so
  non-finite floats inside documents survive too.
- :class:`UTCDateTime`: aware datetimes in, aware UTC datetimes out, on both databases.
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import JSON, DateTime, Float
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.types import TypeDecorator

from syncopate.results_db import codec

__all__ = ["ExactFloat", "JSONDoc", "UTCDateTime"]


class _SqliteReal(Float):
    """SQLite's REAL without the driver-side float conversion, so that the text `'NaN'` gets through."""

    def bind_processor(self, dialect: Any) -> None:
        return None

    def result_processor(self, dialect: Any, coltype: Any) -> None:
        return None


class ExactFloat(TypeDecorator):
    """Double precision that keeps ±inf and NaN (see the module docstring)."""

    impl = Float(precision=53)
    cache_ok = True

    def load_dialect_impl(self, dialect: Any) -> Any:
        if dialect.name == "sqlite":
            return _SqliteReal(precision=53)
        return dialect.type_descriptor(self.impl)

    def process_bind_param(self, value: Any, dialect: Any) -> Any:
        if value is None:
            return None
        value = float(value)
        if math.isnan(value) and dialect.name == "sqlite":
            return "NaN"
        return value

    def process_result_value(self, value: Any, dialect: Any) -> float | None:
        if value is None:
            return None
        return float(value)


class JSONDoc(TypeDecorator):
    """A JSON document with explicit non-finite floats (JSONB on PostgreSQL)."""

    impl = JSON().with_variant(JSONB(), "postgresql")
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Any) -> Any:
        return codec.encode(value, "JSON column")

    def process_result_value(self, value: Any, dialect: Any) -> Any:
        return codec.decode(value)


class UTCDateTime(TypeDecorator):
    """Timestamps in UTC; a naive datetime is taken to be UTC already."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        value = value.astimezone(timezone.utc)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc)
