"""`syncopate report`: the dashboard's views as one self-contained HTML file, for sharing.

The same data functions and charts as the web app: the overview (table and bar charts), a
drill-down per shape (convergence, backend × num_splits, tile orders, failures with their error
text), the sweeps with two of them compared, and the environments. Tables are plain HTML; charts
are inline SVG rendered here by vl-convert (the `dashboard` extra), so the file needs no network to
be read. Where vl-convert is missing, charts are embedded as Vega-Lite specs drawn by vega-embed
from a CDN when the file is opened, and the report says so.
"""

from __future__ import annotations

import html
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from syncopate.dashboard import charts, data, views
from syncopate.errors import ConfigError
from syncopate.files import check_writable, write_atomically
from syncopate.records import utcnow
from syncopate.results_db.repository import ResultsDB

__all__ = ["ReportOptions", "build_report", "write_report"]

log = logging.getLogger(__name__)

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px; color: #222; }
h1 { margin-bottom: 4px; } h2 { margin-top: 36px; border-bottom: 1px solid #ccc; } h3 { margin-top: 28px; }
h4 { margin: 22px 0 4px; font-size: 1em; } .meta { color: #555; font-size: 0.9em; } nav a { margin-right: 14px; }
.scroll { overflow-x: auto; max-width: 100%; }
table.data { border-collapse: collapse; font-size: 0.85em; margin: 8px 0 16px; }
table.data th, table.data td { border: 1px solid #ddd; padding: 3px 7px; text-align: right; white-space: nowrap; }
table.data th { background: #f3f3f3; } table.data td:nth-child(-n+4) { text-align: left; }
td.error, table.failures td { text-align: left !important; white-space: pre-wrap; max-width: 60em; }
.chart { margin: 10px 0 18px; max-width: 100%; } .chart svg { max-width: 100%; height: auto; }
.note { color: #8a5a00; }
.row { display: flex; flex-wrap: wrap; gap: 28px; align-items: flex-start; } .row > div { max-width: 100%; }
"""

CHART_WIDTH = 1100
"""Pixels across a full-width chart of the report, its labels and legend included: it fits a page
from 1150 px wide, and is scaled down (CSS) on a narrower one."""
HALF_WIDTH = 520
"""Pixels across each of two charts side by side."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ReportOptions:
    """What goes into a report."""

    filters: data.Filters = data.Filters()
    drill_down: int = 30
    """Shapes given a drill-down section, in the overview's order (0: none)."""
    compare: tuple[int, int] | None = None
    """Sweeps (A, B) to compare; None: the two most recent."""
    max_points: int = 800
    """Trials drawn per convergence chart (every n-th plus each new best past that)."""
    title: str = "Syncopate results"

    def __post_init__(self) -> None:
        if self.drill_down < 0:
            raise ConfigError(f"drill_down={self.drill_down} must be 0 or more")
        if self.max_points < 1:
            raise ConfigError(f"max_points={self.max_points} must be at least 1")


class _Charts:
    """Renders charts as inline SVG, or as Vega-Lite specs where vl-convert is not installed."""

    def __init__(self) -> None:
        try:
            import vl_convert  # noqa: F401

            self.svg = True
        except ImportError:
            self.svg = False
        self.count = 0

    def __call__(self, chart: Any, empty: str) -> str:
        if chart is None:
            return f'<p class="meta">{html.escape(empty)}</p>'
        self.count += 1
        if self.svg:
            return f'<div class="chart">{charts.to_svg(chart)}</div>'
        spec = chart.to_json().replace("</", "<\\/")
        return (
            f'<div class="chart" id="chart{self.count}"></div><script type="application/json" '
            f'class="vl-spec" data-target="chart{self.count}">{spec}</script>'
        )

    def scripts(self) -> str:
        if self.svg or not self.count:
            return ""
        return """
<script src="https://cdn.jsdelivr.net/npm/vega@6"></script>
<script src="https://cdn.jsdelivr.net/npm/vega-lite@6"></script>
<script src="https://cdn.jsdelivr.net/npm/vega-embed@7"></script>
<script>
for (const s of document.querySelectorAll("script.vl-spec")) {
  vegaEmbed("#" + s.dataset.target, JSON.parse(s.textContent), {actions: false});
}
</script>"""


def _table(frame: pd.DataFrame, css: str = "data") -> str:
    """A table in a box of the page's width that scrolls sideways where the table is wider."""
    if frame.empty:
        return '<p class="meta">(none)</p>'
    return f'<div class="scroll">{frame.to_html(index=False, escape=True, classes=css, border=0, na_rep="–")}</div>'


def _anchor(i: int) -> str:
    return f"shape-{i}"


def _overview_section(overview: pd.DataFrame, draw: _Charts, drill: int) -> list[str]:
    out = [
        '<h2 id="overview">Overview: best configuration per shape</h2>',
        "<p>Speedups are baseline time / best time, both from the best trial's sweep; <i>of bound</i> is the "
        "overlap bound max(GEMM alone, fastest collective alone) / best time (1: at the bound). Rows of "
        "different sources (measured, predicted, fixture) are listed and drawn apart.</p>",
    ]
    table = views.overview_table(overview)
    if drill:
        links = [f'<a href="#{_anchor(i)}">{i + 1}</a>' if i < drill else "" for i in range(len(table))]
        table.insert(0, "#", links)
        html_table = table.to_html(
            index=False,
            escape=False,
            classes="data",
            border=0,
            na_rep="–",
            formatters={c: (lambda v: html.escape(str(v))) for c in table.columns if c != "#"},
        )
        out.append(f'<div class="scroll">{html_table}</div>')
    else:
        out.append(_table(table))
    drawn = charts.panels(overview)
    if not drawn:
        out.append('<p class="meta">No ok trial to draw.</p>')
    for panel, rows in drawn:
        out.append(f"<h4>{html.escape(panel)}</h4>")
        out.append(
            draw(
                charts.speedup_chart(rows, width=CHART_WIDTH),
                "No speedups to draw: no baselines in the best trials' sweeps.",
            )
        )
        out.append(draw(charts.bound_chart(rows, width=CHART_WIDTH), "No overlap bound to draw."))
        out.append(draw(charts.times_chart(rows, width=CHART_WIDTH), "No times to draw."))
    return out


def _drill_section(db: ResultsDB, overview: pd.DataFrame, draw: _Charts, options: ReportOptions) -> list[str]:
    out = ['<h2 id="workloads">Workload drill-down</h2>']
    shown = overview.head(options.drill_down)
    if len(overview) > len(shown):
        out.append(
            f'<p class="note">The first {len(shown)} of {len(overview)} shapes (the overview\'s order); '
            f"`syncopate report --drill-down N` sets how many.</p>"
        )
    for i, (_, row) in enumerate(shown.iterrows()):
        sel = data.Selection.of(row)
        trials = data.convergence(db, sel, max_points=options.max_points)
        out.append(f'<h3 id="{_anchor(i)}">{i + 1}. {html.escape(views.selection_label(row))}</h3>')

        def fmt(v: Any, spec: str) -> str:
            return "–" if pd.isna(v) else format(v, spec)

        out.append(
            f"<p>best {fmt(row['best_us'], '.1f')} µs · × torch_seq {fmt(row['speedup_seq'], '.3f')} · "
            f"× async-TP {fmt(row['speedup_async_tp'], '.3f')} · of bound {fmt(row['of_bound'], '.3f')} · "
            f"{row['trials']} trials, {row['failed']} failed<br>best configuration: "
            f"<code>{html.escape(str(row['config'] or '–'))}</code> · "
            f"environment: {html.escape(row['env_label'])}</p>"
        )
        if trials.attrs.get("thinned"):
            out.append(
                f'<p class="meta">{trials.attrs["total"]} trials: every n-th and each new best drawn.</p>'
            )
        out.append(
            draw(charts.convergence_chart(trials, sel.source, width=CHART_WIDTH), "No ok trial to draw.")
        )
        orders = data.tile_orders(db, sel)
        out.append('<div class="row">')
        out.append(
            draw(
                charts.backend_splits_chart(data.backend_splits(db, sel), width=HALF_WIDTH),
                "No ok trial per backend.",
            )
        )
        out.append(
            f"<div>{draw(charts.tile_order_chart(orders, width=HALF_WIDTH), 'No ok trial per tile order.')}"
            f"{_table(views.tile_orders_table(orders))}</div>"
        )
        out.append("</div>")
        failed = data.failures(db, sel)
        if failed.empty:
            out.append('<p class="meta">No failed trial.</p>')
        else:
            out.append(draw(charts.failure_chart(failed, width=HALF_WIDTH), ""))
            out.append(_table(views.failures_table(failed), "data failures"))
    return out


def _sweeps_section(db: ResultsDB, draw: _Charts, options: ReportOptions) -> list[str]:
    frame = data.sweeps(db, options.filters)
    out = ['<h2 id="sweeps">Sweeps</h2>', _table(views.sweeps_table(frame))]
    if options.compare is not None:
        a, b = options.compare
        known = set(frame["sweep_id"]) | set(s.sweep_id for s in db.sweeps())
        for s in (a, b):
            if s not in known:
                raise ConfigError(
                    f"sweep {s} does not exist in {db.url}: compare two of "
                    f"{', '.join(map(str, sorted(known))) or 'none'}"
                )
    elif len(frame) >= 2:
        b, a = int(frame["sweep_id"].iloc[0]), int(frame["sweep_id"].iloc[1])
    else:
        return out
    compared = data.compare_sweeps(db, a, b, options.filters)
    out.append(f"<h3>Sweep {a} (A) against sweep {b} (B)</h3>")
    out.append(_table(views.environment_diff_table(data.environment_diff(db, a, b))))
    out.append(
        draw(
            charts.compare_chart(compared, a, b, width=CHART_WIDTH),
            "No shape has an ok trial in both sweeps.",
        )
    )
    out.append(_table(views.compare_table(compared)))
    return out


def build_report(db: ResultsDB, options: ReportOptions = ReportOptions()) -> str:
    """The report as one HTML document. ConfigError where the database has no trials (saying how
    to fill it) or where a sweep to compare does not exist."""
    counts = data.counts(db)
    if counts["trials"] == 0:
        raise ConfigError(
            f"no trials in {db.url} to report: fill it first, e.g. "
            f"`syncopate tune configs/quickstart.yaml --db {db.url}` or "
            f"`syncopate import-bench BENCH.json --db {db.url}`"
        )
    draw = _Charts()
    overview = data.overview(db, options.filters)
    body = [
        f"<h1>{html.escape(options.title)}</h1>",
        f'<p class="meta">{html.escape(db.url)} · {counts["trials"]} trials, {counts["sweeps"]} sweeps · '
        f"written {utcnow().strftime('%Y-%m-%d %H:%M UTC')} · "
        f"{html.escape(views.filters_caption(options.filters))}</p>",
        '<nav><a href="#overview">Overview</a><a href="#workloads">Workloads</a><a href="#sweeps">Sweeps</a>'
        '<a href="#environments">Environments</a></nav>',
    ]
    if overview.empty:
        body.append('<h2 id="overview">Overview</h2><p class="note">No trials match these filters.</p>')
    else:
        body += _overview_section(overview, draw, min(options.drill_down, len(overview)))
        if options.drill_down:
            body += _drill_section(db, overview, draw, options)
    body += _sweeps_section(db, draw, options)
    body += [
        '<h2 id="environments">Environments</h2>',
        _table(views.environments_table(data.environments(db))),
    ]
    if not draw.svg and draw.count:
        body.insert(
            2,
            '<p class="note">vl-convert is not installed here, so the charts are drawn by vega-embed '
            "from a CDN when this file is opened (the tables need nothing).</p>",
        )
    head = (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(options.title)}'
        f"</title><style>{_CSS}</style></head>\n<body>\n"
    )
    return head + "\n".join(body) + draw.scripts() + "\n</body></html>\n"


def write_report(db: ResultsDB, out: Path, options: ReportOptions = ReportOptions()) -> int:
    """Write the report to `out` atomically (nothing is left behind on failure); its size in bytes."""
    check_writable(out)
    text = build_report(db, options).encode("utf-8")
    write_atomically(out, text)
    log.info("wrote %s (%d bytes)", out, len(text))
    return len(text)
