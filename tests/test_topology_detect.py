"""Layer: pure CPU logic. NVLink detection through the NVML C library (the path taken where
nvidia-ml-py is not installed), against a stand-in library: active links counted, a GPU without
NVLink (NVML_ERROR_NOT_SUPPORTED) gives 0, a UUID NVML does not know falls back to the index, and a
library that cannot start gives None (the detector then warns and assumes PCIe)."""

from __future__ import annotations

from syncopate.platform import _device_uuid, _nvlink_peers_ctypes

NOT_SUPPORTED = 3


class FakeNvml:
    def __init__(self, links: list[int] | None, init: int = 0, uuids: tuple[str, ...] = ("GPU-abc",)):
        self.links, self.init, self.uuids = links, init, uuids
        self.calls: list[str] = []

    def nvmlInit_v2(self):
        self.calls.append("init")
        return self.init

    def nvmlShutdown(self):
        self.calls.append("shutdown")
        return 0

    def nvmlDeviceGetHandleByUUID(self, uuid, handle):
        self.calls.append(f"uuid {uuid.value.decode()}")
        if uuid.value.decode() not in self.uuids:
            return 13  # NVML_ERROR_NOT_FOUND
        handle._obj.value = 1
        return 0

    def nvmlDeviceGetHandleByIndex_v2(self, index, handle):
        self.calls.append(f"index {index.value}")
        handle._obj.value = 2
        return 0

    def nvmlDeviceGetNvLinkState(self, handle, link, state):
        if self.links is None:
            return NOT_SUPPORTED
        if link.value >= len(self.links):
            return 2  # NVML_ERROR_INVALID_ARGUMENT: no such link
        state._obj.value = self.links[link.value]
        return 0


def test_active_links_are_counted():
    lib = FakeNvml([1] * 12 + [0] * 6)
    assert _nvlink_peers_ctypes(0, "GPU-abc", lib=lib) == 12
    assert lib.calls == ["init", "uuid GPU-abc", "shutdown"]
    assert _nvlink_peers_ctypes(0, None, lib=FakeNvml([1, 1, 0, 1])) == 3


def test_a_gpu_without_nvlink_has_none():
    assert _nvlink_peers_ctypes(0, "GPU-abc", lib=FakeNvml(None)) == 0


def test_an_unknown_uuid_falls_back_to_the_index():
    lib = FakeNvml([1, 1])
    assert _nvlink_peers_ctypes(3, "GPU-zzz", lib=lib) == 2
    assert lib.calls == ["init", "uuid GPU-zzz", "index 3", "shutdown"]


def test_nvml_that_cannot_start_says_nothing():
    lib = FakeNvml([1], init=9)  # NVML_ERROR_DRIVER_NOT_LOADED
    assert _nvlink_peers_ctypes(0, None, lib=lib) is None
    assert lib.calls == ["init"]


def test_device_uuid_in_nvml_spelling():
    class Props:
        uuid = "1c3f7973-3c03-581d-3cdf-bf71e0e4f8fd"

    assert _device_uuid(Props()) == "GPU-1c3f7973-3c03-581d-3cdf-bf71e0e4f8fd"
    assert _device_uuid(object()) is None
