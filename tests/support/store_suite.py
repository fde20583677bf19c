"""The conformance suite every TrialStore passes: subclass :class:`TrialStoreSuite` and give a
`store` fixture that yields a fresh, empty store."""

from __future__ import annotations

from dataclasses import replace

import pytest

from syncopate.autotuner.store import SWEEP_STATUSES, TrialStore
from syncopate.errors import SyncopateError
from syncopate.records import BaselineRecord, Environment, TrialRecord
from syncopate.search_space import Candidate, Topology, Workload

W1 = Workload(kind="ag_gemm", shape=(4096, 4096, 4096))
W2 = Workload(kind="gemm_rs", shape=(4096, 4096, 4096))
TOPO = Topology.from_key("H200x2-nvlink")
ENV = Environment(
    syncopate="0.1.0", torch="2.13", triton="3.9", cuda="13.0", nccl="2.28", driver="580", gpu_model="H200"
)
OTHER_ENV = replace(ENV, driver="590")
C1 = Candidate(num_splits=1)
C2 = Candidate(num_splits=2)
C3 = Candidate(num_splits=4)


def trial(
    candidate: Candidate,
    median: float | None,
    *,
    status: str = "ok",
    workload: Workload = W1,
    environment: Environment = ENV,
    source: str = "fixture",
) -> TrialRecord:
    samples = (median * 0.99, median, median * 1.01) if median is not None else ()
    return TrialRecord(
        workload=workload,
        topology=TOPO,
        environment=environment,
        candidate=candidate,
        status=status,
        source=source,
        median_us=median,
        p20_us=median,
        p80_us=median,
        samples_us=samples,
        error="" if status == "ok" else status,
        worker={"host": "h", "gang": 0},
    )


def baseline(name: str, median: float, workload: Workload = W1) -> BaselineRecord:
    return BaselineRecord(
        workload=workload, topology=TOPO, environment=ENV, name=name, median_us=median, source="fixture"
    )


class TrialStoreSuite:
    """Behaviour the coordinator relies on, for any TrialStore."""

    @pytest.fixture
    def store(self) -> TrialStore:  # pragma: no cover - every subclass overrides it
        raise NotImplementedError

    def test_sweeps_get_distinct_ids_and_the_latest_is_found_by_name(self, store):
        a = store.start_sweep("s", {"name": "s", "runner": "cpu-fixture"})
        b = store.start_sweep("s", {"name": "s", "runner": "gpu"})
        other = store.start_sweep("t", {"name": "t"})
        assert len({a, b, other}) == 3
        latest = store.latest_sweep("s")
        assert (latest.sweep_id, latest.name, latest.status, latest.runner) == (b, "s", "running", "gpu")
        assert latest.config == {"name": "s", "runner": "gpu"}
        assert store.latest_sweep("t").sweep_id == other and store.latest_sweep("t").runner is None
        assert store.latest_sweep("nothing") is None

    def test_stored_keys_are_per_sweep_workload_and_environment(self, store):
        s1 = store.start_sweep("s", {})
        s2 = store.start_sweep("s2", {})
        store.record_trial(s1, trial(C1, 10.0))
        store.record_trial(s1, trial(C2, None, status="timeout"))
        store.record_trial(s1, trial(C3, 12.0, workload=W2))
        store.record_trial(s2, trial(C3, 9.0))
        store.record_trial(s1, trial(C3, 8.0, environment=OTHER_ENV))
        assert store.stored_keys(s1, W1, TOPO, ENV) == {C1.key(), C2.key()}
        assert store.stored_keys(s1, W2, TOPO, ENV) == {C3.key()}
        assert store.stored_keys(s2, W1, TOPO, ENV) == {C3.key()}
        assert store.stored_keys(s1, W1, TOPO, OTHER_ENV) == {C3.key()}

    def test_recording_a_trial_twice_keeps_one(self, store):
        s = store.start_sweep("s", {})
        store.record_trial(s, trial(C1, 10.0))
        store.record_trial(s, trial(C1, 10.0))
        assert store.stored_keys(s, W1, TOPO, ENV) == {C1.key()}

    @pytest.mark.parametrize("source", ["fixture", "measured"])
    def test_sweep_best_is_the_fastest_ok_trial_of_its_sweep_and_environment(self, store, source):
        s = store.start_sweep("s", {})
        other = store.start_sweep("other", {})
        store.record_trial(s, trial(C1, 10.0, source=source))
        store.record_trial(s, trial(C2, 5.0, status="wrong_result", source=source))
        store.record_trial(s, trial(C3, 7.5, source=source))
        store.record_trial(s, trial(Candidate(num_splits=8), 1.0, environment=OTHER_ENV, source=source))
        store.record_trial(other, trial(C2, 2.0, source=source))
        best = store.sweep_best(s, W1, TOPO, ENV)
        assert best is not None and best.candidate == C3 and best.median_us == pytest.approx(7.5)
        assert best.status == "ok" and best.source == source and best.worker["host"] == "h"
        assert store.sweep_best(other, W1, TOPO, ENV).candidate == C2
        assert store.sweep_best(s, W2, TOPO, ENV) is None

    def test_baselines_round_trip(self, store):
        s = store.start_sweep("s", {})
        store.record_baselines(s, [baseline("torch_seq", 20.0), baseline("gemm_alone", 15.0)])
        store.record_baselines(s, [baseline("torch_seq", 30.0, workload=W2)])
        got = {b.name: b.median_us for b in store.stored_baselines(s, W1, TOPO, ENV)}
        assert got == {"torch_seq": pytest.approx(20.0), "gemm_alone": pytest.approx(15.0)}
        assert [b.median_us for b in store.stored_baselines(s, W2, TOPO, ENV)] == [pytest.approx(30.0)]
        assert store.stored_baselines(s, W1, TOPO, OTHER_ENV) == []

    def test_baselines_are_stored_all_or_none(self, store):
        s = store.start_sweep("s", {})
        with pytest.raises(SyncopateError):
            store.record_baselines(s, [baseline("torch_seq", 20.0), "not a baseline"])
        assert store.stored_baselines(s, W1, TOPO, ENV) == []

    @pytest.mark.parametrize("status", [s for s in SWEEP_STATUSES if s != "running"])
    def test_a_sweep_ends_with_any_final_status_and_resumes(self, store, status):
        s = store.start_sweep("s", {})
        store.finish_sweep(s, status)
        assert store.latest_sweep("s").status == status
        store.resume_sweep(s)
        assert store.latest_sweep("s").status == "running"
