"""The environment fingerprint (:class:`Environment`, a value) and how this process reads its own,
and the provenance stamp of a measurement.

Which kernel code a fused op runs is a field of its configuration (a candidate's `kernel`), except
for one environment variable that overrides it: `SYNCOPATE_GLUON=1` (the Gluon kernels for every
candidate where they apply, `syncopate.kernels.launch`). The override is part of the fingerprint
(the `triton` field reads e.g. `3.6.0+gluon`), so a trial measured under it is stored under a
fingerprint of its own and a lookup from a job without it never matches it exactly.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import socket
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from syncopate.errors import ConfigError
from syncopate.platform import cpu_torch_build, gpu_model_of
from syncopate.version import __version__

__all__ = [
    "GLUON_SUFFIX",
    "GLUON_VAR",
    "KERNEL_SWITCHES",
    "SPIN_LIMIT_VAR",
    "Environment",
    "current_environment",
    "git_revision",
    "gluon_on",
    "job_spin_limit",
    "kernel_switches",
    "provenance",
    "with_kernels",
]

GLUON_VAR = "SYNCOPATE_GLUON"
"""`1`: the fused ops run the Gluon kernels where they apply (opt-in; anything else: the Triton ones)."""

SPIN_LIMIT_VAR = "SYNCOPATE_SPIN_LIMIT"
"""A positive integer: every eager call of the fused ops bounds its kernels' waits to that many
polls, and its streams' waits to that many microseconds of the host's waiting for the call, and
checks them after the call, raising a timeout that names the word a wait ran out on instead of
hanging (a diagnosis setting: each call then synchronizes). Unset or 0: unbounded."""

GLUON_SUFFIX = "+gluon"
"""Appended to the fingerprint's `triton` field where the Gluon kernels are on."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Environment:
    """Versions that decide whether a measurement still holds: the environment fingerprint."""

    syncopate: str
    torch: str
    triton: str
    cuda: str
    nccl: str
    driver: str
    gpu_model: str

    def key(self) -> str:
        """Stable hash of every field (16 hex digits)."""
        blob = json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, str]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Environment:
        return cls(
            **{k: str(d[k]) for k in ("syncopate", "torch", "triton", "cuda", "nccl", "driver", "gpu_model")}
        )

    def short(self) -> str:
        return (
            f"torch {self.torch}, triton {self.triton}, CUDA {self.cuda}, NCCL {self.nccl}, {self.gpu_model}"
        )

    @classmethod
    def current(cls) -> Environment:
        """The fingerprint of this process (:func:`current_environment`)."""
        return current_environment()


def _package_version(name: str) -> str:
    """A package's version without importing it (importing triton alone costs a quarter second)."""
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "none"


def _triton_version() -> str:
    version = _package_version("triton")
    return _package_version("pytorch-triton") if version == "none" else version


def _environment_without_torch() -> Environment | None:
    """The fingerprint where it can be known without importing torch (a second or more): a torch
    built without CUDA or ROCm, or a CUDA build on a machine with no NVIDIA driver, sees no GPU, so
    its version and CUDA version (from torch's version.py) are all there is to read. None where a
    GPU might be visible: only torch can then say which GPU, NCCL and driver it would use."""
    build = cpu_torch_build()
    if build is None:
        return None
    return Environment(
        syncopate=__version__,
        torch=str(build["__version__"]),
        triton=_triton_version(),
        cuda=str(build.get("cuda") or "none"),
        nccl="none",
        driver="none",
        gpu_model="cpu",
    )


def job_spin_limit(env: Mapping[str, str] | None = None) -> int:
    """:data:`SPIN_LIMIT_VAR` of `env` (default: this process's environment) as a poll count, 0 where
    unset; ConfigError for anything but a non-negative integer."""
    raw = (os.environ if env is None else env).get(SPIN_LIMIT_VAR, "").strip()
    if not raw:
        return 0
    if not raw.isdigit() or int(raw) >= 1 << 31:
        raise ConfigError(
            f"{SPIN_LIMIT_VAR}={raw!r}: give a number of polls, a whole number below 2^31 such as "
            f"16777216 (seconds a wait, as a tuning run bounds them), or 0 or nothing for unbounded waits"
        )
    return int(raw)


