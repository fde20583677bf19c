"""Altair charts of the dashboard's data frames, shared by the web app and the static report.

Each function takes a frame from :mod:`syncopate.dashboard.data` and returns an Altair chart, or
None where the frame has nothing to draw. Only the columns a chart needs are embedded, as plain
JSON values. Rows of different sources are drawn in separate panels, and each source keeps its
colour (:data:`SOURCE_COLORS`), so measured and predicted numbers never look alike.
"""

from __future__ import annotations

import math
from typing import Any

import altair as alt
import pandas as pd

__all__ = [
    "SOURCE_COLORS",
    "backend_splits_chart",
    "bound_chart",
    "compare_chart",
    "convergence_chart",
    "failure_chart",
    "panel_label",
    "speedup_chart",
    "tile_order_chart",
    "times_chart",
    "to_svg",
]

SOURCE_COLORS: dict[str, str] = {"measured": "#1f77b4", "predicted": "#ff7f0e", "fixture": "#8c8c8c"}
"""One colour per trial source."""

_BASELINE_COLORS = {
    "torch_seq": "#7f7f7f",
    "torch_async_tp": "#bcbd22",
    "overlap bound": "#2ca02c",
    "best (Syncopate)": "#1f77b4",
}


def _values(frame: pd.DataFrame, columns: list[str]) -> alt.Data:
    """The columns as inline JSON values (NaN and NA as null, times as ISO strings)."""
    out = []
    for record in frame[columns].to_dict("records"):
        clean: dict[str, Any] = {}
        for k, v in record.items():
            if v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA or v is pd.NaT:
                clean[k] = None
            elif isinstance(v, pd.Timestamp):
                clean[k] = v.isoformat()
            elif hasattr(v, "item"):  # numpy scalars
                clean[k] = v.item()
            else:
                clean[k] = v
        out.append(clean)
    return alt.Data(values=out)


def panel_label(row: Any) -> str:
    """`H200x2-nvlink · bb79b704 · measured`: one overview panel (topology, environment, source)."""
    return f"{row['topology']} · {str(row['environment'])[:8]} · {row['source']}"


def _with_panels(frame: pd.DataFrame) -> pd.DataFrame:
    frame = frame.sort_values(["kind", "dtype", "m", "n", "k"]).copy()
    frame["panel"] = [panel_label(row) for _, row in frame.iterrows()]
    frame["label"] = [
        f"{kind} {m}×{n}×{k} {d}"
        for kind, m, n, k, d in zip(frame["kind"], frame["m"], frame["n"], frame["k"], frame["dtype"])
    ]
    return frame


def _facet(layers: alt.LayerChart | alt.Chart, data: alt.Data, step: int) -> alt.FacetChart:
    """One row of panels per (topology, environment, source); shapes along x, kinds side by side.

    (Independent x scales per kind would be tidier, but Vega-Lite then loses the offset of grouped
    bars, so every panel shares one x axis.)"""
    return layers.properties(width=alt.Step(step), height=190).facet(
        data=data, row=alt.Row("panel:N", title=None, header=alt.Header(labelAngle=0, labelAlign="left"))
    )


def _x(frame: pd.DataFrame) -> alt.X:
    return alt.X(
        "label:N",
        title="kind and shape (M×N×K dtype)",
        sort=list(dict.fromkeys(frame["label"])),
        axis=alt.Axis(labelAngle=-35, labelLimit=260),
    )


def speedup_chart(overview: pd.DataFrame) -> alt.FacetChart | None:
    """Best time's speedup over torch_seq and over torch async-TP per shape; a rule at 1."""
    if overview.empty or overview[["speedup_seq", "speedup_async_tp"]].isna().all().all():
        return None
    frame = _with_panels(overview)
    long = frame.melt(
        id_vars=["panel", "kind", "label", "source", "config", "best_us"],
        value_vars=["speedup_seq", "speedup_async_tp"],
        var_name="baseline",
        value_name="speedup",
    )
    long["baseline"] = long["baseline"].map(
        {"speedup_seq": "over torch_seq", "speedup_async_tp": "over async-TP"}
    )
    long = long.dropna(subset=["speedup"])
    data = _values(long, ["panel", "kind", "label", "source", "config", "best_us", "baseline", "speedup"])
    bars = (
        alt.Chart()
        .mark_bar()
        .encode(
            x=_x(frame),
            xOffset=alt.XOffset("baseline:N"),
            y=alt.Y("speedup:Q", title="speedup (baseline / best)"),
            color=alt.Color(
                "baseline:N",
                scale=alt.Scale(domain=["over torch_seq", "over async-TP"], range=["#4c78a8", "#9ecae9"]),
                title=None,
            ),
            tooltip=[
                "label:N",
                "baseline:N",
                alt.Tooltip("speedup:Q", format=".3f"),
                alt.Tooltip("best_us:Q", format=".1f", title="best µs"),
                "config:N",
                "source:N",
            ],
        )
    )
    rule = alt.Chart().mark_rule(color="black", strokeDash=[4, 3]).encode(y=alt.datum(1.0))
    return _facet(alt.layer(bars, rule), data, 30).properties(
        title="Speedup of the best configuration over torch (above 1: faster)"
    )


