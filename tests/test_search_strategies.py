"""Layer: pure CPU logic (Optuna in memory and on SQLite). One conformance suite every strategy
passes against a replayed synthetic sweep, then what is particular to the Optuna-based ones (a
study that resumes, and refuses a changed space), the model's seeds and pruner, the noise-aware
confirmation, the replay runner and the evaluation helpers."""

from __future__ import annotations

import math

import pytest

from syncopate.autotuner.confirm import Confirmation
from syncopate.autotuner.evaluation import model_agreement, spearman, trials_to_target
from syncopate.autotuner.optuna_strategies import ModelPruner, space_fingerprint, study_name
from syncopate.autotuner.strategies import AVAILABLE_STRATEGIES, SearchProblem, make_strategy
from syncopate.autotuner.synthetic import synthetic_sweep
from syncopate.cost_model.calibration_defaults import default_calibration
from syncopate.cost_model.model import CostModel
from syncopate.errors import ConfigError, StudyMismatchError
from syncopate.records import TrialRecord
from syncopate.search_space import (
    COPY_ENGINE_KINDS,
    SpaceOptions,
    TileConfig,
    Topology,
    Workload,
    default_candidate,
    space,
    unfused_candidate,
)
from syncopate.workers import RunnerSpec
from syncopate.workers.replay_runner import ReplayOptions, ReplayRunner, load_sweep_file, write_sweep

TOPO = Topology.from_key("H200x2-nvlink")
W = Workload(kind="ag_gemm", shape=(8192, 2048, 8192))
OPTIONS = SpaceOptions(
    templates=("direct",),
    num_splits=(1, 2, 4),
    tile_orders=("arrival", "row_major"),
    group_m=(8,),
    comm_sms={"copy_engine": (0,), "sm_copy": (16, 64), "nccl": (64,)},
    tile_configs=tuple(TileConfig.from_key(k) for k in ("128x256x64w8s3", "128x128x64w8s4", "64x128x64w4s4")),
)
STRATEGIES = sorted(AVAILABLE_STRATEGIES)


@pytest.fixture(scope="module")
def sweep():
    return synthetic_sweep([W], TOPO, seed=3, options=OPTIONS)


@pytest.fixture(scope="module")
def model():
    return CostModel(default_calibration(TOPO))


def problem(sweep, model, **kw) -> SearchProblem:
    return SearchProblem(
        workload=W, topology=TOPO, options=OPTIONS, environment=sweep.environment, calibration=model, **kw
    )


def drive(strategy, sweep, limit: int = 10_000) -> list[TrialRecord]:
    """Ask one at a time, answer from the sweep, tell; every trial in order."""
    told = []
    table = sweep.trials[W.key()]
    while len(told) < limit:
        asked = strategy.ask(1)
        if not asked:
            break
        told.append(table[asked[0].key()])
        strategy.tell(told[-1])
    return told


# -- the conformance suite ------------------------------------------------------------------------


@pytest.mark.parametrize("name", STRATEGIES)
def test_never_proposes_twice_and_keeps_to_its_budget(name, sweep, model):
    s = make_strategy(name, problem(sweep, model), max_trials=20, seed=0)
    assert s.planned == 20 and s.remaining == 20
    told = drive(s, sweep)
    keys = [t.candidate.key() for t in told]
    assert len(keys) == 20 == len(set(keys)) and s.remaining == 0 and s.ask(1) == []
    guards = {c.key() for c in problem(sweep, model).guards()}
    valid = {c.key() for c in space(W, TOPO, OPTIONS)} | guards
    assert set(keys) <= valid
    assert (
        set(keys[:2]) == guards
    )  # the untuned default and the unfused template first, the latter outside this space
    s.close()


@pytest.mark.parametrize("name", STRATEGIES)
def test_without_a_budget_measures_the_whole_space_once(name, sweep, model):
    s = make_strategy(name, problem(sweep, model), max_trials=None, seed=1)
    told = [t.candidate.key() for t in drive(s, sweep)]
    pruned = getattr(s, "pruned", frozenset())  # model-guided: what the model called clearly losing
    assert len(told) == len(set(told)) and not pruned & set(told)
    assert sorted(told + sorted(pruned)) == sorted(sweep.trials[W.key()])


