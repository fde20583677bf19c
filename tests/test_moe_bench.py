"""Layer: gloo process groups on the CPU, and multi-GPU. benchmarks/moe_bench.py: with --cpu on a
shrunk case, every candidate is checked and timed beside torch's path, the all-to-all and the
GEMM alone, the layer beside torch's and its phases, and the table, the JSON and every rank's log
come out; without a GPU it refuses in one line; a bad file is refused with exit 2; on two GPUs
(skipped here), the file's Qwen3 layer at EP=2 with fewer tokens, spawned and under torchrun."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _run(
    tmp_path, *args: str, launcher: tuple[str, ...] = (), env: dict | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *launcher, "benchmarks/moe_bench.py", *args],
        cwd=REPO,
        capture_output=True,
        check=False,
        text=True,
        timeout=720,
        env={**_without_interpreter(), "OUT": str(tmp_path), **(env or {})},
    )


def _without_interpreter() -> dict[str, str]:
    """This process's environment less TRITON_INTERPRET (the CPU suite sets it). What these tests
    check is the bench's work (every candidate checked and timed, its table, JSON and logs); under
    the interpreter the layer's row kernels (the top-k sum, SwiGLU, the segment sums) would take
    minutes of it, so on the CPU they take torch's ops here, and their own tests interpret them."""
    return {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}


def _check(tmp_path, out, cases: int, backends: set[str]) -> dict:
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads((tmp_path / "moe_bench.json").read_text())
    rows = result["ops"]
    assert len(rows) == cases
    assert {r["kind"] for r in rows} == {"a2a_gemm", "gemm_a2a"}
    for r in rows:
        assert r["torch_rel_error"] < 1e-2
        t = r["times"]
        assert min(t["torch"]["median_us"], t["a2a"]["median_us"], t["gemm"]["median_us"]) > 0
        assert r["bound_us"] == max(t["a2a"]["median_us"], t["gemm"]["median_us"])
        # the dedup template's transfer alone, beside the bound (nccl among the backends)
        assert ("a2a_dedup" in t) == ("nccl" in backends) and t.get("a2a_dedup", {"median_us": 1})[
            "median_us"
        ] > 0
        # torch's NVSHMEM all-to-all runs where the ranks' symmetric memory is NVSHMEM's: not in
        # these runs (gloo ranks, or CUDA ranks of CUDA memory), and the row says why
        assert r["torch_nvshmem"] in (
            "torch's NVSHMEM all-to-all runs on CUDA ranks only",
            "this process's symmetric memory is not NVSHMEM's (syncopate.use_nvshmem() on every rank first)",
        ), r["torch_nvshmem"]
        assert "torch_nvshmem" not in t and r["torch_nvshmem_over_ours"] is None
        shorts = [c["short"] for c in r["candidates"]]
        assert shorts[0] == "unfused" and len(shorts) > 1
        assert ("dedup" in shorts) == ("nccl" in backends)
        assert {c["config"]["backend"] for c in r["candidates"][1:]} == backends
        for c in r["candidates"]:
            assert c["status"] == "ok" and c["rel_error"] < 1e-2 and c["times"]["median_us"] > 0, c
        best = min(c["times"]["median_us"] for c in r["candidates"])
        assert r["best_us"] == best and r["torch_over_ours"] == pytest.approx(t["torch"]["median_us"] / best)
        # torch's path, unfused and the fastest as a layer calls them
        fastest = next(c for c in r["candidates"] if c["short"] == r["best"])
        assert set(r["eager"]) == {"torch", "unfused", r["best"]}
        assert r["eager_torch_over_ours"] == pytest.approx(
            r["eager"]["torch"]["median_us"] / fastest["eager"]["median_us"]
        )
    for r in result["layers"]:
        assert r["times"]["torch"]["median_us"] > 0
        assert [c["config"] for c in r["configs"]][0] == "unfused"
        assert all(c["status"] == "ok" and c["rel_error"] < 3e-2 for c in r["configs"]), r
    assert "qwen3_30b_a3b" in out.stdout and "bound/ours" in out.stdout and "MoELayer" in out.stdout
    assert result["environment"]["torch"]
    return result


