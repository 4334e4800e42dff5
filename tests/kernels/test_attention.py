"""GroupQueryAttention against onnxruntime: prompt and decode, batch > 1, GQA head sharing, packed QKV,
rotary, local window, softcap, smooth softmax / head sink, attention bias, qk output; every test runs on
the numpy path and at every native dispatch level (attention bias and qk output stay on numpy)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from onnx_prepared.errors import KernelError
from onnx_prepared.kernels.attention import group_query_attention
from tests.helpers.dispatch import PATHS, use_path

ort = pytest.importorskip("onnxruntime")


@pytest.fixture(autouse=True, params=PATHS)
def path(request, monkeypatch):
    yield from use_path(request.param, monkeypatch)

_INPUTS = ["query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length",
           "cos_cache", "sin_cache", "position_ids", "attention_bias", "head_sink"]


def _ort_gqa(feeds: dict, n_out: int, **attrs):
    names = [n if n in feeds else "" for n in _INPUTS]
    while names and not names[-1]:
        names.pop()
    outs = ["output", "present_key", "present_value", "output_qk"][:n_out]
    node = helper.make_node("GroupQueryAttention", names, outs, domain="com.microsoft", **attrs)
    ins = [
        helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape) for k, v in feeds.items()
    ]
    g = helper.make_graph([node], "g", ins, [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _ours(feeds: dict, **attrs):
    return group_query_attention(*[feeds.get(n) for n in _INPUTS], **attrs)


def _case(rng, *, b=2, s=4, past=0, buf=None, nh=4, kvh=2, h=16, packed=False, rotary=False, max_pos=32):
    """Feeds for a step where every batch entry has ``past`` cached tokens and ``s`` new ones."""
    total = past + s
    if past and s > 1:
        b = 1  # onnxruntime: "batch_size must be 1 when sequence_length > 1 and past context is given"
    feeds = {}
    if packed:
        feeds["query"] = rng.standard_normal((b, s, (nh + 2 * kvh) * h)).astype(np.float32)
    else:
        feeds["query"] = rng.standard_normal((b, s, nh * h)).astype(np.float32)
        feeds["key"] = rng.standard_normal((b, s, kvh * h)).astype(np.float32)
        feeds["value"] = rng.standard_normal((b, s, kvh * h)).astype(np.float32)
    buf = past if buf is None else buf
    feeds["past_key"] = rng.standard_normal((b, kvh, buf, h)).astype(np.float32)
    feeds["past_value"] = rng.standard_normal((b, kvh, buf, h)).astype(np.float32)
    feeds["seqlens_k"] = np.full(b, total - 1, np.int32)
    feeds["total_sequence_length"] = np.array(total, np.int32)
    if rotary:
        ang = rng.random((max_pos, h // 2)).astype(np.float32) * 3
        feeds["cos_cache"], feeds["sin_cache"] = np.cos(ang), np.sin(ang)
    return feeds


def _check(feeds, n_out=3, valid=None, **attrs):
    want = _ort_gqa(feeds, n_out, **attrs)
    got = _ours(feeds, **attrs)
    assert len(got) >= n_out
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-5)
    for g, w in zip(got[1:3], want[1:3]):
        assert g.shape == w.shape
        t = valid if valid is not None else g.shape[2]
        np.testing.assert_allclose(g[:, :, :t], w[:, :, :t], rtol=1e-5, atol=1e-6)
    if n_out == 4:
        np.testing.assert_allclose(got[3], want[3], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("past", [0, 5])
@pytest.mark.parametrize("s", [1, 3])
@pytest.mark.parametrize("kvh", [1, 2, 4])
def test_prompt_and_decode_match_onnxruntime(past, s, kvh):
    rng = np.random.default_rng(past * 10 + s + kvh)
    _check(_case(rng, s=s, past=past, kvh=kvh), num_heads=4, kv_num_heads=kvh)


@pytest.mark.parametrize("past", [0, 6])
@pytest.mark.parametrize("interleaved", [0, 1])
def test_rotary_and_packed_qkv(past, interleaved):
    rng = np.random.default_rng(11 + past + interleaved)
    feeds = _case(rng, s=3 if past == 0 else 1, past=past, packed=True, rotary=True)
    _check(feeds, num_heads=4, kv_num_heads=2, do_rotary=1, rotary_interleaved=interleaved)


@pytest.mark.parametrize("past", [0, 6])
def test_rotary_position_ids(past):
    rng = np.random.default_rng(17 + past)
    s = 3 if past == 0 else 1
    feeds = _case(rng, b=1 if past == 0 else 2, s=s, past=past, rotary=True)
    feeds["position_ids"] = rng.integers(0, 32, (feeds["query"].shape[0], s)).astype(np.int64)
    _check(feeds, num_heads=4, kv_num_heads=2, do_rotary=1)


def test_shared_buffer_present_has_buffer_length():
    rng = np.random.default_rng(5)
    feeds = _case(rng, b=1, s=1, past=4, buf=12, rotary=True)
    _check(feeds, valid=5, num_heads=4, kv_num_heads=2, do_rotary=1)
    got = _ours(feeds, num_heads=4, kv_num_heads=2, do_rotary=1)
    assert got[1].shape == (1, 2, 12, 16)


@pytest.mark.parametrize("attrs", [
    {"local_window_size": 3},
    {"softcap": 2.0},
    {"smooth_softmax": 1},
    {"scale": 0.3},
])
@pytest.mark.parametrize("past", [0, 4])
def test_attention_variants(attrs, past):
    rng = np.random.default_rng(len(attrs) + past)
    _check(_case(rng, s=5 if past == 0 else 2, past=past), num_heads=4, kv_num_heads=2, **attrs)


@pytest.mark.parametrize("past", [0, 3])
def test_head_sink_and_attention_bias(past):
    rng = np.random.default_rng(21 + past)
    s = 4 if past == 0 else 1
    feeds = _case(rng, s=s, past=past)
    feeds["attention_bias"] = rng.standard_normal((2, 1, s, past + s)).astype(np.float32)
    feeds["head_sink"] = rng.standard_normal(4).astype(np.float32)
    _check(feeds, num_heads=4, kv_num_heads=2)


@pytest.mark.parametrize("qk_output", [1, 2])
def test_qk_output(qk_output):
    rng = np.random.default_rng(31 + qk_output)
    _check(_case(rng, s=3, past=2), n_out=4, num_heads=4, kv_num_heads=2, qk_output=qk_output)


def test_unequal_prompt_lengths_valid_rows():
    rng = np.random.default_rng(41)
    feeds = _case(rng, b=2, s=5, past=0)
    feeds["seqlens_k"] = np.array([4, 2], np.int32)
    want = _ort_gqa(feeds, 3, num_heads=4, kv_num_heads=2)
    got = _ours(feeds, num_heads=4, kv_num_heads=2)
    np.testing.assert_allclose(got[0][0], want[0][0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got[0][1, :3], want[0][1, :3], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got[1][1, :, :3], want[1][1, :, :3], rtol=1e-5, atol=1e-6)


def test_unsupported_inputs_raise_kernel_error():
    feeds = _case(np.random.default_rng(0), s=1, past=2)
    with pytest.raises(KernelError, match="query_seqlens"):
        group_query_attention(*[feeds.get(n) for n in _INPUTS], None, None, None, None,
                              np.ones(2, np.int32), num_heads=4, kv_num_heads=2)


@pytest.mark.parametrize("attrs", [{}, {"local_window_size": 50}, {"softcap": 3.0}, {"smooth_softmax": 1}])
@pytest.mark.parametrize("past", [0, 7])
def test_long_prompts_in_causal_chunks(attrs, past):
    """Prompts longer than one query chunk (attention._CHUNK) read only the keys up to each chunk's end."""
    rng = np.random.default_rng(51 + past + len(attrs))
    feeds = _case(rng, b=1, s=150, past=past, packed=True, rotary=True, max_pos=160)
    _check(feeds, num_heads=4, kv_num_heads=2, do_rotary=1, **attrs)
    if not past and "local_window_size" not in attrs:  # right-padded entries (their padding rows see no key)
        feeds = _case(rng, b=2, s=130, past=0, packed=True, rotary=True, max_pos=160)
        feeds["seqlens_k"] = np.array([129, 70], np.int32)
        want = _ort_gqa(feeds, 3, num_heads=4, kv_num_heads=2, do_rotary=1, **attrs)
        got = _ours(feeds, num_heads=4, kv_num_heads=2, do_rotary=1, **attrs)
        np.testing.assert_allclose(got[0][0], want[0][0], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(got[0][1, :71], want[0][1, :71], rtol=1e-4, atol=1e-5)
