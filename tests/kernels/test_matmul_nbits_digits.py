"""accuracy_level 0 at few rows by int8 digits (``_native/nbits.h`` NB_MODE_F32_DIGITS, the avx512vnni level):
each block of A as three int8 digits meeting the nibbles in vpdpbusd. Within 2e-6 of max|Y| of the exact
product (fp32's own kernel is within ~5e-7), against onnxruntime within the issue's 1e-5; a block the digits
cannot hold (NaN, infinity, a maximum below 2^-100) leaves the call on the fp32 kernel, bit for bit."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

from onnx_prepared.kernels import matmul_nbits as mm
from onnx_prepared.kernels import native
from tests.kernels.test_matmul_nbits import _close_to_max, _ort, _weights

pytestmark = pytest.mark.skipif("avx512vnni" not in native.supported_levels(), reason="no avx512vnni level")


@contextlib.contextmanager
def _digits(on: bool):
    old = native._ext.set_f32_digits(on)
    try:
        yield
    finally:
        native._ext.set_f32_digits(old)


def _both(A, packed, bias=None):
    with native.forced_level("avx512vnni"):
        with _digits(True):
            yd = mm.matmul_nbits_packed(A, packed, bias, accuracy_level=0)[0]
        with _digits(False):
            yf = mm.matmul_nbits_packed(A, packed, bias, accuracy_level=0)[0]
    return yd, yf


@pytest.mark.parametrize(("K", "N", "bs", "zp_kind"), [(1024, 96, 32, "none"), (1000, 77, 32, "packed"),
                                                      (333, 50, 16, "packed"), (1024, 64, 16, "none"),
                                                      (31, 45, 32, "none"), (2816, 40, 32, "packed")])
@pytest.mark.parametrize("M", [1, 2, 3])
def test_digits_are_within_float_rounding_of_the_exact_product(M, K, N, bs, zp_kind):
    rng = np.random.default_rng(K + N + M)
    B, scales, zp = _weights(rng, K, N, 4, bs, zp_kind, flat=False)
    packed = mm.prepack_matmul_nbits(B, scales, zp, K=K, N=N, bits=4, block_size=bs)
    A = (rng.standard_normal((M, K)) * rng.choice([1e-3, 1.0, 1e3])).astype(np.float32)
    A[0, K // 2] *= 50  # an outlier: the digits' error is relative to the block's maximum
    bias = rng.standard_normal(N).astype(np.float32)
    yd, yf = _both(A, packed, bias)
    assert not np.array_equal(yd, yf)  # the digits ran (their rounding is not fp32's)
    W = mm.dequantize_matmul_nbits(packed).astype(np.float64)
    exact = A.astype(np.float64) @ W[:K] + bias
    _close_to_max(yd, exact, 2e-6)
    _close_to_max(yf, exact, 2e-6)
    _close_to_max(yd, _ort(A, B, scales, zp, bias, K=K, N=N, bits=4, block_size=bs))


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf, 1e-35, 0.0])
def test_a_block_the_digits_cannot_hold_runs_on_the_fp32_kernel(value):
    rng = np.random.default_rng(3)
    K, N = 96, 20
    B, scales, _ = _weights(rng, K, N, 4, 32, "none", flat=False)
    packed = mm.prepack_matmul_nbits(B, scales, None, K=K, N=N, bits=4, block_size=32)
    A = rng.standard_normal((2, K)).astype(np.float32)
    A[1, 32:64] = 0.0
    A[1, 33] = value  # one block of the second row
    yd, yf = _both(A, packed)
    if value == 0.0:  # a zero block is held (digits 0): the call ran by digits
        assert not np.array_equal(yd, yf)
    else:
        assert np.array_equal(yd, yf, equal_nan=True)


@pytest.mark.parametrize("M", [4, 11])
def test_from_four_rows_level_0_stays_onnxruntimes_bits(M):
    """The digits stop at 3 rows: from 4 the dequantizing fp32 kernel gives onnxruntime's bits (a level-0
    prefill is bit-exact, tests/generate/test_bit_exact_llm.py)"""
    rng = np.random.default_rng(M)
    K, N = 1024, 96
    B, scales, zp = _weights(rng, K, N, 4, 32, "none", flat=False)
    packed = mm.prepack_matmul_nbits(B, scales, zp, K=K, N=N, bits=4, block_size=32)
    A = rng.standard_normal((M, K)).astype(np.float32)
    yd, _ = _both(A, packed)
    assert np.array_equal(yd, _ort(A, B, scales, zp, None, K=K, N=N, bits=4, block_size=32))
