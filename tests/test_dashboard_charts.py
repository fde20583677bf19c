"""Layer: pure CPU logic. The Vega-Lite specs the charts of the dashboard and the report are made
of, on the fixture database of `dashboard_data.py`: each is as wide as it is told (its container,
or a number of pixels, labels and legend included), keeps its data in its layers (never at the top
level, where the web app would first draw it empty), puts its legends on top and never cuts a
shape's label; the sweep comparison is drawn around 1 with its noise band."""

from __future__ import annotations

import pandas as pd
import pytest

pytest.importorskip("altair", reason="the dashboard extra is not installed")

import dashboard_data as fx  # noqa: E402

from syncopate.dashboard import charts, data  # noqa: E402
from syncopate.results_db import ResultsDB  # noqa: E402


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    url = fx.build(tmp_path_factory.mktemp("charts") / "results.db")
    with ResultsDB.open(url, read_only=True) as rdb:
        yield rdb


def _all(db, width) -> list:
    overview = data.overview(db)
    found = []
    for _, rows in charts.panels(overview):
        found += [
            charts.speedup_chart(rows, width=width),
            charts.bound_chart(rows, width=width),
            charts.times_chart(rows, width=width),
        ]
    sel = data.Selection.of(overview[overview["workload"] == fx.W1.key()].iloc[0])
    found += [
        charts.convergence_chart(data.convergence(db, sel), width=width),
        charts.backend_splits_chart(data.backend_splits(db, sel), width=width),
        charts.tile_order_chart(data.tile_orders(db, sel), width=width),
        charts.failure_chart(data.failures(db, sel), width=width),
        charts.compare_chart(data.compare_sweeps(db, 1, 2), 1, 2, width=width),
    ]
    return [c for c in found if c is not None]


def _legends(spec: dict) -> list[dict]:
    return [
        enc["legend"]
        for layer in spec["layer"]
        for enc in layer["encoding"].values()
        if isinstance(enc, dict) and enc.get("legend")
    ]


@pytest.mark.parametrize("width", ["container", 1100])
def test_every_chart_is_as_wide_as_told_with_its_data_in_its_layers(db, width):
    specs = [c.to_dict() for c in _all(db, width)]
    assert len(specs) == 6 + 5
    for spec in specs:
        assert spec["width"] == width and spec["autosize"] == {"type": "fit-x", "contains": "padding"}
        assert isinstance(spec["height"], int)  # pixels: a stretched width keeps the layout
        assert "data" not in spec and "datasets" not in spec, spec.get("title")
        assert len(spec["layer"]) >= 2 and all("values" in layer["data"] for layer in spec["layer"])
        assert all(legend["orient"] == "top" for legend in _legends(spec)), spec["title"]
        for layer in spec["layer"]:
            y = layer["encoding"].get("y", {})
            if y.get("type") == "nominal":
                assert y["axis"]["labelLimit"] == 0  # a shape's label is never cut


def test_the_comparison_is_drawn_around_1_with_its_noise_band(db):
    spec = charts.compare_chart(data.compare_sweeps(db, 1, 2), 1, 2).to_dict()
    band, dots, rule = spec["layer"]
    lo, hi = band["encoding"]["x"]["scale"]["domain"]
    assert lo < 1 < hi and 1 - lo == pytest.approx(hi - 1)  # centred on 1, not from 0
    rows = {r["label"].split(" · ")[0]: r for r in dots["data"]["values"]}
    w1, w2 = rows["ag_gemm 8192×2048×8192 bf16"], rows["gemm_rs 8192×8192×2048 bf16"]
    assert (w1["verdict"], w2["verdict"]) == ("B slower", "B faster")
    assert w1["lo"] == pytest.approx(420 * 0.99 / (400 * 1.02)) and hi > w1["hi"]
    assert band["encoding"]["x2"]["field"] == "hi" and rule["encoding"]["x"] == {"datum": 1.0}


def test_a_difference_within_noise_says_so():
    compared = pd.DataFrame(
        {
            "kind": ["ag_gemm"],
            "m": [8192],
            "n": [4096],
            "k": [8192],
            "dtype": ["bf16"],
            "topology": ["H200x2-nvlink"],
            "source": ["measured"],
            "best_us_a": [358.8],
            "best_us_b": [362.7],
            "ratio": [362.7 / 358.8],
            "ratio_lo": [0.994],
            "ratio_hi": [1.024],
        }
    )
    dots = charts.compare_chart(compared, 4, 5).to_dict()["layer"][1]
    assert dots["data"]["values"][0]["verdict"] == "within noise"


def test_the_times_chart_has_one_legend_for_colour_and_marker(db):
    pytest.importorskip("vl_convert", reason="the dashboard extra (vl-convert) is not installed")
    for _, rows in charts.panels(data.overview(db)):
        svg = charts.to_svg(charts.times_chart(rows, width=900))
        assert svg.count("role-legend-symbol") == 4  # four series, each once: colour and marker in one legend
        assert 'width="900"' in svg.split(">", 1)[0]  # the whole chart, legend and labels included
