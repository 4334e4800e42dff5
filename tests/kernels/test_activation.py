"""Activation, Softmax, Clip, Erf/Gelu and Identity kernels against onnx.reference."""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes

from tests.kernels.onnx_node_check import assert_same, check, run_ort, run_ours

RNG = np.random.default_rng(2)


@pytest.fixture(autouse=True)
def _seeded_rng(request):
    """Each test draws from its own stream: a module-wide one made inputs depend on test order (xdist)."""
    global RNG
    RNG = np.random.default_rng(zlib.crc32(request.node.name.encode()))
EDGES = np.array([0.0, -0.0, 1e-30, -1e-30, 20.0, -20.0, 100.0, -100.0, 1e4, -1e4, np.inf, -np.inf, np.nan],
                 np.float32)


def _rand(shape, dtype=np.float32, scale=3.0):
    return (RNG.standard_normal(shape) * scale).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize(
    ("op", "attrs"),
    [("Relu", {}), ("LeakyRelu", {}), ("LeakyRelu", {"alpha": 0.2}), ("Elu", {}), ("Elu", {"alpha": 0.5}),
     ("HardSigmoid", {}), ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}), ("Sigmoid", {}), ("Tanh", {})],
)
def test_activations(op, attrs, dtype):
    tol = 2e-3 if dtype == np.float16 else 1e-6
    atol = 1e-7
    rand_atol = min(atol, tol * 1e-3)
    if op == "Sigmoid" and dtype == np.float32:
        # onnxruntime's (and so our, bit for bit) MLAS logistic approximates within ~2e-7 absolute, which
        # is up to 7e-4 relative where sigmoid is small: about a third of random draws broke rtol alone
        tol, atol = 1e-5, 3e-7
        rand_atol = atol
    (y,) = check(op, [_rand((2, 3, 5), dtype)], opset=13, rtol=tol, atol=rand_atol, **attrs)
    assert y.dtype == dtype
    check(op, [EDGES.astype(dtype)], opset=13, rtol=tol, atol=atol, **attrs)


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64])
def test_relu_integers(dtype):
    check("Relu", [np.array([-3, 0, 5], dtype)], opset=14)


def test_sigmoid_float16_small_values_not_flushed():
    x = np.array([-11.0, -15.0, -17.0, 11.0], np.float16)
    (y,) = check("Sigmoid", [x], opset=13, rtol=1e-3)
    assert y[0] > 0 and y[1] > 0


def test_scalar_inputs():
    for op in ["Relu", "LeakyRelu", "Elu", "HardSigmoid", "Sigmoid", "Tanh"]:
        (y,) = check(op, [np.array(-1.5, np.float32)], opset=13, rtol=1e-5 if op == "Sigmoid" else 1e-6)
        assert y.shape == ()


def test_identity_passes_through():
    x = _rand((2, 2))
    (y,) = check("Identity", [x], opset=16)
    assert y is x


# **** Clip ****


@pytest.mark.parametrize("attrs", [{}, {"min": -0.5}, {"max": 0.5}, {"min": -1.0, "max": 1.0}])
def test_clip_6_attributes(attrs):
    check("Clip", [_rand((3, 4))], opset=6, **attrs)


@pytest.mark.parametrize("opset", [11, 12, 13])
@pytest.mark.parametrize(("lo", "hi"), [(-0.5, 0.5), (None, 0.5), (-0.5, None), (None, None), (1.0, -1.0)])
def test_clip_inputs(opset, lo, hi):
    x = _rand((3, 4))
    inputs = [x, None if lo is None else np.array(lo, np.float32), None if hi is None else np.array(hi, np.float32)]
    while inputs[-1] is None:
        inputs.pop()
    check("Clip", inputs, opset=opset)


def test_clip_integers_and_nan():
    check("Clip", [np.arange(-5, 5, dtype=np.int32), np.array(-2, np.int32), np.array(3, np.int32)], opset=13)
    check("Clip", [EDGES, np.array(-1, np.float32), np.array(1, np.float32)], opset=13)
    check("Clip", [np.array(7.0, np.float32), np.array(0, np.float32), np.array(1, np.float32)], opset=13)


