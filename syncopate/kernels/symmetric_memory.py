"""Which allocator backs this process's symmetric memory: torch's CUDA one (the default) or NVSHMEM.

torch's symmetric memory has one backend per process, chosen before its first allocation and fixed
after it (`torch.distributed._symmetric_memory.set_backend`). Backend `nvshmem` of the fused ops
moves chunks with NVSHMEM device calls, which need NVSHMEM-backed buffers; every other backend runs
on either. NVSHMEM is an opt-in, not the default, because torch async-TP
(`torch.ops.symm_mem.fused_all_gather_matmul` and the like) does not run in a process whose
symmetric memory is NVSHMEM's.

A process opts in, on every rank and before its first fused call (more exactly, before anything
allocates symmetric memory in it), with :func:`use_nvshmem`, or with the environment variable
`SYNCOPATE_SYMMETRIC_MEMORY=nvshmem`, read when Syncopate makes its first context
(:func:`apply_requested`). :func:`nvshmem_refusal` says why backend `nvshmem` cannot run on a
context's buffers, for the error a call raises before it enqueues anything.
"""

from __future__ import annotations

import logging
import os

import torch

from syncopate.errors import ConfigError, RuntimeUnavailableError

__all__ = [
    "MEMORY_VAR",
    "MEMORY_CHOICES",
    "apply_requested",
    "current_memory",
    "nvshmem_refusal",
    "process_memory",
    "process_refusal",
    "requested_memory",
    "use_nvshmem",
]

log = logging.getLogger(__name__)

MEMORY_VAR = "SYNCOPATE_SYMMETRIC_MEMORY"
"""Environment variable: `nvshmem` makes the process's symmetric memory NVSHMEM's when Syncopate
makes its first context; `cuda` (or unset) leaves torch's default."""

MEMORY_CHOICES: tuple[str, ...] = ("cuda", "nvshmem")

_CHOSEN: set[str] = set()
"""`"nvshmem"` once :func:`use_nvshmem` has set torch's process-wide backend: what
:func:`process_memory` goes by where torch cannot be asked (a torch without `get_backend`). It
mirrors torch's own process-wide setting, which cannot be undone either."""

_OPT_IN = (
    f"call syncopate.use_nvshmem() on every rank before the first fused call (or set {MEMORY_VAR}=nvshmem)"
)
"""How a process gets NVSHMEM symmetric memory: the end of every refusal, before the backend to
choose otherwise (`sm_copy` for the dense kinds, `copy_engine` for the MoE ops)."""


def _symm_mem():
    try:
        import torch.distributed._symmetric_memory as symm_mem
    except ImportError:
        raise RuntimeUnavailableError(
            f"torch {torch.__version__} has no symmetric memory; NVSHMEM needs torch >= 2.8 with CUDA"
        ) from None
    return symm_mem


def current_memory(device: torch.device | None = None) -> str | None:
    """torch's symmetric-memory backend for CUDA devices in this process (`"NVSHMEM"`, `"CUDA"`, …),
    or None where torch names none (nothing chosen or allocated yet, or a torch without the query)."""
    symm_mem = _symm_mem()
    get_backend = getattr(symm_mem, "get_backend", None)
    if get_backend is None:
        return None
    try:
        name = get_backend(device if device is not None else torch.device("cuda"))
    except Exception:  # a torch build without the CUDA allocators
        return None
    return None if name is None else str(name)


