"""Layer: gloo process groups on the CPU. benchmarks/train_step.py with --cpu: transformers' Llama at
tiny widths trained by torch's styles and by syncopate.tp's on two ranks, its table and JSON (the
same losses within float32 rounding, the variants that need CUDA said to be impossible in their
rows), and its refusals of a world or a token count that do not split. Its loss plans: torchtitan's
loss parallelism (logits sharded on the vocabulary) and `--no-loss-parallel` (logits replicated) give
one step the loss and gradients of each other and of the whole model's own loss (transformers'
label shift, not the benchmark's), and the result and table say which plan ran."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.gloo import run_gloo

REPO = Path(__file__).resolve().parents[1]
VOCAB = 256


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "benchmarks/train_step.py", *args],
        cwd=REPO,
        capture_output=True,
        check=False,
        text=True,
        timeout=280,
    )


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_cpu_run_trains_both_plans_and_reports_them(tmp_path):
    pytest.importorskip("transformers")
    out = _run(
        "--cpu",
        "--world",
        "2",
        "--tokens",
        "64",
        "--batch",
        "2",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--variants",
        "torch",
        "async-tp",
        "torch-graphs",
        "syncopate",
        "syncopate-graphs",
        "--launch",
        "auto",
        "direct",
        "--host-profile",
        "1",
        "--json",
        str(tmp_path / "r.json"),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads((tmp_path / "r.json").read_text())
    rows = {r["variant"]: r for r in result["variants"]}
    assert (result["world"], result["tokens"], result["batch"], result["sequence"]) == (2, 64, 2, 32)
    assert (
        len(rows["torch"]["losses"]) == 3
        and rows["torch"]["step_ms"] > 0
        and rows["torch"]["tokens_per_s"] > 0
    )
    assert rows["syncopate"]["max_loss_diff_vs_torch"] < 1e-4
    assert rows["syncopate/direct"]["max_loss_diff_vs_torch"] < 1e-4  # --launch: once per launch
    assert [r["variant"] for r in result["variants"]].count("syncopate-graphs") == 1
    torch_row = rows["torch"]  # each rank's steps and enqueue times; the step is the slowest rank's
    assert len(torch_row["step_ms_by_rank"]) == 2 and len(torch_row["enqueue_ms_by_rank"][1]) == 3
    assert torch_row["step_ms_all"] == [max(s) for s in zip(*torch_row["step_ms_by_rank"])]
    assert all(
        e <= s
        for r in range(2)
        for e, s in zip(torch_row["enqueue_ms_by_rank"][r], torch_row["step_ms_by_rank"][r])
    )
    for r in range(2):  # the process's CPU time over each step's enqueue (its threads may run side by side)
        assert (
            len(torch_row["enqueue_cpu_ms_by_rank"][r]) == 3
            and min(torch_row["enqueue_cpu_ms_by_rank"][r]) > 0
        )
    host = rows["syncopate"]["host_profile"]  # rank 0's whole steps under cProfile
    assert host["steps"] == 1 and host["cpu_ms"] > 0 and host["wall_ms"] > 0
    assert host["top"] and all(f["calls"] > 0 and f["cumulative_ms"] >= f["own_ms"] >= 0 for f in host["top"])
    assert [f["own_ms"] for f in host["top"]] == sorted((f["own_ms"] for f in host["top"]), reverse=True)
    assert host["syncs"] == []  # a CPU step has no device to wait for
    assert "host a step of syncopate (rank 0, 1 steps under cProfile)" in out.stdout
    assert result["optimizer"] == "fused"  # torchtitan's AdamW
    states = torch_row["cudagraph_by_step"]  # a step's CUDA-graph trees and compile counters, per step
    assert len(states) == 3 and all(s["recorded_graphs"] == s["warmup_runs"] == 0 for s in states)
    assert "enqueue cpu" in out.stdout
    assert result["loss_parallel"] is True
    assert "loss parallel (logits sharded on the vocabulary)" in out.stdout.splitlines()[0]
    assert "not possible on the CPU" in rows["async-tp"]["skipped"]
    assert "not possible on the CPU" in rows["syncopate-graphs"]["skipped"]
    assert "not possible on the CPU" in rows["torch-graphs"]["skipped"]
    assert result["configurations"].startswith("lookup on ")
    lines = out.stdout.splitlines()
    assert any(line.startswith("syncopate ") for line in lines) and any(
        "async-tp" in line and "not possible" in line for line in lines
    )


@pytest.mark.parametrize(
    "args, said",
    [
        (["--cpu", "--world", "1"], "world size 1"),
        (["--cpu", "--world", "2", "--tokens", "63"], "--tokens 63 must be"),
        ([], "run it under torchrun"),
    ],
)
def test_what_does_not_split_is_refused(args, said):
    out = _run(*args)
    assert out.returncode == 2 and said in out.stderr


def _bench():
    """benchmarks/train_step.py as a module (benchmarks/ is not a package)."""
    spec = importlib.util.spec_from_file_location("train_step", REPO / "benchmarks" / "train_step.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _grads(model) -> dict:
    """Every parameter's gradient as this rank holds it (a partial one summed) and its placements."""
    from torch.distributed.tensor import DTensor, Partial, Replicate

    out = {}
    for key, p in model.named_parameters():
        g = p.grad
        if isinstance(g, DTensor):
            whole = [Replicate() if isinstance(pl, Partial) else pl for pl in g.placements]
            out[key] = (g.redistribute(placements=whole).to_local().clone(), tuple(g.placements))
        else:
            out[key] = (g.clone(), None)
    return out


