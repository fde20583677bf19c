"""Layer: two GPUs. `syncopate calibrate`'s microbenchmarks on the GPUs at hand, quickly: every
backend's curve, a GEMM rate, the op costs, turned into rows the cost model reads back."""

from __future__ import annotations

import pytest

from syncopate.cost_model.calibration import Calibration, records_from_measurements, resolve_calibration
from syncopate.search_space import TILE_CONFIGS, Topology

pytestmark = [pytest.mark.multigpu, pytest.mark.timeout(900)]


def test_a_quick_calibration_is_measured_and_read_back(tmp_path):
    from syncopate.measure.calibrate import CalibrateOptions, run_calibration
    from syncopate.results_db import ResultsDB

    options = CalibrateOptions(
        sizes=(1 << 20, 16 << 20),
        comm_sms=(16, 64),
        tile_configs=TILE_CONFIGS[:1],
        program_fractions=(1.0, 0.5),
        warmup=2,
        repetitions=5,
    )
    result = run_calibration(options, 2)
    rows = records_from_measurements(result)
    kinds = {(r.kind, r.key) for r in rows}
    assert {
        ("transfer", "copy_engine/intra"),
        ("transfer", "sm_copy/intra"),
        ("transfer", "nccl/intra"),
        ("gemm", TILE_CONFIGS[0].key()),
        ("op_costs", "op"),
    } <= kinds
    topology = Topology.from_dict(result["topology"])
    with ResultsDB.open(f"sqlite:///{tmp_path / 'cal.db'}", upgrade=True) as db:
        for r in rows:
            db.record_calibration(r)
        cal: Calibration = resolve_calibration(topology, rows[0].environment, db, "auto")
    assert cal.origin[f"gemm/{TILE_CONFIGS[0].key()}"].startswith("measured")
    ce = cal.transfer("copy_engine")
    assert 10 < (16 << 20) / ce.time_us(16 << 20) / 1e3 < 2000  # GB/s
    assert 50 < cal.gemm[TILE_CONFIGS[0].key()].tflops(topology.sm_count) < 5000