@pytest.mark.parametrize("name", STRATEGIES)
def test_finds_the_optimum_of_a_replayed_sweep(name, sweep, model):
    best = min(t.median_us for t in sweep.trials[W.key()].values() if t.status == "ok")
    s = make_strategy(name, problem(sweep, model), max_trials=None, seed=0)
    told = drive(s, sweep)
    assert min(t.median_us for t in told if t.status == "ok") == best


@pytest.mark.parametrize("name", STRATEGIES)
def test_skips_what_a_resumed_sweep_stored(name, sweep, model):
    first = drive(make_strategy(name, problem(sweep, model), max_trials=12, seed=0), sweep, limit=5)
    done = frozenset(t.candidate.key() for t in first)
    again = make_strategy(name, problem(sweep, model, done=done), max_trials=12, seed=0)
    assert again.planned == 12 and again.remaining == 7
    rest = drive(again, sweep)
    assert len(rest) == 7 and not done & {t.candidate.key() for t in rest}


@pytest.mark.parametrize("name", ["grid", "seeded", "random"])
def test_a_resume_with_another_budget_keeps_max_trials_the_count_in_all(name, sweep, model):
    first = drive(make_strategy(name, problem(sweep, model), max_trials=10, seed=0), sweep, limit=4)
    done = frozenset(t.candidate.key() for t in first)
    more = make_strategy(name, problem(sweep, model, done=done), max_trials=16, seed=0)
    assert more.planned == 16 and more.remaining == 12
    rest = {t.candidate.key() for t in drive(more, sweep)}
    assert len(rest) == 12 and not done & rest
    if name == "random":  # a larger budget draws the same candidates and more
        whole = make_strategy(name, problem(sweep, model), max_trials=16, seed=0)
        assert done | rest == {c.key() for c in whole.ask(16)}
    fewer = make_strategy(name, problem(sweep, model, done=done), max_trials=3, seed=0)
    assert fewer.planned == 4 and fewer.remaining == 0 and fewer.ask(1) == []


@pytest.mark.parametrize("name", STRATEGIES)
def test_a_resume_with_a_budget_below_what_is_stored_proposes_nothing(name, sweep, model):
    first = drive(make_strategy(name, problem(sweep, model), max_trials=10, seed=0), sweep, limit=6)
    done = frozenset(t.candidate.key() for t in first)
    fewer = make_strategy(name, problem(sweep, model, done=done), max_trials=2, seed=0)
    assert (fewer.planned, fewer.remaining, fewer.ask(1)) == (6, 0, [])
    fewer.close()


@pytest.mark.parametrize("bad", [0, -3])
def test_a_budget_of_zero_or_less_is_refused(bad, sweep, model):
    with pytest.raises(ConfigError, match=f"max_trials={bad} must be a positive"):
        make_strategy("optuna-tpe", problem(sweep, model), max_trials=bad, seed=0)


def test_an_unknown_strategy_is_refused_naming_the_known_ones(sweep, model):
    with pytest.raises(
        ConfigError,
        match="unknown strategy 'annealing': accepted are grid, seeded, random, optuna-tpe, model-guided",
    ):
        make_strategy("annealing", problem(sweep, model), max_trials=5, seed=0)


# -- Optuna: studies --------------------------------------------------------------------------


def test_study_is_named_per_workload_topology_environment(sweep, model):
    p = problem(sweep, model)
    assert study_name(p) == f"syncopate/{W.key()}/{TOPO.key()}/{sweep.environment.key()}"


def test_a_study_in_the_database_resumes_where_it_stopped(tmp_path, sweep, model):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    a = make_strategy("optuna-tpe", problem(sweep, model, storage=url), max_trials=10, seed=0)
    first = drive(a, sweep)
    a.close()
    b = make_strategy("optuna-tpe", problem(sweep, model, storage=url), max_trials=10, seed=0)
    in_space = {c.key() for c in space(W, TOPO, OPTIONS)}  # the unfused guard is measured beside the study
    assert set(b.values) == {
        t.candidate.key() for t in first if t.status == "ok" and t.candidate.key() in in_space
    }
    second = {t.candidate.key() for t in drive(b, sweep)}
    guards = {c.key() for c in problem(sweep, model).guards()}
    assert guards <= second  # every new sweep measures the guards, even those the study knows
    assert second - guards and not {t.candidate.key() for t in first} & (second - guards)


