"""Layer: pure CPU logic. `MoeCandidate` checks itself and names the value and what is accepted,
round-trips through JSON with a stable key; `check_moe_candidate` and `moe_space` for a workload
and a world size."""

from __future__ import annotations

import pytest

from syncopate.errors import ConfigError
from syncopate.search_space.moe_workload import (
    MOE_DEFAULT_BACKENDS,
    MoeCandidate,
    MoeWorkload,
    RoutingSpec,
    check_moe_candidate,
    moe_space,
)


def _workload(**kw):
    base = {"kind": "a2a_gemm", "tokens": 4096, "hidden": 2048, "ffn": 768, "experts": 128, "top_k": 8}
    return MoeWorkload(**{**base, **kw})


def test_a_candidate_round_trips_with_a_stable_key():
    c = MoeCandidate(template="pipelined", backend="copy_engine", chunks_per_source=4, order="pairwise")
    assert MoeCandidate.from_json(c.to_json()) == c
    assert MoeCandidate.from_dict(c.to_dict()) == c
    assert (
        c.to_json()
        == '{"backend":"copy_engine","chunks_per_source":4,"order":"pairwise","template":"pipelined"}'
    )
    assert c.key() == MoeCandidate.from_json(c.to_json()).key() and len(c.key()) == 16
    assert c.key() != c.replace(chunks_per_source=2).key()
    assert c.short() == "pipelined/copy_engine/c4/pairwise"
    assert MoeCandidate().short() == "unfused"
    assert MoeCandidate() == MoeCandidate(
        template="unfused", backend="nccl", chunks_per_source=1, order="ring"
    )


@pytest.mark.parametrize(
    "kw, words",
    [
        (
            {"template": "fusion"},
            "unknown MoE template 'fusion': accepted are unfused, pipelined, fused, dedup",
        ),
        (
            {"template": "fused"},
            "template fused moves its pieces through the symmetric buffers of backend 'copy_engine', got "
            "backend 'nccl'; use backend 'copy_engine' (or template 'pipelined' for 'nccl')",
        ),
        (
            {"template": "fused", "backend": "copy_engine", "block_m": 48},
            "block_m=48 is not accepted for template fused: give one of 16, 32, 64, 128, 256",
        ),
        (
            {"template": "fused", "backend": "copy_engine", "num_warps": 16},
            "num_warps=16 is not accepted for template fused: give one of 2, 4, 8",
        ),
        (
            {"template": "fused", "backend": "copy_engine", "num_stages": True},
            "num_stages=True is not accepted for template fused",
        ),
        (
            {"template": "pipelined", "block_n": 64},
            "template pipelined runs no Triton kernel of its own: block_n=64 applies to templates 'fused' "
            "and 'fused_dedup' only; leave the tile fields at their defaults",
        ),
        (
            {"template": "fused_dedup", "backend": "nccl"},
            "template fused_dedup moves its pieces through the symmetric buffers of backend 'copy_engine'",
        ),
        (
            {"template": "fused_dedup", "backend": "copy_engine", "chunks_per_source": 2},
            "template fused_dedup moves one piece a source rank",
        ),
        (
            {"template": "pipelined", "backend": "sm_copy"},
            "unknown MoE backend 'sm_copy': accepted are nccl, copy_engine, nvshmem",
        ),
        (
            {"template": "pipelined", "order": "zigzag"},
            "unknown MoE piece order 'zigzag': accepted are ring, pairwise",
        ),
        (
            {"template": "pipelined", "chunks_per_source": 3},
            "chunks_per_source=3 is not accepted: give one of 1, 2, 4, 8",
        ),
        ({"template": "pipelined", "chunks_per_source": True}, "chunks_per_source=True is not accepted"),
        ({"template": "pipelined", "chunks_per_source": "2"}, "chunks_per_source='2' is not accepted"),
        (
            {"backend": "copy_engine"},
            "template unfused runs torch's all_to_all_single and one grouped GEMM: it takes backend 'nccl', "
            "chunks_per_source=1 and order 'ring', got backend 'copy_engine', chunks_per_source=1 and order 'ring'",
        ),
        ({"chunks_per_source": 2}, "got backend 'nccl', chunks_per_source=2 and order 'ring'"),
        (
            {"template": "dedup", "backend": "copy_engine", "chunks_per_source": 2},
            "template dedup moves one piece a source rank (a token's rows there are summed in one "
            "place): it takes chunks_per_source=1, got 2",
        ),
        (
            {"template": "dedup", "order": "pairwise"},
            "template dedup on backend 'nccl' runs torch's all_to_all_single and one grouped GEMM: it "
            "takes chunks_per_source=1 and order 'ring', got chunks_per_source=1 and order 'pairwise' "
            "(backend 'copy_engine' pipelines it by source rank, in either order)",
        ),
        (
            {"template": "dedup", "backend": "nvshmem"},
            "backend nvshmem moves the pieces of template 'pipelined' only",
        ),
        (
            {"template": "dedup", "block_m": 128},
            "template dedup runs no Triton kernel of its own: block_m=128 applies to templates 'fused' and "
            "'fused_dedup' only",
        ),
    ],
)
def test_bad_values_are_refused_by_name(kw, words):
    with pytest.raises(ConfigError) as e:
        MoeCandidate(**kw)
    assert words in str(e.value)