def bound_chart(overview: pd.DataFrame) -> alt.FacetChart | None:
    """Fraction of the overlap bound reached (bound / best time) per shape; a rule at 1."""
    if overview.empty or overview["of_bound"].isna().all():
        return None
    frame = _with_panels(overview).dropna(subset=["of_bound"])
    data = _values(frame, ["panel", "kind", "label", "source", "config", "best_us", "bound_us", "of_bound"])
    bars = (
        alt.Chart()
        .mark_bar()
        .encode(
            x=_x(frame),
            y=alt.Y(
                "of_bound:Q",
                title="bound / best",
                scale=alt.Scale(domain=[0, max(1.1, float(frame["of_bound"].max()) * 1.05)]),
            ),
            color=alt.Color(
                "source:N",
                scale=alt.Scale(domain=list(SOURCE_COLORS), range=list(SOURCE_COLORS.values())),
                title="source",
            ),
            tooltip=[
                "label:N",
                alt.Tooltip("of_bound:Q", format=".3f", title="fraction of bound"),
                alt.Tooltip("best_us:Q", format=".1f", title="best µs"),
                alt.Tooltip("bound_us:Q", format=".1f", title="bound µs"),
                "config:N",
                "source:N",
            ],
        )
    )
    rule = alt.Chart().mark_rule(color="black", strokeDash=[4, 3]).encode(y=alt.datum(1.0))
    return _facet(alt.layer(bars, rule), data, 22).properties(
        title="Fraction of the overlap bound reached (1: at the bound)"
    )


def times_chart(overview: pd.DataFrame) -> alt.FacetChart | None:
    """Times side by side per shape: torch_seq, torch async-TP, the overlap bound and the best."""
    if overview.empty or overview["best_us"].isna().all():
        return None
    frame = _with_panels(overview)
    frame = frame.rename(
        columns={
            "torch_seq_us": "torch_seq",
            "torch_async_tp_us": "torch_async_tp",
            "bound_us": "overlap bound",
            "best_us": "best (Syncopate)",
        }
    )
    long = frame.melt(
        id_vars=["panel", "kind", "label", "source"],
        value_vars=list(_BASELINE_COLORS),
        var_name="series",
        value_name="us",
    ).dropna(subset=["us"])
    data = _values(long, ["panel", "kind", "label", "source", "series", "us"])
    bars = (
        alt.Chart()
        .mark_bar()
        .encode(
            x=_x(frame),
            xOffset=alt.XOffset("series:N", sort=list(_BASELINE_COLORS)),
            y=alt.Y("us:Q", title="time (µs)"),
            color=alt.Color(
                "series:N",
                sort=list(_BASELINE_COLORS),
                scale=alt.Scale(domain=list(_BASELINE_COLORS), range=list(_BASELINE_COLORS.values())),
                title=None,
            ),
            tooltip=["label:N", "series:N", alt.Tooltip("us:Q", format=".1f", title="µs"), "source:N"],
        )
    )
    return _facet(bars, data, 44).properties(title="Times (µs, lower is better)")


def convergence_chart(trials: pd.DataFrame, source: str = "measured") -> alt.LayerChart | None:
    """Time of every `ok` trial against its order in its sweep and strategy, and the running best."""
    ok = trials[trials["status"] == "ok"].dropna(subset=["median_us"])
    if ok.empty:
        return None
    last = int(ok["order"].max())
    data = _values(
        ok, ["order", "median_us", "best_so_far", "series", "backend", "num_splits", "tile_order", "trial_id"]
    )
    base = alt.Chart(data).encode(
        x=alt.X(
            "order:Q",
            title="trial (order within sweep and strategy)",
            scale=alt.Scale(domainMin=1, nice=False, padding=8),
            axis=alt.Axis(format="d", values=list(range(1, last + 1)))
            if last <= 12
            else alt.Axis(format="d", tickMinStep=1),
        ),
        color=alt.Color("series:N", title="sweep · strategy"),
    )
    points = base.mark_circle(size=28, opacity=0.55).encode(
        y=alt.Y("median_us:Q", title="median time (µs)", scale=alt.Scale(type="log", nice=False, padding=8)),
        tooltip=[
            "trial_id:Q",
            "series:N",
            alt.Tooltip("median_us:Q", format=".1f"),
            "backend:N",
            "num_splits:O",
            "tile_order:N",
        ],
    )
    best = base.mark_line(interpolate="step-after", strokeWidth=2).encode(y="best_so_far:Q")
    return alt.layer(points, best).properties(
        width=640,
        height=260,
        title=f"Convergence: time against trial order, running best as a line ({source})",
    )


