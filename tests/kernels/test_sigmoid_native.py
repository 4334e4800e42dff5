"""Sigmoid's native float32 pass (kernels/_native/act.c) against onnxruntime at every dispatch level:
bit-equal at every level on a CPU with FMA (MLAS's FMA3 logistic, what onnxruntime runs there; portable
computes it lane by lane with fmaf), within the approximation's error on numpy, including the masked
tail, NaN/inf and saturated inputs."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from onnx_prepared.kernels import native
from onnx_prepared.kernels.activation import sigmoid

ort = pytest.importorskip("onnxruntime")


def _ort_sigmoid(x: np.ndarray) -> np.ndarray:
    g = helper.make_graph([helper.make_node("Sigmoid", ["X"], ["Y"])], "g",
                          [helper.make_tensor_value_info("X", TensorProto.FLOAT, list(x.shape))],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, list(x.shape))])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"X": x})[0]


def _fma_cpu() -> bool:
    return "avx2" in native.supported_levels()


@pytest.mark.parametrize("level", native.supported_levels() or ["numpy"])
@pytest.mark.parametrize("shape", [(5,), (71,), (33, 1031), (3, 5, 16384)])
def test_sigmoid_matches_onnxruntime(level, shape):
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * 10).astype(np.float32)
    flat = x.reshape(-1)
    flat[:5] = [np.nan, np.inf, -np.inf, 100, -100][: flat.size]
    if level != "numpy":
        with native.forced_level(level):
            (got,) = sigmoid(x)
    else:
        (got,) = sigmoid(x)
    assert got.shape == x.shape and got.dtype == np.float32
    assert np.array_equal(np.isnan(got), np.isnan(x))
    want = _ort_sigmoid(x)
    if level != "numpy" and _fma_cpu():
        assert np.array_equal(got, want, equal_nan=True)
    ok = ~np.isnan(x)
    # MLAS's logistic approximates: absolute error up to ~2e-7 between its roundings and against float64
    np.testing.assert_allclose(got[ok], want[ok], rtol=1e-6, atol=3e-7)
    exact = 1 / (1 + np.exp(-x.astype(np.float64)))
    np.testing.assert_allclose(got[ok], exact[ok], rtol=1e-5, atol=3e-7)


def test_non_float32_inputs_stay_on_numpy():
    x64 = np.linspace(-5, 5, 101)
    (y,) = sigmoid(x64)
    assert y.dtype == np.float64
    np.testing.assert_allclose(y, 1 / (1 + np.exp(-x64)), rtol=1e-15)
