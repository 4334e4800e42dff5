"""Construction is separate from the session (builder phases), and RuntimeContext carries a KV cache."""

import numpy as np
import pytest

from onnx_prepared.errors import ClosedError, InvalidFeedError
from onnx_prepared.generate import TinyLlmConfig, generate_tiny_llm
from onnx_prepared.generate.feeds import decode_feeds, empty_past, prefill_feeds
from onnx_prepared.runtime import RuntimeContext, RuntimeSession
from onnx_prepared.runtime.builder import build_session
from tests.helpers.models import gemm_mlp

X = np.random.default_rng(0).standard_normal((2, 16)).astype(np.float32)


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    path = generate_tiny_llm(tmp_path_factory.mktemp("llm"), layers=2, hidden=128, intermediate=256, heads=4,
                             kv_heads=2, vocab=512, seed=3)
    return path, TinyLlmConfig.from_model(path)


def test_builder_reads_no_weight_and_session_adopts_its_parts(tmp_path):
    parts = build_session(gemm_mlp(tmp_path, layers=2))
    assert parts.state.counters == {} and parts.arenas.snapshot()["preparation"]["live"] == 0
    assert parts.companion is None and not parts.owns_scheduler
    with RuntimeSession.from_parts(parts) as s:
        assert s.plan is parts.plan and s.state is parts.state and s.scheduler is parts.scheduler
        (y,) = s.run({"x": X})
    with RuntimeSession(gemm_mlp(tmp_path, layers=2)) as ref:
        np.testing.assert_array_equal(y, ref.run({"x": X})[0])
    with pytest.raises(ClosedError):
        s.run({"x": X})


def test_context_carries_the_kv_cache_like_explicit_feeds(llm):
    path, cfg = llm
    prompt = np.arange(3, 11)
    with RuntimeSession(path) as s:
        names = [s.plan.execution.slot_names[i] for i in s.plan.execution.output_slots]
        li = names.index("logits")
        # explicit feeds: the caller moves present.* to past_key_values.* itself
        out = dict(zip(names, s.run(prefill_feeds(cfg, prompt))))
        expected = [out["logits"]]
        for _ in range(3):
            out = dict(zip(names, s.run(decode_feeds(cfg, int(out["logits"][0, -1].argmax()), out))))
            expected.append(out["logits"])
        # the same loop through a RuntimeContext: the past is bound, rebound after every run
        ctx = RuntimeContext.kv_cache(s.plan, empty_past(cfg))
        assert ctx.carry["present.0.key"] == "past_key_values.0.key" and len(ctx.carry) == 2 * cfg.layers
        ids = prompt[None, :]
        got = []
        for step in range(4):
            mask = np.ones((1, ctx.bindings["past_key_values.0.key"].shape[2] + ids.shape[1]), np.int64)
            logits = s.run({"input_ids": ids, "attention_mask": mask}, ctx)[li]
            got.append(logits)
            assert ctx.bindings["past_key_values.0.key"].shape[2] == len(prompt) + step
            ids = np.array([[int(logits[0, -1].argmax())]])
        for e, g in zip(expected, got):
            np.testing.assert_array_equal(e, g)
        with pytest.raises(InvalidFeedError, match="also bound by the RuntimeContext"):
            s.run({"input_ids": ids, "attention_mask": mask, **empty_past(cfg)}, ctx)


def test_a_failed_run_leaves_the_context_bindings_as_they_were(llm):
    path, cfg = llm
    with RuntimeSession(path) as s:
        past = empty_past(cfg)
        ctx = RuntimeContext.kv_cache(s.plan, past)
        with pytest.raises(InvalidFeedError):
            s.run({"input_ids": np.array([[1, 2]])}, ctx)  # attention_mask missing
        assert all(ctx.bindings[k] is v for k, v in past.items())


def test_kv_cache_context_needs_present_past_pairs(tmp_path):
    with RuntimeSession(gemm_mlp(tmp_path, layers=1)) as s, pytest.raises(InvalidFeedError, match="present"):
        RuntimeContext.kv_cache(s.plan)