def test_a_changed_space_is_refused_and_the_study_left_as_it_was(tmp_path, sweep, model):
    import optuna

    url = f"sqlite:///{tmp_path / 'study.db'}"
    drive(make_strategy("optuna-tpe", problem(sweep, model, storage=url), max_trials=6, seed=0), sweep)
    name = study_name(problem(sweep, model))
    before = optuna.load_study(study_name=name, storage=url)
    n_before, attrs_before = len(before.trials), dict(before.user_attrs)
    wider = SpaceOptions(
        **{**{f: getattr(OPTIONS, f) for f in OPTIONS.__slots__}, "num_splits": (1, 2, 4, 8)}
    )
    changed = SearchProblem(
        workload=W, topology=TOPO, options=wider, environment=sweep.environment, storage=url
    )
    with pytest.raises(StudyMismatchError, match="made over another search space") as e:
        make_strategy("optuna-tpe", changed, max_trials=6, seed=0)
    assert "optuna delete-study" in str(e.value) and "Nothing was changed" in str(e.value)
    after = optuna.load_study(study_name=name, storage=url)
    assert len(after.trials) == n_before and dict(after.user_attrs) == attrs_before
    assert attrs_before["space_fingerprint"] == space_fingerprint(space(W, TOPO, OPTIONS))


def test_failed_trials_are_told_as_failed_and_never_proposed_again(sweep, model):
    s = make_strategy("optuna-tpe", problem(sweep, model), max_trials=None, seed=0)
    in_space = {c.key() for c in space(W, TOPO, OPTIONS)}
    first = next(c for c in s.ask(3) if c.key() in in_space)  # the first the study proposed
    s.tell(
        TrialRecord(
            workload=W,
            topology=TOPO,
            environment=sweep.environment,
            candidate=first,
            status="compile_error",
            error="planted",
        )
    )
    state = [t for t in s.study.trials if t.user_attrs.get("candidate_key") == first.key()][0]
    assert state.state.name == "FAIL" and state.user_attrs["status"] == "compile_error"
    assert first.key() not in {t.candidate.key() for t in drive(s, sweep)}


# -- seeded ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "config", ["configs/llama_tp8.yaml", "configs/llama_tp4.yaml", "configs/llama_tp2.yaml"]
)
def test_seeded_measures_the_bench_grid_first_then_the_space_evenly(config):
    """The suites' `tiny` grid comes first, every one of its candidates the space holds, in its
    order; the rest of the budget goes to the space's other candidates, spread over all of it."""
    from syncopate.autotuner.sweep import load_sweep
    from syncopate.search_space import bench_grid

    sweep = load_sweep(config)
    topo, options = sweep.topology(), sweep.space
    firsts = {w.kind: w for w in reversed(sweep.workloads)}  # the first shape of each kind
    for w in firsts.values():
        cands = space(w, topo, options)
        index = {c.key(): i for i, c in enumerate(cands)}
        held = set(index)
        grid = bench_grid(w, topo, "tiny", ("copy_engine", "sm_copy", "nccl"))
        tiny = [c.key() for c in grid]
        seeds = [k for k in tiny if k in held]
        cublas = {c.template for c in grid if c.key() in held} & set(COPY_ENGINE_KINDS)
        assert cublas, w.key()
        for c in grid:  # what the space leaves out, its options leave out
            assert (
                c.key() in held
                or c.tile_order not in options.tile_orders
                or c.num_splits not in options.num_splits
            )
        problem = SearchProblem(workload=w, topology=topo, options=options)
        guards = [c.key() for c in problem.guards()]
        assert guards == [default_candidate(w, topo).key(), unfused_candidate().key()]
        seeds = [k for k in seeds if k not in guards]
        gluon = {c.key() for c in grid if c.kernel == "gluon"}
        assert gluon & set(seeds), w.key()  # Hopper: the grid's fused candidates in both kernels
        seeds = [k for k in seeds if k not in gluon] + [k for k in seeds if k in gluon]
        s = make_strategy("seeded", problem, max_trials=64, seed=0)
        asked = [c.key() for c in s.ask(64)]
        assert asked[:2] == guards and asked[2 : 2 + len(seeds)] == seeds
        assert len(asked) == len(set(asked)) == min(64, len(held | set(guards)))
        rest = [index[k] for k in asked[2 + len(seeds) :]]
        assert rest == sorted(rest) and rest[-1] > len(cands) * 0.8  # evenly over the whole space
        few = make_strategy("seeded", problem, max_trials=5, seed=0)
        picked = [c.key() for c in few.ask(64)]
        assert (
            len(picked) == 5
            and picked[:2] == guards
            and set(picked[2:]) <= set(seeds) - gluon
            and picked[2] == seeds[0]
        )
        triton = len([k for k in seeds if k not in gluon])
        some = make_strategy("seeded", problem, max_trials=2 + triton + 3, seed=0)
        picked = [c.key() for c in some.ask(200)]
        assert picked[: 2 + triton] == asked[: 2 + triton] and set(picked[2 + triton :]) <= gluon


