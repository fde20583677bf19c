"""`syncopate bench --layer`: a tensor-parallel layer as a job runs it, against torch's paths.

The unit of speed is the layer, not the op: a layer's ops meet each other's entry handshakes, rank
skew and stream joins, and an eager job pays every call's host time. One process per GPU (spawned
here, NCCL group). For each implementation — torch's collectives and matmuls in sequence
(`torch`), torch's fused symmetric-memory ops (`async_tp`), Syncopate's fused ops with the
configurations `lookup` serves (`syncopate`) and with the untuned defaults (`default`) — the same
layer (same weights and input) is timed forward and forward + backward:

- `eager`: `EAGER_CALLS` iterations back to back with the host on the path (`time_eager`);
- `graph`: one iteration captured in a CUDA graph, replayed back to back.

`bound` is the same layer with its communication left out: the same torch matmuls, attention
and activation on the shapes each rank computes, the gathered input and the scattered output's
gradient read from buffers of their size. No overlap of the collectives with that work can make
the layer faster than it, so `bound / ours` says how much of the communication Syncopate hides and
`torch / bound` the most any overlap could gain over torch's path on these GPUs.

`profile_dir` also records, for each implementation, a torch.profiler trace of a few eager
forward + backward iterations (`{layer}-tp{tp}-{impl}-rank{r}.json`) and each rank's device time a
iteration by kernel class (GEMMs, NCCL, Syncopate's kernels, copies, the rest) and by stream: where
the layer spends the time its ops did not.

| layer       | forward (sequence parallel)                                                    |
|-------------|--------------------------------------------------------------------------------|
| `mlp`       | x → all_gather_matmul(x, [gate; up]) → silu(gate) · up → matmul_reduce_scatter |
| `attention` | x → all_gather_matmul(x, qkv) → causal SDPA per head → matmul_reduce_scatter   |

Without sequence parallelism the column layer is local and the row layer `matmul_all_reduce`.
Rank 0 prints the table and returns every number; outputs are compared with torch's path.

`dtype="fp8"` trains every implementation's GEMMs in FP8 (`syncopate.tp.float8`: each GEMM's
operands quantized row-wise along its contracted dimension, bf16 out, the weights and the
activations between the GEMMs in bf16): `torch`, torch's collectives and `torch._scaled_mm` in
sequence; `async_tp`, torch's fused scaled ops (`fused_all_gather_scaled_matmul`,
`fused_scaled_matmul_reduce_scatter`); `syncopate` and `default`, the FP8 fused ops with the
configurations looked up (or the untuned defaults) for the `fp8` workloads.
"""

from __future__ import annotations

import dataclasses
import socket
import statistics
import time
from typing import Any

from syncopate.errors import ConfigError

__all__ = ["DTYPES", "LAYERS", "IMPLS", "LayerBench", "format_layer_table", "run_layer_bench"]

