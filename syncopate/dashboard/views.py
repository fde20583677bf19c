"""What the web app and the static report both show: table layouts, labels and messages.

The frames of :mod:`syncopate.dashboard.data` carry every column; the functions here pick, order,
round and name the ones a reader needs, so the app and the report show the same tables.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from syncopate.dashboard.data import SWEEP_COLUMNS, Filters

__all__ = [
    "compare_table",
    "empty_message",
    "environment_diff_table",
    "environments_table",
    "failures_table",
    "filters_caption",
    "overview_table",
    "selection_label",
    "sweeps_table",
    "tile_orders_table",
]

_OVERVIEW = {
    "topology": "topology",
    "environment": "environment",
    "source": "source",
    "kind": "kind",
    "m": "M",
    "n": "N",
    "k": "K",
    "dtype": "dtype",
    "best_us": "best µs",
    "speedup_seq": "× torch_seq",
    "speedup_async_tp": "× async-TP",
    "of_bound": "of bound",
    "config": "best configuration",
    "torch_seq_us": "torch_seq µs",
    "torch_async_tp_us": "async-TP µs",
    "bound_us": "bound µs",
    "trials": "trials",
    "failed": "failed",
    "best_trial_id": "trial",
    "sweep_id": "sweep",
}


def _round(frame: pd.DataFrame, digits: dict[str, int]) -> pd.DataFrame:
    for column, n in digits.items():
        if column in frame:
            frame[column] = pd.to_numeric(frame[column], errors="coerce").round(n)
    return frame


def overview_table(overview: pd.DataFrame) -> pd.DataFrame:
    """The overview as shown: one row per shape, best time, speedups, fraction of the bound."""
    out = overview[list(_OVERVIEW)].copy()
    out["environment"] = out["environment"].str[:8]
    out = _round(
        out,
        {
            "best_us": 1,
            "torch_seq_us": 1,
            "torch_async_tp_us": 1,
            "bound_us": 1,
            "speedup_seq": 3,
            "speedup_async_tp": 3,
            "of_bound": 3,
        },
    )
    return out.rename(columns=_OVERVIEW).reset_index(drop=True)


def selection_label(row: Any) -> str:
    """`ag_gemm 8192×2048×8192 bf16 · H200x2-nvlink · bb79b704 · measured`."""
    return (
        f"{row['kind']} {row['m']}×{row['n']}×{row['k']} {row['dtype']} · {row['topology']} · "
        f"{str(row['environment'])[:8]} · {row['source']}"
    )


def tile_orders_table(orders: pd.DataFrame) -> pd.DataFrame:
    out = _round(
        orders[["tile_order", "best_us", "mean_us", "trials", "ok", "failed"]].copy(),
        {"best_us": 1, "mean_us": 1},
    )
    return out.rename(columns={"tile_order": "tile order", "best_us": "best µs", "mean_us": "mean µs"})


def failures_table(failed: pd.DataFrame) -> pd.DataFrame:
    return failed.rename(
        columns={"error": "error text", "first_trial": "first trial", "last_trial": "last trial"}
    )


def sweeps_table(frame: pd.DataFrame) -> pd.DataFrame:
    out = frame[[c for c in SWEEP_COLUMNS if c != "last_trial_at"]].copy()
    for column in ("started_at", "finished_at"):
        out[column] = [
            v.strftime("%Y-%m-%d %H:%M:%S UTC") if isinstance(v, pd.Timestamp) and not pd.isna(v) else ""
            for v in pd.to_datetime(out[column], utc=True)
        ]
    out = _round(out, {"duration_s": 1})
    return out.rename(
        columns={
            "sweep_id": "sweep",
            "started_at": "started",
            "finished_at": "finished",
            "duration_s": "duration s",
        }
    )


def compare_table(compared: pd.DataFrame) -> pd.DataFrame:
    """Sweeps A and B side by side (columns suffixed A and B); `B / A` above 1: B is slower, and
    its noise band (from the best trials' p20 and p80) says whether that is more than noise."""
    out = compared.copy()
    band = []
    verdict = []
    for ratio, lo, hi in zip(out["ratio"], out["ratio_lo"], out["ratio_hi"]):
        if pd.isna(ratio):
            band.append("")
            verdict.append("")
            continue
        band.append("" if pd.isna(lo) or pd.isna(hi) else f"{lo:.3f}–{hi:.3f}")
        if pd.isna(lo) or pd.isna(hi):
            verdict.append("no spread stored")
        else:
            verdict.append("B slower" if lo > 1 else "B faster" if hi < 1 else "within noise")
    out["band"] = band
    out["verdict"] = verdict
    out = _round(out, {"best_us_a": 1, "best_us_b": 1, "ratio": 3, "torch_seq_us_a": 1, "torch_seq_us_b": 1})
    out["env_a"] = out["env_a"].fillna("").astype(str).str[:8]
    out["env_b"] = out["env_b"].fillna("").astype(str).str[:8]
    columns = [
        "kind",
        "m",
        "n",
        "k",
        "dtype",
        "topology",
        "source",
        "best_us_a",
        "best_us_b",
        "ratio",
        "band",
        "verdict",
        "torch_seq_us_a",
        "torch_seq_us_b",
        "trials_a",
        "trials_b",
        "env_a",
        "env_b",
    ]
    return out[columns].rename(
        columns={
            "m": "M",
            "n": "N",
            "k": "K",
            "best_us_a": "best µs A",
            "best_us_b": "best µs B",
            "ratio": "B / A",
            "band": "B / A noise band",
            "torch_seq_us_a": "torch_seq µs A",
            "torch_seq_us_b": "torch_seq µs B",
            "trials_a": "trials A",
            "trials_b": "trials B",
            "env_a": "environment A",
            "env_b": "environment B",
        }
    )


def environment_diff_table(diff: pd.DataFrame) -> pd.DataFrame:
    """The environments of two sweeps field by field, `changed` in words (yes / no)."""
    out = diff.copy()
    out["changed"] = ["yes" if changed else "no" for changed in out["changed"]]
    return out


def environments_table(frame: pd.DataFrame) -> pd.DataFrame:
    out = frame.copy()
    out["created_at"] = [
        v.strftime("%Y-%m-%d %H:%M UTC") if isinstance(v, pd.Timestamp) else str(v)
        for v in pd.to_datetime(out["created_at"], utc=True)
    ]
    return out.rename(columns={"created_at": "first stored", "gpu_model": "GPU"})


def filters_caption(filters: Filters) -> str:
    """`topology H200x2-nvlink · source measured` (or `no filters: everything stored`)."""
    parts = []
    for name, values in (
        ("topology", filters.topologies),
        ("environment", tuple(v[:8] for v in filters.environments)),
        ("dtype", filters.dtypes),
        ("kind", filters.kinds),
        ("source", filters.sources),
    ):
        if values:
            parts.append(f"{name} {', '.join(values)}")
    return " · ".join(parts) if parts else "no filters: everything stored"


def empty_message(url: str) -> str:
    """Markdown: the database has no trials, and the commands that fill it."""
    return (
        f"**No tuning results in `{url}` yet.** Fill it with a sweep, then reload this page:\n\n"
        f"```bash\nsyncopate tune configs/quickstart.yaml --db {url}\n```\n\n"
        f"On a machine without GPUs, `--runner cpu-fixture` stores synthetic rows (source `fixture`) to try "
        f"the dashboard. A `syncopate bench --json bench.json` run on GPUs can be stored too:\n\n"
        f"```bash\nsyncopate import-bench bench.json --db {url}\n```"
    )
