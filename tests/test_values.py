"""Layer: pure CPU logic. Shapes, workloads, topologies and candidates: validation, keys, JSON
round-trips and the stable hash."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from syncopate.errors import ConfigError
from syncopate.search_space import (
    BACKENDS,
    GPUS,
    INTERCONNECTS,
    TEMPLATES,
    TILE_ORDERS,
    Candidate,
    Shape,
    Topology,
    Workload,
    canonical_dtype,
)


def test_sharding_rules_of_each_kind():
    w = Workload(kind="ag_gemm", shape=(8192, 4096, 1024))
    assert w.local_shapes(2) == {"a": (4096, 1024), "b": (1024, 2048), "out": (8192, 2048)}
    w = Workload(kind="gemm_rs", shape=(8192, 4096, 1024))
    assert w.local_shapes(4) == {"a": (8192, 256), "b": (256, 4096), "out": (2048, 4096)}
    w = Workload(kind="gemm_ar", shape=(100, 64, 64))
    assert w.local_shapes(2)["out"] == (100, 64)


@pytest.mark.parametrize(
    "kind, shape, ws, message",
    [
        ("ag_gemm", (8191, 4096, 64), 2, "M=8191 is not divisible by world size 2"),
        ("ag_gemm", (8192, 4097, 64), 2, "N=4097 is not divisible"),
        ("gemm_rs", (8192, 4096, 63), 2, "K=63 is not divisible"),
        ("gemm_ar", (8192, 4096, 66), 4, "K=66 is not divisible by world size 4"),
    ],
)
def test_shard_divisibility_is_checked(kind, shape, ws, message):
    with pytest.raises(ConfigError, match=message):
        Workload(kind=kind, shape=shape).check_world_size(ws)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            {"kind": "gemm_xyz", "shape": (1, 1, 1)},
            "unknown kind 'gemm_xyz': accepted are ag_gemm, gemm_rs, gemm_ar",
        ),
        (
            {"kind": "gemm_a2a", "shape": (1, 1, 1)},
            "kind 'gemm_a2a' is a mixture-of-experts op, run by syncopate.moe .* accepted here are "
            "ag_gemm, gemm_rs, gemm_ar",
        ),
        ({"kind": "ag_gemm", "shape": (0, 1, 1)}, "M=0 must be positive"),
        ({"kind": "ag_gemm", "shape": (1, -4, 1)}, "N=-4 must be positive"),
        ({"kind": "ag_gemm", "shape": (1, 1, 1.5)}, "K=1.5 must be an integer"),
        ({"kind": "ag_gemm", "shape": (1, 1, True)}, "K=True must be an integer"),
        ({"kind": "ag_gemm", "shape": (2**62, 8, 8)}, "M=4611686018427387904 is larger than 1048576"),
        ({"kind": "ag_gemm", "shape": (8, 8, 10**20)}, "K=100000000000000000000 is larger than 1048576"),
        (
            {"kind": "gemm_rs", "shape": (2**20, 2**20, 64)},
            r"the output would have 1099511627776 elements, more than 17179869184 \(2\^34\)",
        ),
        ({"kind": "ag_gemm", "shape": (1, 1, 1), "dtype": "int8"}, "unknown dtype 'int8'"),
    ],
)
def test_bad_workloads_name_the_value(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        Workload(**kwargs)


def test_integral_numbers_of_other_types_are_dims():
    np = pytest.importorskip("numpy")
    w = Workload(kind="ag_gemm", shape=(np.int64(8192), np.int32(4096), 8192))
    assert w.shape.as_tuple() == (8192, 4096, 8192) and type(w.shape.m) is int
    assert (
        w == Workload(kind="ag_gemm", shape=(8192, 4096, 8192)) and w.key() == "ag_gemm/8192x4096x8192/bf16"
    )
    assert Workload(kind="ag_gemm", shape=np.array([8192, 4096, 8192])) == w
    with pytest.raises(ConfigError, match="is not understood"):
        Workload(kind="ag_gemm", shape=np.array([8192, 4096]))
    with pytest.raises(ConfigError, match="is not understood"):
        Workload(kind="ag_gemm", shape="8192x4096x8192")


def test_dtype_aliases_and_torch_names():
    assert canonical_dtype("bfloat16") == canonical_dtype("torch.bfloat16") == "bf16"
    assert canonical_dtype("half") == "fp16"


def test_workload_key_round_trip():
    w = Workload(kind="gemm_rs", shape=(8192, 4096, 11008), dtype="fp16")
    assert Workload.from_key(w.key()) == w
    assert Workload.from_dict(w.to_dict()) == w


@given(
    gpu=st.sampled_from(sorted(GPUS)),
    nodes=st.integers(1, 4),
    per_node=st.sampled_from([1, 2, 4, 8]),
    ic=st.sampled_from(sorted(INTERCONNECTS)),
)
def test_topology_key_round_trips(gpu, nodes, per_node, ic):
    t = Topology(world_size=nodes * per_node, gpu_model=gpu, interconnect=ic, nodes=nodes)
    assert Topology.from_key(t.key()) == t
    assert Topology.from_dict(t.to_dict()) == t
    assert t.sm_count == GPUS[gpu].sm_count


def test_topology_key_examples():
    assert Topology.from_key("H200x2-nvlink").key() == "H200x2-nvlink"
    t = Topology.from_key("H100x16-nvswitch-2n")
    assert (t.world_size, t.nodes, t.gpus_per_node) == (16, 2, 8)


@pytest.mark.parametrize(
    "key, message",
    [
        ("H200-nvlink", "does not parse"),
        ("H200x2", "does not parse"),
        ("H200x2-infiniband", "unknown interconnect 'infiniband'"),
        ("Z9x2-nvlink", "unknown GPU 'Z9'"),
        ("H200x3-nvlink-2n", "nodes=2 must be a positive integer dividing world_size=3"),
    ],
)
def test_bad_topology_keys(key, message):
    with pytest.raises(ConfigError, match=message):
        Topology.from_key(key)


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"sm_count": -4}, r"sm_count=-4 must be an integer in \[1, 1024\]"),
        ({"sm_count": 2.5}, "sm_count=2.5 must be an integer"),
        ({"sm_count": 100000}, "sm_count=100000 must be"),
        ({"memory_gb": -1.0}, r"memory_gb=-1.0 must be a number in \(0, 4096\]"),
        ({"memory_gb": float("nan")}, "memory_gb=nan must be a number"),
        ({"link_gbps": float("inf")}, "link_gbps=inf must be a number"),
        ({"link_gbps": -450}, "link_gbps=-450 must be a number"),
        ({"world_size": 2.0}, "world_size=2.0 must be an integer"),
        ({"world_size": 10**6}, "world_size=1000000 must be an integer in"),
    ],
)
def test_topology_figures_out_of_range_are_refused(fields, message):
    with pytest.raises(ConfigError, match=message):
        Topology(**{"world_size": 2, "gpu_model": "H200", **fields})


def test_topology_zero_figures_take_the_models_and_from_dict_names_what_it_lacks():
    t = Topology(world_size=2, gpu_model="H200", sm_count=0, memory_gb=0, link_gbps=0)
    assert (t.sm_count, t.memory_gb, t.link_gbps) == (132, 141, 450)
    assert Topology(world_size=2, gpu_model="H200", sm_count=114, link_gbps=300.5).sm_count == 114
    with pytest.raises(ConfigError, match="lacks gpu_model: give world_size and gpu_model"):
        Topology.from_dict({"world_size": 2})
    with pytest.raises(ConfigError, match="must be a mapping"):
        Topology.from_dict("H200x2-nvlink")
    assert Topology.from_dict(t.to_dict()) == t


candidates = st.builds(
    lambda backend, **kw: Candidate(backend=backend, comm_sms=0 if backend == "copy_engine" else 16, **kw),
    backend=st.sampled_from(BACKENDS),
    template=st.sampled_from(TEMPLATES),
    num_splits=st.integers(2, 64),
    tile_order=st.sampled_from(TILE_ORDERS),
    block_m=st.sampled_from([64, 128, 256]),
    block_n=st.sampled_from([64, 128, 256]),
    block_k=st.sampled_from([32, 64, 128]),
    group_m=st.sampled_from([1, 4, 8]),
    num_warps=st.sampled_from([4, 8]),
    num_stages=st.integers(2, 6),
)


@settings(max_examples=200)
@given(c=candidates)
def test_candidate_json_round_trips_and_hash_is_stable(c):
    again = Candidate.from_json(c.to_json())
    assert again == c
    assert again.key() == c.key()
    assert json.loads(c.to_json()) == c.to_dict()


def test_candidate_hash_is_stable_across_processes():
    c = Candidate(backend="nccl", comm_sms=8, num_splits=4)
    code = (
        "from syncopate.search_space import Candidate; "
        "print(Candidate(backend='nccl', comm_sms=8, num_splits=4).key())"
    )
    other = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert other == c.key()
    assert len(c.key()) == 16
    assert Candidate().key() != c.key()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"backend": "mpi"}, "unknown backend 'mpi': accepted are copy_engine, sm_copy, nvshmem, nccl"),
        ({"template": "star"}, "unknown plan template 'star'"),
        ({"tile_order": "hilbert"}, "unknown tile order 'hilbert'"),
        ({"block_m": 96}, "block_m=96 must be a power of two"),
        ({"num_splits": 0}, "num_splits=0 must be in"),
        ({"comm_sms": 4}, "copy_engine spends no SM: comm_sms must be 0, got 4"),
        ({"backend": "sm_copy"}, "sm_copy needs comm_sms >= 1"),
        ({"template": "bidirectional_ring", "num_splits": 1}, "needs num_splits >= 2"),
        ({"num_warps": True}, "num_warps=True must be an integer"),
    ],
)
def test_bad_candidates_name_the_field(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        Candidate(**kwargs)


def test_candidate_from_json_rejects_unknown_fields_and_garbage():
    with pytest.raises(ConfigError, match="unknown candidate field"):
        Candidate.from_json('{"backend": "nccl", "comm_sms": 8, "warp_spec": 1}')
    with pytest.raises(ConfigError, match="does not parse"):
        Candidate.from_json("{not json")


def test_search_space_imports_neither_torch_nor_triton():
    code = (
        "import sys, syncopate, syncopate.search_space, syncopate.autotuner; "
        "print('torch' in sys.modules, 'triton' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_shape_helpers():
    assert Shape.of((1, 2, 3)) == Shape(m=1, n=2, k=3) == Shape.from_key("1x2x3")
    with pytest.raises(ConfigError, match="not understood"):
        Shape.of("big")
