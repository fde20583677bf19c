"""Detect the topology of a process group from torch, the hosts and NVML."""

from __future__ import annotations

import logging
import socket

from syncopate.errors import RuntimeUnavailableError
from syncopate.search_space import GPUS, Topology

__all__ = ["detect_topology", "gpu_model_of"]

log = logging.getLogger(__name__)


def gpu_model_of(name: str) -> str:
    """`NVIDIA H200` → `H200`; a name not in the table keeps its first word."""
    words = name.replace("NVIDIA", "").replace("-", " ").split()
    for w in words:
        if w.upper() in GPUS:
            return w.upper()
    return "".join(ch for ch in (words[0] if words else "GPU") if ch.isalnum())


def _nvlink_peers(device_index: int, uuid: str | None = None) -> int | None:
    """How many active NVLinks the GPU has; None where NVML cannot say (no driver library).

    Through nvidia-ml-py where it is installed, else through the driver's own libnvidia-ml.so.1
    (which every driver install has; Syncopate does not depend on nvidia-ml-py)."""
    try:
        import pynvml
    except ImportError:
        return _nvlink_peers_ctypes(device_index, uuid)
    try:
        pynvml.nvmlInit()
        try:
            handle = None
            if uuid:
                try:
                    handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
                except Exception:  # an older nvidia-ml-py that wants bytes, or a UUID NVML does not know
                    handle = None
            if handle is None:
                handle = pynvml.nvmlDeviceGetHandleByIndex(device_index)
            active = 0
            for link in range(18):
                try:
                    if pynvml.nvmlDeviceGetNvLinkState(handle, link) == pynvml.NVML_FEATURE_ENABLED:
                        active += 1
                except pynvml.NVMLError:
                    break
            return active
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return None


def _nvlink_peers_ctypes(device_index: int, uuid: str | None = None, lib=None) -> int | None:
    """`_nvlink_peers` through the NVML C library (`lib`: the loaded library, for tests)."""
    import ctypes

    try:
        lib = lib or ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    if lib.nvmlInit_v2() != 0:
        return None
    try:
        handle = ctypes.c_void_p()
        found = -1
        if uuid:
            found = lib.nvmlDeviceGetHandleByUUID(ctypes.c_char_p(uuid.encode()), ctypes.byref(handle))
        if found != 0:
            found = lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(device_index), ctypes.byref(handle))
        if found != 0:
            return None
        active = 0
        for link in range(18):
            state = ctypes.c_int(0)
            if lib.nvmlDeviceGetNvLinkState(handle, ctypes.c_uint(link), ctypes.byref(state)) != 0:
                break  # no such link, or NVLink not supported here
            active += state.value == 1  # NVML_FEATURE_ENABLED
        return active
    finally:
        lib.nvmlShutdown()


def _device_uuid(props) -> str | None:
    """NVML's spelling of the device's UUID (`GPU-…`), or None where torch does not give it."""
    uuid = getattr(props, "uuid", None)
    if not uuid:
        return None
    text = str(uuid)
    return text if text.startswith("GPU-") else f"GPU-{text}"


def _no_gpu() -> None:
    e = RuntimeUnavailableError(
        "cannot detect a topology: no CUDA GPU is visible (give a key such as H200x2-nvlink)"
    )
    e.reason = "no CUDA GPU is visible"
    raise e


def detect_topology(group=None) -> Topology:
    """World size and node count of `group` (or of the visible GPUs), GPU model, SMs and interconnect."""
    from syncopate.environment import no_gpu_for_torch

    if no_gpu_for_torch():  # said without the second that importing torch takes
        _no_gpu()
    import torch
    import torch.distributed as dist

    if not torch.cuda.is_available():
        _no_gpu()
    device = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(device)
    model = gpu_model_of(props.name)
    if dist.is_initialized():
        group = group or dist.group.WORLD
        world = dist.get_world_size(group)
        hosts: list[str] = [""] * world
        dist.all_gather_object(hosts, socket.gethostname(), group=group)
        nodes = len(set(hosts))
    else:
        world, nodes = torch.cuda.device_count(), 1
    links = _nvlink_peers(device, _device_uuid(props))
    if links is None:
        log.warning("NVML cannot be read here: the interconnect is taken to be PCIe; give a topology key "
                    "(such as H200x2-nvlink) where the GPUs are joined by NVLink")
        links = 0
    if links == 0:
        interconnect = "pcie"
    else:
        interconnect = "nvswitch" if world // nodes > 2 else "nvlink"
    if world % nodes:
        nodes = 1
    return Topology(
        world_size=world, gpu_model=model, interconnect=interconnect, nodes=nodes, sm_count=props.multi_processor_count,
        memory_gb=round(props.total_memory / 1e9, 1),
    )
