"""The default calibration: what the cost model uses where nothing was measured.

Every figure below is a *lead*, marked `default` wherever it is used, and replaced part by part
by what `syncopate calibrate` measures. Where a figure comes from:

Measured on two H200s joined by NV18 (2026-11-21/22; see DESIGN.md), times in µs:

| quantity                                   | figure                                   | used for                          |
|--------------------------------------------|------------------------------------------|-----------------------------------|
| copy-engine push to the peer, 256 MB       | 380 GB/s                                 | `copy_engine` peak                |
| copy-engine all-gather alone, 64 MiB/rank  | 212.3 (and 208.0, 216.7 for 64 MiB RS/AG)| `copy_engine`: 28 µs a call, 3 µs and half the peak at 1 MiB a chunk |
| copy-engine all-gather alone, 32 MiB/rank  | 134.3                                    | checks the curve (predicts 122)   |
| NCCL all-gather alone, 32 / 64 MiB per rank| 159.7 / 292.2                            | `nccl` peak 255 GB/s, 26 µs fixed |
| SM-driven chunk copier, 16/32/64 programs  | 230/400/700 GB/s read+write, locally     | `nvshmem` peaks 104/180/315 GB/s  |
| fused AG+GEMM, N=28672 K=8192 (best found) | 2465.6: 28 waves of 128×256 tiles, K=8192, 132 SMs | 128×256×64 tiles: 820 TFLOP/s (87 µs a wave, 1 µs of it per-tile cost) |

From the GPU table (datasheet) of :mod:`syncopate.search_space.topology`: SM count, bf16 rate
(GEMM rates of other GPU models are the H200 figures scaled by bf16 TFLOP/s), HBM bandwidth
(80 % of it is what a kernel reaches), interconnect class (transfer curves scale with the
interconnect's nominal bandwidth against NVLink's 450 GB/s).

Against those figures the defaults predict, for the four fused shapes (sequential / NCCL alone /
copy engine alone / best fused candidate, µs, predicted vs measured): AG N=2048 K=8192
470/464.5, 289/292.2, 210/212.3, 277/290.3; AG N=11008 K=4096 654/651.3, 161/159.7, 123/134.3,
529/504.5; AG N=28672 K=8192 2743/2667.3, 289/299.2, 210/216.7, 2497/2465.6; RS N=8192 K=2048
484/532.0, 289/333.2, 210/208.0, 275/330.4. Several of these figures are where the defaults come
from, so this checks the derivation more than the model; the reduce-scatter is the visible gap
(NCCL's reduction and the fused op come out 13–17 % fast).

Pure leads, to be measured: the other tile configurations' rates relative to 128×256×64 (smaller
tiles reuse less of each load), per-tile cost 1 µs, the GEMM's slowdown while each backend
communicates (copy engine 3 %, SM copier 2 %, NCCL 5 %), the copier's peer stores at 90 % of its
local rate, NCCL at 85 % with 8 SMs left to it, a local copy-engine copy at 1600 GB/s,
and the inter-node figures (a 400 Gb/s NIC per GPU: NCCL 40 GB/s; SM-driven puts over the network
up to 40 GB/s; the copy engine cannot cross nodes).

Pure Python.
"""

from __future__ import annotations

from syncopate.autotuner.calibration import Calibration, Curve, GemmRate, OpCosts, TransferModel
from syncopate.errors import CalibrationError
from syncopate.search_space import GPUS, INTERCONNECTS, TILE_CONFIGS, Topology

__all__ = ["DEFAULT_ORIGIN", "CURVE_SIZES", "H200_TILE_TFLOPS", "default_calibration"]

MiB = 1 << 20

CURVE_SIZES: tuple[int, ...] = tuple(64 * 1024 * 4**i for i in range(8))
"""Transfer sizes of the default curves (and of `syncopate calibrate`): 64 KiB … 1 GiB, ×4."""

DEFAULT_ORIGIN = "default (see syncopate.autotuner.calibration_defaults: 2×H200 figures and datasheet leads)"

H200_TILE_TFLOPS: dict[str, float] = {
    "128x256x64w8s3": 820.0,
    "128x256x64w8s4": 810.0,
    "256x128x64w8s3": 800.0,
    "128x128x64w8s4": 700.0,
    "128x128x64w4s4": 650.0,
    "128x128x64w8s5": 695.0,
    "128x128x128w8s3": 680.0,
    "128x64x64w4s4": 510.0,
    "64x128x64w4s4": 500.0,
}
"""TFLOP/s of the persistent GEMM on all 132 SMs of an H200, bf16, per tile configuration. The
first is derived from the fused AG+GEMM measurement above; the others are leads."""