def test_bad_input_to_from_dict_and_from_json():
    words = (
        "unknown MoE candidate field\\(s\\) splits: accepted are backend, block_k, block_m, block_n, "
        "chunks_per_source, comm_sms, num_stages, num_warps, order, template"
    )
    with pytest.raises(ConfigError, match=words):
        MoeCandidate.from_dict({"template": "pipelined", "splits": 2})
    with pytest.raises(ConfigError, match="a MoE candidate is a mapping, got a list of 1 item"):
        MoeCandidate.from_json("[1]")
    with pytest.raises(ConfigError, match="MoE candidate JSON does not parse"):
        MoeCandidate.from_json("{")
    with pytest.raises(TypeError):
        MoeCandidate("pipelined")  # keyword-only


def test_a_fused_candidate_keeps_its_tiles_and_the_others_leave_them_out():
    c = MoeCandidate(
        template="fused",
        backend="copy_engine",
        chunks_per_source=2,
        order="pairwise",
        block_m=128,
        num_warps=8,
    )
    assert MoeCandidate.from_json(c.to_json()) == c
    assert c.to_dict() == {
        "template": "fused",
        "backend": "copy_engine",
        "chunks_per_source": 2,
        "order": "pairwise",
        "block_m": 128,
        "block_n": 128,
        "block_k": 64,
        "num_warps": 8,
        "num_stages": 3,
    }
    assert c.key() != c.replace(block_m=64).key()
    assert c.short() == "fused/copy_engine/c2/pairwise/128x128x64w8s3"
    # its backward's plan: pipelined, the same backend, chunks and order, no tiles
    assert c.as_pipelined() == MoeCandidate(
        template="pipelined", backend="copy_engine", chunks_per_source=2, order="pairwise"
    )
    assert "block_m" not in c.as_pipelined().to_dict()
    # the other templates' JSON and keys do not name the tile fields
    assert "block_m" not in MoeCandidate().to_json()
    assert MoeCandidate.from_dict({"template": "pipelined", "block_m": 64}) == MoeCandidate(
        template="pipelined"
    )


def test_pairwise_needs_a_power_of_two_world_size():
    c = MoeCandidate(template="pipelined", order="pairwise")
    for ws in (1, 2, 4, 8):
        check_moe_candidate(c, ws)
    with pytest.raises(ConfigError, match="needs a power-of-two world size, got 6; use order 'ring'"):
        check_moe_candidate(c, 6)
    check_moe_candidate(c.replace(order="ring"), 6)


