"""The loop of the one-GPU check scripts: run each named check, print `ok    NAME` or `FAIL  NAME`
and its traceback (the tests that run these scripts count the `ok` lines); and how those tests run
a script.
"""

from __future__ import annotations

import os
import subprocess
import sys
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_script(name: str, timeout: float) -> subprocess.CompletedProcess:
    """Run `tests/support/NAME` in a fresh process with the project importable and without
    TRITON_INTERPRET (which the interpreter tests set in the test process): compiled kernels, and
    CUDA started by the script itself."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, str(ROOT / "tests/support" / name)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


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
