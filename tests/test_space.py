"""Layer: pure CPU logic. The search space: every enumerated candidate is valid, unique and
deterministic; hardware and shape rules prune; Optuna distributions cover it."""

from __future__ import annotations

import pytest

from syncopate.autotuner.sweep import load_sweep
from syncopate.errors import ConfigError
from syncopate.search_space import (
    PLANLESS_KINDS,
    Candidate,
    SpaceOptions,
    TileConfig,
    Topology,
    Workload,
    candidate_from_params,
    check_candidate,
    default_candidate,
    optuna_distributions,
    space,
    unfused_candidate,
)

H200x2 = Topology.from_key("H200x2-nvlink")


@pytest.fixture(scope="module")
def suite():
    return load_sweep("configs/llama_tp2.yaml").workloads


def test_every_candidate_of_the_suite_is_valid_and_unique(suite):
    for w in suite:
        cands = space(w, H200x2)
        assert cands, w
        keys = [c.key() for c in cands]
        assert len(keys) == len(set(keys))
        for c in cands:
            check_candidate(c, w, H200x2)
        assert {c.backend for c in cands} == {"copy_engine", "sm_copy", "nccl"}


@pytest.mark.parametrize(
    "config", ["configs/llama_tp2_sweep.yaml", "configs/llama_tp4_sweep.yaml", "configs/h200x2.yaml"]
)
def test_every_candidate_of_a_configured_space_passes_the_ops_checks(config):
    """What `syncopate tune` enumerates the ops accept: opt-in orders (kept_interleaved, direct
    plans only) included, so no trial of a sweep is refused at launch."""
    sweep = load_sweep(config)
    topo = Topology.from_key(sweep.topology_key) if not sweep.detect_topology else H200x2
    for w in sweep.workloads:
        cands = space(w, topo, sweep.space)
        assert cands, w
        for c in cands:
            check_candidate(c, w, topo)


def test_space_is_deterministic():
    w = Workload(kind="ag_gemm", shape=(8192, 2048, 8192))
    assert [c.key() for c in space(w, H200x2)] == [c.key() for c in space(w, H200x2)]


def test_ring_is_skipped_on_two_gpus_but_searched_on_eight():
    w = Workload(kind="ag_gemm", shape=(8192, 4096, 8192))
    assert "ring" not in {c.template for c in space(w, H200x2)}
    assert "ring" in {c.template for c in space(w, Topology.from_key("H200x8-nvswitch"))}


def test_chunks_are_never_shorter_than_a_tile():
    w = Workload(kind="ag_gemm", shape=(1024, 2048, 1024))
    for c in space(w, H200x2):
        assert 512 // c.num_splits >= c.block_m


def test_shared_memory_and_registers_prune_tile_configs():
    big = TileConfig(256, 256, 128, 8, 4)
    opts = SpaceOptions(tile_configs=(big, TileConfig(128, 128, 64, 8, 3)))
    w = Workload(kind="ag_gemm", shape=(8192, 4096, 4096))
    assert {TileConfig.of(c) for c in space(w, H200x2, opts)} == {TileConfig(128, 128, 64, 8, 3)}
    with pytest.raises(ConfigError, match="KiB of shared memory"):
        check_candidate(Candidate(block_m=256, block_n=256, block_k=128, num_stages=4), w, H200x2)
    with pytest.raises(ConfigError, match="accumulator registers"):
        check_candidate(Candidate(block_m=256, block_n=256, block_k=32, num_stages=2, num_warps=4), w, H200x2)


@pytest.mark.parametrize("kind", ["ag_gemm", "gemm_rs", "gemm_ar"])
def test_nccl_gets_the_sms_its_kernels_need(kind):
    w = Workload(kind=kind, shape=(8192, 8192, 2048), dtype="bf16")
    with pytest.raises(ConfigError, match="backend nccl needs comm_sms >= 64, got 16"):
        check_candidate(Candidate(backend="nccl", comm_sms=16), w, H200x2)
    check_candidate(Candidate(backend="nccl", comm_sms=64), w, H200x2)
    assert {c.comm_sms for c in space(w, H200x2) if c.backend == "nccl" and c.template != "unfused"} == {64}


def test_comm_sms_must_leave_sms_for_the_gemm():
    w = Workload(kind="ag_gemm", shape=(8192, 4096, 4096))
    with pytest.raises(ConfigError, match="comm_sms=100 leaves too few of 132 SMs"):
        check_candidate(Candidate(backend="sm_copy", comm_sms=100), w, H200x2)


