"""Layer: pure CPU logic, and the command line with the results database on SQLite. The model-width
table and the fused ops a tensor-parallel decoder layer calls (`syncopate.models.layer_ops`): each
column- and row-parallel projection's forward and backward op by the documented rule, merged q/k/v
and gate/up, Qwen3's heads wider than its hidden size, the plan without sequence parallelism, widths
read from a Hugging Face config.json, and widths that do not split refused; `syncopate tune --model`
tunes those ops (predicted by the cost model here), writes the sweep config it derived, and prints
what lookup gives each, with bad combinations of arguments refused before anything is stored."""

from __future__ import annotations

import json

import pytest

from syncopate.autotuner.sweep import load_sweep
from syncopate.cli import main
from syncopate.errors import ConfigError
from syncopate.models import MODEL_SPECS, ModelSpec, layer_ops, model_spec
from syncopate.results_db import ResultsDB


def _ops(calls) -> list[tuple]:
    return [(c.projection, c.direction, c.workload.kind, c.workload.shape.key()) for c in calls]


def test_llama_3_8b_at_tp4_calls_four_ops_forward_and_four_backward():
    assert _ops(layer_ops(model_spec("Llama-3-8B"), 4, 8192)) == [
        ("qkv", "forward", "ag_gemm", "8192x6144x4096"),  # q 4096 + k 1024 + v 1024 out of 4096
        ("qkv", "backward", "gemm_rs", "8192x4096x6144"),
        ("o", "forward", "gemm_rs", "8192x4096x4096"),
        ("o", "backward", "ag_gemm", "8192x4096x4096"),
        ("gate_up", "forward", "ag_gemm", "8192x28672x4096"),
        ("gate_up", "backward", "gemm_rs", "8192x4096x28672"),
        ("down", "forward", "gemm_rs", "8192x4096x14336"),
        ("down", "backward", "ag_gemm", "8192x14336x4096"),
    ]


@pytest.mark.parametrize("name", sorted(MODEL_SPECS))
def test_every_projection_follows_the_column_and_row_rule(name):
    spec = MODEL_SPECS[name]
    features = {
        "qkv": (spec.hidden, (spec.heads + 2 * spec.kv_heads) * spec.head_dim),
        "o": (spec.heads * spec.head_dim, spec.hidden),
        "gate_up": (spec.hidden, 2 * spec.ffn),
        "down": (spec.ffn, spec.hidden),
    }
    for c in layer_ops(spec, 8, 4096):
        n_in, n_out = features[c.projection]
        column = c.projection in ("qkv", "gate_up")
        forward_kind, backward_kind = ("ag_gemm", "gemm_rs") if column else ("gemm_rs", "ag_gemm")
        s = c.workload.shape
        if c.direction == "forward":
            assert (c.workload.kind, s.m, s.n, s.k) == (forward_kind, 4096, n_out, n_in)
        else:
            assert (c.workload.kind, s.m, s.n, s.k) == (backward_kind, 4096, n_in, n_out)


def test_qwen3_32b_heads_are_wider_than_its_hidden_size():
    ops = {
        (c.projection, c.direction): c.workload.shape.key()
        for c in layer_ops(model_spec("qwen3-32b"), 8, 8192)
    }
    assert ops[("qkv", "forward")] == "8192x10240x5120"  # (64 + 2 * 8) heads of 128
    assert ops[("o", "forward")] == "8192x5120x8192"


def test_without_sequence_parallelism_the_all_reduces_remain():
    assert _ops(layer_ops(model_spec("llama-3-8b"), 2, 2048, sequence_parallel=False)) == [
        ("qkv", "backward", "gemm_ar", "2048x4096x6144"),
        ("o", "forward", "gemm_ar", "2048x4096x4096"),
        ("gate_up", "backward", "gemm_ar", "2048x4096x28672"),
        ("down", "forward", "gemm_ar", "2048x4096x14336"),
    ]


