"""A local Ray cluster on the CPU with declared GPU resources, for the tests of gangs and `tune`."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def local_ray(num_gpus: int) -> Iterator[None]:
    """Start Ray with 2 CPUs and `num_gpus` declared GPUs (workers import the checkout), yield, stop it.

    Use as the body of a module fixture: `yield from local_ray(2)`.
    """
    import ray

    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    ray.init(
        num_cpus=2, num_gpus=num_gpus, include_dashboard=False, log_to_driver=False, logging_level="ERROR"
    )
    yield
    ray.shutdown()