def test_the_cpu_run_checks_and_times_every_candidate(tmp_path):
    args = ("--cpu", "--models", "qwen3_30b_a3b", "--ep", "2", "--shrink", "64", "--tokens", "16")
    out = _run(tmp_path, *args, "--repetitions", "2", "--routings", "skewed", "--phases")
    result = _check(tmp_path, out, cases=2, backends={"nccl"})
    assert len(result["layers"]) == 1
    # each layer configuration's phases, host and device, in the order a call runs them
    for c in result["layers"][0]["configs"]:
        assert list(c["phases"]) == ["route", "layout", "dispatch", "act", "combine", "backward"], c
        assert all(p["host_us"] > 0 and p["device_us"] > 0 for p in c["phases"].values()), c
    assert "MoELayer phases, host / device" in out.stdout
    # the layer with each op's candidate an eager lookup serves: the faster of unfused and the
    # fastest on the device, both timed as a layer calls them
    best = {
        r["kind"]: min((c for c in r["candidates"] if "eager" in c), key=lambda c: c["eager"]["median_us"])[
            "short"
        ]
        for r in result["ops"]
    }
    tuned = f"tuned: {best['a2a_gemm']} + {best['gemm_a2a']}"
    names = [c["config"] for c in result["layers"][0]["configs"]]
    assert tuned in names
    # the plans' forward with unfused's backward too, but for dedup, whose backward is its own
    assert (f"{tuned}, unfused backward" in names) == ("dedup" not in (best["a2a_gemm"], best["gemm_a2a"]))
    # and each as a tuned layer runs its plans: checked against unfused on its first calls, then
    # one kept (where both ops' plan is unfused there is nothing to check)
    for name in [n for n in names if not n.endswith((", checked", ", unfused backward"))][1:]:
        checked = next(c for c in result["layers"][0]["configs"] if c["config"] == f"{name}, checked")
        if name == "tuned: unfused + unfused":
            assert checked["check"] is None
        else:
            assert checked["check"]["kept"] in ("plans", "unfused")
            assert checked["check"]["timed"] == "forward + backward"
    log = (tmp_path / "moe_bench.log").read_text()
    assert "pipelined/nccl/c2/ring: ok" in log and "rank0" in log
    assert "rank1" in (tmp_path / "moe_bench.log.rank1").read_text()


def test_without_a_gpu_it_says_so_in_one_line(tmp_path):
    out = _run(tmp_path, "--ep", "2", env={"CUDA_VISIBLE_DEVICES": ""})
    err = out.stderr.strip().splitlines()
    assert out.returncode == 1 and len(err) == 1 and "needs a CUDA GPU" in err[0], out.stderr[-2000:]


def test_bad_input_is_refused(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "ep: [3]\ntokens: [8]\nroutings: [{}]\nmodels: {m: {hidden: 8, ffn: 8, experts: 8, top_k: 2}}\n"
    )
    out = _run(tmp_path, "--cpu", "--config", str(bad))
    assert out.returncode == 2
    assert "experts=8 is not divisible by world size 3" in out.stderr
    out = _run(tmp_path, "--cpu", "--phases", "--no-layer")
    assert out.returncode == 2 and "--phases times the layer's phases" in out.stderr
    out = _run(tmp_path, "--cpu", "--models", "nope")
    assert out.returncode == 2 and "no case of" in out.stderr
    out = _run(tmp_path, "--cpu", "--backends", "sm_copy")
    assert (
        out.returncode == 2
        and "unknown backend(s) sm_copy: accepted are nccl, copy_engine, nvshmem" in out.stderr
    )
    out = _run(tmp_path, "--cpu", "--backends", "nccl,nvshmem")
    assert (
        out.returncode == 2
        and "backend nvshmem puts rows between GPUs: it does not go with --cpu" in out.stderr
    )
    out = _run(tmp_path, "--cpu", "--templates", "pipelined,sparse")
    assert (
        out.returncode == 2
        and "unknown template(s) sparse: accepted are unfused, pipelined, fused" in out.stderr
    )


QWEN_EP2 = (
    "--models",
    "qwen3_30b_a3b",
    "--ep",
    "2",
    "--tokens",
    "1024",
    "--repetitions",
    "5",
    "--grid",
    "tiny",
)


@pytest.mark.multigpu
def test_two_gpus_run_the_qwen_layer(tmp_path):
    result = _check(tmp_path, _run(tmp_path, *QWEN_EP2), cases=4, backends={"nccl", "copy_engine"})
    for r in result["ops"]:  # the fused candidates were checked and timed beside the others
        assert any(c["short"].startswith("fused/copy_engine/c2/ring/") for c in r["candidates"]), r
    for r in result["layers"]:
        assert any(c["config"].startswith("fused/") for c in r["configs"]), r


@pytest.mark.multigpu
def test_two_gpus_run_under_torchrun(tmp_path):
    launcher = ("-m", "torch.distributed.run", "--nproc-per-node", "2")
    out = _run(tmp_path, *QWEN_EP2, "--routings", "uniform", launcher=launcher)
    _check(tmp_path, out, cases=2, backends={"nccl", "copy_engine"})