def test_widths_come_from_a_hugging_face_config(tmp_path):
    config = {
        "architectures": ["Qwen3ForCausalLM"],
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "num_hidden_layers": 36,
        "vocab_size": 151936,
        "model_type": "qwen3",
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    spec = model_spec(tmp_path)  # the folder holding it, as a checkpoint's
    assert spec.to_dict() == {**MODEL_SPECS["qwen3-8b"].to_dict(), "name": "qwen3"}
    assert _ops(layer_ops(spec, 4, 8192)) == _ops(layer_ops(MODEL_SPECS["qwen3-8b"], 4, 8192))
    del config["head_dim"], config["num_key_value_heads"]  # Llama-2 style: head_dim = hidden / heads, MHA
    (tmp_path / "config.json").write_text(json.dumps(config))
    spec = ModelSpec.from_hf_config(tmp_path / "config.json")
    assert (spec.head_dim, spec.kv_heads) == (128, 32)


@pytest.mark.parametrize(
    "call, said",
    [
        (lambda: layer_ops(MODEL_SPECS["llama-3-8b"], 3, 8192), "heads=32 is not divisible by tp=3"),
        (lambda: layer_ops(MODEL_SPECS["llama-3-8b"], 16, 8192), "kv_heads=8 is not divisible by tp=16"),
        (lambda: layer_ops(MODEL_SPECS["llama-3-8b"], 4, 8190), "tokens=8190 is not divisible by tp=4"),
        (lambda: layer_ops(MODEL_SPECS["llama-3-8b"], 1, 8192), "--tp 1 must be an integer of at least 2"),
        (lambda: model_spec("llama-9b"), "unknown model 'llama-9b': known are llama-3-8b"),
        (
            lambda: ModelSpec(name="x", hidden=64, ffn=0, heads=4, kv_heads=4, head_dim=16),
            "ffn=0 must be a positive",
        ),
        (
            lambda: ModelSpec(name="x", hidden=64, ffn=64, heads=4, kv_heads=3, head_dim=16),
            "not a multiple of kv_heads=3",
        ),
    ],
)
def test_what_does_not_split_is_refused_by_name(call, said):
    with pytest.raises(ConfigError, match=said):
        call()


def test_a_config_without_the_widths_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64}))
    with pytest.raises(ConfigError, match="has no intermediate_size, num_attention_heads"):
        model_spec(tmp_path / "config.json")


