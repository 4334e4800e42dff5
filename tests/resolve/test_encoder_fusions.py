"""resolve/fusions.py's transformer-encoder fusions (fuse_encoder): each fires on its exact pattern, the fused
node computes what onnxruntime computes for the unfused graph (at every dispatch level and on numpy), and
near misses (an extra reader, a graph output in the middle, a wrong constant, a non-initializer operand)
are left as written."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_prepared
from onnx_prepared.model import load_model
from onnx_prepared.resolve import resolve_model
from tests.helpers.dispatch import PATHS, use_path
from tests.helpers.ort_int8 import exact_matmul_integer_model

ort = pytest.importorskip("onnxruntime")
F = TensorProto.FLOAT
RNG = np.random.default_rng(13)


@pytest.fixture(params=PATHS)
def path(request, monkeypatch):
    yield from use_path(request.param, monkeypatch)


def _const(name: str, v: float) -> helper.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(v, np.float32)))


def _save(tmp_path, nodes, inputs, outputs, inits=(), opset=17) -> str:
    g = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info(o, F, None) for o in outputs],
                          list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    p = str(tmp_path / "m.onnx")
    with open(p, "wb") as f:
        f.write(m.SerializeToString())
    return p


def _choices(p) -> list[str]:
    return list(resolve_model(load_model(p)).kernel_choices)


def _check(p, feeds, ref=None):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    want = ort.InferenceSession(ref or p, so, providers=["CPUExecutionProvider"]).run(None, feeds)
    got = onnx_prepared.InferenceSession(p).run(None, feeds)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, atol=1e-5, rtol=1e-5)


def _x(name, shape):
    return helper.make_tensor_value_info(name, F, shape)


# **** MatMul + bias ****


def _matmul_bias(tmp_path, *, bias_dims=(5,), extra=False, as_output=False, bias_input=False):
    w = numpy_helper.from_array(RNG.standard_normal((8, 5)).astype(np.float32), "W")
    b = numpy_helper.from_array(RNG.standard_normal(bias_dims).astype(np.float32), "b")
    nodes = [helper.make_node("MatMul", ["A", "W"], ["mm"]), helper.make_node("Add", ["b", "mm"], ["Y"])]
    outs = ["Y"] + (["mm"] if as_output else [])
    if extra:
        nodes.append(helper.make_node("Relu", ["mm"], ["R"]))
        outs.append("R")
    ins = [_x("A", [2, "s", 8])] + ([_x("b", list(bias_dims))] if bias_input else [])
    return _save(tmp_path, nodes, ins, outs, [w] + ([] if bias_input else [b]))


def test_matmul_bias_is_fused_and_matches_onnxruntime(tmp_path, path):
    p = _matmul_bias(tmp_path)
    assert _choices(p) == ["prepacked:matmul-b-kn-float32-k8-n5"]  # one node: the Add is gone
    for shape in ((2, 3, 8), (2, 1, 8)):
        _check(p, {"A": RNG.standard_normal(shape).astype(np.float32)})


@pytest.mark.parametrize("variant", [dict(extra=True), dict(as_output=True), dict(bias_dims=(1, 5)),
                                     dict(bias_input=True)])
def test_matmul_bias_near_misses_are_left_as_written(tmp_path, variant):
    p = _matmul_bias(tmp_path, **variant)
    assert any("Add" in c for c in _choices(p))
    feeds = {"A": RNG.standard_normal((2, 3, 8)).astype(np.float32)}
    if variant.get("bias_input"):
        feeds["b"] = RNG.standard_normal(5).astype(np.float32)
    _check(p, feeds)


# **** the Erf GELU ****


def _gelu(tmp_path, *, d=2 ** 0.5, a=1.0, m=0.5, erf_out=False, other_x=False):
    nodes = [_const("cd", d), _const("ca", a), _const("cm", m),
             helper.make_node("Div", ["X", "cd"], ["t"]), helper.make_node("Erf", ["t"], ["e"]),
             helper.make_node("Add", ["e", "ca"], ["e1"]),
             helper.make_node("Mul", ["Z" if other_x else "X", "e1"], ["p"]),
             helper.make_node("Mul", ["p", "cm"], ["Y"])]
    ins = [_x("X", [2, "s", 16])] + ([_x("Z", [2, "s", 16])] if other_x else [])
    return _save(tmp_path, nodes, ins, ["Y"] + (["e"] if erf_out else []))


def test_gelu_is_fused_and_matches_onnxruntime(tmp_path, path):
    p = _gelu(tmp_path)
    assert [c for c in _choices(p) if "Constant" not in c] == ["onnx_prepared::GeluErf-1"]
    x = (RNG.standard_normal((2, 7, 16)) * 3).astype(np.float32)
    x.reshape(-1)[:4] = [0.0, -0.0, 6.0, -6.0]
    _check(p, {"X": x})


@pytest.mark.parametrize("variant", [dict(m=0.25), dict(a=2.0), dict(d=1.5), dict(erf_out=True), dict(other_x=True)])
def test_gelu_near_misses_are_left_as_written(tmp_path, variant):
    p = _gelu(tmp_path, **variant)
    assert any(c.startswith("ai.onnx::Erf") for c in _choices(p))
    assert "onnx_prepared::GeluErf-1" not in _choices(p)
    feeds = {"X": RNG.standard_normal((2, 3, 16)).astype(np.float32)}
    if variant.get("other_x"):
        feeds["Z"] = RNG.standard_normal((2, 3, 16)).astype(np.float32)
    _check(p, feeds)


# **** Add + LayerNormalization ****


def _add_ln(tmp_path, *, sum_read=False, stats=False, sum_output=False, h_as_scale=False, b_shape=(2, "s", 32)):
    s = numpy_helper.from_array(RNG.standard_normal(32).astype(np.float32), "s")
    beta = numpy_helper.from_array(RNG.standard_normal(32).astype(np.float32), "beta")
    ln_out = ["Y", "mean", "inv"] if stats else ["Y"]
    nodes = [helper.make_node("Add", ["A", "B"], ["h"]),
             helper.make_node("LayerNormalization", ["h", "h" if h_as_scale else "s", "beta"], ln_out,
                              epsilon=1e-5)]
    outs = list(ln_out)
    if sum_read:
        nodes.append(helper.make_node("Relu", ["h"], ["R"]))
        outs.append("R")
    if sum_output:
        outs.append("h")
    return _save(tmp_path, nodes, [_x("A", [2, "s", 32]), _x("B", list(b_shape))], outs, [s, beta])


@pytest.mark.parametrize("variant", [dict(), dict(stats=True), dict(sum_read=True), dict(sum_output=True),
                                     dict(b_shape=(1, "s", 32))])
def test_add_layer_norm_is_fused_and_matches_onnxruntime(tmp_path, path, variant):
    p = _add_ln(tmp_path, **variant)
    assert "onnx_prepared::AddLayerNormalization-1" in _choices(p)
    assert not any("ai.onnx::Add" in c for c in _choices(p))
    b_shape = (1, 5, 32) if variant.get("b_shape") else (2, 5, 32)
    _check(p, {"A": RNG.standard_normal((2, 5, 32)).astype(np.float32),
               "B": RNG.standard_normal(b_shape).astype(np.float32)})


def test_add_read_as_a_scale_is_left_as_written(tmp_path):
    p = _add_ln(tmp_path, h_as_scale=True, b_shape=(32,))
    assert any(c.startswith("ai.onnx::Add") for c in _choices(p))
    assert "onnx_prepared::AddLayerNormalization-1" not in _choices(p)


# **** quantize_dynamic's chain ****


def _dq_chain(tmp_path, *, cast_to=F, extra=False, scale_input=False, bias=True, per_column=False):
    K, N = 24, 10
    w = numpy_helper.from_array(RNG.integers(-60, 61, (K, N)).astype(np.int8), "Wq")
    wzp = numpy_helper.from_array(np.array(0, np.int8), "wzp")
    ws = numpy_helper.from_array((RNG.random(N if per_column else ()) * 0.01 + 0.001).astype(np.float32), "ws")
    b = numpy_helper.from_array(RNG.standard_normal(N).astype(np.float32), "b")
    nodes = [helper.make_node("DynamicQuantizeLinear", ["X"], ["q", "qs", "qzp"]),
             helper.make_node("Mul", ["qs", "ws"], ["sm"]),
             helper.make_node("MatMulInteger", ["q", "Wq", "qzp", "wzp"], ["y32"]),
             helper.make_node("Cast", ["y32"], ["yf"], to=cast_to),
             helper.make_node("Mul", ["yf", "sm"], ["mm"])]
    outs = ["Y" if bias else "mm"]
    if bias:
        nodes.append(helper.make_node("Add", ["b", "mm"], ["Y"]))
    if extra:
        nodes.append(helper.make_node("Cast", ["y32"], ["y32f"], to=F))
        outs.append("y32f")
    inits = [w, wzp, b] + ([] if scale_input else [ws])
    ins = [_x("X", [2, "s", K])] + ([_x("ws", [N] if per_column else [])] if scale_input else [])
    return _save(tmp_path, nodes, ins, outs, inits, opset=13)


@pytest.mark.parametrize("variant", [dict(), dict(bias=False), dict(per_column=True)])
def test_dynamic_quant_matmul_is_fused_and_matches_onnxruntime(tmp_path, path, variant):
    p = _dq_chain(tmp_path, **variant)
    assert [c.split("-")[0] for c in _choices(p)] == ["prepacked:mmi"]  # the whole chain is one node
    ref = exact_matmul_integer_model(p)
    _check(p, {"X": (RNG.standard_normal((2, 6, 24)) * 2).astype(np.float32)}, ref)


@pytest.mark.parametrize("variant", [dict(cast_to=TensorProto.DOUBLE), dict(extra=True), dict(scale_input=True)])
def test_dynamic_quant_matmul_near_misses_are_left_as_written(tmp_path, variant):
    p = _dq_chain(tmp_path, **variant)
    assert any("DynamicQuantizeLinear" in c for c in _choices(p))
    if variant.get("cast_to") == TensorProto.DOUBLE:
        return  # a Mul of double by float: not a valid model to run
    feeds = {"X": RNG.standard_normal((2, 6, 24)).astype(np.float32)}
    if variant.get("scale_input"):
        feeds["ws"] = np.array(0.004, np.float32)
    _check(p, feeds, exact_matmul_integer_model(p))


# **** a quantized embedding: Gather + DequantizeLinear turned round, the table dequantized once ****


def _embedding(tmp_path, *, rows=50, per_axis=False, extra=False):
    t = numpy_helper.from_array(RNG.integers(-128, 128, (rows, 16)).astype(np.int8), "T")
    s = numpy_helper.from_array((RNG.random(16 if per_axis else ()) * 0.02 + 1e-3).astype(np.float32), "ts")
    z = numpy_helper.from_array(np.array(3, np.int8) if not per_axis else np.zeros(16, np.int8), "tz")
    nodes = [helper.make_node("Gather", ["T", "ids"], ["gq"]),
             helper.make_node("DequantizeLinear", ["gq", "ts", "tz"], ["Y"], **({"axis": 2} if per_axis else {}))]
    outs = ["Y"]
    if extra:
        nodes.append(helper.make_node("Cast", ["gq"], ["gf"], to=F))
        outs.append("gf")
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, [2, "s"])
    return _save(tmp_path, nodes, [ids], outs, [t, s, z], opset=13)


def test_quantized_embedding_is_dequantized_once_and_matches_onnxruntime(tmp_path, path):
    p = _embedding(tmp_path)
    assert _choices(p) == ["prepacked:dqfold-int8-float32-50x16-axis1-bs0-zp1", "ai.onnx::Gather-1"]
    ids = RNG.integers(-50, 50, (2, 7)).astype(np.int64)
    _check(p, {"ids": ids})
    sess = onnx_prepared.InferenceSession(p)
    first = sess.run(None, {"ids": ids})[0]
    np.testing.assert_array_equal(sess.run(None, {"ids": ids})[0], first)


@pytest.mark.parametrize("variant", [dict(per_axis=True), dict(extra=True), dict(rows=80000)])
def test_quantized_embedding_near_misses_are_left_as_written(tmp_path, variant):
    p = _embedding(tmp_path, **variant)
    assert _choices(p)[0].startswith("ai.onnx::Gather")  # the Gather still reads the quantized table
    _check(p, {"ids": RNG.integers(0, 50, (2, 5)).astype(np.int64)})


# **** a Reshape to a shape built from another tensor's dims ****


def _int_const(name: str, v) -> helper.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(v, np.int64)))


def _reshape_chain(tmp_path, *, other_source=False, unsqueeze_read=False, gather_read=False, zero=False):
    nodes = [_int_const("i0", 0), _int_const("i1", 1), _int_const("ax", [0]),
             _int_const("tail", [0 if zero else 3, 4]), helper.make_node("Shape", ["S"], ["sh"]),
             helper.make_node("Shape", ["Z" if other_source else "S"], ["sh2"]),
             helper.make_node("Gather", ["sh", "i0"], ["d0"], axis=0),
             helper.make_node("Gather", ["sh2", "i1"], ["d1"]),
             helper.make_node("Unsqueeze", ["d0", "ax"], ["u0"]), helper.make_node("Unsqueeze", ["d1", "ax"], ["u1"]),
             helper.make_node("Concat", ["u0", "u1", "tail"], ["shape"], axis=0),
             helper.make_node("Reshape", ["X", "shape"], ["Y"])]
    outs = ["Y"]
    if unsqueeze_read:
        nodes.append(helper.make_node("Cast", ["u0"], ["uf"], to=F))
        outs.append("uf")
    if gather_read:
        nodes.append(helper.make_node("Cast", ["d1"], ["df"], to=F))
        outs.append("df")
    ins = [_x("X", None), _x("S", [2, "s", 5]), _x("Z", [2, "s", 5])]
    return _save(tmp_path, nodes, ins, outs, opset=17)


def _feeds(s=3):
    return {k: RNG.standard_normal((2, s, 12 if k == "X" else 5)).astype(np.float32) for k in ("X", "S", "Z")}


@pytest.mark.parametrize("variant", [dict(), dict(gather_read=True), dict(zero=True)])
def test_reshape_from_shape_is_fused_and_matches_onnxruntime(tmp_path, variant):
    p = _reshape_chain(tmp_path, **variant)
    ch = [c for c in _choices(p) if "Constant" not in c]
    assert "onnx_prepared::ReshapeFromShape-1" in ch and "ai.onnx::Concat-4" not in ch
    assert ch.count("ai.onnx::Shape-1") == (1 if variant.get("gather_read") else 0)
    for s in (3, 1):
        feeds = _feeds(s)
        if variant.get("zero"):
            feeds["X"] = RNG.standard_normal((2, s, 3, 4)).astype(np.float32)
        _check(p, feeds)


@pytest.mark.parametrize("variant", [dict(other_source=True), dict(unsqueeze_read=True)])
def test_reshape_from_shape_near_misses_are_left_as_written(tmp_path, variant):
    p = _reshape_chain(tmp_path, **variant)
    assert "ai.onnx::Concat-4" in _choices(p)
    _check(p, _feeds())


# **** an attention block's scaled, masked Softmax ****


def _attention_softmax(tmp_path, *, axis=-1, d=2.828427, div_read=False, mask_shape=(2, 1, 1, 8)):
    nodes = [_const("d", d), helper.make_node("Div", ["S", "d"], ["t"]), helper.make_node("Add", ["t", "M"], ["u"]),
             helper.make_node("Softmax", ["u"], ["Y"], axis=axis)]
    outs = ["Y"] + (["t"] if div_read else [])
    return _save(tmp_path, nodes, [_x("S", [2, 4, 8, 8]), _x("M", list(mask_shape))], outs)


@pytest.mark.parametrize("mask_shape", [(2, 1, 1, 8), (8,), (1, 2, 4, 8, 8)])
def test_attention_softmax_is_fused_and_matches_onnxruntime(tmp_path, path, mask_shape):
    p = _attention_softmax(tmp_path, mask_shape=mask_shape)
    assert [c for c in _choices(p) if "Constant" not in c] == ["onnx_prepared::ScaledMaskedSoftmax-1"]
    mask = np.where(RNG.random(mask_shape) < 0.3, -10000.0, 0.0).astype(np.float32)
    _check(p, {"S": (RNG.standard_normal((2, 4, 8, 8)) * 5).astype(np.float32), "M": mask})


@pytest.mark.parametrize("variant", [dict(axis=1), dict(d=0.0), dict(div_read=True)])
def test_attention_softmax_near_misses_are_left_as_written(tmp_path, variant):
    p = _attention_softmax(tmp_path, **variant)
    assert "onnx_prepared::ScaledMaskedSoftmax-1" not in _choices(p)
    if variant.get("d") == 0.0:
        return
    _check(p, {"S": RNG.standard_normal((2, 4, 8, 8)).astype(np.float32),
               "M": RNG.standard_normal((2, 1, 1, 8)).astype(np.float32)})
