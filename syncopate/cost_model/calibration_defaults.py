"""The default calibration: what the cost model uses where nothing was measured.

Every part is a lead, marked `default` wherever it is used and replaced part by part by what
`syncopate calibrate` measures on the GPUs at hand: one machine's figures are only leads for
another. Where the constants come from:

- the transfer curves (fixed cost, peak, size at half the peak) of the copy engine, NCCL and the
  SM-driven copier per SM count, and the 128×256×64 tile's GEMM rate: one machine of two H200s
  joined by NVLink, each collective timed alone and the best fused AG+GEMM's waves;
- the NVSHMEM copier's peaks per SM count (`nvshmem/intra`): a probe of its puts with signals,
  all-gathering 64 MiB a rank to three peers on four H100s over NVSwitch (bytes out of a rank per
  second); its fixed cost and size at half the peak are the SM copier's;
- the GPU table of :mod:`syncopate.search_space.topology`: other GPU models scale the H200's GEMM
  rates by their bf16 rate and SM count, the HBM figures by their bandwidth (a kernel reaching
  80 % of it); other interconnects scale the curves by their nominal bandwidth against NVLink's;
- the FP8 GEMM rate: FP8_GEMM_SPEEDUP times the bf16 rate (the datasheets' dense FP8 figure is
  twice the bf16 one; a lead, not measured);
- leads to be measured: the other tiles' rates (smaller tiles reuse less of each load), the
  per-tile cost, the GEMM's slowdown while each backend communicates, NCCL with few SMs, and the
  inter-node figures (the copy engine cannot cross nodes).

Pure Python.
"""

from __future__ import annotations

from syncopate.cost_model.calibration import Calibration, Curve, GemmRate, OpCosts, TransferModel
from syncopate.errors import CalibrationError
from syncopate.search_space import GPUS, INTERCONNECTS, TILE_CONFIGS, Topology

__all__ = ["DEFAULT_ORIGIN", "CURVE_SIZES", "FP8_GEMM_SPEEDUP", "H200_TILE_TFLOPS", "default_calibration"]

MiB = 1 << 20

CURVE_SIZES: tuple[int, ...] = tuple(64 * 1024 * 4**i for i in range(8))
"""Transfer sizes of the default curves (and of `syncopate calibrate`): 64 KiB … 1 GiB, ×4."""

DEFAULT_ORIGIN = "default (see syncopate.cost_model.calibration_defaults: 2×H200 figures and datasheet leads)"

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
first is derived from a measured fused AG+GEMM; the others are leads."""

FP8_GEMM_SPEEDUP = 2.0
"""An FP8 (e4m3, `torch._scaled_mm`) GEMM's rate against the calibrated bf16 rate: a lead from the
datasheets of Hopper GPUs (dense FP8 twice dense bf16), not measured; what moves is modelled as it
is (1-byte rows of A with their scales, bf16 partials)."""

_NVLINK_GBPS = INTERCONNECTS["nvlink"]
_H200_BF16 = GPUS["H200"].bf16_tflops
_PER_SM_GAIN_AT_HALF = 1.025
"""A program's rate when half the SMs run: 2.5 % above its rate on all of them (less contention
for HBM and L2; a lead)."""


def _transfers(topology: Topology) -> dict[str, TransferModel]:
    scale = topology.link_gbps / _NVLINK_GBPS

    def curve(latency_us: float, peak_gbps: float, half_bytes: float) -> Curve:
        return Curve.saturating(
            latency_us=latency_us, peak_gbps=peak_gbps * scale, half_bytes=half_bytes, sizes=CURVE_SIZES
        )

    out = {
        "copy_engine/intra": TransferModel(
            backend="copy_engine", scope="intra", call_us=28.0, curves={0: curve(3.0, 380.0, 1 * MiB)}
        ),
        "nccl/intra": TransferModel(
            backend="nccl",
            scope="intra",
            call_us=10.0,
            curves={8: curve(8.0, 0.85 * 255.0, 2 * MiB), 16: curve(8.0, 255.0, 2 * MiB)},
        ),
        "sm_copy/intra": TransferModel(
            backend="sm_copy",
            scope="intra",
            call_us=12.0,
            curves={
                sms: curve(2.0, min(gbps, 380.0), 1 * MiB)
                for sms, gbps in ((8, 52.0), (16, 104.0), (32, 180.0), (64, 315.0))
            },
        ),
        "nvshmem/intra": TransferModel(
            backend="nvshmem",
            scope="intra",
            call_us=12.0,
            curves={
                sms: curve(2.0, min(gbps, 380.0), 1 * MiB)
                for sms, gbps in ((4, 72.0), (8, 135.0), (16, 245.0), (32, 264.0), (64, 264.0))
            },
        ),
    }
    if topology.nodes > 1:

        def net(latency_us: float, peak_gbps: float, half_bytes: float) -> Curve:
            return Curve.saturating(
                latency_us=latency_us, peak_gbps=peak_gbps, half_bytes=half_bytes, sizes=CURVE_SIZES
            )

        out["nccl/inter"] = TransferModel(
            backend="nccl",
            scope="inter",
            call_us=15.0,
            curves={8: net(15.0, 40.0, 4 * MiB), 16: net(15.0, 40.0, 4 * MiB)},
        )
        for backend in ("sm_copy", "nvshmem"):
            out[f"{backend}/inter"] = TransferModel(
                backend=backend,
                scope="inter",
                call_us=15.0,
                curves={
                    sms: net(5.0, gbps, 2 * MiB)
                    for sms, gbps in ((8, 20.0), (16, 30.0), (32, 38.0), (64, 40.0))
                },
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
        launch_us=6.0,
        wait_us=0.8,
        local_copy_gbps=1600.0 * spec.hbm_gbps / GPUS["H200"].hbm_gbps,
        hbm_gbps=0.8 * spec.hbm_gbps,
        overlap_slowdown={"copy_engine": 0.03, "sm_copy": 0.02, "nvshmem": 0.02, "nccl": 0.05},
    )
    transfers = _transfers(topology)
    gemm = _gemm(topology)
    origin = {f"transfer/{k}": DEFAULT_ORIGIN for k in transfers}
    origin.update({f"gemm/{k}": DEFAULT_ORIGIN for k in gemm})
    origin["op_costs"] = DEFAULT_ORIGIN
    return Calibration(
        topology=topology.key(),
        gpu_model=topology.gpu_model,
        transfers=transfers,
        gemm=gemm,
        costs=costs,
        origin=origin,
    )