@pytest.fixture
def db(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("SYNCOPATE_DB", raising=False)
    return f"sqlite:///{tmp_path / 'results.db'}"


def test_tune_model_predicts_every_op_and_shows_what_lookup_gives(tmp_path, db, capsys):
    out_config = tmp_path / "llama.yaml"
    assert (
        main(
            [
                "tune",
                "--model",
                "llama-3-8b",
                "--tp",
                "4",
                "--tokens",
                "8192",
                "--runner",
                "model",
                "--max-trials",
                "2",
                "--db",
                db,
                "--config-out",
                str(out_config),
            ]
        )
        == 0
    )
    out = capsys.readouterr()
    assert "predicting for H200x4-nvswitch" in out.err
    text = " ".join(out.out.split())
    assert "sweep 'llama-3-8b-tp4-8192'" in text and "PREDICTED by the cost model" in text
    assert "what lookup gives each op of a llama-3-8b layer at TP=4, 8192 tokens on H200x4-nvswitch" in text
    rows = [line for line in out.out.splitlines() if line.startswith("│")]
    lookup_rows = [r for r in rows if "forward" in r or "backward" in r]
    # predictions are never served as measurements: with nothing measured, lookup answers from the cost model
    assert len(lookup_rows) == 8 and all("│ cost_model │" in r for r in lookup_rows)
    sweep = load_sweep(out_config)
    want = {c.workload for c in layer_ops(MODEL_SPECS["llama-3-8b"], 4, 8192)}
    assert set(sweep.workloads) == want and len(sweep.workloads) == 8
    with ResultsDB.open(db) as d:
        assert {t.workload for t in d.trials()} == want
        assert {t.record.source for t in d.trials()} == {"predicted"}


def test_tune_model_in_fp8_tunes_the_fp8_ops_the_fused_templates_included(tmp_path, db, capsys):
    out_config = tmp_path / "llama-fp8.yaml"
    args = ["tune", "--model", "llama-3-8b", "--tp", "4", "--dtype", "float8_e4m3fn", "--runner", "model"]
    args += ["--max-trials", "4", "--db", db, "--config-out", str(out_config)]
    assert main(args) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "sweep 'llama-3-8b-tp4-8192-fp8'" in text
    sweep = load_sweep(out_config)
    want = {c.workload for c in layer_ops(MODEL_SPECS["llama-3-8b"], 4, 8192, dtype="fp8")}
    assert set(sweep.workloads) == want and {w.dtype for w in want} == {"fp8"}
    with ResultsDB.open(db) as d:
        trials = d.trials()
        assert {t.workload for t in trials} == want
        assert {t.candidate.template for t in trials} & {"direct", "ring"}, (
            "the fused templates take FP8 tiles"
        )


@pytest.mark.parametrize(
    "args, said",
    [
        ([], "give a sweep CONFIG (YAML), or --model NAME --tp N"),
        (["--model", "llama-3-8b", "--tp", "2", "--dtype", "fp16"], "--dtype 'fp16': accepted are bf16, fp8"),
        (["--model", "llama-3-8b", "--tp", "2", "--dtype", "int4"], "--dtype 'int4': accepted are bf16, fp8"),
        (["configs/quickstart.yaml", "--dtype", "fp8"], "--dtype goes with --model"),
        (["--model", "llama-3-8b"], "--model llama-3-8b needs --tp N"),
        (["configs/quickstart.yaml", "--model", "llama-3-8b", "--tp", "2"], "not both"),
        (["configs/quickstart.yaml", "--tp", "2", "--tokens", "4096"], "--tp, --tokens go with --model"),
        (
            ["--model", "llama-3-8b", "--tp", "2", "--topology", "H200x4-nvswitch", "--runner", "model"],
            "--topology H200x4-nvswitch has 4 GPUs but --tp is 2",
        ),
        (["--model", "qwen3-14b", "--tp", "3", "--runner", "model"], "heads=40 is not divisible by tp=3"),
    ],
)
def test_tune_model_refuses_bad_arguments_and_stores_nothing(tmp_path, db, capsys, args, said):
    assert main(["tune", *args, "--db", db]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("syncopate: error: ") and said in err[0], err
    assert not (tmp_path / "results.db").exists()


def test_tune_layer_tunes_that_layers_ops_only(tmp_path, db, capsys):
    out_config = tmp_path / "mlp.yaml"
    args = ["tune", "--layer", "mlp", "--hidden", "512", "--ffn", "1024", "--tp", "2", "--tokens", "1024"]
    args += ["--runner", "model", "--max-trials", "2", "--db", db, "--config-out", str(out_config)]
    assert main(args) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "what lookup gives each op of a mlp-h512-f1024 mlp at TP=2, 1024 tokens" in text
    assert "the mlp layer itself is timed on GPUs only" in text
    spec = ModelSpec(name="x", hidden=512, ffn=1024, heads=32, kv_heads=8, head_dim=16)
    want = {c.workload for c in layer_ops(spec, 2, 1024) if c.projection in ("gate_up", "down")}
    assert set(load_sweep(out_config).workloads) == want and len(want) == 4
    with ResultsDB.open(db) as d:
        assert {t.workload for t in d.trials()} == want


@pytest.mark.parametrize(
    "args, said",
    [
        (["--hidden", "512", "--tp", "2"], "--hidden give a layer's widths: use them with --layer"),
        (["--layer", "norm", "--tp", "2"], "--layer 'norm': accepted are mlp, attention"),
        (["--layer", "mlp"], "--layer mlp needs --tp N"),
        (["--layer", "mlp", "--model", "llama-3-8b", "--ffn", "512", "--tp", "2"], "leave out --ffn"),
        (
            ["--layer", "attention", "--hidden", "1000", "--heads", "32", "--tp", "2"],
            "multiple of --heads 32",
        ),
        (["configs/quickstart.yaml", "--layer", "mlp", "--tp", "2"], "or --layer mlp, not both"),
    ],
)
def test_tune_layer_refuses_bad_arguments_and_stores_nothing(tmp_path, db, capsys, args, said):
    assert main(["tune", *args, "--runner", "model", "--db", db]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and said in err[0], err
    assert not (tmp_path / "results.db").exists()


def test_the_layer_check_names_each_mode_and_pass_the_tuned_layer_loses():
    from syncopate.cli.tune_model_cmds import layer_verdicts

    result = {
        "results": {
            "torch": {"eager/forward": 100.0, "graph/forward": 90.0},
            "default": {"eager/forward": 95.0, "graph/forward": 70.0},
            "syncopate": {"eager/forward": 90.0, "graph/forward": 77.0},
        }
    }
    lines = layer_verdicts(result)
    assert lines == [
        "graph/forward: the tuned layer takes 77.0 µs, 10.0% more than with the untuned defaults (70.0 µs)"
    ]
    result["results"]["syncopate"]["graph/forward"] = 60.0
    assert "no slower" in layer_verdicts(result)[0]


def test_the_layer_check_says_what_overlap_can_win_where_the_bound_is_measured():
    from syncopate.cli.tune_model_cmds import bound_lines

    result = {
        "results": {
            "torch": {"graph/forward_backward": 4373.5, "eager/forward": 1519.8},
            "syncopate": {"graph/forward_backward": 4061.7, "eager/forward": 1263.3},
            "bound": {"graph/forward_backward": 3855.7},
        }
    }
    assert bound_lines(result) == [
        "graph/forward_backward: without communication the layer takes 3855.7 µs: overlap can make it at most "
        "1.134x torch's path; the tuned layer is at 0.949 of that bound"
    ]
    assert (
        bound_lines({"results": {"torch": {"graph/forward": 1.0}, "syncopate": {"graph/forward": 1.0}}}) == []
    )


def test_the_lookup_table_shows_the_time_the_answer_was_ranked_by(tmp_path, db):
    """In mode eager the served trial's back-to-back eager time, in mode graph its device time."""
    from rich.console import Console

    from syncopate.cli.tune_model_cmds import _lookup_table
    from syncopate.records import TrialRecord
    from syncopate.results_db.lookups import clear_cache
    from syncopate.search_space import Topology, space

    topo = Topology.from_key("H200x2-nvlink")
    spec = ModelSpec(name="x", hidden=512, ffn=1024, heads=8, kv_heads=8, head_dim=64)
    calls = [c for c in layer_ops(spec, 2, 1024) if c.projection == "down" and c.direction == "forward"]
    w = calls[0].workload
    from syncopate.environment import current_environment

    env = current_environment()
    with ResultsDB.open(db, upgrade=True) as d:
        d.record_trials(
            d.start_sweep("s"),
            [
                TrialRecord(
                    workload=w,
                    topology=topo,
                    environment=env,
                    candidate=space(w, topo)[0],
                    status="ok",
                    median_us=111.1,
                    eager_us=222.2,
                    host_us=33.3,
                )
            ],
        )

    def shown(mode):
        clear_cache()
        out = Console(width=250, record=True)
        out.print(_lookup_table(spec, 2, 1024, calls, topo.key(), db, "mlp", mode))
        return out.export_text()

    eager, graph = shown("eager"), shown("graph")
    assert "measured µs (eager)" in eager and "222.2" in eager and "111.1" not in eager
    assert "measured µs (graph)" in graph and "111.1" in graph and "222.2" not in graph