def _grad_mismatches(plans: dict, whole_grads: dict, rank: int, ws: int) -> list[str]:
    """Each plan's gradients against the replicated-logits plan's (values and placements) and against
    the whole model's (this rank's block of it): a line for each that differs."""
    import torch

    replicated = plans[("torch", False)][2]
    lines = []
    for (styles, loss_parallel), (_, _, grads) in plans.items():
        plan = f"rank {rank}, {styles}'s styles, loss_parallel={loss_parallel}"
        for key, (g, placements) in grads.items():
            want, want_placements = replicated[key]
            whole = whole_grads[key]
            if g.shape != whole.shape:  # this rank's shard: the whole model's in the same block
                dim = next(i for i, (a, b) in enumerate(zip(g.shape, whole.shape)) if a != b)
                whole = whole.chunk(ws, dim)[rank]
            for name, ok in (
                ("placements vs replicated logits'", placements == want_placements),
                ("vs replicated logits'", torch.allclose(g, want, rtol=1e-4, atol=1e-6)),
                ("vs the whole model's", torch.allclose(g, whole, rtol=1e-4, atol=1e-6)),
            ):
                if not ok:
                    lines.append(f"{plan}: {key} {name}")
    return lines


def _loss_plans_worker(rank, ws, init, q):
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=ws)
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import DTensor

        from syncopate.models import ModelSpec

        bench = _bench()
        spec, cpu = ModelSpec(**bench.TINY), torch.device("cpu")
        mesh = init_device_mesh("cpu", (ws,))
        tokens = torch.randint(0, VOCAB, (2, 16 * ws + 1), generator=torch.Generator().manual_seed(1))
        inputs, labels = bench.next_tokens(tokens)
        positions = torch.arange(inputs.shape[1]).unsqueeze(0)

        def build():
            # lm_head ten times its initial scale: logits of spread 1 or so, not nearly uniform ones,
            # so that the loss depends on which token is each position's label.
            model = bench.build_model(spec, 2, VOCAB, cpu, torch.float32, seed=0)
            with torch.no_grad():
                model.lm_head.weight.mul_(10)
            return model

        # The whole model's own loss on the unsplit tokens: transformers shifts the labels itself and
        # leaves the last position out, whose logits depend on no other position's (causal attention).
        whole = build()
        whole_loss = whole(input_ids=tokens, labels=tokens).loss
        whole_loss.backward()
        whole_grads = {k: p.grad.clone() for k, p in whole.named_parameters()}

        plans = {}
        for styles, loss_parallel in (("torch", True), ("torch", False), ("syncopate", True)):
            model = bench.parallelize(build(), mesh, styles, loss_parallel=loss_parallel)
            seen = []
            model.lm_head.register_forward_hook(
                lambda m, a, out, seen=seen: seen.append(
                    (tuple(out.placements), tuple(out.to_local().shape))
                    if isinstance(out, DTensor)
                    else (None, tuple(out.shape))
                )
            )
            loss = bench.forward_backward(model, inputs, labels, positions, loss_parallel)
            plans[(styles, loss_parallel)] = (loss.item(), seen, _grads(model))

        # The command line's plan into the result (the CLI test runs the default one end to end).
        command = ["--cpu", "--world", str(ws), "--tokens", "32", "--steps", "1", "--warmup", "0"]
        default = bench.parse_args(command).loss_parallel
        replicated = bench.parse_args([*command, "--variants", "torch", "--no-loss-parallel"])
        result = bench.run_rank(replicated, cpu)
        q.put(
            (
                rank,
                whole_loss.item(),
                {plan: (loss, seen) for plan, (loss, seen, _) in plans.items()},
                _grad_mismatches(plans, whole_grads, rank, ws),
                (default, None if result is None else json.loads(json.dumps(result))),
            )
        )
    finally:
        dist.destroy_process_group()