LAYERS = ("mlp", "attention")
DTYPES = ("bf16", "fp8")
IMPLS = ("torch", "async_tp", "syncopate", "default", "bound")
MODES = ("eager", "graph")
PASSES = ("forward", "forward_backward")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class LayerBench:
    """One layer benchmark: the layer's widths, the tokens, the group size and what to time."""

    layer: str = "mlp"
    """`mlp` (SwiGLU: gate and up merged in one column layer) or `attention` (qkv, SDPA, o)."""
    hidden: int = 4096
    """Model width (the row layer's output, the column layer's input)."""
    ffn: int = 14336
    """MLP width (each of gate and up); unused by `attention`."""
    heads: int = 32
    """Attention heads (query); unused by `mlp`."""
    kv_heads: int = 8
    """Key/value heads (grouped-query attention); unused by `mlp`."""
    head_dim: int = 0
    """Width of a head; 0: hidden / heads. Unused by `mlp`."""
    tokens: int = 8192
    """Tokens of the whole layer (sequence × batch): the ops' M."""
    tp: int = 2
    """Tensor-parallel group size: one process and one GPU a rank."""
    sequence_parallel: bool = True
    """Input and output sharded by tokens (all-gather / reduce-scatter); else whole (all-reduce)."""
    impls: tuple[str, ...] = IMPLS
    modes: tuple[str, ...] = MODES
    passes: tuple[str, ...] = PASSES
    repetitions: int = 7
    """Timed repetitions of `EAGER_CALLS` back-to-back iterations each."""
    profile_dir: str | None = None
    """Where to write each implementation's profiler traces (None: no profile)."""
    launch: str = "auto"
    """How Syncopate's fused calls outside a capture are launched (`syncopate.set_launch`)."""
    dtype: str = "bf16"
    """`bf16`, or `fp8`: every GEMM on FP8 operands, as `float8=True` runs them (`syncopate.tp.float8`)."""

    def __post_init__(self) -> None:
        if self.layer not in LAYERS:
            raise ConfigError(f"unknown layer {self.layer!r}: accepted are {', '.join(LAYERS)}")
        if isinstance(self.head_dim, bool) or not isinstance(self.head_dim, int) or self.head_dim < 0:
            raise ConfigError(
                f"layer bench head_dim={self.head_dim!r} must be 0 (hidden / heads) or a positive integer"
            )
        for name in ("hidden", "ffn", "heads", "kv_heads", "tokens", "tp", "repetitions"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"layer bench {name}={value!r} must be a positive integer")
        if self.tp < 2:
            raise ConfigError(f"layer bench tp={self.tp}: a tensor-parallel layer needs at least 2 ranks")
        from syncopate.kernels.replay import LAUNCHES

        if self.launch not in LAUNCHES:
            raise ConfigError(f"layer bench launch={self.launch!r}: accepted are {', '.join(LAUNCHES)}")
        for field, given, accepted in (
            ("impls", self.impls, IMPLS),
            ("modes", self.modes, MODES),
            ("passes", self.passes, PASSES),
        ):
            bad = [x for x in given if x not in accepted]
            if bad or not given:
                raise ConfigError(f"layer bench {field}={list(given)}: accepted are {', '.join(accepted)}")
        if self.sequence_parallel and self.tokens % self.tp:
            raise ConfigError(
                f"tokens={self.tokens} must be a multiple of tp={self.tp} with sequence parallelism "
                f"(each rank holds tokens/tp of them)"
            )
        if self.layer == "attention":
            if (not self.head_dim and self.hidden % self.heads) or self.heads % self.kv_heads:
                raise ConfigError(
                    f"attention: hidden={self.hidden} must be a multiple of heads={self.heads} (or give "
                    f"head_dim), and heads a multiple of kv_heads={self.kv_heads}"
                )
            if self.kv_heads % self.tp:
                raise ConfigError(
                    f"attention: kv_heads={self.kv_heads} must be a multiple of tp={self.tp} (each rank "
                    f"holds whole heads)"
                )
        elif self.ffn % self.tp:
            raise ConfigError(f"mlp: ffn={self.ffn} must be a multiple of tp={self.tp}")
        if self.dtype not in DTYPES:
            raise ConfigError(f"layer bench dtype={self.dtype!r}: accepted are {', '.join(DTYPES)}")
        if self.dtype == "fp8":
            self._check_fp8_dims()

    def _check_fp8_dims(self) -> None:
        """ConfigError naming the first dimension of the layer's GEMMs that torch._scaled_mm cannot
        take (a multiple of 16 on CUDA): the features a rank holds and the tokens."""
        from syncopate.tp.float8 import DIM_MULTIPLE

        col, row = self.local_features()
        for what, size in (
            ("hidden", self.hidden),
            ("the column layer's out features a rank holds", col),
            ("the row layer's in features a rank holds", row),
            ("tokens", self.tokens),
        ):
            if size % DIM_MULTIPLE:
                raise ConfigError(
                    f"layer bench dtype=fp8: every dimension of the layer's GEMMs must be a multiple of "
                    f"{DIM_MULTIPLE} (torch._scaled_mm on CUDA), but {what} is {size}: change the widths "
                    f"or tokens, or bench the layer in bf16"
                )

    @property
    def head_width(self) -> int:
        return self.head_dim or self.hidden // self.heads

    def local_features(self) -> tuple[int, int]:
        """(the column layer's out features, the row layer's in features) a rank holds."""
        if self.layer == "mlp":
            return 2 * self.ffn // self.tp, self.ffn // self.tp
        hd = self.head_width
        return (self.heads + 2 * self.kv_heads) * hd // self.tp, self.heads * hd // self.tp

    def ops(self) -> list[tuple[str, tuple[int, int, int]]]:
        """The fused ops the layer calls, forward then backward: (kind, global M×N×K)."""
        m, h = self.tokens, self.hidden
        col = 2 * self.ffn if self.layer == "mlp" else (self.heads + 2 * self.kv_heads) * self.head_width
        row = self.ffn if self.layer == "mlp" else self.heads * self.head_width
        if self.sequence_parallel:
            return [
                ("ag_gemm", (m, col, h)),
                ("gemm_rs", (m, h, row)),  # forward
                ("ag_gemm", (m, row, h)),
                ("gemm_rs", (m, h, col)),
            ]  # backward: row's input grad, column's
        return [("gemm_ar", (m, h, row)), ("gemm_ar", (m, h, col))]