# **** Softmax / LogSoftmax ****


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("opset", [1, 11])
@pytest.mark.parametrize("axis", [None, 0, 1, 2, -1, -3])
def test_softmax_coerced_2d(op, opset, axis):
    """Opset < 13 flattens to 2-D at ``axis``. onnx.reference ignores that (it normalizes along ``axis``
    only), so the expectation is onnxruntime's."""
    pytest.importorskip("onnxruntime")
    if opset == 1 and axis is not None and axis < 0:
        pytest.skip("negative axes arrived in opset 11")
    attrs = {} if axis is None else {"axis": axis}
    x = _rand((2, 3, 4))
    ours = run_ours(op, [x], opset=opset, **attrs)
    assert_same(ours, run_ort(op, [x], opset=opset, **attrs), rtol=1e-5, atol=1e-6)


def test_softmax_coerced_2d_by_hand():
    x = _rand((2, 3, 4))
    (y,) = run_ours("Softmax", [x], opset=11, axis=1)
    flat = x.reshape(2, 12).astype(np.float64)
    e = np.exp(flat - flat.max(axis=1, keepdims=True))
    np.testing.assert_allclose(y, (e / e.sum(axis=1, keepdims=True)).reshape(x.shape), rtol=1e-5)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("axis", [None, 0, 1, -1, -2])
def test_softmax_13_axis(op, axis):
    attrs = {} if axis is None else {"axis": axis}
    check(op, [_rand((2, 3, 4))], opset=13, rtol=1e-5, atol=1e-6, **attrs)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_masked_rows_and_dtypes(op):
    x = _rand((3, 5))
    x[0, :2] = -np.inf
    x[1, :] = 1000.0
    check(op, [x], opset=13, rtol=1e-5, atol=1e-6)
    check(op, [_rand((4, 6), np.float16)], opset=13, rtol=1e-3, atol=1e-3)
    check(op, [_rand((4, 6), np.float64)], opset=13, rtol=1e-12)


def test_softmax_empty():
    (y,) = run_ours("Softmax", [np.zeros((0, 4), np.float32)], opset=13)
    assert y.shape == (0, 4)
    (y,) = run_ours("Softmax", [np.zeros((2, 0), np.float32)], opset=1)
    assert y.shape == (2, 0)


@settings(max_examples=20, derandomize=True, deadline=None)
@given(shape=array_shapes(min_dims=1, max_dims=4, max_side=4), data=st.data())
def test_softmax_random_axes(shape, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    check("Softmax", [_rand(shape)], opset=13, rtol=1e-5, atol=1e-6, axis=axis)
    check("LogSoftmax", [_rand(shape)], opset=13, rtol=1e-5, atol=1e-6, axis=axis)


# **** Erf / Gelu ****


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_erf(dtype):
    x = np.concatenate([np.linspace(-5, 5, 201), [0.0, 1e-8, -1e-8, 1e-3, 3.9, 4.1, 10.0]]).astype(dtype)
    tol = 1e-3 if dtype == np.float16 else 1e-6
    (y,) = check("Erf", [x], opset=13, rtol=tol, atol=tol * 1e-3)
    assert y.dtype == dtype
    check("Erf", [EDGES.astype(dtype)], opset=13, rtol=tol)


def test_erf_dense_accuracy_float32():
    x = np.linspace(-6, 6, 20001, dtype=np.float32)
    (y,) = run_ours("Erf", [x], opset=13)
    exact = np.array([math.erf(float(v)) for v in x])
    np.testing.assert_allclose(y, exact, rtol=1e-6, atol=1e-7)


def _gelu_exact(x: np.ndarray, approximate: str) -> np.ndarray:
    v = x.astype(np.float64)
    if approximate == "tanh":
        return 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3)))
    return 0.5 * v * (1 + np.array([math.erf(t / math.sqrt(2)) for t in v.ravel()]).reshape(v.shape))