def backend_splits_chart(cells: pd.DataFrame) -> alt.LayerChart | None:
    """Heatmap of the best time per backend × num_splits (darker: faster), each cell labelled."""
    cells = cells.dropna(subset=["best_us"])
    if cells.empty:
        return None
    data = _values(cells, ["backend", "num_splits", "best_us", "trials", "ok"])
    base = alt.Chart(data).encode(
        x=alt.X("num_splits:O", title="num_splits", axis=alt.Axis(labelAngle=0)),
        y=alt.Y("backend:N", title=None),
    )
    rect = base.mark_rect().encode(
        color=alt.Color("best_us:Q", title="best µs", scale=alt.Scale(scheme="viridis")),
        tooltip=["backend:N", "num_splits:O", alt.Tooltip("best_us:Q", format=".1f"), "trials:Q", "ok:Q"],
    )
    middle = float(cells["best_us"].min() + cells["best_us"].max()) / 2
    text = base.mark_text(fontSize=11).encode(
        text=alt.Text("best_us:Q", format=".0f"),
        color=alt.condition(alt.datum.best_us < middle, alt.value("white"), alt.value("black")),
    )
    return alt.layer(rect, text).properties(
        width=alt.Step(56),
        height=alt.Step(40),
        title=alt.Title("Best time per backend × num_splits", subtitle="µs; darker is faster"),
    )


def tile_order_chart(orders: pd.DataFrame) -> alt.LayerChart | None:
    """Best (bar) and mean (tick) `ok` time per tile order."""
    orders = orders.dropna(subset=["best_us"])
    if orders.empty:
        return None
    data = _values(orders, ["tile_order", "best_us", "mean_us", "trials", "ok", "failed"])
    base = alt.Chart(data).encode(y=alt.Y("tile_order:N", title=None))
    bars = base.mark_bar(color="#4c78a8").encode(
        x=alt.X("best_us:Q", title="time (µs): bar best, tick mean"),
        tooltip=[
            "tile_order:N",
            alt.Tooltip("best_us:Q", format=".1f"),
            alt.Tooltip("mean_us:Q", format=".1f"),
            "trials:Q",
            "ok:Q",
            "failed:Q",
        ],
    )
    ticks = base.mark_tick(color="black", thickness=2, size=18).encode(x="mean_us:Q")
    return alt.layer(bars, ticks).properties(width=320, height=alt.Step(32), title="Tile orders compared")


def failure_chart(failed: pd.DataFrame) -> alt.Chart | None:
    """Failed trials per status."""
    if failed.empty:
        return None
    per = failed.groupby("status", as_index=False)["trials"].sum()
    data = _values(per, ["status", "trials"])
    return (
        alt.Chart(data)
        .mark_bar(color="#d62728")
        .encode(
            x=alt.X("trials:Q", title="failed trials"),
            y=alt.Y("status:N", title=None),
            tooltip=["status:N", "trials:Q"],
        )
        .properties(width=320, height=alt.Step(28), title="Failures by status")
    )


def compare_chart(compared: pd.DataFrame, a: int, b: int) -> alt.LayerChart | None:
    """Best time of sweep b over sweep a per workload (above 1: b is slower); a rule at 1."""
    both = compared.dropna(subset=["ratio"]).copy()
    if both.empty:
        return None
    both["label"] = [
        f"{k} {m}×{n}×{kk} {d} · {t} · {s}"
        for k, m, n, kk, d, t, s in zip(
            both["kind"], both["m"], both["n"], both["k"], both["dtype"], both["topology"], both["source"]
        )
    ]
    both["verdict"] = ["B slower" if r > 1 else "B faster or equal" for r in both["ratio"]]
    data = _values(both, ["label", "ratio", "best_us_a", "best_us_b", "verdict"])
    bars = (
        alt.Chart(data)
        .mark_bar()
        .encode(
            y=alt.Y("label:N", title=None, sort=None),
            x=alt.X("ratio:Q", title=f"best of sweep {b} / best of sweep {a}"),
            color=alt.Color(
                "verdict:N",
                scale=alt.Scale(domain=["B slower", "B faster or equal"], range=["#d62728", "#2ca02c"]),
                title=None,
            ),
            tooltip=[
                "label:N",
                alt.Tooltip("ratio:Q", format=".3f"),
                alt.Tooltip("best_us_a:Q", format=".1f"),
                alt.Tooltip("best_us_b:Q", format=".1f"),
            ],
        )
    )
    rule = alt.Chart(data).mark_rule(color="black", strokeDash=[4, 3]).encode(x=alt.datum(1.0))
    return alt.layer(bars, rule).properties(
        width=420, height=alt.Step(24), title=f"Sweep {b} against sweep {a}"
    )


def to_svg(chart: Any) -> str | None:
    """The chart as an SVG document, rendered here (vl-convert, the `dashboard` extra); None where
    vl-convert is not installed."""
    try:
        import vl_convert
    except ImportError:
        return None
    return vl_convert.vegalite_to_svg(chart.to_json())