def _local_ops(bench: LayerBench, col, row):
    """The bound's column and row layers: `col`'s and `row`'s weights in local matmuls, their
    communication left out (with sequence parallelism: the gathered input read from a buffer of its
    size, forward; the output's gathered gradient likewise, backward). In FP8 (`bench.dtype`) the
    matmuls are float8 linears of mode `local`: the same quantizations and scaled GEMMs, forward and
    backward, as the layers'."""
    import torch

    if bench.dtype == "fp8":
        from syncopate.tp.float8 import Float8Linear

        def linear(x, weight, bias):
            return Float8Linear.apply(x, weight, bias, None, "torch", {}, "local")
    else:
        linear = torch.nn.functional.linear

    if bench.sequence_parallel:
        rows = bench.tokens // bench.tp
        weight = col.weight
        gathered = torch.randn(bench.tokens, bench.hidden, device=weight.device, dtype=weight.dtype)
        gathered_grad = torch.randn(bench.tokens, bench.hidden, device=weight.device, dtype=weight.dtype)

        class _Gathered(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return gathered.view_as(gathered)

            @staticmethod
            def backward(ctx, grad):
                return grad[:rows]

        class _Scattered(torch.autograd.Function):
            @staticmethod
            def forward(ctx, y):
                return y[:rows]

            @staticmethod
            def backward(ctx, grad):
                return gathered_grad

        def col_fn(x):
            return linear(_Gathered.apply(x), col.weight, col.bias)

        def row_fn(h):
            return _Scattered.apply(linear(h, row.weight, row.bias))

        return col_fn, row_fn

    def col_fn(x):
        return linear(x, col.weight, col.bias)

    def row_fn(h):
        return linear(h, row.weight, row.bias)

    return col_fn, row_fn


def _build(bench: LayerBench, impl: str, group, device, weights: dict, configs: dict | None):
    """The layer of `impl` (syncopate.tp's layers on this rank's shards of `weights`) as a callable;
    `bound`: torch's layer's shards in local matmuls, without communication (`_local_ops`)."""
    import torch

    from syncopate.tp.layers import ColumnParallelLinear, RowParallelLinear

    kind = {"syncopate": "fused", "default": "fused", "bound": "torch"}.get(impl, impl)
    sp = bench.sequence_parallel
    float8 = bench.dtype == "fp8"
    col_cfg, row_cfg = configs if configs is not None else (None, None)
    col = ColumnParallelLinear.from_linear(
        weights["col"], group, sequence_parallel=sp, impl=kind, configs=col_cfg, float8=float8
    )
    row = RowParallelLinear.from_linear(
        weights["row"], group, sequence_parallel=sp, impl=kind, configs=row_cfg, float8=float8
    )
    params = [*col.parameters(), *row.parameters()]
    if impl == "bound":
        col, row = _local_ops(bench, col, row)
    tp = bench.tp
    if bench.layer == "mlp":

        def forward(x):
            gate, up = col(x).chunk(2, dim=-1)
            return row(torch.nn.functional.silu(gate) * up)
    else:
        heads, kv, hd = bench.heads // tp, bench.kv_heads // tp, bench.head_width

        def forward(x):
            qkv = col(x)
            tokens = qkv.shape[0]
            q, k, v = qkv.split([heads * hd, kv * hd, kv * hd], dim=-1)
            q = q.view(1, tokens, heads, hd).transpose(1, 2)
            k = k.view(1, tokens, kv, hd).transpose(1, 2)
            v = v.view(1, tokens, kv, hd).transpose(1, 2)
            o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            return row(o.transpose(1, 2).reshape(tokens, heads * hd))

    return forward, params


def _default_configs(bench: LayerBench, topology) -> tuple[dict, dict]:
    """The untuned default configuration of each op the column and the row layer call, by kind
    (a layer calls at most one op of each kind, forward and backward together)."""
    from syncopate.search_space import Workload, default_candidate

    def default(kind, shape):
        return default_candidate(Workload(kind=kind, shape=shape, dtype=bench.dtype), topology)

    ops = bench.ops()
    if bench.sequence_parallel:  # column: forward ag, backward rs; row: forward rs, backward ag
        (ag_col, s1), (rs_row, s2), (ag_row, s3), (rs_col, s4) = ops
        return (
            {"ag_gemm": default(ag_col, s1), "gemm_rs": default(rs_col, s4)},
            {"gemm_rs": default(rs_row, s2), "ag_gemm": default(ag_row, s3)},
        )
    (ar_row, s1), (ar_col, s2) = ops
    return {"gemm_ar": default(ar_col, s2)}, {"gemm_ar": default(ar_row, s1)}


def _time_graph(step, group, calls: int, repetitions: int):
    """`step` captured in a CUDA graph once (after warm-up on a side stream), replayed back to back."""
    import torch

    from syncopate.measure.timing import time_eager

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    torch.cuda.synchronize()
    return time_eager(graph.replay, group, calls=calls, repetitions=repetitions), graph


KERNEL_CLASSES = ("gemm", "nccl", "syncopate", "copy", "other")


def kernel_class(name: str) -> str:
    """The class of a device activity by its name, for the profile's summary: cuBLAS/CUTLASS GEMMs,
    NCCL's kernels, Syncopate's Triton kernels, memory copies and sets, the rest."""
    low = name.lower()
    if "nccl" in low:
        return "nccl"
    if low.startswith("memcpy") or low.startswith("memset") or "copy engine" in low:
        return "copy"
    if any(s in low for s in ("gemm", "cutlass", "nvjet", "xmma", "matmul", "sm90_", "cublas")):
        return "syncopate" if low.startswith("_") and "kernel" in low else "gemm"
    if low.startswith("_") or "syncopate" in low:
        return "syncopate"
    return "other"


def summarize_trace(events, iterations: int) -> dict:
    """Device µs an iteration by kernel class and by stream, and the busiest kernels, from a
    profiler's device events (`(name, stream, duration_us)`)."""
    by_class = dict.fromkeys(KERNEL_CLASSES, 0.0)
    by_stream: dict[str, float] = {}
    by_name: dict[str, float] = {}
    for name, stream, dur in events:
        by_class[kernel_class(name)] += dur / iterations
        by_stream[str(stream)] = by_stream.get(str(stream), 0.0) + dur / iterations
        by_name[name] = by_name.get(name, 0.0) + dur / iterations
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:12]
    return {
        "by_class": {k: round(v, 1) for k, v in by_class.items()},
        "by_stream": {k: round(v, 1) for k, v in sorted(by_stream.items(), key=lambda kv: -kv[1])},
        "top": [[k[:120], round(v, 1)] for k, v in top],
    }


