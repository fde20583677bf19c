"""Facts of the machine this process runs on: its GPUs, how they are joined, whether torch can
see any, and the switches every process Syncopate starts runs under.

- :func:`detect_topology`: the topology of a process group, from torch, the hosts and NVML;
- :func:`gpu_model_of`: a device name as a GPU model of :data:`~syncopate.search_space.GPUS`;
- :func:`no_gpu_for_torch`: whether torch would certainly see no GPU, said without importing it;
- :data:`MULTICAST_OFF`: the variables that keep NCCL, torch symmetric memory and NVSHMEM off
  NVLink SHARP (NVLS) multicast objects, which these machines do not lend.

Read by the environment fingerprint, the runtime, the workers and the lookup alike, so it sits
below them all and imports only the values it returns (`search_space`); nothing here imports torch
until a function needs it.
"""

from __future__ import annotations

import ast
import importlib.util
import logging
import socket
import sys
from pathlib import Path

from syncopate.errors import RuntimeUnavailableError
from syncopate.search_space import GPUS, Topology

__all__ = ["MULTICAST_OFF", "cpu_torch_build", "detect_topology", "gpu_model_of", "no_gpu_for_torch"]

log = logging.getLogger(__name__)

MULTICAST_OFF: dict[str, str] = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
"""Variables that turn NVLink multicast off in NCCL, torch symmetric memory and NVSHMEM."""


def gpu_model_of(name: str) -> str:
    """`NVIDIA H200` → `H200`; a name not in the table keeps its first word."""
    words = name.replace("NVIDIA", "").replace("-", " ").split()
    for w in words:
        if w.upper() in GPUS:
            return w.upper()
    return "".join(ch for ch in (words[0] if words else "GPU") if ch.isalnum())


def _torch_build() -> dict[str, object] | None:
    """The literals of torch's `version.py` (`__version__`, `cuda`, `hip`, …) read from the file,
    without importing torch; None where torch is not installed or the file says something else."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    try:
        tree = ast.parse((Path(next(iter(spec.submodule_search_locations))) / "version.py").read_text())
    except (OSError, SyntaxError, StopIteration):
        return None
    found: dict[str, object] = {}
    for node in tree.body:
        target = (
            node.targets[0]
            if isinstance(node, ast.Assign) and len(node.targets) == 1
            else (node.target if isinstance(node, ast.AnnAssign) else None)
        )
        if isinstance(target, ast.Name) and node.value is not None:
            try:
                found[target.id] = ast.literal_eval(node.value)
            except ValueError:
                continue
    return found if isinstance(found.get("__version__"), str) else None


def _nvidia_driver_loaded() -> bool:
    """Whether this machine has an NVIDIA driver loaded (without one, torch sees no CUDA GPU)."""
    return Path("/proc/driver/nvidia/version").exists() or Path("/dev/nvidiactl").exists()


def cpu_torch_build() -> dict[str, object] | None:
    """The literals of torch's `version.py` where torch would certainly see no GPU here, read
    without importing torch (a second or more): a torch built without CUDA or ROCm, or a CUDA
    build on a machine with no NVIDIA driver. None where a GPU might be visible: only torch can
    then say."""
    build = _torch_build()
    if build is None or build.get("hip") or build.get("xpu"):
        return None
    cuda = build.get("cuda")
    if cuda is not None and (not isinstance(cuda, str) or _nvidia_driver_loaded()):
        return None
    return build


def no_gpu_for_torch() -> bool:
    """Whether torch would certainly see no GPU here, known without importing it (False: it may
    see one, or only torch can tell)."""
    return "torch" not in sys.modules and cpu_torch_build() is not None


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
    """The topology of `group` (default: the initialised default group, else the visible GPUs):
    world size and node count, GPU model and SM count from torch, the interconnect from NVML.
    RuntimeUnavailableError where no CUDA GPU is visible."""
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
        log.warning(
            "NVML cannot be read here: the interconnect is taken to be PCIe; give a topology key "
            "(such as H200x2-nvlink) where the GPUs are joined by NVLink"
        )
        links = 0
    if links == 0:
        interconnect = "pcie"
    else:
        interconnect = "nvswitch" if world // nodes > 2 else "nvlink"
    if world % nodes:
        nodes = 1
    return Topology(
        world_size=world,
        gpu_model=model,
        interconnect=interconnect,
        nodes=nodes,
        sm_count=props.multi_processor_count,
        memory_gb=round(props.total_memory / 1e9, 1),
    )
