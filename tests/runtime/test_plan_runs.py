"""The plan is what runs: the session tasks the scheduler executes are exactly the plan's descriptors."""

import numpy as np
import pytest

from onnx_prepared.generate import TinyLlmConfig, generate_tiny_llm
from onnx_prepared.generate.feeds import prefill_feeds
from onnx_prepared.plan import TaskKind, TaskScope
from onnx_prepared.runtime import RuntimeSession
from tests.helpers.models import gemm_mlp

X = np.random.default_rng(0).standard_normal((2, 16)).astype(np.float32)


def _session_task_names(s) -> list[str]:
    return [r.name for r in s.scheduler.trace.records() if r.name.startswith("S.")]


def _check_plan_matches_what_ran(s, feeds):
    """Cold run with every producer started at submission: each descriptor runs once, nothing else."""
    acted = []
    with s.trace_actions(acted.append):
        s.run(feeds)
    ran = _session_task_names(s)
    planned = [t.id for t in s.plan.session_tasks]
    assert sorted(ran) == sorted(planned)  # every task run has a descriptor, and every descriptor ran
    for t in s.plan.session_tasks:  # the key each publishing descriptor names is resident now
        if t.publishes is not None:
            assert s.store.state(t.publishes).value == "resident"
    inv = s.plan.invocation_tasks  # the continuation executed exactly the invocation tasks' ranges
    assert acted == [pc for t in inv for pc in range(*t.actions)]


def test_mlp_session_tasks_are_the_plan_descriptors(tmp_path):
    with RuntimeSession(gemm_mlp(tmp_path, layers=3, share_b=True), {"trace": True}) as s:
        _check_plan_matches_what_ran(s, {"x": X})


@pytest.fixture(scope="module")
def tied_llm(tmp_path_factory):
    path = generate_tiny_llm(tmp_path_factory.mktemp("llm"), layers=2, hidden=128, intermediate=256, heads=4,
                             kv_heads=2, vocab=512, seed=1)
    return path, TinyLlmConfig.from_model(path)


def test_tied_embedding_raw_object_has_its_publish_descriptor(tied_llm):
    """A raw object shares its source read with a prepack of the same tensor and is published by its
    own PUBLISH_RAW task, in the plan as in the scheduler."""
    path, cfg = tied_llm
    assert cfg.tied
    with RuntimeSession(path, {"trace": True}) as s:
        kinds = {t.kind for t in s.plan.session_tasks}
        assert TaskKind.PUBLISH_RAW in kinds
        for t in s.plan.session_tasks:
            assert t.scope is TaskScope.SESSION
            if t.kind is TaskKind.PUBLISH_RAW:
                (dep,) = t.dependencies
                assert s.plan.by_id[dep].kind is TaskKind.READ_SOURCE and t.publishes.is_raw
        _check_plan_matches_what_ran(s, prefill_feeds(cfg, np.arange(3, 19)))