# -- model-guided ------------------------------------------------------------------------------


def test_model_guided_measures_the_models_picks_first(sweep, model):
    p = problem(sweep, model, model_top_k=4)
    s = make_strategy("model-guided", p, max_trials=30, seed=0)
    guards = {c.key() for c in p.guards()}
    ranked = [r for r in model.rank(W, TOPO, space(W, TOPO, OPTIONS)) if r.candidate.key() not in guards]
    asked = s.ask(3)
    assert {c.key() for c in asked[:2]} == guards and asked[2].key() == ranked[0].candidate.key()
    seeded = [t for t in s.study.trials if t.user_attrs.get("seeded_by") == "cost model"]
    assert len(seeded) == 4 and all(t.user_attrs["predicted_us"] > 0 for t in seeded)


def test_the_pruner_rejects_only_clearly_losing_predictions():
    pruner = ModelPruner(margin=0.1, min_trials=3)
    assert pruner.threshold() is None and not pruner.losing(1e9)
    for predicted, measured in ((100, 110), (200, 220), (300, 330)):
        pruner.observe(predicted, measured)
    limit = pruner.threshold()
    assert limit == pytest.approx(110 * 1.1 / 1.1)
    assert pruner.losing(limit * 1.01) and not pruner.losing(limit * 0.99)


# -- noise-aware confirmation -----------------------------------------------------------------


