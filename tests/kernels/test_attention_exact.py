"""GroupQueryAttention's native path bit for bit against onnxruntime (its flash path: MLAS's SGEMM, exp and
RoPE roundings, the decode GEMVs; see kernels/_native/attention.inc): prefill of odd lengths, one and
several key blocks, a lone last query row, decode with a past, multi-token steps with a past, rotary
(interleaved or not), packed or separate QKV, a local window, batch 2. Bit-equal at every level (portable
too: its fused multiply-adds are fmaf) in the order onnxruntime's MLAS picks on this CPU
(``attention.gqa_order``: its AVX-512F or its AVX2 sum-exp kernel). The other order, forced, is
deterministic and close but not bit-equal. onnxruntime runs on one thread (with more it may split a
decode's keys over threads, which rounds otherwise)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from onnx_prepared.errors import KernelError
from onnx_prepared.kernels import attention, native
from tests.kernels.test_attention import _INPUTS, _ours

ort = pytest.importorskip("onnxruntime")

pytestmark = pytest.mark.skipif(not native.available(), reason="native extension not built")

#: the order onnxruntime's MLAS runs on this CPU (AVX-512F or AVX2 sum-exp) and the other one
OWN = "avx2" if native.available() and native._ext.gqa_cpu_order() else "avx512"
OTHER = "avx512" if OWN == "avx2" else "avx2"


def _use_order(mp: pytest.MonkeyPatch, order: str | None) -> None:
    """The order the calls that follow use (read once per process, then cached): forced, or the CPU's."""
    if order is None:
        mp.delenv(attention.ORDER_ENV, raising=False)
    else:
        mp.setenv(attention.ORDER_ENV, order)
    attention.gqa_order.cache_clear()


@pytest.fixture(autouse=True)
def _cpu_order(monkeypatch):
    """Every test starts in the CPU's order and leaves none cached for the next."""
    _use_order(monkeypatch, None)
    yield
    attention.gqa_order.cache_clear()


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
    ({"s": 127}, {}),
    ({"s": 128}, {}),
    ({"s": 129}, {}),  # the last query row is a block of one (MLAS's M = 1 kernel)
    ({"s": 300}, {}),  # two key blocks where L2 is 512 KiB (256 keys at H=64), one where it is 1 MiB
    ({"s": 600}, {}),  # two key blocks of 512 (online softmax rescaled by expf)
    ({"s": 40, "h": 128, "nh": 8, "kvh": 2}, {}),
    ({"s": 33, "h": 32, "nh": 4, "kvh": 4}, {"rotary_interleaved": 1}),
    ({"s": 1, "past": 16}, {}),
    ({"s": 1, "past": 300}, {}),
    ({"s": 1, "past": 1000}, {}),
    ({"s": 1, "past": 37, "b": 2}, {}),
    ({"s": 1, "past": 50}, {"local_window_size": 8}),
    ({"s": 3, "past": 20, "buf": 30}, {}),
    ({"s": 16, "past": 40}, {}),
    ({"s": 127, "past": 10, "buf": 200}, {}),
    ({"s": 128, "past": 40}, {}),
    ({"s": 129, "past": 7}, {}),
    ({"s": 300, "past": 100}, {}),
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
        assert np.array_equal(g, w), (int((g != w).sum()), float(np.abs(g - w).max()))


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
        assert np.array_equal(g, w), (int((g != w).sum()), float(np.abs(g - w).max()))


@pytest.mark.parametrize("level", native.supported_levels())
@pytest.mark.parametrize("kw", [{"s": 128}, {"s": 300, "past": 100}, {"s": 1, "past": 300}], ids=str)
def test_the_other_order_is_deterministic_and_close(monkeypatch, level, kw):
    """The order of the CPU onnxruntime does not run on here (forced): the same bits on every call, within
    float rounding of onnxruntime's output, and not its bits (the exp sums are in other lanes)."""
    f = _feeds(sum(kw.values()), **kw)
    a = {"num_heads": 16, "kv_num_heads": 4, "do_rotary": 1}
    want = _ort(f, **a)
    _use_order(monkeypatch, OTHER)
    with native.forced_level(level):
        first, again = _ours(f, **a), _ours(f, **a)
    assert attention.gqa_order() == OTHER
    for g, g2, w in zip(first, again, want):
        assert np.array_equal(g, g2)
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=2e-5)
    assert not np.array_equal(first[0], want[0])
    for g, w in zip(first[1:], want[1:]):  # present K/V are copies and RoPE: no softmax in them
        assert np.array_equal(g, w)


def test_order_follows_the_cpu_or_the_variable(monkeypatch):
    """Unset: AVX-512F decides, as in MLAS's platform setup (/proc/cpuinfo agrees where it exists); a bad
    value names the variable and the choices."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as fh:
            flags = next((ln.split(":", 1)[1].split() for ln in fh if ln.startswith("flags")), None)
    except OSError:
        flags = None
    if flags is not None:
        assert attention.gqa_order() == ("avx512" if "avx512f" in flags else "avx2")
    for order in attention.GQA_ORDERS:
        _use_order(monkeypatch, order)
        assert attention.gqa_order() == order
    _use_order(monkeypatch, "sse")
    with pytest.raises(KernelError, match=f"{attention.ORDER_ENV}='sse'.*avx512, avx2"):
        attention.gqa_order()
