"""GroupQueryAttention's native path (kernels/_native/attention.c) at every dispatch level, against the numpy
path and onnxruntime, with hypothesis over batch, new tokens, past length, heads / KV heads, head size
(multiples of the vector width and not), rotary on/off (interleaved or not), packed or separate QKV and a
local window; plus its errors and its run-to-run bit-identity."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from onnx_prepared.errors import KernelError
from onnx_prepared.kernels import attention, native
from tests.kernels.test_attention import _INPUTS, _ort_gqa

pytestmark = pytest.mark.skipif(not native.available(), reason="native extension not built")

LEVELS = native.supported_levels()
HEADS = [(1, 1), (2, 1), (4, 2), (6, 3), (8, 2), (3, 3)]


def _feeds(rng, b, s, past, nh, kvh, h, packed, rotary, buf_extra=0):
    total = past + s
    f = {}
    if packed:
        f["query"] = rng.standard_normal((b, s, (nh + 2 * kvh) * h)).astype(np.float32)
    else:
        f["query"] = rng.standard_normal((b, s, nh * h)).astype(np.float32)
        f["key"] = rng.standard_normal((b, s, kvh * h)).astype(np.float32)
        f["value"] = rng.standard_normal((b, s, kvh * h)).astype(np.float32)
    if past or buf_extra:
        f["past_key"] = rng.standard_normal((b, kvh, past + buf_extra, h)).astype(np.float32)
        f["past_value"] = rng.standard_normal((b, kvh, past + buf_extra, h)).astype(np.float32)
    f["seqlens_k"] = np.full(b, total - 1, np.int32)
    f["total_sequence_length"] = np.array([total], np.int32)
    if rotary:
        ang = rng.random((total + 8, h // 2)).astype(np.float32) * 3
        f["cos_cache"], f["sin_cache"] = np.cos(ang), np.sin(ang)
    return f


def _run(feeds, **attrs):
    return attention.group_query_attention(*[feeds.get(n) for n in _INPUTS], **attrs)


def _numpy(feeds, monkeypatch, **attrs):
    with monkeypatch.context() as m:
        m.setattr(native, "_ext", None)
        return _run(feeds, **attrs)


cases = st.fixed_dictionaries({
    "b": st.integers(1, 3), "s": st.sampled_from([1, 2, 5, 17, 40]), "past": st.sampled_from([0, 1, 7, 33]),
    "heads": st.sampled_from(HEADS), "h": st.sampled_from([4, 6, 8, 16, 20, 32, 64]),
    "packed": st.booleans(), "rotary": st.booleans(), "interleaved": st.booleans(),
    "window": st.sampled_from([-1, -1, 3]), "seed": st.integers(0, 2**16),
})


@pytest.mark.parametrize("level", LEVELS)
@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(c=cases)
def test_native_matches_numpy_path(level, c, monkeypatch):
    nh, kvh = c["heads"]
    rng = np.random.default_rng(c["seed"])
    feeds = _feeds(rng, c["b"], c["s"], c["past"], nh, kvh, c["h"], c["packed"], c["rotary"])
    attrs = {"num_heads": nh, "kv_num_heads": kvh, "do_rotary": int(c["rotary"]),
             "rotary_interleaved": int(c["interleaved"]), "local_window_size": c["window"]}
    want = _numpy(feeds, monkeypatch, **attrs)
    with native.forced_level(level):
        got = _run(feeds, **attrs)
    assert [g.shape for g in got] == [w.shape for w in want]
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=2e-5)
    for g, w in zip(got[1:], want[1:]):  # the rotation is the same float32 arithmetic
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("level", LEVELS)
@settings(max_examples=15, deadline=None, derandomize=True)
@given(c=cases)
def test_native_matches_onnxruntime(level, c):
    nh, kvh = c["heads"]
    h = max(16, c["h"] // 16 * 16)  # onnxruntime wants a multiple of 16
    b = 1 if c["past"] and c["s"] > 1 else c["b"]  # onnxruntime: batch 1 for a multi-token step with a past
    rng = np.random.default_rng(c["seed"])
    feeds = _feeds(rng, b, c["s"], c["past"], nh, kvh, h, c["packed"], c["rotary"])
    attrs = {"num_heads": nh, "kv_num_heads": kvh, "do_rotary": int(c["rotary"]),
             "rotary_interleaved": int(c["interleaved"]), "local_window_size": c["window"]}
    if not c["past"]:  # onnxruntime wants the past inputs; an empty past is the first prompt
        feeds["past_key"] = np.zeros((b, kvh, 0, h), np.float32)
        feeds["past_value"] = np.zeros((b, kvh, 0, h), np.float32)
    want = _ort_gqa(feeds, 3, **attrs)
    with native.forced_level(level):
        got = _run(feeds, **attrs)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-3, atol=1e-4)
    for g, w in zip(got[1:], want[1:]):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("level", LEVELS)
def test_shared_buffer_and_repeat_runs_are_bit_identical(level):
    """A past buffer longer than the context (genai's shared buffer), then the same call again: equal bits."""
    rng = np.random.default_rng(3)
    feeds = _feeds(rng, 2, 1, 9, 8, 2, 64, True, True, buf_extra=6)
    attrs = {"num_heads": 8, "kv_num_heads": 2, "do_rotary": 1}
    with native.forced_level(level):
        first = _run(feeds, **attrs)
        again = _run(feeds, **attrs)
    assert first[1].shape == (2, 2, 15, 64)
    for x, y in zip(first, again):
        assert np.array_equal(x, y)


def test_result_does_not_depend_on_the_thread_count():
    rng = np.random.default_rng(8)
    feeds = _feeds(rng, 2, 40, 0, 8, 2, 64, True, True)  # large enough for the pool
    attrs = {"num_heads": 8, "kv_num_heads": 2, "do_rotary": 1}
    before = native.get_num_threads()
    try:
        native.set_num_threads(1)
        one = _run(feeds, **attrs)
        native.set_num_threads(2)
        two = _run(feeds, **attrs)
    finally:
        native.set_num_threads(before)
    for x, y in zip(one, two):
        assert np.array_equal(x, y)


def test_bad_lengths_and_positions_raise_kernel_error():
    rng = np.random.default_rng(4)
    feeds = _feeds(rng, 1, 1, 5, 4, 2, 16, True, True)
    attrs = {"num_heads": 4, "kv_num_heads": 2, "do_rotary": 1}
    bad = dict(feeds, seqlens_k=np.array([9], np.int32))  # more than total
    with pytest.raises(KernelError, match="seqlens_k"):
        _run(bad, **attrs)
    short = dict(feeds, cos_cache=feeds["cos_cache"][:3], sin_cache=feeds["sin_cache"][:3])
    with pytest.raises(KernelError, match="rotary position 5"):
        _run(short, **attrs)
    with pytest.raises(KernelError, match="past_key"):
        _run(dict(feeds, past_key=feeds["past_key"][:, :1], past_value=feeds["past_value"][:, :1]), **attrs)
