"""Layer: pure CPU logic. The SM-copy backend is named `sm_copy`: input that gives its earlier name
`nvshmem` is refused with a message naming the new one."""

from __future__ import annotations

import re

import pytest

from syncopate.cli import main
from syncopate.errors import ConfigError
from syncopate.search_space import BACKENDS, Candidate, SpaceOptions

RENAMED = (
    "backend 'nvshmem' was renamed 'sm_copy' (this backend stores chunks with SM copies; no NVSHMEM "
    "is used) — use 'sm_copy'"
)


def test_the_backend_is_named_sm_copy_and_its_old_name_is_refused_with_the_new_one():
    assert "sm_copy" in BACKENDS and "nvshmem" not in BACKENDS
    with pytest.raises(ConfigError) as info:
        Candidate(backend="nvshmem", comm_sms=16)
    assert str(info.value) == RENAMED
    with pytest.raises(ConfigError, match=f"^{re.escape(RENAMED)}$"):
        Candidate.from_json('{"backend": "nvshmem", "comm_sms": 16, "num_splits": 2}')
    with pytest.raises(ConfigError, match=f"^{re.escape(RENAMED)} in space.backends$"):
        SpaceOptions(backends=("copy_engine", "nvshmem"))
    with pytest.raises(ConfigError, match=f"^{re.escape(RENAMED)} in space.comm_sms$"):
        SpaceOptions(comm_sms={"nvshmem": (32,)})
    with pytest.raises(
        ConfigError, match="^unknown backend 'nvshmemx': accepted are copy_engine, sm_copy, nccl$"
    ):
        Candidate(backend="nvshmemx", comm_sms=16)


@pytest.mark.parametrize(
    ("space", "where"),
    [
        ("backends: [copy_engine, nvshmem]", "space.backends: "),
        ("comm_sms: {nvshmem: [32]}", ""),
    ],
)
def test_a_sweep_config_naming_the_old_backend_is_refused_with_the_new_name(tmp_path, capsys, space, where):
    config = tmp_path / "old.yaml"
    config.write_text(
        "name: old\ntopology: H200x2-nvlink\nworkloads:\n  - kind: ag_gemm\n    shapes: [[8192, 4096, 8192]]\n"
        f"space:\n  {space}\n"
    )
    assert main(["validate", str(config)]) == 2
    err = capsys.readouterr().err
    assert where + RENAMED in " ".join(err.split()), err