def test_loss_parallel_gives_the_replicated_logits_loss_and_gradients():
    """Float32 on the CPU, where the plans differ only in the order of float sums (row-parallel
    partial products all-reduced; the loss's log-sum-exp from each vocabulary shard's max and sum):
    the losses agree within a float32 ulp or so (relative 1e-7), checked to relative 1e-5; the
    gradients use a tenth of `allclose(rtol=1e-4, atol=1e-6)` (atol for the gradients near zero). A
    wrong label changes a token's loss by about the logits' spread (of order 1, lm_head scaled up)
    and every gradient: a label shift that is off in either plan fails both checks. The GPU runs'
    bf16 is not checked here; the CPU path is float32."""
    pytest.importorskip("transformers")
    from torch.distributed.tensor import Shard

    mismatches, results = [], []
    ranks = sorted(run_gloo(_loss_plans_worker, 2, timeout=240))
    for rank, whole_loss, plans, lines, (default, result) in ranks:
        mismatches += lines
        assert default is True, "loss parallelism is not the command line's default"
        if result is not None:
            results.append(result)
        # lm_head's output, [2, 32, VOCAB] whole: a vocabulary shard under loss parallelism.
        sharded = [((Shard(2),), (2, 32, VOCAB // 2))]
        assert plans[("torch", True)][1] == plans[("syncopate", True)][1] == sharded
        assert plans[("torch", False)][1] == [(None, (2, 32, VOCAB))]
        replicated_loss = plans[("torch", False)][0]
        for (styles, loss_parallel), (loss, _) in plans.items():
            plan = f"rank {rank}, {styles}'s styles, loss_parallel={loss_parallel}"
            assert loss == pytest.approx(whole_loss, rel=1e-5), f"{plan}: loss vs the whole model's"
            assert loss == pytest.approx(replicated_loss, rel=1e-5), f"{plan}: loss vs replicated logits'"
    assert not mismatches, "\n".join(mismatches)
    [result] = results
    assert result["loss_parallel"] is False and "losses" in result["variants"][0], result
    table = _bench().table
    assert "logits replicated (all-gathered, loss on every rank)" in table(result).splitlines()[0]
    assert "loss parallel (logits sharded" in table({**result, "loss_parallel": True}).splitlines()[0]
    old = {k: v for k, v in result.items() if k != "loss_parallel"}  # a result from before the switch
    assert "logits replicated" in table(old).splitlines()[0]


def test_profile_summary_sorts_kernels_into_categories_a_step():
    """--profile's summary: each kernel in the first category whose name fragment it holds, µs a step
    (the profiler's totals over the profiled steps), the top kernels largest first; host-side events
    (no device time) are left out."""
    from types import SimpleNamespace as Event

    bench = _bench()
    events = [
        Event(key="consumer_kernel", count=40, device_time_total=8000.0),
        Event(key="graph_entry_kernel", count=8, device_time_total=160.0),
        Event(key="nvjet_tst_256x128_64x4_1x2_h_bz_coopA_NTT", count=20, device_time_total=6000.0),
        Event(
            key="void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits>",
            count=4,
            device_time_total=3000.0,
        ),
        Event(key="ncclDevKernel_AllGather_RING_LL", count=2, device_time_total=500.0),
        Event(key="Memcpy PtoP (Device -> Device)", count=12, device_time_total=400.0),
        Event(key="triton_poi_fused_mul_silu_0", count=8, device_time_total=300.0),
        Event(key="void at::native::vectorized_elementwise_kernel<4>", count=10, device_time_total=100.0),
        Event(key="aten::mm", count=20, device_time_total=0.0),
        Event(
            key="void at::native::(anonymous)::multi_tensor_apply_kernel<Adam>",
            count=6,
            cuda_time_total=200.0,
        ),
    ]
    for e in events:
        if not hasattr(e, "device_time_total"):
            e.device_time_total = None
    out = bench.profile_summary(events, steps=2, top=3)
    assert out["category_us"] == {
        "syncopate": 4000.0,
        "gemm": 3000.0,
        "attention": 1500.0,
        "nccl": 250.0,
        "copy": 200.0,
        "compiled": 150.0,
        "optimizer": 100.0,
        "entry": 80.0,  # a captured call's meeting, apart from the fused kernels
        "other": 50.0,
    }
    assert [k["category"] for k in out["top"]] == ["syncopate", "gemm", "attention"]
    assert out["top"][0] == {"kernel": "consumer_kernel", "us": 4000.0, "calls": 20, "category": "syncopate"}
    text = bench.profile_table({"variants": [{"variant": "syncopate", "profile": out}, {"variant": "torch"}]})
    assert "syncopate" in text and "4.00" in text and "consumer_kernel" in text
    assert bench.profile_table({"variants": [{"variant": "torch"}]}) == ""


def test_cudagraph_growth_says_what_the_timed_steps_recorded_again():
    bench = _bench()
    held = {"recorded_graphs": 16, "warmup_runs": 16, "unique_graphs": 8}
    assert bench.cudagraph_growth([{}, held, held, held], warmup=2).endswith(
        "over the timed steps nothing new (every step replayed)"
    )
    grown = {**held, "recorded_graphs": 18, "cudagraph_skips": 1}
    said = bench.cudagraph_growth([{}, held, held, grown], warmup=2)
    assert "recorded_graphs 18" in said and said.endswith("recorded_graphs +2, cudagraph_skips +1")


def test_timeline_summary_finds_the_device_idle_and_where_the_host_was():
    bench = _bench()

    def dev(cat, name, ts, dur, corr, stream=7):
        return {"cat": cat, "name": name, "ts": ts, "dur": dur, "tid": stream, "args": {"correlation": corr}}

    trace = {
        "traceEvents": [
            dev("kernel", "gemm", 1000, 100, 1),
            dev("gpu_memcpy", "Memcpy PtoP", 1050, 100, 2, stream=9),  # overlaps the GEMM on another stream
            dev("kernel", "late", 1300, 50, 3),  # 150 µs with nothing running before it
            dev("kernel", "soon", 1360, 10, 4),  # 10 µs: under the threshold
            {
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "ts": 1290,
                "dur": 5,
                "tid": 1,
                "args": {"correlation": 3},
            },
            {"cat": "cpu_op", "name": "step", "ts": 900, "dur": 1000, "tid": 1},
            {"cat": "cpu_op", "name": "aten::mm", "ts": 1280, "dur": 20, "tid": 1},
            {"cat": "cpu_op", "name": "elsewhere", "ts": 1285, "dur": 20, "tid": 2},  # another thread
        ]
    }
    t = bench.timeline_summary(trace)
    assert t["span_ms"] == pytest.approx(0.370) and t["busy_ms"] == pytest.approx(0.210)
    assert (
        t["idle_ms"] == pytest.approx(0.160) and t["gap_count"] == 1 and t["gap_ms"] == pytest.approx(0.150)
    )
    (gap,) = t["gaps"]
    assert gap["at_ms"] == pytest.approx(0.150) and gap["us"] == 150 and gap["next"] == "late"
    assert gap["launched_us_into_gap"] == 140 and gap["host"] == "aten::mm < step"
    assert t["host_calls"] == [{"call": "cudaLaunchKernel", "calls": 1, "us": 5}]
    assert bench.timeline_summary({"traceEvents": []})["gaps"] == []
    text = bench.timeline_table({"variants": [{"variant": "v", "timeline": t}]})
    assert "traced step of v (rank 0): device span 0.37 ms, busy 0.21, idle 0.16 (1 gaps" in text
    assert "aten::mm < step" in text
