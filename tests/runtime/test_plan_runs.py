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
    """Cold run with every producer started at submission (or, for an object the run computed in its
    source form, when it ended: prepare() waits for those): each descriptor runs once, nothing else."""
    acted = []
    with s.trace_actions(acted.append):
        s.run(feeds)
    s.prepare()
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


def test_budget_restores_run_their_read_packed_descriptors(tmp_path):
    """Under a residency budget with build_if_missing, an evicted object comes back through its restore
    descriptor (a READ_PACKED of the entry this session persisted): every task the scheduler ran is a
    descriptor of the plan, restores included."""
    path = gemm_mlp(tmp_path, layers=4, width=32)
    with RuntimeSession(path) as s:
        s.prepare()
        limit = max(s.store.entry(r.key).nbytes for r in s.plan.requirements)
    opts = {"trace": True, "prepared_memory_limit": limit, "prepared_model_policy": "build_if_missing",
            "prepared_model_path": str(tmp_path / "c" / "m.prepared.onnx")}
    x = np.random.default_rng(1).standard_normal((2, 32)).astype(np.float32)
    with RuntimeSession(path, opts) as s:
        for _ in range(3):
            s.run({"x": x})
        s.flush_cache()
        ran = [n for n in _session_task_names(s) if n != "S.cache.flush"]
        assert set(ran) <= set(s.plan.by_id)
        restores = set(s.plan.restorer.values())
        assert restores and restores <= {t.id for t in s.plan.session_tasks}
        assert all(s.plan.by_id[t].kind is TaskKind.READ_PACKED for t in restores)
        assert set(ran) & restores  # some evicted object was restored by its descriptor
        packed = [k for k in s.plan.restorer]
        assert sum(s.state.counters[f"read_packed:{k}"] for k in packed) > 0


def test_every_session_task_kind_has_one_body():
    from onnx_prepared.runtime.state import BODIES

    assert set(BODIES) == set(TaskKind) - {TaskKind.EXECUTE}


def _refuse_lock_creation(monkeypatch):
    """A cache folder nobody may write (as for root, whom permission bits do not stop)."""
    from onnx_prepared.prepared import cache_io

    real = cache_io.open_lock

    def refuse(path, *, create):
        if create:
            raise PermissionError(13, "Permission denied", path)
        return real(path, create=False)

    monkeypatch.setattr(cache_io, "open_lock", refuse)


@pytest.mark.parametrize("folder", ["refused", "chmod"])
def test_read_only_cache_folder_plans_no_persist_and_every_descriptor_runs(tmp_path, monkeypatch, folder):
    """build_if_missing in a folder that cannot be written degrades to read-only at open, so the plan
    emits no PERSIST (or restore) descriptor that would never run; a writable folder plans them."""
    import os
    import warnings

    from onnx_prepared.errors import CacheWarning

    path = gemm_mlp(tmp_path, layers=3)
    companion = tmp_path / "c" / "m.prepared.onnx"
    opts = {"trace": True, "prepared_model_policy": "build_if_missing", "prepared_model_path": str(companion)}
    with RuntimeSession(path, {**opts, "prepared_model_path": str(tmp_path / "w" / "m.prepared.onnx")}) as s:
        assert s.companion.writable and s.plan.persister
        assert any(t.kind is TaskKind.PERSIST for t in s.plan.session_tasks)
    if folder == "chmod":
        if os.geteuid() == 0:
            pytest.skip("root ignores permission bits")
        companion.parent.mkdir()
        os.chmod(companion.parent, 0o555)
    else:
        _refuse_lock_creation(monkeypatch)
    try:
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            with RuntimeSession(path, opts) as s:
                assert s.companion.policy.value == "read_only" and s.companion.degraded
                assert not s.plan.persister and not s.plan.restorer
                assert all(t.kind is not TaskKind.PERSIST for t in s.plan.session_tasks)
                _check_plan_matches_what_ran(s, {"x": X})
                s.prepare()
        assert sum(issubclass(x.category, CacheWarning) for x in w) == 1
        assert not companion.exists()
    finally:
        if folder == "chmod":
            os.chmod(companion.parent, 0o755)
