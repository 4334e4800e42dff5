"""Residency budget: evictions keep PreparedArena within its limit and never change a result."""

import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from onnx_prepared.generate import TinyLlmConfig, generate_tiny_llm
from onnx_prepared.generate.feeds import decode_feeds, prefill_feeds
from onnx_prepared.runtime import RuntimeSession
from tests.helpers.models import add_checksums, gemm_mlp

X = [np.random.default_rng(i).standard_normal((2, 32)).astype(np.float32) for i in range(3)]


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    path = gemm_mlp(tmp_path_factory.mktemp("mlp"), layers=4, width=32, share_b=False)
    add_checksums(path)
    return path


def _sizes(path):
    with RuntimeSession(path) as s:
        s.prepare()
        sizes = {r.key: s.store.entry(r.key).nbytes for r in s.plan.requirements}
        per_action = max(sum(sizes[s.plan.requirements[b].key] for b in bits) for bits in s.plan.action_requirements)
    return sizes, per_action


def _run_all(path, opts, feeds_list):
    with RuntimeSession(path, opts) as s:
        outs = [s.run(f) for f in feeds_list]
        return outs, s


def test_one_object_budget_gemm_mlp_is_bit_identical_and_stays_within_the_limit(mlp):
    sizes, per_action = _sizes(mlp)
    limit = max(sizes.values())
    ref, _ = _run_all(mlp, None, [{"x": x} for x in X])
    outs, s = _run_all(mlp, {"prepared_memory_limit": limit}, [{"x": x} for x in X])
    for a, b in zip(ref, outs):
        np.testing.assert_array_equal(a[0], b[0])
    assert s.producers.residency.evictions > 0
    assert s.counters["hot_runs"] == 0  # never all resident: every run takes the cold path
    # Only the set of objects one node reads at once may exceed a budget smaller than that set.
    assert s.arenas.prepared.peak_live <= max(limit, per_action)


def test_eviction_invalidates_the_readiness_epoch(mlp):
    with RuntimeSession(mlp) as s:
        s.prepare()
        s.run({"x": X[0]})
        assert s.counters["hot_runs"] == 1
        key = s.plan.requirements[0].key
        s.store.evict(key).release()
        y = s.run({"x": X[0]})
        assert s.counters["cold_runs"] == 1 and s.counters["hot_runs"] == 1
        y2 = s.run({"x": X[0]})  # resident again: back on the hot path
        assert s.counters["hot_runs"] == 2
        np.testing.assert_array_equal(y[0], y2[0])


def test_evicted_objects_are_restored_from_the_companion_cache(mlp, tmp_path):
    sizes, _ = _sizes(mlp)
    opts = {"prepared_memory_limit": max(sizes.values()), "prepared_model_policy": "build_if_missing",
            "prepared_model_path": str(tmp_path / "c" / "m.prepared.onnx")}
    ref, _ = _run_all(mlp, None, [{"x": x} for x in X])
    outs, s = _run_all(mlp, opts, [{"x": x} for x in X])
    counters = s.state.counters
    for a, b in zip(ref, outs):
        np.testing.assert_array_equal(a[0], b[0])
    packed = [r.key for r in s.plan.requirements if not r.key.is_raw]
    assert all(counters[f"prepack:{k}"] == 1 for k in packed)  # packed once, then persisted
    assert sum(counters[f"read_packed:{k}"] for k in packed) > 0  # restores read packed bytes


@pytest.fixture(scope="module")
def small_llm(tmp_path_factory):
    path = generate_tiny_llm(tmp_path_factory.mktemp("llm"), layers=2, hidden=128, intermediate=256, heads=4,
                             kv_heads=2, vocab=512, seed=1)
    return path, TinyLlmConfig.from_model(path)


def _generate(path, cfg, opts, steps):
    with RuntimeSession(path, opts) as s:
        names = [o.name for o in s.resolved.source.graph.output]
        outs = s.run(prefill_feeds(cfg, np.arange(3, 19)))
        logits = [outs[0]]
        for _ in range(steps):
            present = dict(zip(names, outs))
            outs = s.run(decode_feeds(cfg, int(outs[0][0, -1].argmax()), present))
            logits.append(outs[0])
        return logits, s


def test_tiny_llm_under_a_one_block_budget_prefill_and_32_decode_steps_bit_identical(small_llm):
    path, cfg = small_llm
    ref, _ = _generate(path, cfg, None, 32)
    with RuntimeSession(path) as s:
        s.prepare()
        block = sum(s.store.entry(r.key).nbytes for r in s.plan.requirements if ".layers.0." in r.key.lineage[0])
    got, s = _generate(path, cfg, {"prepared_memory_limit": block}, 32)
    assert len(got) == 33
    for a, b in zip(ref, got):
        np.testing.assert_array_equal(a, b)
    assert s.producers.residency.evictions > 0


@settings(max_examples=8, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(frac=st.floats(0.0, 1.0), n_runs=st.integers(2, 4))
def test_concurrent_runs_under_random_budgets_never_deadlock(mlp, frac, n_runs):
    sizes, _ = _sizes(mlp)
    lo, hi = max(sizes.values()), sum(sizes.values())
    limit = int(lo + frac * (hi - lo))
    ref, _ = _run_all(mlp, None, [{"x": x} for x in X])
    with RuntimeSession(mlp, {"prepared_memory_limit": limit}) as s:
        handles = [s.run_async({"x": X[i % 3]}) for i in range(n_runs)]
        results = [h.result(timeout=60) for h in handles]  # a deadlock fails here, bounded
        pins = [s.store.entry(r.key).pins for r in s.plan.requirements]
    for i, r in enumerate(results):
        np.testing.assert_array_equal(r[0], ref[i % 3][0])
    assert pins == [0] * len(pins)


def test_concurrent_threads_under_budget(mlp):
    sizes, _ = _sizes(mlp)
    ref, _ = _run_all(mlp, None, [{"x": x} for x in X])
    errors, outs = [], {}
    with RuntimeSession(mlp, {"prepared_memory_limit": max(sizes.values())}) as s:
        def worker(i):
            try:
                outs[i] = s.run({"x": X[i % 3]})
            except BaseException as e:
                errors.append(e)

        ts = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
    assert not errors and len(outs) == 6
    for i, o in outs.items():
        np.testing.assert_array_equal(o[0], ref[i % 3][0])


def test_arena_retention_caps_trim_retained_capacity(mlp):
    caps = {"preparation": 0, "execution": 100}
    with RuntimeSession(mlp, {"arena_retention_caps": caps}) as s:
        s.run({"x": X[0]})
        snap = s.arenas.snapshot()
    assert snap["preparation"]["retained"] == 0  # source buffers were freed, none retained
    assert snap["execution"]["retained"] <= 100 < snap["execution"]["peak_live"]


def test_prefetch_window_is_shared_by_concurrent_runs_under_a_lock():
    """Concurrent runs of one session grow and shrink one window; it stays within [1, cap]."""
    from onnx_prepared.runtime.state import PrefetchWindow

    w = PrefetchWindow(8, 20)
    barrier = threading.Barrier(4)

    def churn(i):
        barrier.wait()
        for _ in range(500):
            w.grow() if i % 2 else w.shrink()

    ts = [threading.Thread(target=churn, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    assert 1 <= w.size <= 20
    w.grow()
    assert w.size <= w.cap == 20