@pytest.mark.parametrize("approximate", [None, "none", "tanh"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_gelu(approximate, dtype):
    """onnx.reference has no Gelu kernel (it is a function op), so the expectation is float64 math."""
    x = np.concatenate([_rand((40,)), [0.0, -10.0, 10.0, 1e-6]]).astype(dtype)
    attrs = {} if approximate is None else {"approximate": approximate}
    (y,) = run_ours("Gelu", [x], opset=20, **attrs)
    assert y.dtype == dtype and y.shape == x.shape
    tol = 2e-3 if dtype == np.float16 else 1e-6
    np.testing.assert_allclose(y.astype(np.float64), _gelu_exact(x, approximate or "none"), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize(
    ("op", "opset", "attrs"),
    [("Softplus", 1, {}), ("Softsign", 1, {}), ("Selu", 6, {}), ("Selu", 6, {"alpha": 2.0, "gamma": 3.0}),
     ("ThresholdedRelu", 10, {}), ("ThresholdedRelu", 10, {"alpha": 0.5}), ("HardSwish", 14, {})],
)
def test_more_activations(op, opset, attrs, dtype):
    tol = 2e-3 if dtype == np.float16 else 1e-6
    check(op, [_rand((3, 7), dtype)], opset=opset, rtol=tol, atol=tol * 1e-3, **attrs)
    check(op, [np.array([0.0, 50.0, -50.0, 1e4, -1e4], dtype)], opset=opset, rtol=tol, atol=1e-7, **attrs)


@pytest.mark.parametrize(("xs", "ss"), [((2, 3, 4, 4), (3, 1, 1)), ((2, 3), (3,)), ((2, 3), ()), ((4,), (4,)),
                                        ((2, 3, 4), (1, 1, 4))])
def test_prelu_unidirectional_slope(xs, ss):
    check("PRelu", [_rand(xs), _rand(ss)], opset=16)
    check("PRelu", [_rand(xs), _rand(ss)], opset=9)


@pytest.mark.parametrize("shape", [(1, 1024), (3, 37), (0,), ()])
def test_native_hardswish_is_the_numpy_kernel_bit_for_bit(shape):
    """float32 HardSwish runs in one native pass (act.c) with numpy's roundings: the same bits as the numpy
    ufuncs (edges: NaN, -0, infinities, the clip's corners), and a strided input takes the numpy path."""
    from onnx_prepared.kernels import native
    from onnx_prepared.kernels.activation import hard_swish

    x = _rand(shape) * 3
    if x.size >= len(EDGES):
        x.reshape(-1)[:len(EDGES)] = EDGES
        x.reshape(-1)[len(EDGES):len(EDGES) + 4] = [3.0, -3.0, 2.9999998, -3.0000002]
    y = hard_swish(x)[0]
    saved = native._ext
    try:
        native._ext = None
        with np.errstate(invalid="ignore"):  # -inf * 0
            ref = hard_swish(x)[0]
    finally:
        native._ext = saved
    assert y.dtype == np.float32 and y.shape == x.shape
    np.testing.assert_array_equal(y.view(np.int32), ref.view(np.int32))
    if x.ndim == 2:
        with np.errstate(invalid="ignore"):
            np.testing.assert_array_equal(hard_swish(x[:, ::2])[0], ref[:, ::2])


@pytest.mark.parametrize("shape", [(2, 64, 16, 16), (3, 37), (0,), ()])
def test_native_relu_is_numpy_maximum_bit_for_bit(shape):
    """float32 Relu runs in one native pass (act.c): np.maximum(x, 0)'s bits (NaN payloads kept, -0.0 to
    +0.0, infinities), and a strided input takes the numpy path."""
    from onnx_prepared.kernels.activation import relu

    x = _rand(shape)
    if x.size >= len(EDGES) + 1:
        x.reshape(-1)[:len(EDGES)] = EDGES
        x.reshape(-1)[len(EDGES)] = -np.float32(np.nan)
    y = relu(x)[0]
    ref = np.maximum(x, 0)
    assert y.dtype == np.float32 and y.shape == x.shape
    np.testing.assert_array_equal(np.asarray(y).view(np.int32), np.asarray(ref).view(np.int32))
    if x.ndim == 2:
        np.testing.assert_array_equal(relu(x[:, ::2])[0], ref[:, ::2])
