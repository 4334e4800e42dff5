"""RotaryEmbedding (com.microsoft and ONNX-23) against onnxruntime and onnx.reference."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from onnx_prepared.kernels.rotary import rotary_embedding_23, rotary_embedding_ms

ort = pytest.importorskip("onnxruntime")


def _model(node, feeds: dict, out_type=TensorProto.FLOAT, opset=23):
    ins = [
        helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape) for k, v in feeds.items()
    ]
    outs = [helper.make_tensor_value_info(o, out_type, None) for o in node.output]
    g = helper.make_graph([node], "g", ins, outs)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)])


def _ort(node, feeds, **kw):
    m = _model(node, feeds, **kw)
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def _caches(rng, max_pos, half):
    ang = rng.random((max_pos, half)).astype(np.float32) * 6
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("layout", ["3d", "4d"])
@pytest.mark.parametrize("pos_kind", ["start", "2d"])
@pytest.mark.parametrize("partial", [False, True])
def test_ms_rotary_matches_onnxruntime(interleaved, layout, pos_kind, partial):
    rng = np.random.default_rng(interleaved * 8 + partial)
    b, s, n, h = 2, 5, 3, 8
    rot = 4 if partial else h
    cos, sin = _caches(rng, 16, rot // 2)
    x = rng.standard_normal((b, s, n * h) if layout == "3d" else (b, n, s, h)).astype(np.float32)
    pos = np.array([3], np.int64) if pos_kind == "start" else rng.integers(0, 16, (b, s)).astype(np.int64)
    attrs = {"interleaved": interleaved}
    if partial:
        attrs.update(num_heads=n, rotary_embedding_dim=rot)
    elif layout == "3d":
        attrs.update(num_heads=n)
    node = helper.make_node("RotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"], domain="com.microsoft", **attrs)
    (want,) = _ort(node, {"x": x, "pos": pos, "cos": cos, "sin": sin})
    (got,) = rotary_embedding_ms(x, pos, cos, sin, **attrs)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("layout", ["3d", "4d"])
@pytest.mark.parametrize("with_pos", [True, False])
@pytest.mark.parametrize("partial", [False, True])
def test_onnx23_rotary_matches_reference_and_onnxruntime(interleaved, layout, with_pos, partial):
    rng = np.random.default_rng(3 + interleaved)
    b, s, n, h = 2, 4, 2, 8
    rot = 4 if partial else h
    x = rng.standard_normal((b, s, n * h) if layout == "3d" else (b, n, s, h)).astype(np.float32)
    if with_pos:
        cos, sin = _caches(rng, 10, rot // 2)
        pos = rng.integers(0, 10, (b, s)).astype(np.int64)
    else:
        ang = rng.random((b, s, rot // 2)).astype(np.float32)
        cos, sin, pos = np.cos(ang), np.sin(ang), None
    attrs = {"interleaved": interleaved}
    if layout == "3d":
        attrs["num_heads"] = n
    if partial:
        attrs["rotary_embedding_dim"] = rot
    names = ["x", "cos", "sin"] + (["pos"] if with_pos else [])
    feeds = {"x": x, "cos": cos, "sin": sin} | ({"pos": pos} if with_pos else {})
    node = helper.make_node("RotaryEmbedding", names, ["y"], **attrs)
    (got,) = rotary_embedding_23(x, cos, sin, pos, **attrs)
    (ref,) = ReferenceEvaluator(_model(node, feeds)).run(None, feeds)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    (want,) = _ort(node, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_registered():
    from onnx_prepared.kernels.registry import lookup

    assert lookup("com.microsoft", "RotaryEmbedding", 1).fn is rotary_embedding_ms
    assert lookup("", "RotaryEmbedding", 23).fn is rotary_embedding_23


@pytest.mark.parametrize("interleaved", [0, 1])
def test_contrib_rotary_bit_equal_to_onnxruntime(interleaved):
    """MLAS's RoPE (onnxruntime's com.microsoft RotaryEmbedding) rounds ``x1 c - x2 s`` as one FMA on FMA
    CPUs; at an FMA dispatch level so do we."""
    from onnx_prepared.kernels import native

    if native.dispatch_level() in ("numpy", "portable"):
        pytest.skip("no FMA dispatch level")
    rng = np.random.default_rng(interleaved)
    b, s, n, h = 2, 9, 4, 64
    x = (rng.standard_normal((b, s, n * h)) * 3).astype(np.float32)
    ang = rng.random((32, h // 2)) * 6
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    pos = np.array([3], np.int64)
    node = helper.make_node("RotaryEmbedding", ["x", "p", "c", "s"], ["y"], domain="com.microsoft",
                            interleaved=interleaved, num_heads=n)
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape),
           helper.make_tensor_value_info("p", TensorProto.INT64, pos.shape),
           helper.make_tensor_value_info("c", TensorProto.FLOAT, cos.shape),
           helper.make_tensor_value_info("s", TensorProto.FLOAT, sin.shape)]
    g = helper.make_graph([node], "g", ins, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x, "p": pos, "c": cos, "s": sin})[0]
    (got,) = rotary_embedding_ms(x, pos, cos, sin, interleaved=interleaved, num_heads=n)
    assert np.array_equal(got, want)
