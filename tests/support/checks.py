"""The loop of the one-GPU check scripts: run each named check, print `ok    NAME` or `FAIL  NAME`
and its traceback (the tests that run these scripts count the `ok` lines)."""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterable


def run_checks(checks: Iterable[tuple[str, Callable[[], None]]]) -> int:
    """Run every check; the exit status: 1 if one failed, else 0."""
    failed = 0
    for name, check in checks:
        try:
            check()
            print(f"ok    {name}", flush=True)
        except Exception:
            failed += 1
            print(f"FAIL  {name}\n{traceback.format_exc()}", flush=True)
    return 1 if failed else 0
