"""Layer/RMS normalizations and the com.microsoft Skip* fusions against onnxruntime and onnx.reference, on the
numpy path and through the extension's RMS norms (llm_norm.c) at every dispatch level."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from onnx_prepared.errors import KernelError
from onnx_prepared.kernels import native
from onnx_prepared.kernels import normalization as nm
from onnx_prepared.kernels.registry import lookup
from tests.helpers.dispatch import PATHS, use_path

ort = pytest.importorskip("onnxruntime")


def _model(node, feeds: dict, n_out: int):
    ins = [
        helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape) for k, v in feeds.items()
    ]
    outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in node.output[:n_out] if o]
    g = helper.make_graph([node], "g", ins, outs)
    ops = [helper.make_opsetid("", 23), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(g, opset_imports=ops)


def _ort(node, feeds, n_out=1):
    m = _model(node, feeds, n_out)
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def _close(got, want, tol=1e-5):
    assert got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


@pytest.fixture
def rng():
    return np.random.default_rng(7)


@pytest.fixture(autouse=True, params=PATHS)
def path(request, monkeypatch):
    yield from use_path(request.param, monkeypatch)


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=st.sampled_from([(1, 1), (3, 7), (2, 5, 16), (1, 4, 1000), (130, 64), (0, 8)]),
       skip=st.booleans(), bias=st.booleans(), eps=st.sampled_from([1e-6, 1e-12]), seed=st.integers(0, 99))
def test_native_rms_matches_numpy_path(path, monkeypatch, shape, skip, bias, eps, seed):
    r = np.random.default_rng(seed)
    x = r.standard_normal(shape).astype(np.float32)
    g = r.standard_normal(shape[-1]).astype(np.float32)
    if skip:
        s = r.standard_normal(shape).astype(np.float32)
        b = r.standard_normal(shape[-1]).astype(np.float32) if bias else None
        got = nm.skip_simplified_layer_normalization(x, s, g, b, epsilon=eps)
    else:
        got = nm.simplified_layer_normalization(x, g, epsilon=eps)
    with monkeypatch.context() as m:
        m.setattr(native, "_ext", None)
        want = (nm.skip_simplified_layer_normalization(x, s, g, b, epsilon=eps) if skip
                else nm.simplified_layer_normalization(x, g, epsilon=eps))
    for a, w in zip(got, want):
        assert a.shape == w.shape and a.dtype == w.dtype
        np.testing.assert_allclose(a, w, rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("axis", [-1, 1])
def test_simplified_layer_norm_matches_onnxruntime(rng, axis):
    x = rng.standard_normal((2, 3, 16)).astype(np.float32) * 3
    g = rng.standard_normal((3, 16) if axis == 1 else 16).astype(np.float32)
    node = helper.make_node("SimplifiedLayerNormalization", ["x", "g"], ["y", "inv"], axis=axis, epsilon=1e-6)
    want = _ort(node, {"x": x, "g": g}, 2)
    for domain in ("", "com.microsoft"):
        fn = lookup(domain, "SimplifiedLayerNormalization", 1).fn
        got = fn(x, g, axis=axis, epsilon=1e-6)
        _close(got[0], want[0])
        _close(got[1], want[1])


@pytest.mark.parametrize("axis", [-1, -2])
def test_rms_normalization_matches_reference_and_onnxruntime(rng, axis):
    x = rng.standard_normal((2, 5, 8)).astype(np.float32)
    s = rng.standard_normal((5, 8) if axis == -2 else 8).astype(np.float32)
    node = helper.make_node("RMSNormalization", ["x", "s"], ["y"], axis=axis, epsilon=1e-5)
    (got,) = nm.rms_normalization(x, s, axis=axis)
    (ref,) = ReferenceEvaluator(_model(node, {"x": x, "s": s}, 1)).run(None, {"x": x, "s": s})
    _close(got, ref)
    _close(got, _ort(node, {"x": x, "s": s})[0])


@pytest.mark.parametrize("with_bias", [False, True])
def test_layer_normalization_matches_onnxruntime(rng, with_bias):
    x = rng.standard_normal((3, 4, 12)).astype(np.float32) + 2
    s = rng.standard_normal(12).astype(np.float32)
    b = rng.standard_normal(12).astype(np.float32)
    feeds = {"x": x, "s": s} | ({"b": b} if with_bias else {})
    node = helper.make_node("LayerNormalization", list(feeds), ["y", "mean", "inv"], epsilon=1e-5)
    want = _ort(node, feeds, 3)
    got = nm.layer_normalization(x, s, b if with_bias else None, epsilon=1e-5)
    for g, w in zip(got, want):
        _close(g, w)


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("skip_2d", [False, True])
@pytest.mark.parametrize("simplified", [True, False])
def test_skip_layer_norms_match_onnxruntime_on_all_outputs(rng, with_bias, skip_2d, simplified):
    x = rng.standard_normal((2, 3, 16)).astype(np.float32)
    skip = rng.standard_normal((3, 16) if skip_2d else (2, 3, 16)).astype(np.float32)
    gamma = rng.standard_normal(16).astype(np.float32)
    beta = rng.standard_normal(16).astype(np.float32)
    bias = rng.standard_normal(16).astype(np.float32)
    if simplified:
        op, names = "SkipSimplifiedLayerNormalization", ["x", "skip", "gamma"] + (["bias"] if with_bias else [])
        fn = nm.skip_simplified_layer_normalization
        args = (x, skip, gamma, bias if with_bias else None)
    else:
        op, names = "SkipLayerNormalization", ["x", "skip", "gamma", "beta"] + (["bias"] if with_bias else [])
        fn = nm.skip_layer_normalization
        args = (x, skip, gamma, beta, bias if with_bias else None)
    feeds = {"x": x, "skip": skip, "gamma": gamma, "beta": beta, "bias": bias}
    feeds = {k: feeds[k] for k in names}
    node = helper.make_node(op, names, ["y", "mean", "inv", "sum"], domain="com.microsoft", epsilon=1e-6)
    want = _ort(node, feeds, 4)
    got = fn(*args, epsilon=1e-6)
    for g, w in zip(got, want):
        _close(g, w)


def test_simplified_layer_norm_float16(rng):
    x = rng.standard_normal((4, 32)).astype(np.float16)
    g = rng.standard_normal(32).astype(np.float16)
    y, _ = nm.simplified_layer_normalization(x, g)
    assert y.dtype == np.float16
    ref = x.astype(np.float32) / np.sqrt((x.astype(np.float32) ** 2).mean(-1, keepdims=True) + 1e-5) * g
    np.testing.assert_allclose(y.astype(np.float32), ref, rtol=2e-3, atol=2e-3)


def test_bad_skip_shape_raises_kernel_error(rng):
    x = rng.standard_normal((2, 3, 8)).astype(np.float32)
    with pytest.raises(KernelError, match="skip shape"):
        nm.skip_simplified_layer_normalization(x, np.zeros((4, 8), np.float32), np.ones(8, np.float32))


@pytest.mark.parametrize("n", [1, 8, 15, 16, 17, 100, 896, 1003])
@pytest.mark.parametrize("op", ["SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization", "RMSNormalization"])
def test_native_rms_norms_are_onnxruntimes_bits(path, op, n):
    """The extension's norms use onnxruntime's float32 order (llm_norm.c): an int8 MatMulNBits after a norm
    turns a last-bit difference into a rounding flip, so equal bits matter for whole-model agreement."""
    if path == "numpy":
        pytest.skip("the numpy path is close to onnxruntime, not bit-equal")
    r = np.random.default_rng(n)
    x = (r.standard_normal((2, 5, n)) * 3).astype(np.float32)
    feeds = {"x": x}
    if op.startswith("Skip"):
        feeds["skip"] = r.standard_normal((2, 5, n)).astype(np.float32)
    feeds["gamma"] = r.standard_normal(n).astype(np.float32)
    if op.startswith("Skip"):
        feeds["bias"] = r.standard_normal(n).astype(np.float32)
    outs = ["y", "m", "inv", "sum"] if op.startswith("Skip") else ["y"]
    node = helper.make_node(op, list(feeds), outs, domain="com.microsoft" if op.startswith("Skip") else "",
                            epsilon=1e-6)
    want = _ort(node, feeds, len(outs))
    if op.startswith("Skip"):
        got = nm.skip_simplified_layer_normalization(feeds["x"], feeds["skip"], feeds["gamma"], feeds["bias"],
                                                     epsilon=1e-6)
        pairs = [(got[0], want[0]), (got[3], want[3])]
    else:
        fn = nm.rms_normalization if op == "RMSNormalization" else nm.simplified_layer_normalization
        pairs = [(fn(x, feeds["gamma"], epsilon=1e-6)[0], want[0])]
    for g, w in pairs:
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("shape,axis", [((2, 8, 32), -1), ((3, 1), -1), ((2, 5, 7), 1), ((4, 6, 2, 3), 2),
                                        ((9, 768), -1), ((130, 64), -1), ((0, 8), -1)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_layer_normalization_any_trailing_axes_matches_onnxruntime(path, shape, axis, with_bias):
    """Every output at every path (the native one, encoder_norm.c, has onnxruntime's mean bit for bit and
    its other outputs within an ulp or so); one output computes the same Y."""
    r = np.random.default_rng(shape[-1])
    x = (r.standard_normal(shape) * 2 + 1).astype(np.float32)
    a = axis % len(shape)
    s = r.standard_normal(shape[a:]).astype(np.float32)
    b = r.standard_normal(shape[a:]).astype(np.float32)
    feeds = {"x": x, "s": s} | ({"b": b} if with_bias else {})
    node = helper.make_node("LayerNormalization", list(feeds), ["y", "mean", "inv"], axis=axis, epsilon=1e-5)
    want = _ort(node, feeds, 3)
    got = nm.layer_normalization(x, s, b if with_bias else None, axis=axis, epsilon=1e-5)
    for g, w in zip(got, want):
        assert g.dtype == np.float32 and g.shape == w.shape
        _close(g, w, 1e-5)
    y1 = nm.layer_normalization(x, s, b if with_bias else None, axis=axis, epsilon=1e-5, n_outputs=1)[0]
    np.testing.assert_array_equal(y1, got[0])


@pytest.mark.parametrize("b_shape", [(2, 8, 32), (1, 8, 32), (32,), (2, 1, 32), (1, 1, 8, 32)])
@pytest.mark.parametrize("swap", [False, True])
def test_add_layer_normalization_is_the_unfused_graph(path, b_shape, swap):
    """The fused Add + LayerNormalization against onnxruntime running the two nodes (all four outputs),
    broadcast skips included: by whole rows (native) and otherwise (the unfused path), either operand."""
    same_shape = b_shape == (2, 8, 32)
    r = np.random.default_rng(5)
    a = r.standard_normal((2, 8, 32)).astype(np.float32)
    b = r.standard_normal(b_shape).astype(np.float32)
    if swap:
        a, b = b, a
    s, beta = r.standard_normal(32).astype(np.float32), r.standard_normal(32).astype(np.float32)
    add = helper.make_node("Add", ["a", "b"], ["h"])
    ln = helper.make_node("LayerNormalization", ["h", "s", "beta"], ["y", "mean", "inv"], epsilon=1e-5)
    feeds = {"a": a, "b": b, "s": s, "beta": beta}
    ins = [helper.make_tensor_value_info(k, TensorProto.FLOAT, v.shape) for k, v in feeds.items()]
    outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in ("y", "mean", "inv", "h")]
    same_shape = same_shape or b_shape in ((1, 8, 32), (32,))  # whole-row broadcasts: native too
    m = helper.make_model(helper.make_graph([add, ln], "g", ins, outs), opset_imports=[helper.make_opsetid("", 17)])
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = nm.add_layer_normalization(a, b, s, beta, epsilon=1e-5)
    for g, w in zip(got, want):
        _close(g, w, 1e-5)
    y, mean, inv, h = nm.add_layer_normalization(a, b, s, beta, epsilon=1e-5, stats=0)
    if same_shape and path != "numpy":  # the native pass skips the statistics nobody reads
        assert mean is None and inv is None
    np.testing.assert_array_equal(y, got[0])
    np.testing.assert_array_equal(h, got[3])