def _trial(cand, samples, env) -> TrialRecord:
    s = sorted(samples)
    n = len(s)
    return TrialRecord(
        workload=W,
        topology=TOPO,
        environment=env,
        candidate=cand,
        status="ok",
        median_us=(s[(n - 1) // 2] + s[n // 2]) / 2,
        p20_us=s[int(0.2 * (n - 1))],
        p80_us=s[math.ceil(0.8 * (n - 1))],
        samples_us=tuple(s),
    )


def test_the_best_few_within_noise_are_measured_again_and_pooled(sweep):
    a, b, c, d = space(W, TOPO, OPTIONS)[:4]
    env = sweep.environment
    conf = Confirmation(top_k=3)
    conf.observe(_trial(a, [99, 100, 101], env))
    conf.observe(_trial(b, [100, 101, 102], env))
    conf.observe(_trial(c, [180, 181, 182], env))
    conf.observe(_trial(d, [95, 96, 97], env))
    # d is best; a lies within twice the noise (about 2 %) of it; b and c do not
    assert [conf.next(), conf.next(), conf.next()] == [d, a, None]
    conf.record(_trial(d, [105, 106, 107], env))
    conf.record(_trial(a, [100, 100, 100], env))
    v = conf.verdict()
    assert v.candidate == a and v.changed and v.contenders == 2 and v.samples == 6
    assert v.pooled_median_us == pytest.approx(100.0)


def test_without_re_measurements_the_fastest_trial_is_the_winner(sweep):
    a = space(W, TOPO, OPTIONS)[0]
    conf = Confirmation(top_k=0)
    conf.observe(_trial(a, [10, 11, 12], sweep.environment))
    assert conf.next() is None
    v = conf.verdict()
    assert v.candidate == a and not v.changed and v.contenders == 0


# -- replay ------------------------------------------------------------------------------------


def test_a_sweep_file_replays_its_trials(tmp_path, sweep):
    path = tmp_path / "sweep.json.gz"
    write_sweep(path, sweep)
    loaded = load_sweep_file(path)
    assert loaded.synthetic and loaded.topology == TOPO and "SYNTHETIC" in loaded.label
    runner = ReplayRunner(
        RunnerSpec(name="replay", timing=None, topology=TOPO, options=ReplayOptions(source=str(path)))
    )
    cand = space(W, TOPO, OPTIONS)[5]
    out = runner.run(W, cand, 10.0)
    stored = sweep.trials[W.key()][cand.key()]
    assert out.status == stored.status and out.samples_us == stored.samples_us
    other = space(W, TOPO)[-1]
    assert runner.run(W, other, 10.0).status == "crash"
    assert {b.name for b in runner.baselines(W)} >= {"gemm_alone", "torch_seq"}


def test_replay_noise_draws_fresh_samples(tmp_path, sweep):
    path = tmp_path / "sweep.json"
    write_sweep(path, sweep)
    runner = ReplayRunner(
        RunnerSpec(
            name="replay", timing=None, topology=TOPO, options=ReplayOptions(source=str(path), noise=0.05)
        )
    )
    cand = next(t.candidate for t in sweep.trials[W.key()].values() if t.status == "ok")
    assert runner.run(W, cand, 1.0).samples_us != runner.run(W, cand, 1.0).samples_us


@pytest.mark.parametrize(
    "content, message",
    [
        ("{}", "is not a syncopate-sweep file"),
        ("not json", "cannot be read"),
        ('{"format": "syncopate-sweep", "version": 9}', "version 9"),
    ],
)
def test_a_bad_sweep_file_is_refused(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        load_sweep_file(path)
    with pytest.raises(ConfigError, match="does not exist"):
        load_sweep_file(tmp_path / "missing.json")


def test_replay_refuses_another_topology(tmp_path, sweep):
    path = tmp_path / "sweep.json"
    write_sweep(path, sweep)
    with pytest.raises(ConfigError, match="set `topology: H200x2-nvlink`"):
        ReplayRunner(
            RunnerSpec(
                name="replay",
                timing=None,
                topology=Topology.from_key("H100x2-nvlink"),
                options=ReplayOptions(source=str(path)),
            )
        )


# -- evaluation --------------------------------------------------------------------------------


def test_spearman():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(0.9486832980505138)
    assert math.isnan(spearman([1, 1], [1, 2]))


def test_trials_to_target_and_model_agreement(sweep, model):
    o = trials_to_target("model-guided", sweep, W, seed=0, options=OPTIONS, calibration=model)
    assert o.trials is not None and o.fraction <= 0.5 and o.total == len(sweep.trials[W.key()])
    a = model_agreement(model, sweep, W)
    assert -1 <= a.spearman <= 1 and a.pick_gap >= 0 and a.candidates > 0


@pytest.mark.parametrize("name", STRATEGIES)
def test_an_empty_space_says_why(name):
    fused_only = SpaceOptions(templates=("direct", "ring", "bidirectional_ring", "c_stationary"))
    tiny = SearchProblem(
        workload=Workload(kind="gemm_rs", shape=(2, 2, 2)), topology=TOPO, options=fused_only
    )
    with pytest.raises(
        ConfigError,
        match=r"each rank's block has 1 row\(s\), fewer than the smallest tile's 64 "
        r"\(M must be at least 128\); at this size only template 'unfused'",
    ):
        make_strategy(name, tiny, max_trials=4, seed=0)
    narrow = SpaceOptions(tile_configs=(TileConfig.from_key("256x128x64w8s3"),), num_splits=(8,))
    fenced = SearchProblem(
        workload=Workload(kind="ag_gemm", shape=(1024, 4096, 4096)), topology=TOPO, options=narrow
    )
    with pytest.raises(
        ConfigError,
        match=r"the `space:` section leaves no candidate .* but the unfused one "
        r"\(the default space has \d+ fused\): widen it",
    ):
        make_strategy(name, fenced, max_trials=4, seed=0)