def test_a_shape_the_world_size_does_not_divide_has_no_space():
    with pytest.raises(ConfigError, match="not divisible by world size 2"):
        space(Workload(kind="gemm_rs", shape=(8192, 4096, 4095)), H200x2)


def test_default_candidate_is_valid_for_the_suite(suite):
    for w in suite:
        check_candidate(default_candidate(w, H200x2), w, H200x2)


def test_the_default_keeps_its_long_tiles_and_fills_the_sms_on_short_gemms():
    def tile(kind, shape, topo=H200x2):
        c = default_candidate(Workload(kind=kind, shape=shape), topo)
        check_candidate(c, Workload(kind=kind, shape=shape), topo)
        return (c.block_m, c.block_n, c.num_warps, c.num_stages)

    assert tile("ag_gemm", (8192, 14336, 4096)) == (128, 256, 8, 3)  # 1792 tiles: the long default
    assert tile("ag_gemm", (8192, 2048, 8192)) == (128, 128, 8, 4)  # N/ws = 1024: narrow, 512 tiles
    assert tile("gemm_rs", (2048, 4096, 4096)) == (128, 256, 8, 3)  # 256 tiles: two waves of 132
    # 256 rows: 128x256 tiles would be 32 on 132 SMs (46.9 us on one H100, 64x128: 25.7)
    one = Topology(world_size=1, gpu_model="H100")
    assert tile("ag_gemm", (256, 4096, 4096), one) == (64, 128, 4, 4)
    assert tile("gemm_rs", (256, 7168, 4096), one) == (128, 128, 4, 4)  # 64x128 would take two waves
    assert tile("gemm_rs", (1024, 4096, 4096), one) == (128, 256, 8, 3)  # 128 tiles: a wave nearly full


def test_the_defaults_splits_are_near_the_cost_models_best():
    """MIN_CHUNK_BYTES and MAX_DEFAULT_CHUNKS were chosen against the cost model with the default
    calibration: on a grid of shapes the default's splits stay near the model's best, and well ahead
    of 4 splits whatever the size."""
    import itertools
    import statistics
    from dataclasses import replace

    from syncopate.cost_model.calibration_defaults import default_calibration
    from syncopate.cost_model.model import CostModel

    ratios, old_ratios = [], []
    for key in ("H200x2-nvlink", "H200x8-nvswitch"):
        topo = Topology.from_key(key)
        model = CostModel(default_calibration(topo))
        for kind, m, n in itertools.product(
            ("ag_gemm", "gemm_rs", "gemm_ar"), (512, 2048, 8192), (4096, 14336)
        ):
            w = Workload(kind=kind, shape=(m, n, 4096))
            chosen = default_candidate(w, topo)
            times = {}
            for splits in (1, 2, 4, 8):
                try:
                    times[splits] = model.predict(w, topo, replace(chosen, num_splits=splits)).time_us
                except ConfigError:
                    pass
            best = min(times.values())
            ratios.append(times[chosen.num_splits] / best)
            old_ratios.append(times.get(4, times[max(times)]) / best)
    assert statistics.mean(ratios) < 1.02 and max(ratios) < 1.2, ratios
    assert statistics.mean(old_ratios) > statistics.mean(ratios) + 0.1, (old_ratios, ratios)
    # The measured TP=2 shapes (their sweep's best: 2 or 4 splits) keep the old default's 4.
    from syncopate.autotuner.sweep import load_sweep

    for w in load_sweep("configs/llama_tp2.yaml").workloads:
        assert default_candidate(w, H200x2).num_splits == 4, w


