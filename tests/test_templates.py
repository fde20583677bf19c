"""The plan templates' shared conformance suite, the CPU part (pure logic, no GPU): every candidate
template has one runtime template in the registry, serving exactly the kinds the search space
offers it for; its symmetric buffers and context keys follow from the call's shapes; bad requests
are refused with a message naming the value. The GPU part (every template's calls against the
float32 reference, back to back, buffers poisoned) is `tests/test_gpu_ops.py`."""

from __future__ import annotations

import pytest
import torch

from syncopate.errors import ConfigError
from syncopate.kernels.templates import TEMPLATES, CallSpec, template_for
from syncopate.search_space import (
    CANDIDATE_TEMPLATES,
    PLANLESS_KINDS,
    Candidate,
    Workload,
    a_stationary_candidate,
    c_stationary_candidate,
    decomposed_candidate,
    unfused_candidate,
)

KINDS = ("ag_gemm", "gemm_rs", "gemm_ar")


def _candidate(name: str) -> Candidate:
    made = {
        "a_stationary": lambda: a_stationary_candidate(2),
        "c_stationary": c_stationary_candidate,
        "decomposed": lambda: decomposed_candidate(2),
        "unfused": unfused_candidate,
    }
    return made[name]() if name in made else Candidate(template=name, num_splits=2)


def _spec(kind: str, template: str, ws: int = 4, m: int = 4096, n: int = 2048, k: int = 1024) -> CallSpec:
    w = Workload(kind=kind, shape=(m, n, k), dtype="bf16")
    shapes = w.local_shapes(ws)
    return CallSpec(
        kind=kind,
        group=None,
        rank=1,
        world_size=ws,
        a_shape=tuple(shapes["a"]),
        b_shape=tuple(shapes["b"]),
        dtype=torch.bfloat16,
        device=torch.device("cpu"),
        candidate=_candidate(template),
    )


def test_every_candidate_template_has_one_runtime_template():
    assert set(TEMPLATES) == set(CANDIDATE_TEMPLATES)
    for name, template in TEMPLATES.items():
        assert template.name == name


@pytest.mark.parametrize("name", sorted(CANDIDATE_TEMPLATES))
def test_template_serves_the_kinds_the_space_offers(name):
    template = TEMPLATES[name]
    offered = set(PLANLESS_KINDS.get(name, KINDS))
    assert template.kinds == offered
    for kind in KINDS:
        if kind in offered:
            assert template_for(_candidate(name), kind) is template
        else:
            with pytest.raises(ConfigError, match=f"template {name!r} does not serve {kind}"):
                template_for(_candidate(name), kind)


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        (name, kind)
        for name in sorted(CANDIDATE_TEMPLATES)
        for kind in KINDS
        if kind in PLANLESS_KINDS.get(name, KINDS)
    ],
)
def test_spec_shapes_and_buffers(name, kind):
    template = TEMPLATES[name]
    spec = _spec(kind, name)
    w = Workload(kind=kind, shape=(spec.m, spec.n, 1024), dtype="bf16")
    assert spec.out_shape == tuple(w.local_shapes(4)["out"])
    buffers = template.buffers(spec)
    assert all(
        isinstance(shape, tuple) and all(d > 0 for d in shape) and dtype == torch.bfloat16
        for shape, dtype in buffers.values()
    )
    assert (buffers == {}) == (name == "unfused")
    key = template.context_key(spec)
    assert hash(key) is not None
    # A context is sized by its key: another shape gets another key.
    assert template.context_key(_spec(kind, name, m=8192)) != key


def test_fused_templates_share_a_context_per_shape():
    for kind in KINDS:
        keys = {
            TEMPLATES[name].context_key(_spec(kind, name))
            for name in ("direct", "ring", "bidirectional_ring")
        }
        assert len(keys) == 1


def test_unknown_template_is_refused_with_the_accepted_ones():
    cand = Candidate()
    object.__setattr__(cand, "template", "zigzag")
    with pytest.raises(ConfigError, match="no runtime template 'zigzag': accepted are direct"):
        template_for(cand, "ag_gemm")