def _profile(step, group, path: str, iterations: int = 3) -> dict:
    """`iterations` eager calls of `step` under torch.profiler (CUDA activities): the trace written
    to `path`, its summary returned."""
    import torch
    import torch.distributed as dist

    for _ in range(2):
        step()
    torch.cuda.synchronize()
    dist.barrier(group)
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(iterations):
            step()
        torch.cuda.synchronize()
    prof.export_chrome_trace(path)
    events = []
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            events.append((e.name, getattr(e, "device_resource_id", 0), e.time_range.elapsed_us()))
    return summarize_trace(events, iterations)


def _worker(rank: int, world: int, port: int, bench: LayerBench, queue) -> None:
    from syncopate.measure.local_ranks import join_group

    device = join_group(rank, world, port)
    import torch
    import torch.distributed as dist

    from syncopate.kernels import ops
    from syncopate.measure.reference import relative_error
    from syncopate.measure.timing import EAGER_CALLS, time_eager
    from syncopate.platform import detect_topology

    group = dist.group.WORLD
    ops.set_launch(bench.launch)
    torch.manual_seed(0)
    dtype = torch.bfloat16
    col_out = 2 * bench.ffn if bench.layer == "mlp" else (bench.heads + 2 * bench.kv_heads) * bench.head_width
    row_in = bench.ffn if bench.layer == "mlp" else bench.heads * bench.head_width
    if bench.layer == "mlp":  # the merged [gate; up] weight, rows interleaved per rank as from_linear expects
        gate = torch.nn.Linear(bench.hidden, bench.ffn, bias=False, device=device, dtype=dtype)
        up = torch.nn.Linear(bench.hidden, bench.ffn, bias=False, device=device, dtype=dtype)
        col_w: Any = [gate, up]
    else:
        col_w = torch.nn.Linear(bench.hidden, col_out, bias=False, device=device, dtype=dtype)
    weights = {
        "col": col_w,
        "row": torch.nn.Linear(row_in, bench.hidden, bias=False, device=device, dtype=dtype),
    }
    rows = bench.tokens // world if bench.sequence_parallel else bench.tokens
    gen = torch.Generator(device=device).manual_seed(1 + rank if bench.sequence_parallel else 1)
    x = torch.randn(rows, bench.hidden, generator=gen, device=device, dtype=torch.float32).to(dtype)
    dy = torch.randn(rows, bench.hidden, generator=gen, device=device, dtype=torch.float32).to(dtype)
    topology = detect_topology(group)
    results: dict[str, Any] = {}
    reference = None
    for impl in bench.impls:
        configs = _default_configs(bench, topology) if impl == "default" else None
        try:
            forward, params = _build(bench, impl, group, device, weights, configs)
            xi = x.detach().clone().requires_grad_(True)

            def step(forward=forward, xi=xi):
                forward(xi).backward(dy)

            def fwd(forward=forward, xi=xi):
                with torch.no_grad():
                    return forward(xi)

            out = fwd().float()
            if reference is None:
                reference = out
            entry: dict[str, Any] = {"rel_diff_from_first": relative_error(out, reference)}
            for mode in bench.modes:
                for name in bench.passes:
                    fn = fwd if name == "forward" else step
                    if mode == "eager":
                        samples = time_eager(fn, group, repetitions=bench.repetitions)
                    else:  # warmed up and captured with the configurations lookup serves for graphs
                        with ops.mode("graph"):
                            samples, graph = _time_graph(fn, group, EAGER_CALLS, bench.repetitions)
                        # dropped at once: while a graph of torch's NCCL collectives lives (an FP8
                        # layer's backward gathers bf16 rows), destroy_process_group does not return
                        del graph
                    entry[f"{mode}/{name}"] = statistics.median(samples)
            if bench.profile_dir:
                import os

                os.makedirs(bench.profile_dir, exist_ok=True)
                path = os.path.join(bench.profile_dir, f"{bench.layer}-tp{world}-{impl}-rank{rank}.json")
                entry["profile"] = _profile(step, group, path)
            results[impl] = entry
        except Exception as e:  # an impl this torch lacks (async-TP) or that fails here: said in its row
            results[impl] = {"error": f"{type(e).__name__}: {e}"}
            if rank == 0:
                print(f"{impl}: {type(e).__name__}: {e}", flush=True)
        finally:
            torch.cuda.synchronize()
            dist.barrier()
    launch = ops.launch_report()  # how each fused program's eager calls were launched, every impl's
    ops.close_contexts()
    if rank == 0:
        queue.put(
            {
                "bench": dataclasses.asdict(bench),
                "results": results,
                "launch": launch,
                "topology": topology.key(),
                "gpu": torch.cuda.get_device_name(device),
                "torch": torch.__version__,
                "host": socket.gethostname(),
                "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
        )
    dist.destroy_process_group()


def run_layer_bench(bench: LayerBench) -> dict:
    """Spawn `bench.tp` processes (one a GPU), run the benchmark, return rank 0's result."""
    from syncopate.measure.local_ranks import spawn_ranks

    return spawn_ranks(_worker, bench.tp, (bench,), "layer benchmark")


def format_layer_table(result: dict) -> str:
    """µs an iteration per implementation, and torch's paths over Syncopate's, per mode and pass;
    with the `bound` measured, also bound / ours (how much of the communication ours hides) and
    torch / bound (the most an overlap could gain over torch's path)."""
    res = result["results"]
    cols = [i for i in IMPLS if i in res]
    bound = "bound" in res
    dtype = result.get("bench", {}).get("dtype", "bf16")
    head = [f"mode/pass ({dtype})", *cols, "torch/ours", "async/ours", "default/ours"]
    head += ["bound/ours", "torch/bound"] if bound else []
    rows = []
    keys = sorted(
        {k for r in res.values() for k in r if "/" in k},
        key=lambda k: (MODES.index(k.split("/")[0]), PASSES.index(k.split("/")[1])),
    )
    for key in keys:

        def t(impl):
            return res.get(impl, {}).get(key)

        def ratio(num, den="syncopate"):
            a, b = t(num), t(den)
            return f"{a / b:.3f}" if a and b else "–"

        cells = [key, *(f"{t(i):.1f}" if t(i) else "–" for i in cols)]
        cells += [ratio("torch"), ratio("async_tp"), ratio("default")]
        cells += [ratio("bound"), ratio("torch", "bound")] if bound else []
        rows.append(cells)
    return _text_table(head, rows)


def _text_table(head: list[str], rows: list[list[str]]) -> str:
    """A table as the bench prints it: the head, a rule, a line a row, cells between ` | `."""
    return "\n".join(" | ".join(cells) for cells in [head, ["---"] * len(head), *rows])


def format_launch(result: dict) -> str:
    """How each fused program's eager calls were launched (`ops.launch_report`, rank 0's), one line
    a program: empty where the run has no such record or no replayable program."""
    lines = []
    for row in result.get("launch") or []:
        figures = ""
        if "direct_us" in row:
            figures = (
                f" (timed, direct / replayed: {row['direct_us']:.1f} / {row['replayed_us']:.1f} us on the "
                f"stream, {row['direct_host_us']:.1f} / {row['replayed_host_us']:.1f} us of host time)"
            )
        shapes = "x".join(map(str, row["a"])) + " @ " + "x".join(map(str, row["b"]))
        lines.append(f"{row['op']} {shapes} {row['config']}: {row['launch']}{figures}")
    return "\n".join(lines)


def launch_rows(runs: list[dict]) -> tuple[list[str], list[list[str]]]:
    """(head, rows) of a layer's eager iterations with Syncopate's calls launched each way: one row a
    layer and eager pass of `runs` (`run_layer_bench` results) that has more than one launch, our µs
    and torch / ours for each launch (torch timed in the same run), and how many of the fused
    programs `auto` launched eagerly it replays (ours' and the defaults' alike)."""
    from syncopate.kernels.replay import LAUNCHES

    by_layer: dict[tuple, dict[str, dict]] = {}
    for run in runs:
        b = run["bench"]
        widths = (
            f"{b['hidden']}/{b['ffn']}"
            if b["layer"] == "mlp"
            else f"{b['hidden']}, heads {b['heads']}/{b['kv_heads']}"
        )
        key = (b["tp"], f"{b['layer']} {widths}", b["tokens"], b.get("dtype", "bf16"))
        by_layer.setdefault(key, {})[b.get("launch", "auto")] = run
    launches = [launch for launch in LAUNCHES if any(launch in ran for ran in by_layer.values())]
    head = ["TP", "layer", "tokens", "mode/pass"]
    for launch in launches:
        head += [f"ours, {launch}", f"torch / ours, {launch}"]
    head.append("replayed by auto")
    rows = []
    for (tp, layer, tokens, dtype), by_launch in by_layer.items():
        if len(by_launch) < 2:
            continue
        auto = [r for r in by_launch.get("auto", {}).get("launch") or [] if r["launch"] != "sampling"]
        replayed = f"{sum(r['launch'] == 'replayed' for r in auto)} of {len(auto)}" if auto else "–"
        for key in ("eager/forward", "eager/forward_backward"):
            cells = []
            for launch in launches:
                res = by_launch.get(launch, {}).get("results", {})
                ours, torch_us = res.get("syncopate", {}).get(key), res.get("torch", {}).get(key)
                cells.append("–" if ours is None else f"{ours:.1f}")
                cells.append("–" if not (ours and torch_us) else f"{torch_us / ours:.3f}")
            if any(c != "–" for c in cells):
                label = key.replace("_", "+") + ("" if dtype == "bf16" else f" ({dtype})")
                rows.append([f"TP={tp}", layer, str(tokens), label, *cells, replayed])
    return head, rows


def format_launches(runs: list[dict]) -> str:
    """`launch_rows` as a table, or empty where no layer ran under more than one launch."""
    head, rows = launch_rows(runs)
    return _text_table(head, rows) if rows else ""


def format_profile(result: dict) -> str:
    """Each profiled implementation's device µs an eager forward + backward by kernel class (rank 0),
    and its busiest kernels."""
    lines = []
    for impl, entry in result["results"].items():
        prof = entry.get("profile")
        if not prof:
            continue
        classes = ", ".join(f"{k} {v:.0f}" for k, v in prof["by_class"].items() if v)
        streams = ", ".join(f"{k}: {v:.0f}" for k, v in prof["by_stream"].items())
        lines.append(f"{impl}: {classes} µs (streams {streams})")
        lines.extend(f"    {us:9.1f}  {name}" for name, us in prof["top"][:6])
    return "\n".join(lines)