def test_optuna_distributions_cover_the_space():
    w = Workload(kind="ag_gemm", shape=(8192, 4096, 8192))
    dists = optuna_distributions(w, H200x2)
    cands = space(w, H200x2)
    for c in cands[:: max(1, len(cands) // 50)]:
        params = {
            "backend": c.backend,
            "template": c.template,
            "num_splits": c.num_splits,
            "tile_order": c.tile_order,
            "comm_sms": c.comm_sms,
            "tile_config": TileConfig.of(c).key(),
            "group_m": c.group_m,
            "kernel": c.kernel,
        }
        for name, value in params.items():
            assert value in dists[name].choices
        assert candidate_from_params(params) == c


# -- four and eight GPUs on one NVSwitch node (configs/llama_tp4.yaml, llama_tp8.yaml) ---------

TUNED = {"configs/llama_tp4.yaml": "H200x4-nvswitch", "configs/llama_tp8.yaml": "H200x8-nvswitch"}


@pytest.mark.parametrize("config", sorted(TUNED))
def test_the_tp4_and_tp8_suites_search_every_backend_template_and_split(config):
    sweep = load_sweep(config)
    topo = sweep.topology()
    assert topo == Topology.from_key(TUNED[config]) and topo.nodes == 1
    assert len(sweep.workloads) == 18
    assert {w.kind for w in sweep.workloads} == {"ag_gemm", "gemm_rs", "gemm_ar"}
    for w in sweep.workloads:
        cands = space(w, topo, sweep.space)
        assert len({c.key() for c in cands}) == len(cands) > 1000, w
        for c in cands[::7]:
            check_candidate(c, w, topo)
        assert {c.backend for c in cands} == {"copy_engine", "sm_copy", "nccl"}
        routed = {"direct", "ring", "bidirectional_ring"}
        assert {c.template for c in cands} == routed | {t for t, k in PLANLESS_KINDS.items() if w.kind in k}
        fused_splits = {c.num_splits for c in cands if c.template not in PLANLESS_KINDS}
        assert fused_splits == {1, 2, 4, 8}
        if w.kind == "ag_gemm":  # the decomposed all-gather: one GEMM a landed shard, or a half shard
            peers = topo.world_size - 1
            assert {c.num_splits for c in cands if c.template == "decomposed"} >= {1, 2, peers}
        rows = w.shape.m // topo.world_size
        fused = [c for c in cands if c.template not in PLANLESS_KINDS]
        assert all(rows // c.num_splits >= c.block_m for c in fused), "a chunk shorter than a tile"
        check_candidate(default_candidate(w, topo), w, topo)


def test_eight_ranks_cut_their_blocks_into_chunks_at_tile_boundaries():
    """8192 rows over 8 GPUs: 1024 a block. 8 chunks of 128 rows fit 128-row tiles, not 256-row ones,
    and check_candidate says so (as the space leaves them out) instead of the plan failing later."""
    topo = Topology.from_key("H200x8-nvswitch")
    w = Workload(kind="ag_gemm", shape=(8192, 8192, 8192))
    tall = Candidate(num_splits=8, block_m=256, block_n=128, block_k=64, num_warps=8, num_stages=3)
    check_candidate(tall.replace(num_splits=4), w, topo)
    check_candidate(tall.replace(block_m=128), w, topo)
    with pytest.raises(ConfigError, match="block_m=256 rows: num_splits=8 is too many for a block of 1024"):
        check_candidate(tall, w, topo)
    assert tall.key() not in {c.key() for c in space(w, topo)}
    assert tall.key() in {c.key() for c in space(Workload(kind="ag_gemm", shape=(16384, 8192, 8192)), topo)}


@pytest.mark.parametrize("key", sorted(TUNED.values()))
def test_shapes_the_world_size_does_not_divide_are_refused_naming_it(key):
    topo = Topology.from_key(key)
    ws = topo.world_size
    odd = 4096 + ws // 2  # divisible by ws / 2, not by ws
    for kind, shape, dim in (
        ("ag_gemm", (8192, odd, 4096), "N"),
        ("gemm_rs", (odd, 4096, 8192), "M"),
        ("gemm_ar", (8192, 4096, odd), "K"),
    ):
        w = Workload(kind=kind, shape=shape)
        with pytest.raises(ConfigError, match=f"{dim}=\\d+ is not divisible by world size {ws}"):
            space(w, topo)
        with pytest.raises(ConfigError, match=f"world size {ws}"):
            check_candidate(Candidate(), w, topo)


def test_num_splits_beyond_a_ranks_rows_at_eight_gpus():
    topo = Topology.from_key("H200x8-nvswitch")
    w = Workload(kind="gemm_rs", shape=(256, 4096, 4096))  # 32 rows a rank
    with pytest.raises(ConfigError, match="num_splits=64 exceeds the 32 rows each rank's block has"):
        check_candidate(Candidate(num_splits=64, block_m=64, block_n=64, num_warps=4, num_stages=3), w, topo)
    assert space(w, topo) == [unfused_candidate()], "no tile of the default configurations fits 32 rows"
