"""Altair charts of the dashboard's data frames, shared by the web app and the static report.

Each function takes a frame from :mod:`syncopate.dashboard.data` and returns an Altair chart, or
None where the frame has nothing to draw. Rules every chart follows:

- It fits its container: `width="container"` in the web app (the chart is as wide as its column),
  a number of pixels in the report (its whole width, axis labels and legend included).
- Shapes are rows (horizontal bars or dots), so a label such as `gemm_rs 8192×8192×29568 bf16`
  is never cut, turned or overlapped, however many shapes there are; heights are in pixels, so a
  container may stretch the width without dropping the layout.
- Legends sit above the plot, where they always fit.
- Each layer carries its own data (inline, named, a separate object per layer, and at least two
  layers, else Altair lifts the data to the top level), never the top level: the web app then draws
  the chart with its data from the first frame, with no warning about empty scales.
- Rows of different sources are drawn in separate charts (one per panel of topology, environment
  and source: :func:`panels`), and each source keeps its colour (:data:`SOURCE_COLORS`), so
  measured and predicted numbers never look alike.
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
    "panels",
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
_BASELINE_SHAPES = ("circle", "square", "triangle-up", "cross")
"""The times chart's marker per series of :data:`_BASELINE_COLORS`, in its order."""
_VERDICT_COLORS = {"B slower": "#d62728", "within noise": "#7f7f7f", "B faster": "#2ca02c"}

Width = int | str
"""A chart's width: `"container"` (the web app) or its whole width in pixels (the report)."""


def _inline(frame: pd.DataFrame, columns: list[str], name: str) -> alt.InlineData:
    """The columns as named inline JSON values (NaN and NA as null, times as ISO strings)."""
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
    return alt.InlineData(values=out, name=name)


def _sized(chart: alt.LayerChart, width: Width, height: int, title: Any) -> alt.LayerChart:
    """`width` across, axis labels and legend included; `height` pixels of plot."""
    return chart.properties(
        width=width, height=height, title=title, autosize=alt.AutoSizeParams(type="fit-x", contains="padding")
    )


def _top_legend(title: str | None = None, columns: int | None = None) -> alt.Legend:
    kwargs: dict[str, Any] = {"orient": "top", "title": title, "labelLimit": 0}
    if columns is not None:
        kwargs["columns"] = columns
    return alt.Legend(**kwargs)


def _rule_at_one(axis: str) -> alt.Chart:
    """A dashed rule at 1 along `axis` (x or y), with a datum of its own (no field, no axis title)."""
    data = alt.InlineData(values=[{"one": 1.0}], name="one")
    return alt.Chart(data).mark_rule(color="black", strokeDash=[4, 3]).encode(**{axis: alt.datum(1.0)})


def panel_label(row: Any) -> str:
    """`H200x2-nvlink · bb79b704 · measured`: one overview panel (topology, environment, source)."""
    return f"{row['topology']} · {str(row['environment'])[:8]} · {row['source']}"


