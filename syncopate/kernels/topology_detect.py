"""Detect the topology of a process group from torch, the hosts and NVML."""

from __future__ import annotations

import socket

from syncopate.errors import RuntimeUnavailableError
from syncopate.search_space import GPUS, Topology

__all__ = ["detect_topology", "gpu_model_of"]


def gpu_model_of(name: str) -> str:
    """`NVIDIA H200` → `H200`; a name not in the table keeps its first word."""
    words = name.replace("NVIDIA", "").replace("-", " ").split()
    for w in words:
        if w.upper() in GPUS:
            return w.upper()
    return "".join(ch for ch in (words[0] if words else "GPU") if ch.isalnum())


def _nvlink_peers(device_index: int) -> int:
    """How many active NVLinks the GPU has (0 when NVML is missing or reports none)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
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
        return 0


def detect_topology(group=None) -> Topology:
    """World size and node count of `group` (or of the visible GPUs), GPU model, SMs and interconnect."""
    import torch
    import torch.distributed as dist

    if not torch.cuda.is_available():
        e = RuntimeUnavailableError("cannot detect a topology: no CUDA GPU is visible (give a key such as H200x2-nvlink)")
        e.reason = "no CUDA GPU is visible"
        raise e
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
    links = _nvlink_peers(device)
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