def gluon_on(env: Mapping[str, str] | None = None) -> bool:
    """Whether `env` (default: this process's environment) asks for the Gluon kernels."""
    return (os.environ if env is None else env).get(GLUON_VAR, "0") == "1"


def with_kernels(environment: Environment, gluon: bool) -> Environment:
    """`environment` with the kernel setting in its fingerprint: the `triton` field marked
    :data:`GLUON_SUFFIX` where `gluon` is on (and where it already is, left as it is)."""
    if not gluon or environment.triton.endswith(GLUON_SUFFIX):
        return environment
    return dataclasses.replace(environment, triton=environment.triton + GLUON_SUFFIX)


def current_environment() -> Environment:
    """Versions of syncopate, torch, triton, CUDA, NCCL, the driver and the GPU model, and whether
    the Gluon kernels are on (:data:`GLUON_VAR`, read on every call; see :func:`with_kernels`).

    Read without importing torch where torch would see no GPU (:func:`_environment_without_torch`),
    so that a lookup or a read-only command on a CPU machine starts in a fraction of a second; the
    two ways give the same fingerprint there."""
    return _environment(gluon_on())


@functools.cache
def _environment(gluon: bool) -> Environment:
    return with_kernels(_versions(), gluon)


def _versions() -> Environment:
    if "torch" not in sys.modules:
        light = _environment_without_torch()
        if light is not None:
            return light
    return _environment_from_torch()


def _environment_from_torch() -> Environment:
    import torch

    triton_version = _triton_version()
    cuda = torch.version.cuda or "none"
    nccl = "none"
    driver = "none"
    gpu = "cpu"
    if torch.cuda.is_available():
        gpu = gpu_model_of(torch.cuda.get_device_name(0))
        try:
            nccl = ".".join(str(x) for x in torch.cuda.nccl.version())
        except Exception:
            nccl = "unknown"
        driver = _driver_version()
    return Environment(
        syncopate=__version__,
        torch=torch.__version__,
        triton=triton_version,
        cuda=cuda,
        nccl=nccl,
        driver=driver,
        gpu_model=gpu,
    )


def _driver_version() -> str:
    try:
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
        try:
            v = pynvml.nvmlSystemGetDriverVersion()
            return v.decode() if isinstance(v, bytes) else str(v)
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        pass
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


@functools.cache
def git_revision() -> str:
    """The git revision of the syncopate checkout, with `+dirty` where its tracked files differ from
    it (the code that ran is then not that commit); outside one, `SYNCOPATE_GIT_REV` (set in the
    worker image at build time), else `unknown`."""
    root = Path(__file__).resolve().parent.parent
    if not (root / ".git").exists() and os.environ.get("SYNCOPATE_GIT_REV"):
        return os.environ["SYNCOPATE_GIT_REV"]
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5
        )
        if out.returncode != 0:
            return "unknown"
        changed = subprocess.run(
            ["git", "diff", "--quiet", "HEAD", "--", "syncopate"], cwd=root, capture_output=True, timeout=10
        )
        return out.stdout.strip() + ("+dirty" if changed.returncode == 1 else "")
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


KERNEL_SWITCHES: tuple[str, ...] = (GLUON_VAR,)
"""Environment settings that change which kernel code a fused op runs: part of the environment
fingerprint and of every relaunch key, passed on to the gang actors and recorded with each trial."""


def kernel_switches(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The :data:`KERNEL_SWITCHES` set in `base` (default: this process's environment)."""
    env = os.environ if base is None else base
    return {k: env[k] for k in KERNEL_SWITCHES if k in env}


def provenance(**extra: object) -> dict[str, object]:
    """Host, process, git revision, library versions and the kernel switches set
    (:data:`KERNEL_SWITCHES`), plus whatever the caller adds."""
    env = current_environment()
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "git": git_revision(),
        **env.to_dict(),
        "switches": kernel_switches(),
        **extra,
    }
