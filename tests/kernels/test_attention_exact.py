"""GroupQueryAttention's native path bit for bit against onnxruntime (its flash path: MLAS's SGEMM, exp and
RoPE roundings, the decode GEMVs; see kernels/_native/attention.inc): prefill of odd lengths, one and
several key blocks, a lone last query row, decode with a past, a multi-token step with a past, rotary
(interleaved or not), packed or separate QKV, a local window, batch 2. Bit-equal at avx2 and above on a CPU
where onnxruntime runs its AVX-512 kernels (as here); within tolerance at portable and elsewhere.
onnxruntime runs on one thread (with more it may split a decode's keys over threads, which rounds
otherwise)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from onnx_prepared.kernels import native
from tests.kernels.test_attention import _INPUTS, _ours

ort = pytest.importorskip("onnxruntime")

pytestmark = pytest.mark.skipif(not native.available(), reason="native extension not built")

#: onnxruntime dispatches its AVX-512 SGEMM / exp here; our avx2 and avx512 levels repeat those roundings
EXACT = "avx512vnni" in native.supported_levels()


def _ort(feeds: dict, **attrs):
    names = [n if n in feeds else "" for n in _INPUTS]
    while names and not names[-1]:
        names.pop()
    outs = ["output", "present_key", "present_value"]
    node = helper.make_node("GroupQueryAttention", names, outs, domain="com.microsoft", **attrs)
    ins = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
           for k, v in feeds.items()]
    g = helper.make_graph([node], "g", ins, [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def _feeds(seed, *, b=1, s, past=0, buf=None, nh=16, kvh=4, h=64, packed=True):
    rng = np.random.default_rng(seed)
    total = past + s
    f = {}
    if packed:
        f["query"] = (rng.standard_normal((b, s, (nh + 2 * kvh) * h)) * 2).astype(np.float32)
    else:
        f["query"] = (rng.standard_normal((b, s, nh * h)) * 2).astype(np.float32)
        f["key"] = (rng.standard_normal((b, s, kvh * h)) * 2).astype(np.float32)
        f["value"] = rng.standard_normal((b, s, kvh * h)).astype(np.float32)
    buf = past if buf is None else buf
    f["past_key"] = rng.standard_normal((b, kvh, buf, h)).astype(np.float32)
    f["past_value"] = rng.standard_normal((b, kvh, buf, h)).astype(np.float32)
    f["seqlens_k"] = np.full(b, total - 1, np.int32)
    f["total_sequence_length"] = np.array(total, np.int32)
    inv = 1 / (10000 ** (np.arange(0, h, 2) / h))
    ang = np.arange(total + 8)[:, None] * inv[None]
    f["cos_cache"], f["sin_cache"] = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    return f


CASES = [  # (feeds kwargs, attributes beyond the heads)
    ({"s": 16}, {}),
    ({"s": 7, "packed": False}, {}),
    ({"s": 129}, {}),  # the last query row is a block of one (MLAS's M = 1 kernel)
    ({"s": 600}, {}),  # two key blocks of 512 (online softmax rescaled by expf)
    ({"s": 40, "h": 128, "nh": 8, "kvh": 2}, {}),
    ({"s": 33, "h": 32, "nh": 4, "kvh": 4}, {"rotary_interleaved": 1}),
    ({"s": 1, "past": 16}, {}),
    ({"s": 1, "past": 1000}, {}),
    ({"s": 1, "past": 37, "b": 2}, {}),
    ({"s": 1, "past": 50}, {"local_window_size": 8}),
    ({"s": 3, "past": 20, "buf": 30}, {}),
    ({"s": 20}, {"local_window_size": 5}),
]


@pytest.mark.parametrize("level", native.supported_levels())
@pytest.mark.parametrize(("kw", "attrs"), CASES, ids=[str(k) + str(a) for k, a in CASES])
def test_bit_equal_to_onnxruntime(level, kw, attrs):
    f = _feeds(sum(kw.values()) + len(attrs), **kw)
    a = {"num_heads": kw.get("nh", 16), "kv_num_heads": kw.get("kvh", 4), "do_rotary": 1, **attrs}
    want = _ort(f, **a)
    with native.forced_level(level):
        got = _ours(f, **a)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        if EXACT and level != "portable":
            assert np.array_equal(g, w), float(np.abs(g - w).max())
        else:
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("level", native.supported_levels())
@pytest.mark.parametrize(("s", "past", "seqlens"), [(12, 0, [11, 6]), (1, 40, [40, 25])], ids=["prompt", "decode"])
def test_ragged_batch_bit_equal(level, s, past, seqlens):
    """Batch entries of different lengths (a right-padded first prompt; decode steps with different pasts):
    onnxruntime runs each entry alone with its own key blocks, so do we."""
    f = _feeds(len(seqlens) + s, b=2, s=s, past=past)
    f["seqlens_k"] = np.array(seqlens, np.int32)
    a = {"num_heads": 16, "kv_num_heads": 4, "do_rotary": 1}
    want = _ort(f, **a)
    with native.forced_level(level):
        got = _ours(f, **a)
    for g, w in zip(got, want):
        if EXACT and level != "portable":
            assert np.array_equal(g, w), float(np.abs(g - w).max())
        else:
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=2e-5)
