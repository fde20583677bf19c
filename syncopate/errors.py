"""The one exception hierarchy of Syncopate.

Every error a user can cause derives from :class:`SyncopateError`. Messages name the values involved,
what is accepted, and where useful the command that fixes it. The CLI turns these into one line on
stderr and the error's `exit_code`: 2 for a value the user gave that is invalid (:class:`ConfigError`,
as for a usage error), 1 for anything else that stops a command (a database that cannot be used, no
GPU, a Ray cluster out of reach), so that a script can tell "fix the call" from "fix the machine".
"""

from __future__ import annotations

__all__ = [
    "SyncopateError",
    "ConfigError",
    "DatabaseError",
    "SchemaError",
    "NotFoundError",
    "LookupFailedError",
    "RuntimeUnavailableError",
    "CandidateTimeoutError",
    "CalibrationError",
    "StudyMismatchError",
    "Terminated",
    "describe",
]


class SyncopateError(Exception):
    """Base class of every error Syncopate raises on purpose."""

    exit_code = 1


class ConfigError(SyncopateError, ValueError):
    """A value given by the user (shape, dtype, key, config file, candidate) is invalid."""

    exit_code = 2


class DatabaseError(SyncopateError):
    """The results database cannot be opened, read or written."""


class SchemaError(DatabaseError):
    """The database has no tables, or a schema older or newer than this version of Syncopate."""


class NotFoundError(DatabaseError):
    """A row asked for by id or key (a sweep, a trial) does not exist; the message names it."""


class LookupFailedError(SyncopateError, LookupError):
    """A lookup could not be answered (for instance a corrupt export file)."""


class RuntimeUnavailableError(SyncopateError):
    """What the command needs is not present here: GPUs, a Ray cluster, a backend."""


class CandidateTimeoutError(SyncopateError, TimeoutError):
    """A fused kernel waited longer than its deadline for a signal that never arrived."""


class CalibrationError(SyncopateError):
    """The cost model has no calibration it may use for a topology; the message names the command
    that measures one (`syncopate calibrate`)."""


class StudyMismatchError(ConfigError):
    """An Optuna study stored for a workload was made over another search space; nothing in it is
    changed, and the message says how to go on."""


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: the command stops as on Ctrl-C (a sweep is marked `interrupted`, its trials
    kept) and exits with code 143."""


def describe(value: object) -> str:
    """A value as a message names what was given instead of what was wanted: `None`, `True`, `the
    number 3`, `the text 'abc'`, `a list of 2 items`, `a mapping`, else `a Tensor` (its type): the
    reader learns what arrived, never a Python type name such as `NoneType`."""
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, (int, float)):
        return f"the number {value!r}"
    if isinstance(value, str):
        text = value if len(value) <= 40 else value[:37] + "..."
        return f"the text {text!r}"
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value)} item{'s' if len(value) != 1 else ''}"
    if isinstance(value, dict):
        return "a mapping"
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"
