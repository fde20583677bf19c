"""The Streamlit pages of `syncopate dashboard`: overview, workload drill-down, sweeps, environments.

:func:`main` draws one run of the app (the script `app.py` calls it). The database is the one
named by `--db URL` after the script's `--` (as `syncopate dashboard` passes it), else
SYNCOPATE_DB, else the per-user default; it is opened read-only (never created or upgraded here).
Data comes from :mod:`syncopate.dashboard.data`, cached for :data:`CACHE_S` seconds per database
and filters; the sidebar's Reload button drops the cache.
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd
import streamlit as st

from syncopate.dashboard import charts, data, views
from syncopate.errors import SyncopateError
from syncopate.results_db.repository import ResultsDB
from syncopate.results_db.urls import locate

__all__ = ["CACHE_S", "PAGES", "database_argument", "main"]

CACHE_S = 30
"""Seconds a query's answer is reused before the database is asked again."""

PAGES: tuple[str, ...] = ("Overview", "Workload", "Sweeps", "Environments")


def database_argument(argv: list[str] | None = None) -> str | None:
    """The `--db` value among the script's arguments, or None."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--db", default=None)
    known, _ = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    return known.db


@st.cache_resource(show_spinner=False)
def _open(url: str) -> ResultsDB:
    return ResultsDB.open(url, read_only=True)


@st.cache_data(ttl=CACHE_S, show_spinner=False)
def _options(url: str) -> data.FilterOptions:
    return data.filter_options(_open(url))


@st.cache_data(ttl=CACHE_S, show_spinner="reading the best configurations…")
def _overview(url: str, filters: data.Filters) -> pd.DataFrame:
    return data.overview(_open(url), filters)


@st.cache_data(ttl=CACHE_S, show_spinner=False)
def _drill(url: str, sel: data.Selection) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    db = _open(url)
    return (
        data.convergence(db, sel),
        data.backend_splits(db, sel),
        data.tile_orders(db, sel),
        data.failures(db, sel),
    )


@st.cache_data(ttl=CACHE_S, show_spinner=False)
def _sweeps(url: str, filters: data.Filters) -> pd.DataFrame:
    return data.sweeps(_open(url), filters)


@st.cache_data(ttl=CACHE_S, show_spinner=False)
def _compare(url: str, a: int, b: int, filters: data.Filters) -> tuple[pd.DataFrame, pd.DataFrame]:
    db = _open(url)
    return data.compare_sweeps(db, a, b, filters), data.environment_diff(db, a, b)


@st.cache_data(ttl=CACHE_S, show_spinner=False)
def _environments(url: str) -> pd.DataFrame:
    return data.environments(_open(url))


def _chart(chart: object | None, empty: str) -> None:
    """The chart as wide as its column (its width is `container`), or `empty` as a caption."""
    if chart is None:
        st.caption(empty)
    else:
        st.altair_chart(chart, width="stretch")


def _sidebar(options: data.FilterOptions) -> tuple[str, data.Filters]:
    bar = st.sidebar
    bar.title("Syncopate")
    page = bar.radio("View", PAGES, key="page")
    bar.subheader("Filters")
    bar.caption("Empty means every value; measured, predicted and fixture rows are always shown apart.")
    topologies = bar.multiselect(
        "Topology", options.topologies, key="f_topology", placeholder="all topologies"
    )
    envs = bar.multiselect(
        "Environment",
        list(options.environments),
        key="f_environment",
        format_func=lambda k: f"{k[:8]} · {options.environments[k]}",
        placeholder="all environments",
    )
    dtypes = bar.multiselect("dtype", options.dtypes, key="f_dtype", placeholder="all dtypes")
    kinds = bar.multiselect("Kind", options.kinds, key="f_kind", placeholder="all kinds")
    sources = bar.multiselect(
        "Source",
        options.sources,
        key="f_source",
        placeholder="all sources",
        help="measured: timed on GPUs; predicted: the cost model; fixture: synthetic",
    )
    if bar.button("Reload", help=f"Read the database again (answers are kept {CACHE_S} s)"):
        st.cache_data.clear()
    filters = data.Filters(
        topologies=tuple(topologies),
        environments=tuple(envs),
        dtypes=tuple(dtypes),
        kinds=tuple(kinds),
        sources=tuple(sources),
    )
    return page, filters


def _overview_page(url: str, filters: data.Filters) -> None:
    st.header("Overview: best configuration per shape")
    st.caption(views.filters_caption(filters))
    frame = _overview(url, filters)
    if frame.empty:
        st.warning("No trials match these filters.")
        return
    sources = ", ".join(sorted(frame["source"].unique()))
    st.markdown(
        f"**{len(frame)}** shape(s) × topology × environment × source ({sources}). Speedups are "
        f"baseline time / best time, both from the best trial's sweep; *of bound* is the overlap bound "
        f"max(GEMM alone, fastest collective alone) / best time."
    )
    st.dataframe(views.overview_table(frame), hide_index=True, placeholder="–", key="overview_table")
    missing = int(frame["best_us"].notna().sum() - frame["speedup_seq"].notna().sum())
    if missing:
        st.caption(
            f"{missing} row(s) have no baselines in their best trial's sweep: no speedup drawn for them."
        )
    drawn = charts.panels(frame)
    if not drawn:
        st.caption("No ok trial to draw.")
    for panel, rows in drawn:
        st.subheader(panel, divider="gray")
        _chart(charts.speedup_chart(rows), "No speedups to draw: no baselines in the best trials' sweeps.")
        _chart(
            charts.bound_chart(rows),
            "No overlap bound to draw: no GEMM-alone and collective-alone baselines.",
        )
        _chart(charts.times_chart(rows), "No times to draw.")


def _workload_page(url: str, filters: data.Filters) -> None:
    st.header("Workload drill-down")
    frame = _overview(url, filters)
    if frame.empty:
        st.warning("No trials match these filters.")
        return
    labels = [views.selection_label(row) for _, row in frame.iterrows()]
    first_ok = next((i for i, v in enumerate(frame["best_us"]) if not pd.isna(v)), 0)
    chosen = st.selectbox("Shape · topology · environment · source", labels, index=first_ok, key="selection")
    row = frame.iloc[labels.index(chosen) if chosen in labels else 0]
    sel = data.Selection.of(row)
    cols = st.columns(4)
    cols[0].metric("best µs", "–" if pd.isna(row["best_us"]) else f"{row['best_us']:.1f}")
    cols[1].metric("× torch_seq", "–" if pd.isna(row["speedup_seq"]) else f"{row['speedup_seq']:.3f}")
    cols[2].metric(
        "× async-TP", "–" if pd.isna(row["speedup_async_tp"]) else f"{row['speedup_async_tp']:.3f}"
    )
    cols[3].metric("of bound", "–" if pd.isna(row["of_bound"]) else f"{row['of_bound']:.3f}")
    if pd.isna(row["best_trial_id"]):
        best = "no ok trial"
    else:
        best = f"best configuration `{row['config']}` (trial {row['best_trial_id']}, sweep {row['sweep_id']})"
    st.markdown(f"{row['trials']} trial(s), {row['failed']} failed; {best}. Environment: {row['env_label']}.")
    trials, cells, orders, failed = _drill(url, sel)
    if trials.attrs.get("thinned"):
        st.caption(f"{trials.attrs['total']} trials: the chart shows every n-th and each new best.")
    _chart(charts.convergence_chart(trials, sel.source), "No ok trial to draw.")
    left, right = st.columns(2)
    with left:
        _chart(charts.backend_splits_chart(cells), "No ok trial per backend to draw.")
    with right:
        _chart(charts.tile_order_chart(orders), "No ok trial per tile order to draw.")
        st.dataframe(views.tile_orders_table(orders), hide_index=True, placeholder="–")
    st.subheader("Failures")
    if failed.empty:
        st.caption("No failed trial.")
    else:
        _chart(charts.failure_chart(failed), "")
        st.dataframe(views.failures_table(failed), hide_index=True, placeholder="–")


def _sweeps_page(url: str, filters: data.Filters) -> None:
    st.header("Sweeps")
    frame = _sweeps(url, filters)
    if frame.empty:
        st.warning("No sweep has trials matching these filters.")
        return
    st.dataframe(views.sweeps_table(frame), hide_index=True, placeholder="–")
    st.subheader("Two sweeps side by side")
    ids = list(frame["sweep_id"])
    names = {
        s: f"{s}: {n} ({h}, {str(t)[:16]})"
        for s, n, h, t in zip(frame["sweep_id"], frame["name"], frame["host"], frame["started_at"])
    }
    left, right = st.columns(2)
    a = left.selectbox("Sweep A", ids, index=min(1, len(ids) - 1), format_func=names.get, key="sweep_a")
    b = right.selectbox("Sweep B", ids, index=0, format_func=names.get, key="sweep_b")
    compared, envs = _compare(url, int(a), int(b), filters)
    st.dataframe(views.environment_diff_table(envs), hide_index=True, placeholder="–")
    if compared.empty:
        st.caption("Neither sweep has trials matching these filters.")
        return
    _chart(charts.compare_chart(compared, int(a), int(b)), "No shape has an ok trial in both sweeps.")
    st.dataframe(views.compare_table(compared), hide_index=True, placeholder="–")


def main() -> None:
    """One run of the app."""
    st.set_page_config(page_title="Syncopate results", layout="wide")
    location = locate(database_argument())
    url = location.shown()
    try:
        _open(location.given)
        counts = data.counts(_open(location.given))  # not cached: a database just filled shows at once
    except SyncopateError as e:
        st.title("Syncopate results")
        st.error(str(e))
        if location.sqlite_path is not None and not location.sqlite_path.exists():
            st.markdown(views.empty_message(url))
        st.stop()
    if counts["trials"] == 0:
        st.title("Syncopate results")
        st.info(f"{counts['sweeps']} sweep(s), {counts['baselines']} baseline(s), no trial.")
        st.markdown(views.empty_message(url))
        st.stop()
    options = _options(location.given)
    page, filters = _sidebar(options)
    st.sidebar.caption(f"{url}: {counts['trials']} trials, {counts['sweeps']} sweeps")
    if page == "Overview":
        _overview_page(location.given, filters)
    elif page == "Workload":
        _workload_page(location.given, filters)
    elif page == "Sweeps":
        _sweeps_page(location.given, filters)
    else:
        st.header("Environments")
        st.dataframe(
            views.environments_table(_environments(location.given)), hide_index=True, placeholder="–"
        )
