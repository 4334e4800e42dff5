"""Gemm and MatMul fast kernels against onnx.reference."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.kernels.onnx_node_check import check

RNG = np.random.default_rng(0)


def _rand(*shape, dtype=np.float32):
    if np.dtype(dtype).kind in "iu":
        return RNG.integers(-5, 6, size=shape).astype(dtype)
    return RNG.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("trans_a", [0, 1])
@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("c_shape", [None, (), (1,), (5,), (1, 5), (3, 1), (3, 5)])
def test_gemm_transposes_and_c_broadcast(trans_a, trans_b, c_shape):
    a = _rand(*((4, 3) if trans_a else (3, 4)))
    b = _rand(*((5, 4) if trans_b else (4, 5)))
    c = None if c_shape is None else _rand(*c_shape)
    (y,) = check("Gemm", [a, b, c] if c is not None else [a, b], opset=13, rtol=1e-5, atol=1e-6,
                 transA=trans_a, transB=trans_b, alpha=0.5, beta=2.0)
    assert y.shape == (3, 5)


@pytest.mark.parametrize("opset", [7, 9, 11, 13])
def test_gemm_defaults_each_opset(opset):
    check("Gemm", [_rand(2, 3), _rand(3, 4), _rand(4)], opset=opset, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.float64, np.float16, np.int32, np.int64])
def test_gemm_dtypes_preserved(dtype):
    a, b, c = _rand(3, 4, dtype=dtype), _rand(5, 4, dtype=dtype), _rand(5, dtype=dtype)
    tol = 2e-3 if dtype == np.float16 else 1e-6
    (y,) = check("Gemm", [a, b, c], opset=13, rtol=tol, atol=tol, transB=1)
    assert y.dtype == dtype


def test_gemm_integer_with_fractional_alpha_matches_reference():
    a, b, c = _rand(3, 4, dtype=np.int32), _rand(4, 2, dtype=np.int32), _rand(2, dtype=np.int32)
    check("Gemm", [a, b, c], opset=13, alpha=0.5, beta=3.0)


def test_gemm_beta_zero_ignores_c():
    (y,) = check("Gemm", [_rand(2, 3), _rand(3, 2), np.full((2, 2), np.nan, np.float32)], opset=13,
                 rtol=1e-6, atol=1e-6, beta=0.0)
    assert not np.isnan(y).any()


def test_gemm_empty_k():
    (y,) = check("Gemm", [_rand(3, 0), _rand(0, 2), _rand(2)], opset=13)
    assert y.shape == (3, 2)


@pytest.mark.parametrize(
    ("sa", "sb"),
    [((4,), (4,)), ((4,), (4, 3)), ((2, 4), (4,)), ((2, 3, 4), (4, 5)), ((1, 3, 4), (2, 4, 5)),
     ((2, 1, 3, 4), (5, 4, 2)), ((0, 4), (4, 2)), ((3, 0), (0, 2))],
)
def test_matmul_shapes(sa, sb):
    (y,) = check("MatMul", [_rand(*sa), _rand(*sb)], opset=13, rtol=1e-5, atol=1e-6)
    assert isinstance(y, np.ndarray)


@pytest.mark.parametrize("dtype", [np.float16, np.float64, np.int32, np.int64, np.uint8])
def test_matmul_dtypes(dtype):
    a = _rand(2, 3, 4, dtype=dtype) if dtype != np.uint8 else RNG.integers(0, 4, (2, 3, 4)).astype(dtype)
    b = _rand(4, 2, dtype=dtype) if dtype != np.uint8 else RNG.integers(0, 4, (4, 2)).astype(dtype)
    tol = 2e-3 if dtype == np.float16 else 1e-6
    (y,) = check("MatMul", [a, b], opset=13, rtol=tol, atol=tol)
    assert y.dtype == dtype


def test_matmul_bfloat16_keeps_dtype():
    import ml_dtypes

    a, b = _rand(3, 8).astype(ml_dtypes.bfloat16), _rand(8, 2).astype(ml_dtypes.bfloat16)
    (y,) = check("MatMul", [a, b], opset=13, rtol=1e-2, atol=1e-2)
    assert y.dtype == ml_dtypes.bfloat16


@settings(max_examples=30, derandomize=True, deadline=None)
@given(m=st.integers(1, 6), k=st.integers(1, 6), n=st.integers(1, 6), ta=st.booleans(), tb=st.booleans(),
       alpha=st.sampled_from([1.0, -0.5, 2.0]), beta=st.sampled_from([1.0, 0.0, 0.25]))
def test_gemm_random(m, k, n, ta, tb, alpha, beta):
    a = _rand(*((k, m) if ta else (m, k)))
    b = _rand(*((n, k) if tb else (k, n)))
    check("Gemm", [a, b, _rand(1, n)], opset=13, rtol=1e-5, atol=1e-5,
          transA=int(ta), transB=int(tb), alpha=alpha, beta=beta)