_NVLINK_GBPS = INTERCONNECTS["nvlink"]
_H200_BF16 = GPUS["H200"].bf16_tflops
_PER_SM_GAIN_AT_HALF = 1.025
"""A program's rate when half the SMs run: 2.5 % above its rate on all of them (less contention
for HBM and L2; a lead)."""


def _transfers(topology: Topology) -> dict[str, TransferModel]:
    scale = topology.link_gbps / _NVLINK_GBPS

    def curve(latency_us: float, peak_gbps: float, half_bytes: float) -> Curve:
        return Curve.saturating(latency_us=latency_us, peak_gbps=peak_gbps * scale, half_bytes=half_bytes,
                                sizes=CURVE_SIZES)

    out = {
        "copy_engine/intra": TransferModel(
            backend="copy_engine", scope="intra", call_us=28.0, curves={0: curve(3.0, 380.0, 1 * MiB)}
        ),
        "nccl/intra": TransferModel(
            backend="nccl", scope="intra", call_us=10.0,
            curves={8: curve(8.0, 0.85 * 255.0, 2 * MiB), 16: curve(8.0, 255.0, 2 * MiB)},
        ),
        "nvshmem/intra": TransferModel(
            backend="nvshmem", scope="intra", call_us=12.0,
            curves={sms: curve(2.0, min(gbps, 380.0), 1 * MiB)
                    for sms, gbps in ((8, 52.0), (16, 104.0), (32, 180.0), (64, 315.0))},
        ),
    }
    if topology.nodes > 1:

        def net(latency_us: float, peak_gbps: float, half_bytes: float) -> Curve:
            return Curve.saturating(latency_us=latency_us, peak_gbps=peak_gbps, half_bytes=half_bytes, sizes=CURVE_SIZES)

        out["nccl/inter"] = TransferModel(
            backend="nccl", scope="inter", call_us=15.0, curves={8: net(15.0, 40.0, 4 * MiB), 16: net(15.0, 40.0, 4 * MiB)}
        )
        out["nvshmem/inter"] = TransferModel(
            backend="nvshmem", scope="inter", call_us=15.0,
            curves={sms: net(5.0, gbps, 2 * MiB) for sms, gbps in ((8, 20.0), (16, 30.0), (32, 38.0), (64, 40.0))},
        )
    return out


def _gemm(topology: Topology) -> dict[str, GemmRate]:
    spec = GPUS[topology.gpu_model]
    ratio = spec.bf16_tflops / _H200_BF16
    sms = topology.sm_count
    out = {}
    for tc in TILE_CONFIGS:
        full = H200_TILE_TFLOPS.get(tc.key(), 500.0) * ratio * sms / GPUS["H200"].sm_count
        out[tc.key()] = GemmRate(
            tile=tc.key(),
            tflops_by_sms={sms: full, sms // 2: full / 2 * _PER_SM_GAIN_AT_HALF},
            tile_overhead_us=1.0,
        )
    return out


def default_calibration(topology: Topology) -> Calibration:
    """The documented default calibration of `topology` (see the module docstring); CalibrationError
    for a GPU model the table does not know."""
    spec = GPUS.get(topology.gpu_model)
    if spec is None:
        raise CalibrationError(
            f"no default calibration for GPU model {topology.gpu_model} (not in the GPU table): run "
            f"`syncopate calibrate` on a machine with these GPUs"
        )
    costs = OpCosts(
        launch_us=6.0, wait_us=0.8, local_copy_gbps=1600.0 * spec.hbm_gbps / GPUS["H200"].hbm_gbps,
        hbm_gbps=0.8 * spec.hbm_gbps,
        overlap_slowdown={"copy_engine": 0.03, "nvshmem": 0.02, "nccl": 0.05},
    )
    transfers = _transfers(topology)
    gemm = _gemm(topology)
    origin = {f"transfer/{k}": DEFAULT_ORIGIN for k in transfers}
    origin.update({f"gemm/{k}": DEFAULT_ORIGIN for k in gemm})
    origin["op_costs"] = DEFAULT_ORIGIN
    return Calibration(
        topology=topology.key(), gpu_model=topology.gpu_model, transfers=transfers, gemm=gemm, costs=costs,
        origin=origin,
    )
