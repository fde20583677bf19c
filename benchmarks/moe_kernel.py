"""One GPU: the fused MoE dispatch kernel (`syncopate.moe.kernels.dispatch_kernel`) alone, on rank 0
of an expert-parallel routing of configs/moe_ep.yaml's layers, every peer's rows already landed and
their words raised (no transfer, no wait): on the pair rows `fused` receives and on the
deduplicated rows `fused_dedup` receives (read through its index), beside torch._grouped_mm over
the same rows of h. Each kernel's output is checked against torch's; times are medians of 20 calls,
L2 flushed before each, the host kept off the path by a device sleep.

    python benchmarks/moe_kernel.py [--json FILE]          # FILE defaults to $OUT/moe_kernel.json

What it tells: how far the fused kernel's GEMM is from torch's grouped GEMM before any transfer
runs beside it (part of what a fused plan's bound / ours loses), and what reading rows through the
index costs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

CASES = [
    # (name, EP, tokens a rank, hidden, ffn, experts, top_k, routing)
    ("qwen3_30b_a3b", 2, 4096, 2048, 768, 128, 8, "uniform"),
    ("qwen3_30b_a3b", 4, 4096, 2048, 768, 128, 8, "uniform"),
    ("qwen3_30b_a3b", 2, 8192, 2048, 768, 128, 8, "skewed"),
    ("deepseek_v3_scaled", 2, 4096, 7168, 2048, 32, 8, "uniform"),
    ("deepseek_v3_scaled", 4, 4096, 7168, 2048, 32, 8, "uniform"),
]
TILES = [
    {"block_m": 128, "block_n": 256, "block_k": 64, "num_warps": 8, "num_stages": 4},
    {"block_m": 128, "block_n": 256, "block_k": 32, "num_warps": 8, "num_stages": 5},
]


def run_case(torch, bench, model, ws, tokens, hidden, ffn, experts, top_k, routing) -> dict:
    from syncopate.kernels.tables import PAD_WORDS
    from syncopate.moe import draw_routing
    from syncopate.moe.fused import fused_tables
    from syncopate.moe.kernels import launch_dispatch
    from syncopate.moe.ops import _token_rows
    from syncopate.moe.plan import _offsets
    from syncopate.search_space import RoutingSpec
    from syncopate.search_space.moe_workload import MoeCandidate

    dev = torch.device("cuda", 0)
    spec = (
        RoutingSpec(seed=0) if routing == "uniform" else RoutingSpec(distribution="skewed", skew=1.2, seed=0)
    )
    drawn = draw_routing(world_size=ws, tokens=tokens, experts=experts, top_k=top_k, spec=spec)
    layouts = [drawn.layout(q) for q in range(ws)]
    layout = layouts[0]
    gen = torch.Generator(device=dev).manual_seed(1)
    xs = [torch.randn(tokens, hidden, generator=gen, device=dev).bfloat16() for _ in range(ws)]
    w = (torch.randn(experts // ws, hidden, 2 * ffn, generator=gen, device=dev) / hidden**0.5).bfloat16()
    at = _offsets(layout.recv_splits)
    pairs = torch.zeros(layout.rows_received, hidden, dtype=torch.bfloat16, device=dev)
    rows, index, base, peer_once = [], torch.empty(layout.rows_received, dtype=torch.int32), 0, 0
    for s in range(ws):  # what each source's copies leave on rank 0, a row a pair and a row a token
        start = _offsets(layouts[s].send_splits)[0]
        tokens_of = _token_rows(layouts[s])[start : start + layout.recv_splits[s]].to(dev)
        pairs[at[s] : at[s] + tokens_of.numel()] = xs[s][tokens_of]
        once = torch.unique(tokens_of)
        rows.append(xs[s][once])
        peer_once += once.numel() if s else 0
        index[at[s] : at[s] + tokens_of.numel()] = (
            base + torch.searchsorted(once, tokens_of).to(torch.int32).cpu()
        )
        base += once.numel()
    deduplicated, index = torch.cat(rows), index.to(dev)
    h_rows = pairs[layout.expert_order.to(dev)]
    ends = torch.cumsum(layout.group_sizes, 0).to(device=dev, dtype=torch.int32)
    reference = torch._grouped_mm(h_rows, w, offs=ends)
    out = {
        "model": model,
        "ep": ws,
        "tokens": tokens,
        "routing": spec.key(),
        "rows": layout.rows_received,
        "peer_pair_rows": layout.rows_received - layout.recv_splits[0],
        "peer_dedup_rows": peer_once,
        "grouped_mm_us": bench(lambda: torch._grouped_mm(h_rows, w, offs=ends)),
        "kernels": [],
    }
    token_rows = _token_rows(layout).to(dev)
    for tiles in TILES:
        config = MoeCandidate(template="fused", backend="copy_engine", chunks_per_source=1, **tiles)
        table = fused_tables(layout, "a2a_gemm", 0, config, dev).tiles
        pad = torch.full((PAD_WORDS,), 7, dtype=torch.int32, device=dev)  # every word at the call's epoch
        error = torch.zeros(1, dtype=torch.int32, device=dev)
        for template, recv, recv_index in (("fused", pairs, None), ("fused_dedup", deduplicated, index)):
            h = torch.full((layout.rows_received, 2 * ffn), float("nan"), dtype=torch.bfloat16, device=dev)

            def call(recv=recv, recv_index=recv_index, h=h):
                launch_dispatch(
                    xs[0], token_rows, recv, w, h, table, pad, error, epoch=7, programs=132,
                    recv_index=recv_index, **tiles,
                )  # fmt: skip

            call()
            torch.cuda.synchronize()
            rel = float(((h.float() - reference.float()).norm() / reference.float().norm()).item())
            out["kernels"].append(
                {
                    "template": template,
                    "tiles": "{block_m}x{block_n}x{block_k}w{num_warps}s{num_stages}".format(**tiles),
                    "us": bench(call),
                    "rel_error": rel,
                    "error_flag": int(error.item()),
                }
            )
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", help="write the results here (default $OUT/moe_kernel.json where OUT is set)")
    args = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("moe_kernel: needs a CUDA GPU; none is visible", file=sys.stderr)
        return 1
    path = args.json or (
        os.path.join(os.environ["OUT"], "moe_kernel.json") if os.environ.get("OUT") else None
    )
    from gpu_single import bench  # the one-GPU benchmarks' timer: L2 flushed, host kept off the path

    results = []
    for case in CASES:
        results.append(run_case(torch, bench, *case))
        r = results[-1]
        cells = " | ".join(
            f"{k['template']} {k['tiles']} {k['us']:.1f} (err {k['rel_error']:.1e})" for k in r["kernels"]
        )
        print(
            f"{r['model']} EP={r['ep']} T={r['tokens']} {r['routing']}: grouped_mm {r['grouped_mm_us']:.1f} | {cells}"
        )
    doc = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
        "cases": results,
    }
    if path:
        with open(path, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