def test_the_space_of_a_workload():
    space = moe_space(_workload(), 4)
    assert space[0] == MoeCandidate()  # the guard first
    assert space[1] == MoeCandidate(template="dedup")  # torch's all-to-all, a token's row once a rank
    assert len(space) == len(set(space))
    pipelined = space[2:14]
    assert {c.template for c in pipelined} == {"pipelined"}
    assert {c.backend for c in pipelined} == set(MOE_DEFAULT_BACKENDS)
    assert {c.chunks_per_source for c in pipelined} == {1, 2, 4}
    assert {c.order for c in pipelined} == {"ring", "pairwise"}
    assert len(pipelined) == 2 * 3 * 2
    # then dedup on the copy engine, a piece a source rank, in each order
    assert [c.short() for c in space[14:16]] == ["dedup/copy_engine/ring", "dedup/copy_engine/pairwise"]
    # fused after them: chunks × orders × the four tile configurations, copy_engine only; then
    # fused_dedup (the dispatch only), each order × the tile configurations
    fused, fused_dedup = space[16:40], space[40:]
    assert {c.template for c in fused} == {"fused"} and {c.backend for c in fused} == {"copy_engine"}
    assert len(fused) == 3 * 2 * 4
    assert {c.template for c in fused_dedup} == {"fused_dedup"} and len(fused_dedup) == 2 * 4
    assert {(c.chunks_per_source, c.backend) for c in fused_dedup} == {(1, "copy_engine")}
    assert "fused_dedup" not in {c.template for c in moe_space(_workload(kind="gemm_a2a"), 4)}
    assert {(c.block_m, c.block_n, c.block_k, c.num_warps, c.num_stages) for c in fused} == {
        (64, 128, 64, 4, 3),
        (128, 128, 64, 8, 4),
        (128, 256, 64, 8, 4),
        (128, 256, 32, 8, 5),
    }
    assert [c.template for c in moe_space(_workload(), 4, backends=("nccl",))][-1] == "pipelined"
    for c in space:
        check_moe_candidate(c, 4)
    # two ranks: pairwise is ring; three: no pairwise at all
    assert {c.order for c in moe_space(_workload(), 2)} == {"ring"}
    assert {c.order for c in moe_space(_workload(experts=120), 3)} == {"ring"}
    # chunk counts above the rows a source sends a rank on average are left out
    tiny = moe_space(_workload(tokens=1, top_k=2, experts=8), 2, backends=("nccl",))
    assert [
        c.short() for c in moe_space(_workload(tokens=1, top_k=2, experts=8), 2, backends=("copy_engine",))
    ][2:] == [
        "dedup/copy_engine/ring",
        "fused/copy_engine/c1/ring/64x128x64w4s3",
        "fused/copy_engine/c1/ring/128x128x64w8s4",
        "fused/copy_engine/c1/ring/128x256x64w8s4",
        "fused/copy_engine/c1/ring/128x256x32w8s5",
        "fused_dedup/copy_engine/ring/64x128x64w4s3",
        "fused_dedup/copy_engine/ring/128x128x64w8s4",
        "fused_dedup/copy_engine/ring/128x256x64w8s4",
        "fused_dedup/copy_engine/ring/128x256x32w8s5",
    ]
    assert [c.short() for c in tiny] == ["unfused", "dedup", "pipelined/nccl/c1/ring"]
    assert [c.short() for c in moe_space(_workload(), 2, backends=("nccl",), chunks=(8,))] == [
        "unfused",
        "dedup",
        "pipelined/nccl/c8/ring",
    ]
    with pytest.raises(
        ConfigError, match="unknown MoE backend 'sm_copy' in backends: accepted are nccl, copy_engine"
    ):
        moe_space(_workload(), 2, backends=("sm_copy",))
    with pytest.raises(ConfigError, match="chunks_per_source=3 in chunks is not accepted"):
        moe_space(_workload(), 2, chunks=(3,))
    with pytest.raises(ConfigError, match="experts=128 is not divisible by world size 3"):
        moe_space(_workload(), 3)


def test_a_workload_parses_back_from_its_key():
    skewed = RoutingSpec(distribution="skewed", skew=1.2, seed=3)
    for w in (
        _workload(),
        MoeWorkload(
            kind="gemm_a2a", tokens=16, hidden=64, ffn=32, experts=8, top_k=2, routing=skewed, dtype="fp16"
        ),
    ):
        assert MoeWorkload.from_key(w.key()) == w
    for bad in ("a2a_gemm/t16-h64/uniform-seed0/bf16", "x", 7):
        with pytest.raises(ConfigError, match="does not parse: expected KIND/tT-hH-fF-eE-kK/ROUTING/DTYPE"):
            MoeWorkload.from_key(bad)
    with pytest.raises(ConfigError, match="unknown MoE kind 'ag_gemm'"):
        MoeWorkload.from_key("ag_gemm/t16-h64-f32-e8-k2/uniform-seed0/bf16")
