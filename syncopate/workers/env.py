"""The process environment every gang actor (and every process Syncopate starts) runs under.

`RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES=1` keeps Ray from narrowing `CUDA_VISIBLE_DEVICES` to
one GPU per actor: with it narrowed, every actor sees its GPU as device 0 and torch's
symmetric-memory rendezvous fails with "detected allocations from overlapping devices from
different ranks". Each actor instead selects `ray.get_gpu_ids()[0]` itself.

The three multicast switches (:data:`syncopate.platform.MULTICAST_OFF`, re-exported here) keep
NCCL, torch symmetric memory and NVSHMEM off NVLink SHARP (NVLS) multicast objects, which these
machines do not lend.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from syncopate.environment import KERNEL_SWITCHES, kernel_switches
from syncopate.platform import MULTICAST_OFF

__all__ = [
    "ACTOR_ENV",
    "KERNEL_SWITCHES",
    "MULTICAST_OFF",
    "actor_runtime_env",
    "apply_to_current_process",
    "child_env",
    "kernel_switches",
]

ACTOR_ENV: dict[str, str] = {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1", **MULTICAST_OFF}
"""Environment variables set in every gang actor's runtime_env."""


def actor_runtime_env(extra: Mapping[str, str] | None = None) -> dict[str, dict[str, str]]:
    """The `runtime_env` of a gang actor: :data:`ACTOR_ENV`, the kernel settings this process runs
    with (:data:`KERNEL_SWITCHES`: an actor on a cluster started elsewhere runs the same kernels and
    records the same environment fingerprint), plus `extra`."""
    return {"env_vars": {**ACTOR_ENV, **kernel_switches(), **(extra or {})}}


def child_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """A copy of `base` (default: this process's environment) with :data:`ACTOR_ENV` forced in,
    for any subprocess Syncopate starts."""
    env = dict(os.environ if base is None else base)
    env.update(ACTOR_ENV)
    return env


def apply_to_current_process() -> None:
    """Force :data:`ACTOR_ENV` into this process's environment, so that a local Ray cluster started
    from here (and every process it starts) inherits it."""
    os.environ.update(ACTOR_ENV)
