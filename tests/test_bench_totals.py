"""Unit: `syncopate bench --model`'s last line, the layer's ops summed (`format_layer_totals`), on
the committed run of Llama-3-8B's decoder-layer ops at 2048 tokens on four H100s."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

from syncopate.measure.bench import format_layer_totals, summarize_row

RUN = Path(__file__).resolve().parents[1] / "results" / "bench-2026-11-27-h100x4-llama-3-8b-2048.json"


def test_the_totals_are_the_sums_of_the_rows_and_what_ours_and_the_bound_save():
    result = json.loads(RUN.read_text())
    line = format_layer_totals(result)
    rows = [summarize_row(r) for r in result["rows"]]
    seq = sum(r["base"]["torch_seq"] for r in rows)
    ours = sum(r["ours"] for r in rows)
    bound = sum(r["bound"] for r in rows)
    assert line.startswith(f"the layer's {len(rows)} ops, forward and backward")
    numbers = {
        label: re.search(rf"[:,] {label} (\d+\.\d)", line).group(1)
        for label in ("torch seq", "ours", "bound")
    }
    assert numbers == {"torch seq": f"{seq:.1f}", "ours": f"{ours:.1f}", "bound": f"{bound:.1f}"}
    assert f"ours saves {seq - ours:.1f} us a layer" in line and f"the bound {seq - bound:.1f}" in line
    assert seq > ours > bound  # at 2048 tokens: ours ahead of torch, short of the bound


def test_no_totals_where_a_workload_has_no_verified_candidate():
    result = copy.deepcopy(json.loads(RUN.read_text()))
    for t in result["rows"][0]["trials"]:
        t["status"] = "wrong_result"
    assert format_layer_totals(result) == ""
    assert format_layer_totals({"rows": []}) == ""
