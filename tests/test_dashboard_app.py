"""Layer: the Streamlit app run headless in this process (Streamlit's AppTest), on the fixture
database of `dashboard_data.py`: every page renders its tables and charts, the filters change
what is shown, measured and predicted rows are drawn apart, and a database that is empty, missing
or of an older schema says what to run instead of failing."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("streamlit", reason="the dashboard extra is not installed")

import dashboard_data as fx  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

from syncopate.dashboard import data  # noqa: E402
from syncopate.results_db import ResultsDB  # noqa: E402

APP = Path(__file__).resolve().parent.parent / "syncopate" / "dashboard" / "app.py"


@pytest.fixture(autouse=True)
def keep_main_module():
    """AppTest installs the script as sys.modules["__main__"] and leaves it there; put the real one
    back, or every later `multiprocessing` spawn would run the app in its children."""
    main = sys.modules["__main__"]
    yield
    sys.modules["__main__"] = main


def start(monkeypatch, url: str) -> AppTest:
    monkeypatch.setenv("SYNCOPATE_DB", url)
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    return at


def charts(at: AppTest) -> list[dict]:
    """The Vega-Lite specs of the page's charts."""
    return [json.loads(c.proto.spec) for c in at.get("vega_lite_chart")]


def title(spec: dict) -> str:
    return spec["title"] if isinstance(spec["title"], str) else spec["title"]["text"]


def chart_data(at: AppTest, i: int, layer: int = 0) -> pd.DataFrame:
    """The data of a layer of chart `i`, which each layer carries inline (nothing at the chart's top
    level, so the page draws it with its data from the first frame)."""
    spec = charts(at)[i]
    assert "data" not in spec and "datasets" not in spec and not at.get("vega_lite_chart")[i].proto.data.data
    return pd.DataFrame(spec["layer"][layer]["data"]["values"])


@pytest.fixture
def url(tmp_path):
    return fx.build(tmp_path / "results.db")


def test_overview_renders_table_and_charts(monkeypatch, url):
    at = start(monkeypatch, url)
    assert at.header[0].value.startswith("Overview")
    table = at.dataframe[0].value
    assert len(table) == 7
    w1 = table[
        (table["M"] == 8192)
        & (table["N"] == 2048)
        & (table["source"] == "measured")
        & (table["environment"] == fx.ENV.key()[:8])
    ].iloc[0]
    assert (w1["best µs"], w1["× torch_seq"], w1["× async-TP"], w1["of bound"]) == (400.0, 1.5, 1.2, 0.75)
    assert w1["best configuration"] == fx.CE2.short()
    specs = charts(at)
    speedup = "Speedup of the best configuration over torch (above 1: faster)"
    bound = "Fraction of the overlap bound reached (1: at the bound)"
    times = "Times (µs, lower is better)"
    # one panel per topology, environment and source with an ok trial, each with the charts it has data for
    assert [h.value for h in at.main.subheader] == [
        f"H200x2-nvlink · {fx.ENV.key()[:8]} · measured",
        f"H200x2-nvlink · {fx.ENV.key()[:8]} · predicted",
        f"H200x2-nvlink · {fx.OTHER_ENV.key()[:8]} · measured",
    ]
    assert [title(s) for s in specs] == [speedup, bound, times, times, speedup, times]
    assert all(s["width"] == "container" and s["autosize"]["type"] == "fit-x" for s in specs)
    assert "trials" in at.sidebar.caption[-1].value and "14 trials" in at.sidebar.caption[-1].value


def test_measured_and_predicted_are_drawn_apart(monkeypatch, url):
    at = start(monkeypatch, url)
    panels = [h.value for h in at.main.subheader]
    times = [i for i, s in enumerate(charts(at)) if title(s).startswith("Times")]
    assert len(times) == len(panels) == 3
    for panel, i in zip(panels, times):  # each panel's chart holds that panel's source only
        assert set(chart_data(at, i, layer=1)["source"]) == {panel.rsplit(" · ", 1)[1]}  # the dots
    bound = charts(at)[1]
    assert bound["layer"][0]["encoding"]["color"]["field"] == "source"


def test_filters_change_what_is_shown(monkeypatch, url):
    at = start(monkeypatch, url)
    at.sidebar.multiselect(key="f_dtype").set_value(["fp16"]).run()
    table = at.dataframe[0].value
    assert list(table["dtype"]) == ["fp16"] and list(table["best µs"]) == [800.0]
    assert "dtype fp16" in at.caption[0].value

    at.sidebar.multiselect(key="f_dtype").set_value([]).run()
    at.sidebar.multiselect(key="f_source").set_value(["predicted"]).run()
    table = at.dataframe[0].value
    assert list(table["source"]) == ["predicted"] and list(table["best µs"]) == [350.0]
    assert any("No speedups to draw" in c.value for c in at.caption)

    at.sidebar.multiselect(key="f_source").set_value([]).run()
    at.sidebar.multiselect(key="f_topology").set_value(["H100x8-nvswitch"]).run()
    assert len(at.dataframe[0].value) == 1 and not charts(at)  # nothing ok there: no bars

    at.sidebar.multiselect(key="f_environment").set_value([fx.OTHER_ENV.key()]).run()
    assert any("No trials match these filters" in w.value for w in at.warning)