def use_nvshmem() -> None:
    """Make this process's symmetric memory NVSHMEM's, for backend `nvshmem` of the fused ops.

    Call it on every rank, before the first fused call and before anything else allocates symmetric
    memory in the process; calling it again is harmless. torch async-TP does not run in such a
    process. RuntimeUnavailableError where this torch has no NVSHMEM; ConfigError where the process
    already allocated symmetric memory of another backend (the backend cannot change after that).
    """
    symm_mem = _symm_mem()
    if not symm_mem.is_nvshmem_available():
        raise RuntimeUnavailableError(
            f"NVSHMEM is not available in this torch ({torch.__version__}) or on this machine "
            f"(torch.distributed._symmetric_memory.is_nvshmem_available() is False): use backend 'sm_copy', "
            f"which needs no NVSHMEM"
        )
    current = current_memory()
    if current == "NVSHMEM":
        return
    try:
        symm_mem.set_backend("NVSHMEM")
    except Exception as e:
        raise ConfigError(
            f"cannot make this process's symmetric memory NVSHMEM's: it is {current or 'taken'} already "
            f"({e}); the backend is fixed by the process's first symmetric allocation: call "
            f"syncopate.use_nvshmem() first thing on every rank, before any fused call or torch async-TP"
        ) from None
    after = current_memory()
    if after is not None and after != "NVSHMEM":
        raise ConfigError(
            f"cannot make this process's symmetric memory NVSHMEM's: torch still reports {after!r} after "
            f"set_backend('NVSHMEM'); the backend is fixed by the process's first symmetric allocation: call "
            f"syncopate.use_nvshmem() first thing on every rank"
        )
    _CHOSEN.add("nvshmem")
    log.info("symmetric memory of this process: NVSHMEM (torch async-TP does not run here)")


def process_memory() -> str:
    """This process's symmetric memory as a context records it: `nvshmem` or `cuda` (torch's
    default, or another backend that is not NVSHMEM)."""
    current = current_memory()
    if current is not None:
        return "nvshmem" if current == "NVSHMEM" else "cuda"
    return "nvshmem" if "nvshmem" in _CHOSEN else "cuda"


def process_refusal(environ=os.environ, instead: str = "sm_copy") -> str | None:
    """Why backend `nvshmem` cannot run in this process, None where it can: NVSHMEM missing, or the
    process's symmetric memory not NVSHMEM's and not asked to be (:data:`MEMORY_VAR`, applied when
    the first context is made); the message names backend `instead` as the one to choose
    otherwise. Asks no collective and allocates nothing."""
    symm_mem = _symm_mem()
    if not symm_mem.is_nvshmem_available():
        return (
            f"backend 'nvshmem' needs NVSHMEM, which this torch ({torch.__version__}) or this machine lacks "
            f"(torch.distributed._symmetric_memory.is_nvshmem_available() is False): choose backend {instead!r}"
        )
    memory = process_memory()
    if memory == "nvshmem" or (requested_memory(environ) == "nvshmem" and current_memory() is None):
        return None
    return nvshmem_refusal(memory, instead)


def requested_memory(environ=os.environ) -> str:
    """The symmetric memory :data:`MEMORY_VAR` asks for: `cuda` (also when unset) or `nvshmem`."""
    value = environ.get(MEMORY_VAR, "").strip().lower() or "cuda"
    if value not in MEMORY_CHOICES:
        raise ConfigError(
            f"{MEMORY_VAR}={environ.get(MEMORY_VAR)!r} is not a symmetric memory: accepted are "
            f"{', '.join(MEMORY_CHOICES)}"
        )
    return value


def apply_requested(environ=os.environ) -> None:
    """Opt into NVSHMEM where :data:`MEMORY_VAR` says `nvshmem` (Syncopate's contexts call this before
    they allocate)."""
    if requested_memory(environ) == "nvshmem":
        use_nvshmem()


def nvshmem_refusal(memory: str, instead: str = "sm_copy") -> str | None:
    """Why backend `nvshmem` cannot move chunks between buffers of kind `memory` (a context's
    `memory`: `nvshmem`, `cuda`, `ipc`), None where it can; the message names backend `instead` as
    the one to choose otherwise."""
    if memory == "nvshmem":
        return None
    if memory == "ipc":
        return (
            "backend 'nvshmem' needs one GPU a rank, but ranks of this group share a GPU (their buffers go "
            f"through CUDA IPC, not NVSHMEM): choose backend {instead!r}"
        )
    return (
        f"backend 'nvshmem' needs NVSHMEM symmetric memory, but this process's is {memory!r}: {_OPT_IN}, "
        f"or choose backend {instead!r}"
    )