def panels(overview: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """The overview's rows per panel (topology, environment, source), each panel's shapes sorted by
    kind, dtype and dims, with their `label` (`ag_gemm 8192×2048×8192 bf16`); panels with no ok
    trial are left out (nothing to draw)."""
    if overview.empty:
        return []
    frame = overview.sort_values(["kind", "dtype", "m", "n", "k"]).copy()
    frame["panel"] = [panel_label(row) for _, row in frame.iterrows()]
    frame["label"] = [
        f"{kind} {m}×{n}×{k} {d}"
        for kind, m, n, k, d in zip(frame["kind"], frame["m"], frame["n"], frame["k"], frame["dtype"])
    ]
    out = []
    for panel in dict.fromkeys(frame["panel"]):
        rows = frame[frame["panel"] == panel]
        if rows["best_us"].notna().any():
            out.append((panel, rows.reset_index(drop=True)))
    return out


def _shapes(rows: pd.DataFrame) -> alt.Y:
    return alt.Y("label:N", title=None, sort=list(dict.fromkeys(rows["label"])), axis=alt.Axis(labelLimit=0))


def speedup_chart(rows: pd.DataFrame, *, width: Width = "container") -> alt.LayerChart | None:
    """One panel's speedups of the best time over torch_seq and over torch async-TP per shape, as
    horizontal bars; a rule at 1."""
    long = rows.melt(
        id_vars=["label", "source", "config", "best_us"],
        value_vars=["speedup_seq", "speedup_async_tp"],
        var_name="baseline",
        value_name="speedup",
    ).dropna(subset=["speedup"])
    if long.empty:
        return None
    long["baseline"] = long["baseline"].map(
        {"speedup_seq": "over torch_seq", "speedup_async_tp": "over async-TP"}
    )
    data = _inline(long, ["label", "source", "config", "best_us", "baseline", "speedup"], "speedups")
    order = ["over torch_seq", "over async-TP"]
    bars = (
        alt.Chart(data)
        .mark_bar()
        .encode(
            y=_shapes(rows),
            yOffset=alt.YOffset("baseline:N", sort=order),
            x=alt.X("speedup:Q", title="speedup (baseline time / best time)"),
            color=alt.Color(
                "baseline:N",
                scale=alt.Scale(domain=order, range=["#4c78a8", "#9ecae9"]),
                legend=_top_legend(),
            ),
            tooltip=[
                alt.Tooltip("label:N", title="shape"),
                "baseline:N",
                alt.Tooltip("speedup:Q", format=".3f"),
                alt.Tooltip("best_us:Q", format=".1f", title="best µs"),
                alt.Tooltip("config:N", title="configuration"),
                "source:N",
            ],
        )
    )
    shapes = long["label"].nunique()
    return _sized(
        alt.layer(bars, _rule_at_one("x")),
        width,
        30 * shapes,
        "Speedup of the best configuration over torch (above 1: faster)",
    )


def bound_chart(rows: pd.DataFrame, *, width: Width = "container") -> alt.LayerChart | None:
    """One panel's fraction of the overlap bound reached (bound / best time) per shape; a rule at 1."""
    frame = rows.dropna(subset=["of_bound"])
    if frame.empty:
        return None
    data = _inline(frame, ["label", "source", "config", "best_us", "bound_us", "of_bound"], "bound")
    top = max(1.1, float(frame["of_bound"].max()) * 1.05)
    bars = (
        alt.Chart(data)
        .mark_bar()
        .encode(
            y=_shapes(frame),
            x=alt.X("of_bound:Q", title="bound / best", scale=alt.Scale(domain=[0, top])),
            color=alt.Color(
                "source:N",
                scale=alt.Scale(domain=list(SOURCE_COLORS), range=list(SOURCE_COLORS.values())),
                legend=None,
            ),
            tooltip=[
                alt.Tooltip("label:N", title="shape"),
                alt.Tooltip("of_bound:Q", format=".3f", title="fraction of bound"),
                alt.Tooltip("best_us:Q", format=".1f", title="best µs"),
                alt.Tooltip("bound_us:Q", format=".1f", title="bound µs"),
                alt.Tooltip("config:N", title="configuration"),
                "source:N",
            ],
        )
    )
    return _sized(
        alt.layer(bars, _rule_at_one("x")),
        width,
        22 * len(frame),
        "Fraction of the overlap bound reached (1: at the bound)",
    )


def times_chart(rows: pd.DataFrame, *, width: Width = "container") -> alt.LayerChart | None:
    """One panel's times per shape, a dot each on a log scale: torch_seq, torch async-TP, the overlap
    bound and the best (the gaps between dots read as ratios, whatever the shape's size)."""
    frame = rows.rename(
        columns={
            "torch_seq_us": "torch_seq",
            "torch_async_tp_us": "torch_async_tp",
            "bound_us": "overlap bound",
            "best_us": "best (Syncopate)",
        }
    )
    long = frame.melt(
        id_vars=["label", "source"], value_vars=list(_BASELINE_COLORS), var_name="series", value_name="us"
    ).dropna(subset=["us"])
    if long.empty:
        return None
    data = _inline(long, ["label", "source", "series", "us"], "times")
    spans = long.groupby("label", as_index=False)["us"].agg(low="min", high="max")
    span = (
        alt.Chart(_inline(spans, ["label", "low", "high"], "time_spans"))
        .mark_rule(color="#c7c7c7")
        .encode(y=_shapes(frame), x="low:Q", x2="high:Q")
    )
    dots = (
        alt.Chart(data)
        .mark_point(filled=True, size=70, opacity=0.9)
        .encode(
            y=_shapes(frame),
            x=alt.X(
                "us:Q",
                title="time (µs, log scale; lower is better)",
                scale=alt.Scale(type="log", nice=False, padding=12),
            ),
            color=alt.Color(
                "series:N",
                sort=list(_BASELINE_COLORS),
                scale=alt.Scale(domain=list(_BASELINE_COLORS), range=list(_BASELINE_COLORS.values())),
                legend=_top_legend(),
            ),
            shape=alt.Shape(
                "series:N",
                sort=list(_BASELINE_COLORS),
                legend=_top_legend(),  # one legend with color
                scale=alt.Scale(domain=list(_BASELINE_COLORS), range=list(_BASELINE_SHAPES)),
            ),
            tooltip=[
                alt.Tooltip("label:N", title="shape"),
                "series:N",
                alt.Tooltip("us:Q", format=".1f", title="µs"),
                "source:N",
            ],
        )
    )
    return _sized(alt.layer(span, dots), width, 24 * long["label"].nunique(), "Times (µs, lower is better)")


def convergence_chart(
    trials: pd.DataFrame, source: str = "measured", *, width: Width = "container"
) -> alt.LayerChart | None:
    """Time of every `ok` trial against its order in its sweep and strategy, and the running best."""
    ok = trials[trials["status"] == "ok"].dropna(subset=["median_us"])
    if ok.empty:
        return None
    last = int(ok["order"].max())
    series = list(dict.fromkeys(ok["series"]))
    columns = [
        "order",
        "median_us",
        "best_so_far",
        "series",
        "backend",
        "num_splits",
        "tile_order",
        "trial_id",
    ]
    x = alt.X(
        "order:Q",
        title="trial (order within sweep and strategy)",
        scale=alt.Scale(domainMin=1, nice=False, padding=8),
        axis=alt.Axis(format="d", values=list(range(1, last + 1)))
        if last <= 12
        else alt.Axis(format="d", tickMinStep=1),
    )
    color = alt.Color(
        "series:N",
        title="sweep · strategy",
        sort=series,
        legend=_top_legend("sweep · strategy", columns=min(len(series), 4)),
    )
    points = (
        alt.Chart(_inline(ok, columns, "trials"))
        .mark_circle(size=28, opacity=0.55)
        .encode(
            x=x,
            y=alt.Y(
                "median_us:Q", title="median time (µs)", scale=alt.Scale(type="log", nice=False, padding=8)
            ),
            color=color,
            tooltip=[
                "trial_id:Q",
                "series:N",
                alt.Tooltip("median_us:Q", format=".1f"),
                "backend:N",
                "num_splits:O",
                "tile_order:N",
            ],
        )
    )
    best = (
        alt.Chart(_inline(ok, ["order", "best_so_far", "series"], "running_best"))
        .mark_line(interpolate="step-after", strokeWidth=2)
        .encode(
            x=x, y=alt.Y("best_so_far:Q", scale=alt.Scale(type="log", nice=False, padding=8)), color=color
        )
    )
    return _sized(
        alt.layer(points, best),
        width,
        260,
        f"Convergence: time against trial order, running best as a line ({source})",
    )


def backend_splits_chart(cells: pd.DataFrame, *, width: Width = "container") -> alt.LayerChart | None:
    """Heatmap of the best time per backend × num_splits (darker: faster), each cell labelled."""
    cells = cells.dropna(subset=["best_us"])
    if cells.empty:
        return None
    columns = ["backend", "num_splits", "best_us", "trials", "ok"]
    x = alt.X("num_splits:O", title="num_splits", axis=alt.Axis(labelAngle=0))
    y = alt.Y("backend:N", title=None, axis=alt.Axis(labelLimit=0))
    rect = (
        alt.Chart(_inline(cells, columns, "cells"))
        .mark_rect()
        .encode(
            x=x,
            y=y,
            color=alt.Color(
                "best_us:Q",
                title="best µs",
                scale=alt.Scale(scheme="viridis"),
                legend=alt.Legend(orient="top", gradientLength=160),
            ),
            tooltip=["backend:N", "num_splits:O", alt.Tooltip("best_us:Q", format=".1f"), "trials:Q", "ok:Q"],
        )
    )
    middle = float(cells["best_us"].min() + cells["best_us"].max()) / 2
    text = (
        alt.Chart(_inline(cells, columns, "cell_labels"))
        .mark_text(fontSize=11)
        .encode(
            x=x,
            y=y,
            text=alt.Text("best_us:Q", format=".0f"),
            color=alt.condition(alt.datum.best_us < middle, alt.value("white"), alt.value("black")),
        )
    )
    return _sized(
        alt.layer(rect, text),
        width,
        40 * cells["backend"].nunique(),
        alt.Title("Best time per backend × num_splits", subtitle="µs; darker is faster"),
    )


def tile_order_chart(orders: pd.DataFrame, *, width: Width = "container") -> alt.LayerChart | None:
    """Best (bar) and mean (tick) `ok` time per tile order."""
    orders = orders.dropna(subset=["best_us"])
    if orders.empty:
        return None
    columns = ["tile_order", "best_us", "mean_us", "trials", "ok", "failed"]
    y = alt.Y("tile_order:N", title=None, axis=alt.Axis(labelLimit=0))
    bars = (
        alt.Chart(_inline(orders, columns, "orders"))
        .mark_bar(color="#4c78a8")
        .encode(
            y=y,
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
    )
    ticks = (
        alt.Chart(_inline(orders, ["tile_order", "mean_us"], "order_means"))
        .mark_tick(color="black", thickness=2, size=18)
        .encode(y=y, x="mean_us:Q")
    )
    return _sized(alt.layer(bars, ticks), width, 32 * len(orders), "Tile orders compared")


def failure_chart(failed: pd.DataFrame, *, width: Width = "container") -> alt.LayerChart | None:
    """Failed trials per status."""
    if failed.empty:
        return None
    per = failed.groupby("status", as_index=False)["trials"].sum()
    y = alt.Y("status:N", title=None, axis=alt.Axis(labelLimit=0))
    x = alt.X("trials:Q", title="failed trials", axis=alt.Axis(tickMinStep=1, format="d"))
    bars = (
        alt.Chart(_inline(per, ["status", "trials"], "failures"))
        .mark_bar(color="#d62728")
        .encode(x=x, y=y, tooltip=["status:N", "trials:Q"])
    )
    counts = (
        alt.Chart(_inline(per, ["status", "trials"], "failure_counts"))
        .mark_text(align="left", dx=4, fontSize=11)
        .encode(x=x, y=y, text="trials:Q")
    )
    return _sized(alt.layer(bars, counts), width, 28 * len(per), "Failures by status")


def compare_chart(
    compared: pd.DataFrame, a: int, b: int, *, width: Width = "container"
) -> alt.LayerChart | None:
    """Best time of sweep B over sweep A per shape (above 1: B is slower), as a dot on a scale around
    1, with the runs' noise band (p20 of one over p80 of the other, and the other way round) as a
    line through it: a dot whose band crosses 1 is within noise."""
    both = compared.dropna(subset=["ratio"]).copy()
    if both.empty:
        return None
    both["label"] = [
        f"{k} {m}×{n}×{kk} {d} · {t} · {s}"
        for k, m, n, kk, d, t, s in zip(
            both["kind"], both["m"], both["n"], both["k"], both["dtype"], both["topology"], both["source"]
        )
    ]
    both["lo"] = both["ratio_lo"].fillna(both["ratio"])
    both["hi"] = both["ratio_hi"].fillna(both["ratio"])
    both["verdict"] = [
        "B slower" if lo > 1 else "B faster" if hi < 1 else "within noise"
        for lo, hi in zip(both["lo"], both["hi"])
    ]
    reach = max(0.02, float((both[["lo", "hi"]] - 1).abs().max().max()) * 1.15)
    scale = alt.Scale(domain=[1 - reach, 1 + reach], nice=False)
    columns = ["label", "ratio", "lo", "hi", "best_us_a", "best_us_b", "verdict"]
    y = alt.Y("label:N", title=None, sort=None, axis=alt.Axis(labelLimit=0))
    color = alt.Color(
        "verdict:N",
        scale=alt.Scale(domain=list(_VERDICT_COLORS), range=list(_VERDICT_COLORS.values())),
        legend=_top_legend(),
    )
    band = (
        alt.Chart(_inline(both, columns, "bands"))
        .mark_rule(strokeWidth=3, opacity=0.45)
        .encode(
            y=y,
            x=alt.X(
                "lo:Q", scale=scale, title=f"best of sweep {b} / best of sweep {a} (line: p20/p80 noise band)"
            ),
            x2="hi:Q",
            color=color,
        )
    )
    dots = (
        alt.Chart(_inline(both, columns, "ratios"))
        .mark_point(filled=True, size=70)
        .encode(
            y=y,
            x=alt.X("ratio:Q", scale=scale),
            color=color,
            tooltip=[
                alt.Tooltip("label:N", title="shape"),
                alt.Tooltip("ratio:Q", format=".4f", title="B / A"),
                alt.Tooltip("lo:Q", format=".4f", title="noise band from"),
                alt.Tooltip("hi:Q", format=".4f", title="noise band to"),
                alt.Tooltip("best_us_a:Q", format=".1f", title=f"best µs, sweep {a}"),
                alt.Tooltip("best_us_b:Q", format=".1f", title=f"best µs, sweep {b}"),
                "verdict:N",
            ],
        )
    )
    return _sized(
        alt.layer(band, dots, _rule_at_one("x")), width, 24 * len(both), f"Sweep {b} against sweep {a}"
    )


def to_svg(chart: Any) -> str | None:
    """The chart as an SVG document, rendered here (vl-convert, the `dashboard` extra); None where
    vl-convert is not installed."""
    try:
        import vl_convert
    except ImportError:
        return None
    return vl_convert.vegalite_to_svg(chart.to_json())