def test_workload_drill_down(monkeypatch, url):
    at = start(monkeypatch, url)
    at.sidebar.radio(key="page").set_value("Workload").run()
    wanted = f"ag_gemm 8192×2048×8192 bf16 · H200x2-nvlink · {fx.ENV.key()[:8]} · measured"
    assert at.selectbox(key="selection").value == wanted  # the first shape with an ok trial
    failed_only = next(o for o in at.selectbox(key="selection").options if "H100x8-nvswitch" in o)
    at.selectbox(key="selection").set_value(failed_only).run()
    assert "2 trial(s), 2 failed; no ok trial" in at.markdown[0].value
    assert list(at.dataframe[-1].value["error text"]) == ["illegal memory access"]
    at.selectbox(key="selection").set_value(wanted).run()
    assert not at.exception
    assert [m.value for m in at.metric] == ["400.0", "1.500", "1.200", "0.750"]
    titles = [title(s) for s in charts(at)]
    assert titles[0].startswith("Convergence") and "Failures by status" in titles
    assert any(t.startswith("Best time per backend × num_splits") for t in titles)
    assert "Tile orders compared" in titles
    convergence = chart_data(at, 0)
    assert sorted(convergence["median_us"]) == [400.0, 450.0, 500.0]  # ok measured trials only
    failures = at.dataframe[-1].value
    assert list(failures["status"]) == ["oom", "compile_error"]
    assert list(failures["error text"]) == [fx.OOM_ERROR, fx.COMPILE_ERROR]


def test_sweeps_side_by_side(monkeypatch, url):
    at = start(monkeypatch, url)
    at.sidebar.radio(key="page").set_value("Sweeps").run()
    sweeps = at.dataframe[0].value
    assert list(sweeps["sweep"]) == [3, 2, 1] and list(sweeps["host"]) == ["gpu-c", "gpu-b", "gpu-a"]
    assert list(sweeps["duration s"]) == [180.0, 300.0, 600.0]
    at.selectbox(key="sweep_a").set_value(1).run()
    at.selectbox(key="sweep_b").set_value(2).run()
    envs = at.dataframe[1].value
    assert dict(zip(envs["field"], envs["changed"], strict=True))["torch"]
    compared = at.dataframe[2].value
    assert sorted(compared["B / A"].dropna()) == [pytest.approx(0.97), pytest.approx(1.05)]
    assert charts(at)[0]["title"] == "Sweep 2 against sweep 1"


def test_environments_page(monkeypatch, url):
    at = start(monkeypatch, url)
    at.sidebar.radio(key="page").set_value("Environments").run()
    table = at.dataframe[0].value
    assert list(table["torch"]) == ["2.11.0+cu130", "2.12.0+cu130"] and list(table["trials"]) == [12, 2]


def test_empty_database_says_how_to_fill_it(monkeypatch, tmp_path):
    url = fx.build_empty(tmp_path / "empty.db")
    at = start(monkeypatch, url)
    text = "\n".join(m.value for m in at.markdown)
    assert "No tuning results" in text and f"syncopate tune configs/quickstart.yaml --db {url}" in text
    assert f"syncopate import-bench bench.json --db {url}" in text
    assert not at.error and not at.dataframe


def test_missing_database_says_how_to_make_it(monkeypatch, tmp_path):
    path = tmp_path / "nowhere.db"
    at = start(monkeypatch, str(path))
    assert "does not exist" in at.error[0].value and "syncopate db upgrade" in at.error[0].value
    assert "syncopate tune configs/quickstart.yaml" in at.markdown[0].value
    assert not path.exists()  # the dashboard never creates a database


def test_older_schema_says_to_upgrade(monkeypatch, url):
    from syncopate.results_db import schema

    future = f"{int(schema.HEAD) + 1:04d}"  # a revision after this database's, that it cannot be read at
    monkeypatch.setattr(schema, "REVISIONS", (*schema.REVISIONS, future))
    monkeypatch.setattr(schema, "HEAD", future)
    at = start(monkeypatch, url)
    assert f"older than this Syncopate's {future}" in at.error[0].value
    assert f"run `syncopate db upgrade --db {url}`" in at.error[0].value


def test_database_argument_after_the_script():
    from syncopate.dashboard.ui import database_argument

    assert database_argument(["--db", "sqlite:////x.db"]) == "sqlite:////x.db"
    assert database_argument(["-q", "tests/x.py"]) is None


def test_pages_match_the_data_functions(monkeypatch, url):
    at = start(monkeypatch, url)
    with ResultsDB.open(url, upgrade=False) as db:
        expected = data.overview(db)
    shown = at.dataframe[0].value
    assert list(shown["trials"]) == list(expected["trials"])
    assert list(shown["best µs"].fillna(-1)) == list(expected["best_us"].round(1).fillna(-1))
