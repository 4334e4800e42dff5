"""Sigmoid's native float32 pass (kernels/_native/act.c) against onnxruntime and float64, at every dispatch
level (levels without it stay on numpy), including the masked tail, NaN/inf and saturated inputs."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from onnx_prepared.kernels import native
from onnx_prepared.kernels.activation import _NATIVE_MIN, sigmoid

ort = pytest.importorskip("onnxruntime")


def _ort_sigmoid(x: np.ndarray) -> np.ndarray:
    g = helper.make_graph([helper.make_node("Sigmoid", ["X"], ["Y"])], "g",
                          [helper.make_tensor_value_info("X", TensorProto.FLOAT, list(x.shape))],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, list(x.shape))])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"X": x})[0]


@pytest.mark.parametrize("level", native.supported_levels() or ["numpy"])
@pytest.mark.parametrize("shape", [(_NATIVE_MIN + 7,), (33, 1031), (3, 5, 16384)])
def test_sigmoid_matches_onnxruntime_and_float64(level, shape):
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * 10).astype(np.float32)
    flat = x.reshape(-1)
    flat[:9] = [np.nan, np.inf, -np.inf, 100, -100, 88.9, -88.9, 0, 1e-40]
    if level != "numpy":
        with native.forced_level(level):
            (got,) = sigmoid(x)
            used_native = native.sigmoid_f32(x) is not None
        assert used_native == (level == "avx512vnni")
    else:
        (got,) = sigmoid(x)
    assert got.shape == x.shape and got.dtype == np.float32
    assert np.array_equal(np.isnan(got), np.isnan(x))
    exact = 1 / (1 + np.exp(-x.astype(np.float64)))
    ok = ~np.isnan(x)
    np.testing.assert_allclose(got[ok], exact[ok], rtol=3e-7, atol=1e-37)
    # onnxruntime's Sigmoid (MLAS's logistic) is itself an approximation: absolute error up to 1.2e-7
    # (1.4% relative near 1e-5), hence the absolute bound here; the float64 check above is the tight one.
    want = _ort_sigmoid(x)
    np.testing.assert_allclose(got[ok], want[ok], rtol=1e-6, atol=2e-7)


def test_small_and_non_float32_inputs_stay_on_numpy():
    x = np.linspace(-5, 5, 11, dtype=np.float32)
    np.testing.assert_allclose(sigmoid(x)[0], 1 / (1 + np.exp(-x)), rtol=1e-6)
    x64 = np.linspace(-5, 5, _NATIVE_MIN + 1)
    (y,) = sigmoid(x64)
    assert y.dtype == np.float64
    np.testing.assert_allclose(y, 1 / (1 + np.exp(-x64)), rtol=1e-15)
