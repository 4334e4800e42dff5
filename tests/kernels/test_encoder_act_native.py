"""The native Erf, GELU and Softmax of ``_native/encoder_act.c`` against the numpy code they replace (which
tests/kernels/test_activation.py holds to the references): Erf bit for bit, Softmax within float32
rounding, NaN, inf and the vector tails included."""

from __future__ import annotations

import numpy as np
import pytest

from onnx_prepared.kernels import activation, native

pytestmark = pytest.mark.skipif(not native.available(), reason="needs the native extension")
RNG = np.random.default_rng(2024)


def _numpy(fn, *args, **kw):
    saved, native._ext = native._ext, None
    try:
        return fn(*args, **kw)
    finally:
        native._ext = saved


@pytest.mark.parametrize("shape", [(1,), (5,), (2, 8, 128), (3, 1001), (0, 4)])
def test_native_erf_is_the_numpy_approximation_bit_for_bit(shape):
    x = (RNG.standard_normal(shape) * 3).astype(np.float32)
    flat = x.reshape(-1)
    flat[: min(7, flat.size)] = [np.nan, np.inf, -np.inf, 4.0, -4.0, -0.0, 1e-30][: min(7, flat.size)]
    (got,) = activation.erf(x)
    (ref,) = _numpy(activation.erf, x)
    assert got.dtype == np.float32 and got.shape == x.shape
    np.testing.assert_array_equal(got.view(np.uint32), ref.view(np.uint32))


def test_native_erf_reads_strided_input():
    x = RNG.standard_normal((6, 10)).astype(np.float32)[:, ::3]
    np.testing.assert_array_equal(activation.erf(x)[0], _numpy(activation.erf, np.ascontiguousarray(x))[0])


@pytest.mark.parametrize("shape,axis", [((2, 4, 8, 8), -1), ((2, 4, 8, 8), 3), ((7, 33), 1), ((1,), 0), ((3, 5), 0)])
def test_native_softmax_matches_the_numpy_code(shape, axis):
    x = (RNG.standard_normal(shape) * 4).astype(np.float32)
    (got,) = activation.softmax_13(x, axis=axis)
    (ref,) = _numpy(activation.softmax_13, x, axis=axis)
    assert got.dtype == np.float32 and got.shape == x.shape
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-7)


def test_native_softmax_special_rows():
    x = np.array([[0.0, np.nan, 1.0], [np.nan, 0.0, 1.0], [-np.inf, 0.0, 1.0], [-np.inf] * 3, [np.inf, 0.0, 1.0],
                  [1e30, -1e30, 0.0]], np.float32)
    with np.errstate(invalid="ignore"):
        (got,) = activation.softmax_13(x)
        (ref,) = _numpy(activation.softmax_13, x)
    np.testing.assert_allclose(got, ref, rtol=1e-6, equal_nan=True)


def test_large_softmax_stays_on_numpy():
    """Past _NATIVE_SOFTMAX_MAX elements numpy's SIMD exp is faster; the values agree either way."""
    x = RNG.standard_normal((80, 128)).astype(np.float32)
    assert x.size > activation._NATIVE_SOFTMAX_MAX
    np.testing.assert_array_equal(activation.softmax_13(x)[0], _numpy(activation.softmax_13, x)[0])


@pytest.mark.parametrize("shape", [(1,), (2, 8, 128), (3, 1001), (0, 4)])
def test_native_gelu_is_the_unfused_graph_bit_for_bit(shape):
    """onnx_prepared::GeluErf natively (blocks of 256 through the Erf approximation) against the unfused
    Div, Erf, Add, Mul, Mul of the numpy path."""
    x = (RNG.standard_normal(shape) * 4).astype(np.float32)
    flat = x.reshape(-1)
    flat[: min(5, flat.size)] = [np.nan, np.inf, -np.inf, 0.0, -0.0][: min(5, flat.size)]
    with np.errstate(invalid="ignore"):
        (got,) = activation.gelu_erf(x, d=float(np.float32(2 ** 0.5)))
        (ref,) = _numpy(activation.gelu_erf, x, d=float(np.float32(2 ** 0.5)))
    assert got.dtype == np.float32 and got.shape == x.shape
    np.testing.assert_array_equal(got.view(np.uint32), ref.view(np.uint32))
